"""The regression gate's rules and its verdict: this run against reference code, measured
beside it in the same job, and optionally against a saved run.

Memory is deterministic (BLAS pinned, engines warmed up): every benchmark's
peak bytes per forward are measured once for the current engine and once for
the reference code's engine, the same way, and any growth of
``MEMORY_GROWTH_BYTES`` or more fails. A saved run's figures are a second
source, compared only when they were measured with the same allocation
environment (``Environment``).

Latency is not. Raw times from two runs differ by 30-60 % here, and even an
engine's ratio to a fixed yardstick drifts by up to 20 % between processes,
so saved times are never compared. Instead the current engine and the
reference commit's engine (``basecode``) run interleaved in this process,
BLAS pinned to one thread (a neighbour's load then costs a core, not a
straggling BLAS thread), and a benchmark regresses only when, asv-style:

- the median per-round ratio current/reference exceeds ``LATENCY_FACTOR``,
- and does so again in each of ``CONFIRMATIONS`` fresh re-measurements
  (noise comes in bursts; a regression persists),
- and the pooled times differ by a one-sided Mann-Whitney U test at p < ``ALPHA``.

A verdict lists what it compared and, grouped by reason, every benchmark it
did not: a gate that compared nothing says so. ``scripts/gate_rates.py``
measures how often this passes unchanged code and catches planted
regressions; docs/gate.md keeps its last figures. Pure: no pytest, no SciPy.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..timing import Interleaved

# Half the smallest temporary memray sees (NumPy serves arrays under 1 KiB from its own cache):
# a 1 KiB temporary can replace ~100 B of Python objects at the peak, so it grows the peak by
# ~900 B (measured: planted at mlp-b1-d256, 72 B -> 1024 B). Identical code measures equal bytes.
MEMORY_GROWTH_BYTES = 512
LATENCY_FACTOR = 1.15
CONFIRMATIONS = 2
ALPHA = 0.002

# What a benchmark can be compared on: peak bytes against the reference code (A/B), peak bytes
# against a saved run, latency against the reference code (A/B).
KINDS = ("memory", "memory-saved", "latency")
RULES = (f"memory: growth >= {MEMORY_GROWTH_BYTES} B; latency: > {LATENCY_FACTOR:.2f}x in "
         f"{CONFIRMATIONS + 1} interleaved measurements and Mann-Whitney p < {ALPHA}")


def mann_whitney_greater(a, b) -> float:
    """One-sided p-value that ``a`` tends to exceed ``b`` (Mann-Whitney U).

    Normal approximation with tie correction and continuity correction, as
    ``scipy.stats.mannwhitneyu(a, b, alternative="greater", method="asymptotic")``;
    the gate pools at least 45 samples a side, where it is accurate.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = len(a), len(b)
    pooled = np.concatenate([a, b])
    _, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    # average rank of each distinct value: ranks of equal values are shared
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class Finding:
    name: str          # the benchmark, e.g. static-mlp-b32-d1024
    kind: str          # one of KINDS
    baseline: float    # bytes, or seconds per call
    current: float
    ratio: float
    p_value: float | None = None


@dataclass
class ModelChange:
    """A model file that differs at the reference commit, measured there and here on the same engines.

    ``nodes`` and ``flops`` (one sample's) are (at the reference, now); ``benchmarks`` holds, per
    benchmark, what was measured of it: ``ratio`` (latency now / at the reference) and
    ``peak``, ``arena``, ``weights`` as [reference, now] bytes."""
    file: str
    nodes: tuple[int, int]
    flops: tuple[int, int]
    benchmarks: dict[str, dict] = field(default_factory=dict)

    def lines(self) -> list[str]:
        (n0, n1), (f0, f1) = self.nodes, self.flops
        lines = [f"model changed: {self.file}: {n0} -> {n1} nodes, {f1 / max(f0, 1):.2f}x the flops"]
        for name, figures in sorted(self.benchmarks.items()):
            parts = []
            if figures.get("ratio") is not None:
                r = figures["ratio"]
                parts.append(f"{r:.2f}x slower" if r >= 1 else f"{1 / r:.2f}x faster")
            for key, what in (("peak", "per forward"), ("arena", "arena"), ("weights", "weights")):
                if any(figures.get(key) or ()):
                    before, after = figures[key]
                    parts.append(f"{_signed_bytes(after - before)} {what}")
            lines.append(f"  {name}: {', '.join(parts) or 'not measured'}")
        return lines


def _signed_bytes(delta: int) -> str:
    sign = "+" if delta >= 0 else "-"
    size = abs(delta)
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{sign}{size / scale:.1f} {unit}"
    return f"{sign}{size} B"


@dataclass
class Verdict:
    """What was compared, against what, what was not and why, and what regressed."""
    reference: str = "no reference code"     # the code compared against, and why that code
    saved: str | None = None                 # the saved run compared against, and why; None: none
    compared: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    skipped: dict[str, dict[str, list[str]]] = field(default_factory=lambda: {k: {} for k in KINDS})
    regressions: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shard: str | None = None                 # "K/N" when this run measured one shard
    models: list[ModelChange] = field(default_factory=list)    # model files changed since the reference
    ratios: dict[str, float] = field(default_factory=dict)     # latency A/B: benchmark -> median now/reference

    def done(self, kind: str, name: str, finding: Finding | None = None) -> None:
        self.compared[kind].append(name)
        if finding:
            self.regressions.append(finding)

    def skip(self, kind: str, name: str, reason: str) -> None:
        self.skipped[kind].setdefault(reason, []).append(name)

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    @property
    def memory_compared(self) -> int:
        """Benchmarks compared for memory by either source."""
        return len(set(self.compared["memory"]) | set(self.compared["memory-saved"]))

    @property
    def latency_compared(self) -> int:
        return len(self.compared["latency"])

    @property
    def nothing_compared(self) -> bool:
        return not any(self.compared.values())

    def as_dict(self) -> dict:
        return {"failed": self.failed, "nothing_compared": self.nothing_compared,
                "memory_compared": self.memory_compared, "latency_compared": self.latency_compared,
                "reference": self.reference, "saved": self.saved, "shard": self.shard,
                "compared": self.compared, "skipped": self.skipped, "notes": self.notes,
                "regressions": [asdict(f) for f in self.regressions],
                "models": [asdict(m) for m in self.models], "ratios": self.ratios}

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        verdict = cls(reference=data["reference"], saved=data.get("saved"), shard=data.get("shard"),
                      notes=list(data.get("notes", [])),
                      regressions=[Finding(**f) for f in data.get("regressions", [])],
                      models=[ModelChange(m["file"], tuple(m["nodes"]), tuple(m["flops"]), m["benchmarks"])
                              for m in data.get("models", [])],
                      ratios=dict(data.get("ratios", {})))
        for kind in KINDS:
            verdict.compared[kind] = list(data.get("compared", {}).get(kind, []))
            verdict.skipped[kind] = {r: list(n) for r, n in data.get("skipped", {}).get(kind, {}).items()}
        return verdict


def merge(verdicts: list[Verdict]) -> Verdict:
    """The verdicts of the shards of one run as one verdict (references listed if they differ)."""
    merged = Verdict(reference=" | ".join(dict.fromkeys(v.reference for v in verdicts)) or "no shards",
                     saved=" | ".join(dict.fromkeys(v.saved for v in verdicts if v.saved)) or None)
    for v in sorted(verdicts, key=lambda v: v.shard or ""):
        for kind in KINDS:
            merged.compared[kind] += v.compared[kind]
            for reason, names in v.skipped[kind].items():
                merged.skipped[kind].setdefault(reason, []).extend(names)
        merged.regressions += v.regressions
        merged.models += v.models
        merged.ratios.update(v.ratios)
        merged.notes += [n for n in v.notes if n not in merged.notes]
    return merged


# --- the rules ------------------------------------------------------------------------

def memory_finding(name: str, baseline: int, current: int, kind: str = "memory") -> Finding | None:
    if current - baseline >= MEMORY_GROWTH_BYTES:
        return Finding(name, kind, baseline, current, current / max(baseline, 1))
    return None


def saved_figures(run: dict) -> dict[tuple[str, str], dict]:
    """(case id, engine) -> extra_info of a saved run."""
    return {(b["extra_info"].get("case"), b["extra_info"].get("engine")): b["extra_info"]
            for b in run["benchmarks"] if "extra_info" in b}


def memory_findings(reference_run: dict, current: dict, verdict: Verdict) -> None:
    """This run's peaks against a saved run's. current: (case id, engine) -> {"peak", "version"}."""
    saved = saved_figures(reference_run)
    for key, now in current.items():
        name = f"{key[1]}-{key[0]}"
        old = saved.get(key)
        if now.get("peak") is None:
            continue                                  # not measured here: reported by the A/B pass
        if old is None or old.get("peak_bytes") is None:
            verdict.skip("memory-saved", name, "not in the saved run")
        elif old.get("version") != now.get("version"):
            verdict.skip("memory-saved", name, "another workload version in the saved run")
        else:
            verdict.done("memory-saved", name,
                         memory_finding(name, old["peak_bytes"], now["peak"], "memory-saved"))


def latency_comparison(name: str, measure: Callable[[], Interleaved]) -> tuple[float, Finding | None]:
    """``measure()`` times current (a) against reference (b), interleaved: (the median ratio
    current/reference over every measurement taken, the regression or None)."""
    samples = [measure()]
    while samples[-1].median > LATENCY_FACTOR and len(samples) <= CONFIRMATIONS:
        samples.append(measure())
    ratio = float(np.median([r for s in samples for r in s.ratios]))
    if not all(s.median > LATENCY_FACTOR for s in samples) or len(samples) <= CONFIRMATIONS:
        return ratio, None
    current = [t for s in samples for t in s.a_times]
    reference = [t for s in samples for t in s.b_times]
    p = mann_whitney_greater(current, reference)
    if p >= ALPHA:
        return ratio, None
    return ratio, Finding(name, "latency", float(np.median(reference)), float(np.median(current)), ratio, p)


def latency_finding(name: str, measure: Callable[[], Interleaved]) -> Finding | None:
    return latency_comparison(name, measure)[1]


# --- the verdict as text ----------------------------------------------------------------

_WHAT = {"memory": "memory A/B", "memory-saved": "memory vs saved run", "latency": "latency A/B"}


def _names(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _grouped(verdict: Verdict) -> list[tuple[list[str], str, list[str]]]:
    """(kinds, reason, benchmarks) of what was not compared; kinds that left out the same
    benchmarks for the same reason share one line."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for kind in KINDS:
        for reason, names in verdict.skipped[kind].items():
            groups.setdefault((reason, tuple(names)), []).append(kind)
    return [(kinds, reason, list(names)) for (reason, names), kinds in groups.items()]


def _counts(verdict: Verdict) -> list[tuple[str, int, int]]:
    """(kind's name, benchmarks compared, benchmarks in all) for each kind that had any."""
    counts = [(_WHAT[kind], len(verdict.compared[kind]),
               len(verdict.compared[kind]) + sum(len(n) for n in verdict.skipped[kind].values())) for kind in KINDS]
    return [c for c in counts if c[2]]


def format_verdict(verdict: Verdict) -> str:
    """A short block: against what, how many compared per kind, what was not and why, the result."""
    lines = [f"against: {verdict.reference}"]
    if verdict.saved:
        lines.append(f"and saved run: {verdict.saved}")
    lines += [f"  {what + ':':20} {done} of {total} benchmarks compared" for what, done, total in _counts(verdict)]
    lines += [f"  note: {n}" for n in verdict.notes]
    lines += [line for m in verdict.models for line in m.lines()]
    missed = _grouped(verdict)
    if missed:
        lines.append("not compared:")
        lines += [f"  {', '.join(_WHAT[k] for k in kinds)} ({len(names)}): {reason}: {_names(names)}"
                  for kinds, reason, names in missed]
    if verdict.regressions:
        width = max(len(f.name) for f in verdict.regressions)
        lines.append(f"  {'REGRESSED':{width}}  kind              baseline       current    ratio")
        for f in verdict.regressions:
            lines.append(f"  {f.name:{width}}  {f.kind:12}  {_value(f, f.baseline):>12}  {_value(f, f.current):>12}"
                         f"  {f.ratio:6.2f}x" + (f"  p={f.p_value:.1e}" if f.p_value is not None else ""))
        lines.append(f"FAILED: {len(verdict.regressions)} regressions ({RULES})")
    elif verdict.nothing_compared:
        lines.append("NOTHING COMPARED: this run is not gated")
    else:
        lines.append(f"passed: no regression in {sum(map(len, verdict.compared.values()))} comparisons ({RULES})")
    return "\n".join(lines)


def _value(f: Finding | dict, v: float) -> str:
    kind = f.kind if isinstance(f, Finding) else f["kind"]
    return f"{int(v):,} B" if kind.startswith("memory") else f"{v * 1e6:,.1f} µs"


def format_markdown(verdict: Verdict) -> str:
    """The verdict as Markdown, for a CI job summary."""
    status = ("**regression**" if verdict.failed else "**nothing compared**" if verdict.nothing_compared
              else "no regression")
    lines = [f"### Benchmark gate: {status}", "", f"Against {verdict.reference}."]
    if verdict.saved:
        lines.append(f"And saved run {verdict.saved}.")
    lines.append("")
    lines += [f"- {what}: {done} of {total} benchmarks compared" for what, done, total in _counts(verdict)]
    lines += [f"- note: {n}" for n in verdict.notes]
    for model in verdict.models:
        first, *rest = model.lines()
        lines += [f"- {first}", *(f"  - `{r.strip().split(':')[0]}`:{r.split(':', 1)[1]}" for r in rest)]
    for kinds, reason, names in _grouped(verdict):
        lines.append(f"- not compared, {', '.join(_WHAT[k] for k in kinds)} ({len(names)}): {reason}: {_names(names)}")
    if verdict.regressions:
        lines += ["", "| benchmark | kind | baseline | current | ratio |", "|---|---|---|---|---|"]
        for f in verdict.regressions:
            lines.append(f"| `{f.name}` | {f.kind} | {_value(f, f.baseline)} | {_value(f, f.current)} "
                         f"| {f.ratio:.2f}x |")
    return "\n".join(lines) + "\n"

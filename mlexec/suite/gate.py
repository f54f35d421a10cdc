"""The regression gate: this run against a reference, memory from saved figures, latency A/B.

Memory is deterministic (BLAS pinned, engines warmed up), so it is gated on
saved figures: any growth of ``MEMORY_GROWTH_BYTES`` or more in a benchmark's
measured peak against the reference run fails.

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

``scripts/gate_rates.py`` measures how often this passes unchanged code and
catches a planted 25 % slowdown; the README keeps its last figures.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.stats import mannwhitneyu

from .ratio import Interleaved

MEMORY_GROWTH_BYTES = 1024
LATENCY_FACTOR = 1.15
CONFIRMATIONS = 2
ALPHA = 0.002


@dataclass(frozen=True)
class Finding:
    name: str          # the benchmark, e.g. static-mlp-b32-d1024
    kind: str          # "memory" or "latency"
    baseline: float    # bytes, or seconds per call
    current: float
    ratio: float
    p_value: float | None = None


@dataclass
class Verdict:
    regressions: list[Finding] = field(default_factory=list)
    memory_compared: int = 0
    latency_compared: int = 0
    stale: list[str] = field(default_factory=list)    # other workload version: skipped, not misread
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def as_dict(self) -> dict:
        return {"failed": self.failed, "memory_compared": self.memory_compared,
                "latency_compared": self.latency_compared, "stale": self.stale, "notes": self.notes,
                "regressions": [f.__dict__ for f in self.regressions]}


def saved_figures(run: dict) -> dict[tuple[str, str], dict]:
    """(case id, engine) -> extra_info of a saved run."""
    return {(b["extra_info"].get("case"), b["extra_info"].get("engine")): b["extra_info"]
            for b in run["benchmarks"] if "extra_info" in b}


def memory_findings(reference_run: dict, current: dict, verdict: Verdict) -> None:
    """current: (case id, engine) -> {"peak": bytes, "version": str}."""
    saved = saved_figures(reference_run)
    for key, now in current.items():
        old = saved.get(key)
        if old is None or old.get("peak_bytes") is None or now.get("peak") is None:
            continue
        name = f"{key[1]}-{key[0]}"
        if old.get("version") != now.get("version"):
            verdict.stale.append(name)
            continue
        verdict.memory_compared += 1
        if now["peak"] - old["peak_bytes"] >= MEMORY_GROWTH_BYTES:
            verdict.regressions.append(Finding(name, "memory", old["peak_bytes"], now["peak"],
                                               now["peak"] / max(old["peak_bytes"], 1)))


def latency_finding(name: str, measure: Callable[[], Interleaved]) -> Finding | None:
    """``measure()`` times current (a) against reference (b), interleaved."""
    samples = [measure()]
    while samples[-1].median > LATENCY_FACTOR and len(samples) <= CONFIRMATIONS:
        samples.append(measure())
    if not all(s.median > LATENCY_FACTOR for s in samples) or len(samples) <= CONFIRMATIONS:
        return None
    current = [t for s in samples for t in s.a_times]
    reference = [t for s in samples for t in s.b_times]
    p = float(mannwhitneyu(current, reference, alternative="greater").pvalue)
    if p >= ALPHA:
        return None
    ratio = float(np.median([r for s in samples for r in s.ratios]))
    return Finding(name, "latency", float(np.median(reference)), float(np.median(current)), ratio, p)


def format_verdict(verdict: Verdict, reference_label: str) -> str:
    lines = [f"gate against {reference_label}: memory {verdict.memory_compared} benchmarks, "
             f"latency {verdict.latency_compared} benchmarks (A/B in this process)"]
    lines += [f"  note: {n}" for n in verdict.notes]
    if verdict.stale:
        lines.append(f"  skipped {len(verdict.stale)} with another workload version (stale baseline)")
    if not verdict.regressions:
        lines.append(f"  no regression (memory: growth >= {MEMORY_GROWTH_BYTES} B; latency: > "
                     f"{LATENCY_FACTOR:.2f}x in {CONFIRMATIONS + 1} measurements, Mann-Whitney p < {ALPHA})")
        return "\n".join(lines)
    width = max(len(f.name) for f in verdict.regressions)
    lines.append(f"  {'REGRESSED':{width}}  kind        baseline       current    ratio")
    for f in verdict.regressions:
        if f.kind == "memory":
            base, cur = f"{int(f.baseline):,} B", f"{int(f.current):,} B"
        else:
            base, cur = f"{f.baseline * 1e6:,.1f} us", f"{f.current * 1e6:,.1f} us"
        note = f"  p={f.p_value:.1e}" if f.p_value is not None else ""
        lines.append(f"  {f.name:{width}}  {f.kind:8}  {base:>12}  {cur:>12}  {f.ratio:6.2f}x{note}")
    return "\n".join(lines)


def format_markdown(verdict: dict, reference_label: str) -> str:
    """The verdict (``Verdict.as_dict``) as a Markdown table, for a CI job summary."""
    status = "**regression**" if verdict["failed"] else "no regression"
    lines = [f"### Benchmark gate: {status}", "",
             f"Against `{reference_label}`: memory {verdict['memory_compared']} benchmarks, "
             f"latency {verdict['latency_compared']} benchmarks (A/B in one process).", ""]
    lines += [f"- {n}" for n in verdict["notes"]]
    if verdict["regressions"]:
        lines += ["", "| benchmark | kind | baseline | current | ratio |", "|---|---|---|---|---|"]
        for f in verdict["regressions"]:
            fmt = (lambda v: f"{int(v):,} B") if f["kind"] == "memory" else (lambda v: f"{v * 1e6:,.1f} µs")
            lines.append(f"| `{f['name']}` | {f['kind']} | {fmt(f['baseline'])} | {fmt(f['current'])} "
                         f"| {f['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"

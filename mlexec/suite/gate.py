"""The regression gate: a current run against a reference run, both in pytest-benchmark's format.

Memory is deterministic (BLAS pinned, engines warmed up), so any growth of
``MEMORY_GROWTH_BYTES`` or more in a benchmark's measured peak fails.

Latency is not. Raw times from two runs differ by 30-60 % here, so the gate
never compares them. Each run records, per benchmark, ``ratio_samples``: the
engine's time over a frozen yardstick's, interleaved round by round in one
process (``ratio.py``). The gate fails a benchmark only when both hold, the
rule asv's ``continuous`` uses:

- the median ratio grew by more than ``LATENCY_FACTOR``; and
- the two samples differ by a one-sided Mann-Whitney U test at p < ``ALPHA``.

``scripts/gate_rates.py`` measures how often this passes unchanged code and
catches a planted 25 % slowdown; the README keeps its last figures.
"""
from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import mannwhitneyu

MEMORY_GROWTH_BYTES = 1024
LATENCY_FACTOR = 1.10
ALPHA = 0.002


@dataclass(frozen=True)
class Finding:
    name: str          # the benchmark's name, e.g. test_forward[static-mlp-b32-d1024]
    kind: str          # "memory" or "latency"
    baseline: float
    current: float
    p_value: float | None = None

    @property
    def ratio(self) -> float:
        return self.current / self.baseline if self.baseline else float("inf")


@dataclass
class Verdict:
    regressions: list[Finding]
    compared: int = 0
    stale: list[str] = None      # same test, other workload version: skipped, not misread
    missing: list[str] = None    # in the reference, not measured now

    @property
    def failed(self) -> bool:
        return bool(self.regressions)


def compare(reference: dict, current: dict) -> Verdict:
    ref = {b["fullname"]: b for b in reference["benchmarks"]}
    verdict = Verdict([], stale=[], missing=[])
    for bench in current["benchmarks"]:
        old = ref.pop(bench["fullname"], None)
        if old is None:
            continue
        new_info, old_info = bench.get("extra_info", {}), old.get("extra_info", {})
        if new_info.get("version") != old_info.get("version"):
            verdict.stale.append(bench["name"])
            continue
        verdict.compared += 1
        finding = memory_finding(bench["name"], old_info, new_info)
        if finding:
            verdict.regressions.append(finding)
        finding = latency_finding(bench["name"], old_info, new_info)
        if finding:
            verdict.regressions.append(finding)
    verdict.missing = sorted(b["name"] for b in ref.values())
    return verdict


def memory_finding(name, old: dict, new: dict) -> Finding | None:
    if old.get("peak_bytes") is None or new.get("peak_bytes") is None:
        return None
    if new["peak_bytes"] - old["peak_bytes"] >= MEMORY_GROWTH_BYTES:
        return Finding(name, "memory", old["peak_bytes"], new["peak_bytes"])
    return None


def latency_finding(name, old: dict, new: dict) -> Finding | None:
    a, b = old.get("ratio_samples"), new.get("ratio_samples")
    if not a or not b:
        return None
    old_median, new_median = _median(a), _median(b)
    if new_median <= old_median * LATENCY_FACTOR:
        return None
    p = float(mannwhitneyu(b, a, alternative="greater").pvalue)
    if p >= ALPHA:
        return None
    return Finding(name, "latency", old_median, new_median, p)


def _median(values) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def format_verdict(verdict: Verdict, reference_label: str) -> str:
    lines = [f"regression gate against {reference_label}: {verdict.compared} benchmarks compared"]
    if verdict.stale:
        lines.append(f"  skipped {len(verdict.stale)} with another workload version (stale baseline)")
    if not verdict.regressions:
        lines.append("  no regression (memory: growth >= 1 KiB fails; latency: yardstick ratio "
                     f"> {LATENCY_FACTOR:.2f}x with Mann-Whitney p < {ALPHA})")
        return "\n".join(lines)
    width = max(len(f.name) for f in verdict.regressions)
    lines.append(f"  {'REGRESSED':{width}}  kind     baseline      current       ratio")
    for f in verdict.regressions:
        if f.kind == "memory":
            base, cur = f"{int(f.baseline):,} B", f"{int(f.current):,} B"
        else:
            base, cur = f"{f.baseline:.3f}x", f"{f.current:.3f}x"
        note = f"  (p={f.p_value:.1e})" if f.p_value is not None else ""
        lines.append(f"  {f.name:{width}}  {f.kind:7}  {base:>12}  {cur:>12}  {f.ratio:6.2f}x{note}")
    return "\n".join(lines)

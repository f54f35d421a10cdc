"""The speed targets the engines are held to, checked against a report's rows.

Each target is judged on the report's ratios, the median over interleaved
rounds of one engine's time over another's in the same round, and says which
point decided it, so a miss can be looked up in the table above it. "NumPy
engines" are the registered engines that are not peers; "optimized" are
those other than ``naive``.

1. Every optimized engine is at least as fast as naive at every point. Where
   two engines run the same BLAS call their ratio differs from 1 by noise
   alone, so a point counts against the engine only when it is shown slower:
   slower than naive in so many of the rounds that a coin would do that less
   than 1 % of the time (a one-sided sign test; with 9 rounds, all 9). A rule
   on the ratio's quartiles ("slower in 3 rounds of 4") flags two identical
   engines at a point with a 9 % chance, and the grid has dozens of such
   points.
2. Where per-op overhead dominates (batch <= 8, dim <= 256), every optimized
   engine is at least 1.3x naive.
3. At every MLP point the best NumPy engine is at least level with ONNX
   Runtime (1.00x), and ahead of it at batch 1. (It was "within 1.10x" while
   the grid had 12 points; it is judged on every point of the 40.)
4. At mlp batch 128, dim 4096, the best NumPy engine reaches 75 % of the
   calibrated matmul peak.
5. At mlp batch 1, dim 4096, it reaches 80 % of the measured memory bandwidth
   (the weights must stream once per forward).

The engines that compute in 8 bits (``Engine.quantized``: ``int8``, ``onnxruntime-int8``) are
no "NumPy engine" and no peer of targets 1-5: their error is quantization's, hundreds of times
the float bar, so they would win the float targets on precision given away. They have their own
(issue 34), judged when ``int8`` was measured:

6. At mlp batch 1, dim 4096, ``int8`` is at least 2.5x faster than the best float engine measured
   there (any engine that is not quantized, peers included), and the figure says what fraction of
   the copy roof it reaches counted on the int8 weights it holds (the roofline column counts the
   model's float bytes).
7. ``int8`` is ahead of ``onnxruntime-int8`` (the same model quantized by ONNX Runtime's tools) at
   batch 1 on every mlp dim, and within 1.10x of it at batch 8-128.

A quantized target whose comparison was not measured (no float engine or no ``onnxruntime-int8``
beside ``int8``, or no such point in the grid) is listed as not judged, never as met.

Targets 2 and 3 are judged on the median ratio, and say in how many rounds
the ratio fell below the bar: on a shared machine a point near a bar can
land on either side of it from one run to the next, and the count shows
whether a verdict rests on every round or on a coin toss. ``close_calls``
names the points where a deciding figure has its bar inside the
interquartile range of its rounds, or its median below the bar, whatever the
target (an engine's median below 1.0x naive included: with 9 rounds the sign
test cannot show "slower" unless all 9 are, so a 0.78x point would pass);
the report measures those again, with a fixed number of extra rounds
whichever side the first median fell on, and judges on all the rounds (the
sign test of target 1 too, at p < 0.01 on every round).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from engines import ENGINES

from .case import Case

REFERENCE = "naive"
PEER = "onnxruntime"
SIGNIFICANCE = 0.01
SMALL_SPEEDUP = 1.3    # target 2: over naive, where per-op overhead dominates
PEER_SLACK = 1.00      # target 3: how far behind the peer the best NumPy engine may be
# targets 4 and 5: (case, row key, least fraction, of what)
ROOFLINE = ((Case("mlp", 128, 4096), "peak_fraction", 0.75, "of the matmul peak"),
            (Case("mlp", 1, 4096), "bandwidth_fraction", 0.80, "of the memory bandwidth"))
INT8 = "int8"
INT8_PEER = "onnxruntime-int8"
INT8_CASE = Case("mlp", 1, 4096)      # target 6: where the weights stream
INT8_SPEEDUP = 2.5                    # target 6: over the best float engine
INT8_PEER_SLACK = 1.10                # target 7: how far behind onnxruntime-int8 at batch 8-128
INT8_BATCHES = (8, 128)               # target 7's second part, inclusive


def sign_test(slower: int, rounds: int) -> float:
    """The chance of at least ``slower`` of ``rounds`` coin flips coming up "slower"."""
    return sum(math.comb(rounds, k) for k in range(slower, rounds + 1)) / 2 ** rounds


@dataclass(frozen=True)
class Target:
    goal: str
    met: bool
    value: str       # the deciding figure, e.g. "min 0.97x at mlp-b128-d4096"
    judged: bool = True   # False: what it compares was not measured (``met`` is then False)


def _quantized(name: str) -> bool:
    return name in ENGINES and bool(getattr(ENGINES[name], "quantized", False))


def _numpy_engine(name: str) -> bool:
    """A NumPy engine of targets 1-5: registered, no peer, and computing in float."""
    return name in ENGINES and not ENGINES[name].peer and not _quantized(name)


def _float_engine(name: str) -> bool:
    """An engine target 6 compares int8 with: any engine not quantized, peers included (an engine
    outside the registry, a test's, counts as float)."""
    return not _quantized(name)


def _where(row: dict) -> str:
    return row["case"]


def _small(row: dict) -> bool:
    """Where per-op overhead dominates (target 2)."""
    return row["batch"] <= 8 and row["dim"] <= 256


def _best_vs_peer(rows: list[dict]) -> dict:
    """Of one point's NumPy rows, the one that decides target 3: the best ratio to the peer."""
    return max(rows, key=lambda r: r["vs_onnxruntime"])


def _fastest(rows: list[dict]) -> dict:
    """Of one point's NumPy rows, the one that decides targets 4 and 5."""
    return min(rows, key=lambda r: r["median_s"])


class Rounds(NamedTuple):
    """In how many rounds a ratio fell below its bar, of how many."""
    below: int
    total: int


class Span(NamedTuple):
    """A deciding figure's interquartile range over its rounds (None: not measured), and its bar."""
    iqr: list[float] | None
    bar: float


@dataclass(frozen=True)
class _Measured:
    """A report's measured rows (error rows left out), by (case id, engine), and its optimized
    NumPy engines in the rows' order."""
    rows: list[dict]
    cell: dict[tuple[str, str], dict]
    optimized: list[str]

    @classmethod
    def of(cls, rows: list[dict]) -> "_Measured":
        rows = [r for r in rows if not r.get("error")]
        optimized = list(dict.fromkeys(r["engine"] for r in rows
                                       if _numpy_engine(r["engine"]) and r["engine"] != REFERENCE))
        return cls(rows, {(r["case"], r["engine"]): r for r in rows}, optimized)

    def rounds_below(self, r: dict, ref: str, floor: float) -> Rounds:
        """In how many of the rounds ref's time over r's (r's speedup) fell below floor."""
        ref_s = self.cell[(r["case"], ref)]["rounds_s"]
        return Rounds(sum(q < floor * t for t, q in zip(r["rounds_s"], ref_s)), len(ref_s))

    def below(self, r: dict, ref: str, floor: float) -> str:
        return ", below {:.2f}x in {} of {} rounds".format(floor, *self.rounds_below(r, ref, floor))

    def clearly_slower(self, r: dict) -> bool:
        return sign_test(*self.rounds_below(r, REFERENCE, 1.0)) < SIGNIFICANCE

    def numpy_rows(self, case_id: str) -> list[dict]:
        return [self.cell[(case_id, n)] for n in [REFERENCE, *self.optimized] if (case_id, n) in self.cell]


def _vs_naive_targets(m: _Measured, name: str) -> list[Target]:
    """Targets 1 and 2 for one optimized engine."""
    out = []
    mine = [r for r in m.rows if r["engine"] == name and r["vs_naive"] is not None]
    if mine:
        worst = min(mine, key=lambda r: r["vs_naive"])
        slower = [r for r in mine if m.clearly_slower(r)]
        value = f"min {worst['vs_naive']:.2f}x at {_where(worst)}"
        if slower:
            value += "; shown slower at " + ", ".join(
                "{} ({} of {} rounds)".format(_where(r), *m.rounds_below(r, REFERENCE, 1.0)) for r in slower)
        elif worst["vs_naive"] < 1.0:
            value += ", slower in {} of {} rounds: not shown slower".format(*m.rounds_below(worst, REFERENCE, 1.0))
        out.append(Target(f"{name} >= naive at every point", not slower, value))
    small = [r for r in mine if _small(r)]
    if small:
        worst = min(small, key=lambda r: r["vs_naive"])
        out.append(Target(f"{name} >= {SMALL_SPEEDUP}x naive at batch <= 8, dim <= 256",
                          worst["vs_naive"] >= SMALL_SPEEDUP,
                          f"min {worst['vs_naive']:.2f}x at {_where(worst)}" + m.below(worst, REFERENCE, SMALL_SPEEDUP)))
    return out


def _peer_targets(m: _Measured) -> list[Target]:
    """Target 3, judged on each mlp point's best NumPy row against the peer."""
    best = []
    for case_id in dict.fromkeys(r["case"] for r in m.rows if r["model"] == "mlp"):
        here = m.numpy_rows(case_id)
        if here and here[0]["vs_onnxruntime"] is not None:
            best.append(_best_vs_peer(here))
    if not best:
        return []
    worst = min(best, key=lambda r: r["vs_onnxruntime"])
    ratio = worst["vs_onnxruntime"]
    goal = (f"best NumPy engine level with {PEER} at every mlp point" if PEER_SLACK == 1.0 else
            f"best NumPy engine within {PEER_SLACK:.2f}x of {PEER} at every mlp point")
    out = [Target(goal, ratio >= 1 / PEER_SLACK,
                  f"worst {ratio:.2f}x ({worst['engine']}) at {_where(worst)}" + m.below(worst, PEER, 1 / PEER_SLACK))]
    ones = [r for r in best if r["batch"] == 1]
    if ones:
        worst = min(ones, key=lambda r: r["vs_onnxruntime"])
        ratio = worst["vs_onnxruntime"]
        out.append(Target("best NumPy engine ahead of onnxruntime at batch 1", ratio > 1.0,
                          f"worst {ratio:.2f}x ({worst['engine']}) at {_where(worst)}" + m.below(worst, PEER, 1.0)))
    return out


def _roofline_targets(m: _Measured) -> list[Target]:
    """Targets 4 and 5, on the fastest NumPy row at each roofline point."""
    out = []
    for case, key, floor, what in ROOFLINE:
        here = m.numpy_rows(case.id)
        if here:
            best = _fastest(here)
            out.append(Target(f"best NumPy engine >= {floor:.0%} {what} at {case.id}", best[key] >= floor,
                              f"{best[key]:.0%} ({best['engine']})"))
    return out


def _not_judged(goal: str, why: str) -> Target:
    return Target(goal, False, f"not judged: {why}", judged=False)


def _paired_ratio(slow: dict, fast: dict) -> tuple[float, list[float]]:
    """The median and IQR over rounds of slow's time over fast's in the same round."""
    q1, med, q3 = np.percentile(np.asarray(slow["rounds_s"]) / np.asarray(fast["rounds_s"]), [25, 50, 75])
    return float(med), [float(q1), float(q3)]


def _int8_speedup_target(m: _Measured) -> Target:
    """Target 6: int8 over the fastest float engine at INT8_CASE; its copy roof on int8 bytes."""
    where = INT8_CASE.id
    goal = f"{INT8} >= {INT8_SPEEDUP}x the best float engine at {where}"
    mine = m.cell.get((where, INT8))
    floats = [r for r in m.rows if r["case"] == where and _float_engine(r["engine"])]
    if mine is None:
        return _not_judged(goal, f"{INT8} not measured at {where}")
    if not floats:
        return _not_judged(goal, f"no float engine measured at {where}")
    best = _fastest(floats)
    ratio, iqr = _paired_ratio(best, mine)
    value = f"{ratio:.2f}x ({iqr[0]:.2f}-{iqr[1]:.2f}) over {best['engine']}"
    if mine.get("held_bandwidth_fraction") is not None:
        value += (f"; {mine['held_bandwidth_fraction']:.0%} of the copy roof on its "
                  f"{mine['held_bytes'] / 2**20:.1f} MiB of int8 weights")
    return Target(goal, ratio >= INT8_SPEEDUP, value)


def _int8_peer_targets(m: _Measured) -> list[Target]:
    """Target 7: int8 against onnxruntime-int8 at every mlp point where both ran."""
    ahead = f"{INT8} ahead of {INT8_PEER} at batch 1 on every mlp dim"
    low, high = INT8_BATCHES
    within = f"{INT8} within {INT8_PEER_SLACK:.2f}x of {INT8_PEER} at mlp batch {low}-{high}"
    if not any(r["engine"] == INT8_PEER for r in m.rows):
        return [_not_judged(goal, f"{INT8_PEER} not measured") for goal in (ahead, within)]
    pairs = [(m.cell[(r["case"], INT8)], r) for r in m.rows
             if r["engine"] == INT8_PEER and r["model"] == "mlp" and (r["case"], INT8) in m.cell]
    out = []
    for goal, points, bar in ((ahead, [p for p in pairs if p[0]["batch"] == 1], 1.0),
                              (within, [p for p in pairs if low <= p[0]["batch"] <= high], 1 / INT8_PEER_SLACK)):
        if not points:
            out.append(_not_judged(goal, f"no mlp point of those batches with both {INT8} and {INT8_PEER}"))
            continue
        ratios = [(_paired_ratio(peer, mine), mine) for mine, peer in points]
        (ratio, iqr), worst = min(ratios, key=lambda x: x[0][0])
        met = ratio > bar if bar == 1.0 else ratio >= bar
        out.append(Target(goal, met, f"worst {ratio:.2f}x ({iqr[0]:.2f}-{iqr[1]:.2f}) at {_where(worst)}, "
                                     f"over {len(points)} point(s)"))
    return out


def _int8_targets(m: _Measured) -> list[Target]:
    """Targets 6 and 7, when int8 was measured (otherwise left out, as any unmeasured engine's)."""
    if not any(r["engine"] == INT8 for r in m.rows):
        return []
    return [_int8_speedup_target(m)] + _int8_peer_targets(m)


def check(rows: list[dict]) -> list[Target]:
    """The targets that the report's rows can judge: an engine or point of targets 1-5 not
    measured is left out; int8's targets, once int8 ran, say what they could not compare."""
    m = _Measured.of(rows)
    return ([t for name in m.optimized for t in _vs_naive_targets(m, name)]
            + _peer_targets(m) + _roofline_targets(m) + _int8_targets(m))


def _spans(case_id: str, here: list[dict]) -> list[Span]:
    """Of one point's NumPy rows, each figure that decides a target of 2-5, with its bar."""
    spans = [Span(r["vs_naive_iqr"], SMALL_SPEEDUP) for r in here if r["engine"] != REFERENCE and _small(r)]
    vs_peer = [r for r in here if r["vs_onnxruntime"] is not None]
    if here[0]["model"] == "mlp" and vs_peer:
        best = _best_vs_peer(vs_peer)
        spans.append(Span(best["vs_onnxruntime_iqr"], 1 / PEER_SLACK))
        if best["batch"] == 1:
            spans.append(Span(best["vs_onnxruntime_iqr"], 1.0))
    for roof_case, key, floor, _ in ROOFLINE:
        if case_id == roof_case.id:
            best = _fastest(here)
            # the fraction is (roofline time) / (median time); its IQR comes from the times'
            q1, q3 = np.percentile(best["rounds_s"], [25, 75])
            spans.append(Span([best[key] * best["median_s"] / q3, best[key] * best["median_s"] / q1], floor))
    return spans


def close_calls(rows: list[dict]) -> list[str]:
    """The case ids where a figure that decides a target has its median below its
    bar, or its bar within the interquartile range of its rounds (targets 2-5): one more run could
    put the median on the other side, or more rounds could show a miss the first ones could not."""
    points: dict[str, list[dict]] = {}
    for r in rows:
        if not r.get("error") and _numpy_engine(r["engine"]):
            points.setdefault(r["case"], []).append(r)
    close = []
    for case_id, here in points.items():
        # target 1: an engine's median below naive's (near 1.0 alone is two engines on one BLAS call)
        below_naive = any(r["engine"] != REFERENCE and r["vs_naive"] is not None and r["vs_naive"] < 1.0
                          for r in here)
        # a median below its bar has its lower quartile below it too: straddling, or below entirely
        if below_naive or any(s.iqr is not None and s.iqr[0] <= s.bar for s in _spans(case_id, here)):
            close.append(case_id)
    return close


def as_dicts(targets: list[Target]) -> list[dict]:
    return [asdict(t) for t in targets]


def format_lines(targets: list[Target]) -> list[str]:
    return [f"[{'met' if t.met else 'MISSED' if t.judged else 'not judged'}] {t.goal}: {t.value}" for t in targets]

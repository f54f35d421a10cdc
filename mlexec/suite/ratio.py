"""Two workloads timed interleaved in one process: the only latency figure that survives noise.

Absolute times from two runs can't be compared on a shared machine: back to
back, identical runs differ by 30-60 % here. Two callables timed in
alternating blocks within one process see the same machine weather, so their
per-round ratio is steady (identical code: within a few percent).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interleaved:
    a_times: tuple[float, ...]    # seconds per call, per round
    b_times: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.a_times, self.b_times)]

    @property
    def median(self) -> float:
        """Median per-round ratio a/b."""
        return float(np.median(self.ratios))


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleave(a, b, min_rounds: int = 15, seconds: float = 0.25, max_rounds: int = 400,
               warmup_rounds: int = 3) -> Interleaved:
    """Time ``a`` and ``b`` call by call, alternating (ABBA...), for about ``seconds``.

    Single calls rather than blocks: a burst of noise from a neighbour then
    lands on both sides instead of on one block (measured: the spread of the
    median ratio of identical engines fell from 1-2 % to 0.5-0.8 %). The first
    ``warmup_rounds`` are discarded (page faults, caches, clock ramp-up).
    """
    one = max(_time(a), _time(b), 1e-7)
    rounds = int(min(max_rounds, max(min_rounds, seconds / (2 * one))))
    a_times, b_times = [], []
    for r in range(warmup_rounds + rounds):
        if r % 2:
            tb, ta = _time(b), _time(a)
        else:
            ta, tb = _time(a), _time(b)
        if r >= warmup_rounds:
            a_times.append(ta)
            b_times.append(tb)
    return Interleaved(tuple(a_times), tuple(b_times))

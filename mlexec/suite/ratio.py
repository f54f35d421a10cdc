"""Two workloads timed interleaved in one process: the only latency figure that survives noise.

Absolute times from two runs can't be compared on a shared machine: back to
back, identical runs differ by 30-60 % here. Two callables timed in
alternating blocks within one process see the same machine weather, so their
per-round ratio is steady (identical code: within a few percent).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interleaved:
    a_times: tuple[float, ...]    # seconds per call, per round
    b_times: tuple[float, ...]
    calls_per_block: int

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.a_times, self.b_times)]

    @property
    def median(self) -> float:
        """Median per-round ratio a/b."""
        return float(np.median(self.ratios))


def _block(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def interleave(a, b, rounds: int = 15, warmup_rounds: int = 3, block_seconds: float = 0.004) -> Interleaved:
    """Time ``a`` and ``b`` in alternating blocks of calls; the order flips every round.

    A block repeats a call until it lasts ``block_seconds`` (timer resolution and
    scheduler ticks stop mattering); the first ``warmup_rounds`` are discarded
    (page faults, caches, clock ramp-up).
    """
    one = max(_block(a, 1), _block(b, 1), 1e-7)
    calls = max(1, math.ceil(block_seconds / one))
    a_times, b_times = [], []
    for r in range(warmup_rounds + rounds):
        if r % 2:
            tb, ta = _block(b, calls), _block(a, calls)
        else:
            ta, tb = _block(a, calls), _block(b, calls)
        if r >= warmup_rounds:
            a_times.append(ta)
            b_times.append(tb)
    return Interleaved(tuple(a_times), tuple(b_times), calls)

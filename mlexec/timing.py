"""Timing several workloads in one process, interleaved: the only latency figures that survive noise.

Absolute times from two runs can't be compared on a shared machine: back to
back, identical runs differ by 30-60 % here. Workloads timed alternately
within one process see the same machine weather, so their per-round ratio is
steady (identical code: within a few percent). Two ways are used:

- ``interleave(a, b)``: two callables call by call (the gate's A/B);
- ``round_order`` + ``settle`` + ``time_block``: many engines, each round a
  block of calls per engine after ``SETTLE_SECONDS`` of its own untimed calls,
  in the orders of a Williams design (``mlexec report``; the analyzer settles
  the same way).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

SETTLE_SECONDS = 0.3     # untimed calls before each block, while the previous engine's pool goes idle


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


def time_block(fn, x, calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back calls ``fn(x)``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


def settle(fn, x, seconds: float) -> None:
    """Untimed calls for ``seconds`` (at least one): thread pools keep spinning after their last
    call (OpenBLAS's for ~0.2 s), so a block timed right after another engine's runs on contended
    cores. By calls, not by sleeping: after 0.3 s idle here the next calls ran 2-6x slower."""
    end = time.perf_counter() + seconds
    fn(x)
    while time.perf_counter() < end:
        fn(x)


def round_order(n: int, r: int) -> list[int]:
    """Round r's order of n engines, from a Williams design: 0, 1, n-1, 2, n-2, ... shifted by r
    (reversed in every other cycle when n is odd). Over n rounds (2n when n is odd) each engine
    is first equally often and directly follows each other engine equally often."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    row = [(v + r) % n for v in first]
    return row[::-1] if n % 2 and (r // n) % 2 else row

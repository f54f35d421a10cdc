"""Every timing loop of mlexec: several workloads in one process, interleaved, the only latency
figures that survive noise on a shared machine.

Absolute times from two runs can't be compared on a shared machine (identical runs differ by
tens of percent, docs/benchmarks.md). Workloads timed alternately within one process see the
same machine weather, so their per-round ratio is steady. The loops:

- ``interleave(a, b)``: two callables call by call (the gate's A/B);
- ``rounds``: many engines, each round a block of calls per engine after ``SETTLE_SECONDS`` of
  its own untimed calls, in the orders of a Williams design (``round_order``; ``mlexec report``);
- ``two_passes``: single timed calls per engine, settled the same way, in two passes the second
  reversed (the analyzer);
- ``step_times``: each step of a run, e.g. each op of an eager forward (the analyzer's breakdown);
- ``best_time``: the best of a few calls, what a machine can do at its best moment (the roofs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

SETTLE_SECONDS = 0.3     # untimed calls before each block, while the previous engine's pool goes idle


@dataclass(frozen=True)
class Interleaved:
    a_times: tuple[float, ...]    # seconds per call, per round
    b_times: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        """a/b per ABBA cycle (two rounds, each side's two calls summed). Within one cycle each side
        has one call right after its own previous call and one right after the other side's: when
        the two evict each other's weights from cache, per-round ratios alternate between warm/cold
        and cold/warm and their median lands in either mode (measured: a true 1.25x read 0.95-1.88x
        in ten runs at 2 MiB of weights a side; per cycle it does not, docs/gate.md)."""
        a, b = self.a_times, self.b_times
        if len(a) < 2:
            return [x / y for x, y in zip(a, b)]
        return [(a[i] + a[i + 1]) / (b[i] + b[i + 1]) for i in range(0, len(a) - 1, 2)]

    @property
    def median(self) -> float:
        """Median ratio a/b per ABBA cycle."""
        return float(np.median(self.ratios))


def _time(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def interleave(a, b, min_rounds: int = 15, seconds: float = 0.25, max_rounds: int = 400,
               warmup_rounds: int = 3) -> Interleaved:
    """Time ``a`` and ``b`` call by call, alternating (ABBA...), for about ``seconds``.

    Single calls rather than blocks: a burst of noise from a neighbour then
    lands on both sides instead of on one block, which narrows the spread of the
    median ratio. The first ``warmup_rounds`` are discarded (page faults, caches,
    clock ramp-up). Measured figures: docs/methodology.md.
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
    call, so a block timed right after another engine's runs on contended cores. By calls, not by
    sleeping: an idle pause slows the next calls instead (docs/methodology.md)."""
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


def block_calls(fns: Iterable[Callable], x, block_seconds: float) -> int:
    """Calls per block so that the fastest of ``fns`` spends about ``block_seconds`` in one (at
    least one call), from one timed call of each."""
    probe = min(time_block(fn, x, 1) for fn in fns)
    return max(1, int(block_seconds / max(probe, 1e-7)))


def rounds(fns: dict[str, Callable], x, count: int, calls: int, settle_seconds: float = SETTLE_SECONDS,
           first_round: int = 0) -> dict[str, np.ndarray]:
    """Per name, the seconds per call of each of ``count`` rounds: in each, every name's block of
    ``calls`` calls ``fn(x)`` after ``settle_seconds`` of its own untimed calls, the names in the
    order of that round of the Williams design. ``first_round`` continues a design where earlier
    rounds stopped, so rounds added later stay balanced."""
    order = list(fns)
    times: dict[str, list[float]] = {name: [] for name in order}
    for r in range(first_round, first_round + count):
        for name in (order[i] for i in round_order(len(order), r)):
            settle(fns[name], x, settle_seconds)
            times[name].append(time_block(fns[name], x, calls))
    return {name: np.array(t) for name, t in times.items()}


def two_passes(fns: dict[str, Callable], x, calls: int, settle_seconds: float = SETTLE_SECONDS,
               after_pass: Callable[[int], None] | None = None) -> dict[str, list[float]]:
    """Per name, ``calls`` seconds of single calls ``fn(x)``: half of them in a pass over the names
    in order, the rest in a pass in reverse order, so drift falls on every name alike; each name's
    calls follow ``settle_seconds`` of its own untimed ones. ``after_pass(n)`` after each pass of
    n calls per name. Not call-by-call alternation: a call right after another engine's runs
    while that engine's thread pool still spins."""
    order = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in order}
    first = (calls + 1) // 2
    for n, sequence in ((first, order), (calls - first, order[::-1])):
        for name in sequence if n else ():
            settle(fns[name], x, settle_seconds)
            samples[name] += [_time(fns[name], x) for _ in range(n)]
        if after_pass is not None:
            after_pass(n)
    return samples


def step_times(run: Callable[[Callable[..., None]], object], runs: int,
               each: Callable[..., None] | None = None) -> list[list[float]]:
    """Per step, the seconds it took in each of ``runs`` calls ``run(mark)``, where ``run`` calls
    ``mark(*args)`` as each step ends: the time since the run began or the previous mark.
    ``each(*args)``, called from ``mark``, is left out of the times."""
    per_step: list[list[float]] = []
    for _ in range(runs):
        index, last = 0, time.perf_counter()

        def mark(*args):
            nonlocal index, last
            now = time.perf_counter()
            if index == len(per_step):
                per_step.append([])
            per_step[index].append(now - last)
            index += 1
            if each is not None:
                each(*args)
            last = time.perf_counter()

        run(mark)
    return per_step


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The least seconds of ``repeats`` calls ``fn()``, after one untimed: what the machine can do
    at its best moment, which is what a roof is."""
    fn()
    return min((_time(fn) for _ in range(repeats)), default=float("inf"))

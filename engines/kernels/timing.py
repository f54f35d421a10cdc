"""Timing the candidates for one GEMM: interleaved blocks on scratch arrays of its shape, after
the pools of whatever ran before have parked; and one linear's rivals inside an engine's whole
forward (the rules are in ``engines.kernels``' docstring)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ..memory import aligned, aligned_empty
from ..native import openmp
from ..ir.calls import tile
from .table import KERNELS, Gemm, bind, run_calls, streams

BLOCK_SECONDS = 2e-4        # one timed block: long enough that perf_counter's cost is noise
ROUND_BUDGET_S = 0.12       # total timing per GEMM, spread over the rounds
MIN_ROUNDS, MAX_ROUNDS = 5, 41
CAP_S = 0.6                 # past this much timing per GEMM, stop after CAP_ROUNDS (large products)
CAP_ROUNDS = 3
FORWARD_BLOCK_S = 1e-3      # one timed block of whole forwards (measure_forwards)
FORWARD_WARM_S = 2e-3       # untimed forwards before each block, at least one (measure_forwards)
FORWARD_BUDGET_S = 0.15     # total timing of one linear's rivals in the forward
FORWARD_MIN_ROUNDS = 3      # a forward of 60 ms (b128 d4096) then costs 5 forwards per rival in all
PARK_S = 0.25               # idle before timing: longer than MKL's (200 ms) and OpenBLAS's (~0.1 s) spin
BACK_TO_BACK_S = 0.05       # no idle before a measurement of the same candidates that follows another
                            # this closely (one build's GEMMs): only their own pools can be spinning
SETTLE_CALLS, SETTLE_S = 2, 0.005   # untimed calls of each candidate after that (``_settle``)
DROP_AFTER, DROP_RATIO = 2, 2.0  # after this many rounds, drop candidates this much slower than the best
# Weights from CACHED_BYTES up (``table``: what may stay in cache) are timed cycling through copies
# making COLD_BYTES: a large weight reused from cache ranks the kernels otherwise than a forward
# reading it from memory does (measured: docs/kernels.md). At exactly CACHED_BYTES (1 x 2048 x 2048)
# a weight is both timed cold and offered ``numpy-nk``: two of them fill the AMD EPYC's 32 MiB L3.
COLD_BYTES = 128 << 20
DRAWN_BLOCK = 1 << 16       # scratch operands: this many random values drawn, then repeated (``_normal``)


def _settle(calls) -> None:
    """Untimed calls: SETTLE_CALLS, and for SETTLE_S at least."""
    end = time.perf_counter() + SETTLE_S
    for _ in range(SETTLE_CALLS):
        run_calls(calls)
    while time.perf_counter() < end:
        run_calls(calls)


def waiting_seconds() -> float | None:
    """Seconds this process's threads have been ready to run but waiting for a core (Linux's
    /proc/self/task/*/schedstat), or None where that cannot be read. Unlike the host's CPU
    counters it sees only contention for the cores this process runs on."""
    total, seen = 0, False
    for task in Path("/proc/self/task").glob("*/schedstat") if Path("/proc/self/task").is_dir() else ():
        try:
            total += int(task.read_text().split()[1])
            seen = True
        except (OSError, ValueError, IndexError):
            pass                                    # a thread that ended meanwhile
    return total / 1e9 if seen else None


def others_cpu_seconds() -> float | None:
    """CPU-seconds other processes have used on the cores this process may run on (Linux's
    /proc/stat over this process's affinity, less its own CPU time), or None where that cannot be
    read. ``waiting_seconds`` misses what this sees: a one-thread kernel never waits while another
    process holds the second core, so over five one-thread candidates and one two-thread one the
    waiting averaged under ``BUSY_SHARE`` while the two-thread kernel ran 2.5x slow (a cache entry
    that ran ConvNeXt's 4 x 768 x 3072 linears at one thread: 345 against 235 us)."""
    try:
        cpus, ticks = os.sched_getaffinity(0), 0
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
                    ticks += user + nice + system + irq + softirq + steal
    except (OSError, ValueError, AttributeError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK") - time.process_time()


def spare_cores(seconds: float) -> float:
    """Cores this process may run on beyond its BLAS pool's threads, plus what /proc/stat's ticks
    cannot resolve over ``seconds`` (one tick per core at each end): other processes may use that
    much without slowing a measurement."""
    from ..native.threads import blas_threads
    cores = len(os.sched_getaffinity(0))
    return max(0, cores - blas_threads()) + 2 * cores / os.sysconf("SC_CLK_TCK") / max(seconds, 1e-3)


def weight_copies(gemm: Gemm) -> int:
    """How many weight matrices a measurement cycles through: one, or from CACHED_BYTES up
    enough to make COLD_BYTES, so that each call reads its weights from memory as a forward
    over a large model's layers does, not from the cache the previous call warmed."""
    nbytes = 4 * gemm.k * gemm.n
    return -(-COLD_BYTES // nbytes) if streams(nbytes) else 1


_last_measured: list = [None, 0.0]                  # [candidates, when] of this process's last measurement


def measure(gemm: Gemm, names: list[str], budget_s: float = ROUND_BUDGET_S) -> dict[str, float]:
    """Median seconds per call of each candidate on scratch arrays shaped like ``gemm`` (large
    weights cold: ``weight_copies``), timed in blocks interleaved in rotating order after PARK_S
    idle and each candidate's settling calls; a candidate far behind is dropped early (inf)."""
    bound, copies = _scratch_calls(gemm, names)
    reps, rounds, _ = _blocks(bound, BLOCK_SECONDS, budget_s)
    if _last_measured[0] != list(bound) or time.perf_counter() - _last_measured[1] > BACK_TO_BACK_S:
        time.sleep(PARK_S)                          # what ran before (another engine) parks its pool
    openmp.step_aside()                             # after that pause the caller may wake on a worker's CPU
    times = _settled_medians(bound, reps, rounds)
    _last_measured[:] = [list(bound), time.perf_counter()]
    return {name: t / copies for name, t in times.items()}


def measure_forwards(variants: dict[str, list], budget_s: float = FORWARD_BUDGET_S) -> dict[str, float]:
    """Median seconds per forward of each variant (``name -> the calls of one whole forward``,
    on one engine's buffers), timed as ``measure`` times GEMMs but without the idle first: the
    variants differ in one linear's kernel, and each runs among its real neighbours, on the
    pools and with the cache state the forward itself leaves. Hence FORWARD_WARM_S of untimed
    forwards before each timed block: a kernel that holds the weights in its own layout
    (``numpy-nk``, ``mkl-packed``) reads other bytes than its rival, and each block would
    otherwise start from the rival's cache. An mlp b1 d2048 on an AMD EPYC (32 MiB of weights a
    layout, its L3's size): ``numpy-nk`` judged 0.92-0.95x ``numpy`` after no untimed forward or
    one, 1.05-1.16x after three, in a phase where it ran 1.1-1.7x as fast in forwards of its own
    (docs/kernels.md). The rounds fit the budget with the untimed forwards counted."""
    reps, rounds, warm = _blocks(variants, FORWARD_BLOCK_S, budget_s, FORWARD_MIN_ROUNDS, FORWARD_WARM_S)
    times, alive = _interleaved(variants, reps, rounds, warm)
    return {name: float(np.median(t)) if name in alive else float("inf") for name, t in times.items()}


def _blocks(bound: dict[str, list], block_s: float, budget_s: float, min_rounds: int = MIN_ROUNDS,
            warm_s: float = 0.0) -> tuple[int, int, int]:
    """Calls per timed block (about ``block_s``), rounds (``budget_s`` in all, ``min_rounds`` to
    MAX_ROUNDS) and untimed calls before each block (about ``warm_s``, at least one where it is
    not 0), from one warm call of each candidate."""
    openmp.step_aside()                             # the caller off the pool's workers' CPUs
    one = {}
    for name, calls in bound.items():               # warm up, and size the blocks
        run_calls(calls)
        t0 = time.perf_counter()
        run_calls(calls)
        one[name] = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(block_s / max(one.values())))
    warm = -(-warm_s // max(one.values())) if warm_s else 0
    return reps, int(min(MAX_ROUNDS, max(min_rounds, budget_s / ((reps + warm) * sum(one.values()))))), int(warm)


def _settled_medians(bound: dict[str, list], reps: int, rounds: int) -> dict[str, float]:
    for calls in bound.values():
        _settle(calls)                              # then every candidate warm, the pool spinning again
    times, alive = _interleaved(bound, reps, rounds)
    return {name: float(np.median(t)) if name in alive else float("inf") for name, t in times.items()}


def _scratch_calls(gemm: Gemm, names: list[str]) -> tuple[dict[str, list], int]:
    """Each candidate's calls on scratch arrays shaped like ``gemm``, cycling through
    ``weight_copies`` weights, and that count."""
    rng = np.random.default_rng(0)
    def normal(*shape):
        return _normal(rng, shape)
    x, b = normal(gemm.rows, gemm.k), normal(gemm.n)
    b_tiled = tile(b, gemm.rows)
    residual = normal(gemm.rows, gemm.n) if gemm.residual else None
    y = aligned(np.zeros((gemm.rows, gemm.n)))
    weights = [normal(gemm.n, gemm.k).T if gemm.transposed else normal(gemm.k, gemm.n)
               for _ in range(weight_copies(gemm))]
    # per prepare: one state per weight (MKL's packs), shared by a kernel and its one-thread
    # variant as Linears shares them
    states = {None: [None] * len(weights)}
    bound = {}                                      # name -> calls (their pointers hold the states)
    for name in names:
        kernel = KERNELS[name]
        if kernel.prepare not in states:
            states[kernel.prepare] = [kernel.prepare(m) for m in weights]
        bound[name] = [c for m, state in zip(weights, states[kernel.prepare])
                       for c in bind(name, x, y, m, b, b_tiled, residual, state)]
    return bound, len(weights)


def _normal(rng, shape, block: int = DRAWN_BLOCK) -> np.ndarray:
    """Normal float32 values on a cache line: ``block`` of them drawn and repeated. A kernel's time
    does not depend on the values (they only have to be ordinary floats); drawing each of a
    4096 x 4096 weight's 16 Mi values took 0.25 s of a 1.3 s measurement."""
    out = aligned_empty(shape)
    flat = out.reshape(-1)
    drawn = rng.standard_normal(min(block, flat.size), dtype=np.float32)
    whole = flat.size - flat.size % drawn.size
    flat[:whole].reshape(-1, drawn.size)[...] = drawn
    flat[whole:] = drawn[:flat.size - whole]
    return out


def _interleaved(bound: dict[str, list], reps: int, rounds: int, warm: int = 0) -> tuple[dict[str, list[float]], list[str]]:
    """Seconds per call of each block of ``reps`` calls, after ``warm`` untimed ones, candidates
    in rotating order, reversed every other round; and the candidates still in after DROP_AFTER
    rounds."""
    times: dict[str, list[float]] = {name: [] for name in bound}
    alive = list(bound)
    start = time.perf_counter()
    for r in range(rounds):
        if r >= CAP_ROUNDS and time.perf_counter() - start > CAP_S:
            break
        order = alive[r % len(alive):] + alive[:r % len(alive)]
        for name in (order if r % 2 == 0 else order[::-1]):
            calls = bound[name]
            for _ in range(warm):
                run_calls(calls)
            openmp.keep_aside()                     # a worker's wake-up may have brought the caller back
            t0 = time.perf_counter()
            for _ in range(reps):
                run_calls(calls)
            times[name].append((time.perf_counter() - t0) / reps)
        if r + 1 == DROP_AFTER and len(alive) > 2:
            # by its fastest block: one block that waited for a core (another process, say)
            # must not drop the candidate that wins everywhere else
            best = min(np.median(times[n]) for n in alive)
            alive = [n for n in alive if min(times[n]) <= DROP_RATIO * best]
    return times, alive

"""Choosing each linear's kernel: from the cache, else measured alone and then, where rivals came
close, in the engine's own forward (and cached when the machine was not busy); ``Linears`` binds
an engine's linears on their choices and reports them."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from . import cache, timing
from .table import KERNELS, Gemm, bind, unavailable

TUNE_ENV = "MLEXEC_TUNE"
KEEP_DEFAULT = 0.05         # the engine's default stays unless another kernel is this much faster
BUSY_SHARE = 0.25           # seconds per second this process's threads waited for a core while
                            # measuring, or cores other processes used beyond the spare ones, above
                            # which the choice is not cached (idle: 0.003 and 0.01-0.05; one busy
                            # process beside a two-thread matmul: 0.74 and 1.0, the matmul 3.6x slower)


RIVAL_TIMINGS = 4           # gaining_rival: the rival must win one of at most this many timings,
RIVAL_PAUSE_S = 0.3         # this far apart: spread over a second or more


def fastest(times: dict[str, float], default: str) -> str:
    """The fastest of ``times`` (name -> seconds), but ``default`` where it is within KEEP_DEFAULT
    of that (ties included): a change of kernel or thread count has to pay for itself."""
    best = min(times, key=times.get)
    return default if default in times and times[default] <= (1 + KEEP_DEFAULT) * times[best] else best


def confirmed_fastest(measure: Callable[[], dict[str, float]], default: str) -> tuple[str, list[dict]]:
    """``fastest`` of one timing (``measure()``: name -> seconds) where that is ``default``; another
    only where a second timing agrees, and the timings. On a 2-core AMD EPYC host a two-thread
    pool's speed on small products moves between phases of a second or so (an mlp b16 d256
    forward: 13.5-22.7 us in successive half seconds, one process, nothing else running): one
    0.15 s timing in a slow phase chose one thread, and the report then ran it at 0.77x ONNX
    Runtime where the pool ran at 1.11x."""
    timings = [measure()]
    best = fastest(timings[0], default)
    if best != default:
        timings.append(measure())
        if fastest(timings[1], default) != best:
            best = default
    return best, timings


def gaining_rival(measure: Callable[[], dict[str, float]], kept: str, rival: str) -> tuple[str, list[dict]]:
    """``rival`` where one of up to RIVAL_TIMINGS timings (``measure()``: name -> seconds,
    RIVAL_PAUSE_S apart) has it KEEP_DEFAULT faster than ``kept``, else ``kept``; and the timings.
    The thread judge's rule, with one thread kept. On a tie the pool gains nothing and, on a 2-core
    host whose second core comes and goes, can lose (MobileNetV2's int8 b1 forward, AMD EPYC: 0.24
    ms on either in one phase, 0.47 ms on the pool in another). But the pool's slow phases last a
    second or so: two timings back to back inside one tied the pool with one thread, and 8 of 54
    builds ran MobileNetV3-large at b1 on one thread, 0.58-0.93x ONNX Runtime, where the builds on
    the pool ran 0.85-1.20x (AMD EPYC, AVX2; docs/engines.md). Spread out, one of them sees the
    pool's gain."""
    timings = []
    while len(timings) < RIVAL_TIMINGS:
        if timings:
            time.sleep(RIVAL_PAUSE_S)
        timings.append(measure())
        if fastest(timings[-1], kept) == rival:
            return rival, timings
    return kept, timings


# A GEMM timed alone is not the GEMM in the forward: there its weights, its neighbours' data and
# their pools share the cache and the cores (an AMD EPYC's 1 x 1024 x 1024 tied NumPy's two
# threads with SciPy's one alone, and ran 1.4x slower on one thread in the forward). Rivals within
# FORWARD_CLOSE of the best alone, FORWARD_RIVALS at most, are timed again as whole forwards.
FORWARD_CLOSE = 1.5
FORWARD_RIVALS = 3
# The one-thread kernels are candidates below this many multiply-adds: they exist for products so
# small that waking the pool costs more than the second core gives (tens of us). From here up a
# product takes over a millisecond on one core, and timing them took half the tuning of mlp b128
# d4096 (5 of 8 s, loaded Intel Xeon) and of transformer d512 s128 b8. What is given up: in a
# shared 2-core host's cache, 79 choices of that size, two threads ran 1.25-2.1x faster in 49; in
# the other 30, measured beside other work, one thread was ahead by 2-16 % (three by 22-76 %).
ONE_THREAD_MAX_WORK = 1 << 27


# A GEMM of LONE_CORE_WORK multiply-adds or more that no pool kernel ran LONE_CORE_GAIN times as fast
# as the same kernel on one thread was timed while the pool's second core gave nothing. On a 2-core AMD
# EPYC host the second core comes and goes for seconds at a time with no steal time counted (NumPy's
# 64 x 256 x 768 took 158-160 us on two threads for 1.5 s, then 190-208; docs/results): a whole-grid
# run timed NumPy's pool at 1.30-1.88x its one thread on every product from 2^22 up but one,
# 64 x 512 x 512 at 1.03x, where `fused` then kept oneDNN's one-thread matmul (302 against 344 us alone)
# and ran that forward at 0.74x `naive` for the rest of the run. Such a timing says nothing of the
# pool on a whole machine: the choice is the fastest pool kernel where it is LONE_CORE_SLACK of the
# fastest or closer (a slow phase costs that much at most, a fast one gains 1.5-2x), judged no
# further, and not cached.
LONE_CORE_WORK = 1 << 22
LONE_CORE_GAIN = 1.2
LONE_CORE_SLACK = 1.25                     # the pool runs if no more than this behind the fastest alone
ONE_CORE = "measured on one core"          # how such a choice is reported


def second_core_gain(work: int, times: dict[str, float], least: int | None = None) -> float | None:
    """The most any pool kernel in ``times`` gained over its own one-thread variant (``x`` against
    ``x-1t``), where ``work`` (multiply-adds) is ``least`` (LONE_CORE_WORK) or more and a pair was
    timed; else None."""
    if work < (LONE_CORE_WORK if least is None else least):
        return None
    gains = [times[n + "-1t"] / t for n, t in times.items()
             if n + "-1t" in times and np.isfinite(t) and t > 0 and np.isfinite(times[n + "-1t"])]
    return max(gains, default=None)


def on_one_core(work: int, times: dict[str, float], default: str,
                least: int | None = None) -> tuple[str, str] | None:
    """(the kernel to run, why) where ``times`` (name -> seconds; a one-thread variant is named
    ``x-1t``, as the table's kernels and the int8 engine's variants are) were taken while the
    pool's second core gave nothing (``second_core_gain`` under LONE_CORE_GAIN), else None: the
    fastest pool kernel (``fastest``) where it ran within LONE_CORE_SLACK of the fastest alone,
    else the fastest (a process that has one core for good loses no more than that)."""
    gain = second_core_gain(work, times, least)
    if gain is None or gain >= LONE_CORE_GAIN:
        return None
    timed = {n: t for n, t in times.items() if np.isfinite(t)}
    pooled = {n: t for n, t in timed.items() if not n.endswith("-1t")}
    best = fastest(timed, default)
    if pooled and min(pooled.values()) <= LONE_CORE_SLACK * timed[best]:
        best = fastest(pooled, default)
    return best, f"the pool ran {gain:.2f}x its one thread"


def tuning_enabled() -> bool:
    """On unless ``MLEXEC_TUNE`` is 0 (off, false, no): each engine's fixed defaults then."""
    return os.environ.get(TUNE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")



@dataclass
class Choice:
    kernel: str
    how: str                                        # "measured", "measured in the forward", "measured
                                                    # while busy ...", "measured on one core ...",
                                                    # "cached", or "default (MLEXEC_TUNE off)"
    default: str                                    # what the engine runs untuned
    times_s: dict[str, float] = field(default_factory=dict)      # each candidate alone
    seconds: float = 0.0                            # spent measuring
    forward_s: dict[str, float] = field(default_factory=dict)    # rivals in the forward (per forward)
    entry: str = ""                                 # its key in the cache


_MEMO: dict[tuple, Choice] = {}                     # this process's choices: (gemm key, candidates)


def choose(gemm: Gemm, candidates: tuple[str, ...], default: str) -> Choice:
    """The fastest of ``candidates`` and ``default`` for ``gemm`` on this machine: from the cache,
    else measured (and cached). ``default`` unless another is KEEP_DEFAULT faster, and when
    tuning is off or nothing can run."""
    big = gemm.work >= ONE_THREAD_MAX_WORK
    runnable = [c for c in dict.fromkeys((*candidates, default))
                if c not in unavailable() and KERNELS[c].offered_for(gemm)
                and (c == default or not (big and KERNELS[c].one_thread))]
    if not tuning_enabled() or not runnable:
        return Choice(default, f"default ({TUNE_ENV} off)" if not tuning_enabled() else "default", default)
    return cached_or_measured(
        f"{gemm.key}|{','.join(runnable)}", runnable, default,
        lambda: timing.measure(gemm, runnable) if len(runnable) > 1 else {runnable[0]: float("nan")},
        lambda times: on_one_core(gemm.work, times, default))


def cached_or_measured(entry: str, names: list[str], default: str, measure: Callable[[], dict[str, float]],
                       one_core: Callable[[dict[str, float]], tuple[str, str] | None] = lambda times: None) -> Choice:
    """The choice among ``names`` kept under ``entry`` (what it was measured for, the candidates
    included): this process's, else the cache's, else the fastest of ``measure()`` (name -> seconds;
    ``default`` unless another is KEEP_DEFAULT faster), cached unless the machine was busy. The
    kernel table's GEMMs come here through ``choose``; so do choices the table does not hold (the
    int8 engine's variants, timed by that engine), so that a second build of them measures nothing.
    ``one_core(times)`` says where the timing ran without the pool's second core: (the kernel then
    chosen, why), used in this process and neither judged in the forward nor cached."""
    memo_key = (str(cache.cache_path()), entry)
    if memo_key in _MEMO:                           # measured by an earlier build: nothing spent now
        return replace(_MEMO[memo_key], seconds=0.0)
    path = cache.cache_path()
    cached = None if os.environ.get(TUNE_ENV, "").strip().lower() == "again" else cache.read(path).get(entry)
    if isinstance(cached, dict) and cached.get("kernel") in names:
        choice = Choice(cached["kernel"], "cached", default, _seconds(cached.get("times_s")), entry=entry,
                        forward_s=_seconds(cached.get("forward_s")))
    else:
        t0, load0 = time.perf_counter(), _load()
        times = measure()
        seconds = time.perf_counter() - t0
        lone = one_core(times)
        if lone is not None:
            choice = Choice(lone[0], f"{ONE_CORE} ({lone[1]}), not cached", default, times, seconds, entry=entry)
        else:
            choice = _keep(Choice(fastest(times, default), "measured", default, times, seconds, entry=entry), load0,
                           seconds)
    _MEMO[memo_key] = choice
    return choice


def _seconds(times) -> dict[str, float]:
    return {n: float("inf") if t is None else float(t) for n, t in dict(times or {}).items()}


def _load() -> tuple[float | None, float | None]:
    """The counters ``_keep`` compares: this process's waiting for a core, others' CPU time."""
    return timing.waiting_seconds(), timing.others_cpu_seconds()


def _keep(choice: Choice, load0: tuple[float | None, float | None], seconds: float) -> Choice:
    """``choice``, cached unless, while it was measured (the last ``seconds``, from counters
    ``load0``), this process's threads waited for a core or other processes used more than the
    spare cores."""
    # Measured while other work held the cores, a two-thread kernel waits for its second core
    # and a one-thread one wins: right for now, wrong for every later build on an idle
    # machine (a 512 x 256 x 1024 linear cached that way ran at half speed). Used, not cached.
    (waited0, others0), (waited1, others1) = load0, _load()
    span = max(seconds, 1e-3)
    if None not in (waited0, waited1) and (waited1 - waited0) / span > BUSY_SHARE:
        why = f"threads waited {(waited1 - waited0) / span:.2f} s/s for a core"
    elif None not in (others0, others1) and (others1 - others0) / span > timing.spare_cores(span) + BUSY_SHARE:
        why = f"other processes used {(others1 - others0) / span:.2f} cores"
    else:
        why = None
    if why:
        return replace(choice, how=f"{choice.how} while busy ({why}), not cached")
    def finite(times):
        return {n: (t if np.isfinite(t) else None) for n, t in times.items()}
    cache.write(cache.cache_path(), {choice.entry: {"kernel": choice.kernel, "times_s": finite(choice.times_s),
                                                    **({"forward_s": finite(choice.forward_s)} if choice.forward_s else {})}})
    return choice


def _pool_twin(kernel: str, times: dict[str, float]) -> str | None:
    """The pool kernel to set against the one-thread ``kernel`` (``times``: what each candidate
    measured alone, inf where dropped): its own kernel on the pool where that was a candidate
    (``onednn-ip-1t`` -> ``onednn-ip``), else the pool's candidate fastest alone, else None."""
    own = kernel.removesuffix("-1t")
    if own != kernel and own in times:
        return own
    pooled = [n for n in times if KERNELS[n].one_thread is None]
    return min(pooled, key=times.get) if pooled else None


class Linears:
    """The linears of one engine: each one's kernel chosen (``choose``), its calls bound, its
    per-weight state (MKL's packs) made once, and every choice kept for ``report``.

    ``rivals()`` and ``judge()`` let an engine settle close calls in its own forward: it binds a
    batch, binds it again with each rival ``forced`` for one GEMM shape, and hands the forwards'
    calls to ``judge``, which keeps the fastest (``BoundEngine.bind_judged``)."""

    def __init__(self, candidates: Callable[[Gemm], tuple[str, ...]], default: Callable[[Gemm], str]):
        self.candidates = candidates        # what a GEMM of that shape may run on (an engine's offered_kernels)
        self.default = default
        self.states: dict[tuple[str, int], object] = {}     # (library, id(weight)) -> prepared state
        self.choices: dict[str, Choice] = {}                 # gemm key -> choice
        self.forced: dict[str, str] = {}                     # gemm key -> kernel bound instead of its choice
        self.bound_keys: list[str] = []                      # the GEMM shapes bound since last cleared
        self.work: dict[str, int] = {}                       # gemm key -> its multiply-adds
        self._users: dict[tuple[str, int], set[str]] = {}    # state key -> the gemm keys using it
        self.lock = threading.RLock()                        # held by an engine while it binds and judges

    def calls(self, x2, y2, w, b, b_tiled, residual) -> list:
        gemm = Gemm(y2.shape[0], *w.shape, transposed=not w.flags.c_contiguous, residual=residual is not None)
        unit = x2.strides[1] == y2.strides[1] == x2.itemsize
        candidates = self.candidates(gemm) if unit else ("numpy",)
        choice = choose(gemm, candidates, self.default(gemm) if unit else "numpy")
        self.choices.setdefault(gemm.key, choice)      # a second linear of that shape: the memo, 0 s
        # (once judged in the forward, the memo holds the verdict: choose returns it)
        name = self.forced.get(gemm.key, choice.kernel) if unit else choice.kernel
        if gemm.key not in self.bound_keys:
            self.bound_keys.append(gemm.key)
        self.work[gemm.key] = gemm.work
        kernel = KERNELS[name]
        state = None
        if kernel.prepare is not None:
            key = (kernel.library, id(w))
            if key not in self.states:
                self.states[key] = kernel.prepare(w)
            self._users.setdefault(key, set()).add(gemm.key)
            state = self.states[key]
        return bind(name, x2, y2, w, b, b_tiled, residual, state)

    def rivals(self) -> dict[str, list[str]]:
        """For each GEMM shape bound since ``bound_keys`` was cleared and just measured alone (not
        from the cache, not yet in the forward): the kernels to time in the forward (its choice
        first, then the fastest close one across the line between a pool and one thread, then
        the others within FORWARD_CLOSE of the fastest alone, FORWARD_RIVALS in all), where there
        are two or more. Across the line is where the two timings disagree: alone, a pool's
        wake-up is paid every call and the weights stay in cache; in a forward the pool is awake
        and the other layers evict them (an AMD EPYC's packed at 1 x 1024 x 1024: three one-thread
        kernels judged, the pool's onednn-matmul fourth alone and left out; the forward ran at
        0.70x naive's). Not from ONE_THREAD_MAX_WORK multiply-adds up: a product of a
        millisecond or more is little changed by what its neighbours leave in the cache or by a
        pool's wake-up (the two shapes where the forward chose otherwise were 2 x 512 x 512 and
        4 x 1024 x 1024), and judging the transformer d512 s128's four such shapes took 5.4 s of
        its 9.5 s build at batch 8 (loaded Intel Xeon). A one-thread choice whose pool twin
        (``_pool_twin``) was dropped alone, DROP_RATIO behind in two rounds, has that twin
        across the line all the same: the pool's slow phases on a 2-core host last a second or more,
        and such a drop kept static's 64 x 1024 x 256 on ``onednn-ip-1t`` in the cache
        (transformer b1 d256 s64, AMD EPYC: 297 us a call, where NumPy's pool took 190)."""
        found = {}
        for key in self.bound_keys:
            choice = self.choices[key]
            alone = {n: t for n, t in choice.times_s.items() if np.isfinite(t)}
            if not choice.how.startswith("measured") or choice.how.startswith(ONE_CORE) \
                    or choice.forward_s or len(alone) < 2 or self.work.get(key, 0) >= ONE_THREAD_MAX_WORK:
                continue
            close = [n for n in sorted(alone, key=alone.get) if alone[n] <= FORWARD_CLOSE * min(alone.values())]
            pooled = KERNELS[choice.kernel].one_thread is None
            across = [n for n in close if (KERNELS[n].one_thread is None) != pooled][:1]
            twin = None if pooled or across else _pool_twin(choice.kernel, choice.times_s)
            if twin is not None and not np.isfinite(choice.times_s[twin]):
                across = [twin]                     # dropped alone after two rounds: judged all the same
            rivals = list(dict.fromkeys([choice.kernel, *across, *close]))[:FORWARD_RIVALS]
            if len(rivals) > 1:
                found[key] = rivals
        return found

    def pool_twins(self) -> dict[str, str]:
        """For each GEMM shape bound since ``bound_keys`` was cleared that runs on one thread: the
        same kernel on its pool where that was a candidate (``onednn-ip-1t`` -> ``onednn-ip``),
        else the candidate on a pool fastest alone. Alone, and in a forward whose neighbours run
        on one thread, a pool's kernel pays its workers' wake-up on every call; in a forward whose
        linears all run on the pool the workers stay awake between them, which no one linear's
        timing shows (``OneDnnEngine``'s judge of them together). A pool timed alone in a slow
        phase of the host's second core is dropped as far behind (AMD EPYC: 79 of 753 cached
        one-thread choices), hence its own kernel first, timed or not."""
        twins = {}
        for key in self.bound_keys:
            choice = self.choices[key]
            kernel = self.forced.get(key, choice.kernel)
            twin = _pool_twin(kernel, choice.times_s) if KERNELS[kernel].one_thread else None
            if twin is not None:
                twins[key] = twin
        return twins

    def judge(self, key: str, forwards: dict[str, list]) -> Choice:
        """Keep for GEMM shape ``key`` the kernel whose whole forward (``forwards``: kernel -> the
        calls of one forward with that kernel bound for ``key``) ran fastest, its choice unless
        another is KEEP_DEFAULT faster in two timings (``confirmed_fastest``); cached like any
        choice, and the states of the kernels that lost dropped."""
        t0, load0 = time.perf_counter(), _load()
        choice = self.choices[key]
        best, timings = confirmed_fastest(lambda: timing.measure_forwards(forwards), choice.kernel)
        seconds = time.perf_counter() - t0
        judged = replace(choice, kernel=best, how="measured in the forward", forward_s=timings[-1],
                         seconds=choice.seconds + seconds)
        self.choices[key] = judged = _keep(judged, load0, seconds)
        _MEMO[(str(cache.cache_path()), judged.entry)] = judged
        self.drop_unused()
        return judged

    def drop_unused(self) -> None:
        """Forget the prepared states (MKL's packs) no choice runs on any more."""
        for key, users in list(self._users.items()):
            running = (KERNELS[self.forced.get(g, self.choices[g].kernel)] for g in users)
            if not any(k.library == key[0] and k.prepare is not None for k in running):
                del self.states[key], self._users[key]

    @property
    def state_bytes(self) -> int:
        return sum(getattr(s, "nbytes", 0) for s in self.states.values())

    def report(self) -> list[dict]:
        """Per GEMM: the kernel chosen, how, and what every candidate measured (microseconds)."""
        return [{"gemm": key, "kernel": self.forced.get(key, c.kernel),
                 "how": c.how if key not in self.forced else f"{c.how}; {c.kernel} alone, on the pool with the others",
                 "default": c.default, "tuning_s": round(c.seconds, 4),
                 "candidates_us": {n: (None if not np.isfinite(t) else round(1e6 * t, 2))
                                   for n, t in c.times_s.items()}}
                for key, c in self.choices.items()]

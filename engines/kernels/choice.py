"""Choosing each linear's kernel: from the cache, else measured (and cached when the machine was
not busy); ``Linears`` binds an engine's linears on their choices and reports them."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from . import cache, timing
from .table import KERNELS, Gemm, bind, unavailable

TUNE_ENV = "MLEXEC_TUNE"
KEEP_DEFAULT = 0.05         # the engine's default stays unless another kernel is this much faster
BUSY_SHARE = 0.25           # seconds per second this process's threads waited for a core while
                            # measuring, above which the choice is not cached (idle: 0.003; one
                            # busy process beside a two-thread matmul: 0.74, the matmul 3.6x slower)


def tuning_enabled() -> bool:
    """On unless ``MLEXEC_TUNE`` is 0 (off, false, no): each engine's fixed defaults then."""
    return os.environ.get(TUNE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")



@dataclass
class Choice:
    kernel: str
    how: str                                        # "measured", "measured while busy ...", "cached",
                                                    # or "default (MLEXEC_TUNE off)"
    default: str                                    # what the engine runs untuned
    times_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0                            # spent measuring


_MEMO: dict[tuple, Choice] = {}                     # this process's choices: (gemm key, candidates)


def choose(gemm: Gemm, candidates: tuple[str, ...], default: str) -> Choice:
    """The fastest of ``candidates`` and ``default`` for ``gemm`` on this machine: from the cache,
    else measured (and cached). ``default`` unless another is KEEP_DEFAULT faster, and when
    tuning is off or nothing can run."""
    runnable = [c for c in dict.fromkeys((*candidates, default))
                if c not in unavailable() and (KERNELS[c].fits is None or KERNELS[c].fits(gemm))]
    if not tuning_enabled() or not runnable:
        return Choice(default, f"default ({TUNE_ENV} off)" if not tuning_enabled() else "default", default)
    entry = f"{gemm.key}|{','.join(runnable)}"
    memo_key = (str(cache.cache_path()), entry)
    if memo_key in _MEMO:                           # measured by an earlier build: nothing spent now
        return replace(_MEMO[memo_key], seconds=0.0)
    path = cache.cache_path()
    cached = None if os.environ.get(TUNE_ENV, "").strip().lower() == "again" else cache.read(path).get(entry)
    if isinstance(cached, dict) and cached.get("kernel") in runnable:
        times = {n: float("inf") if t is None else float(t) for n, t in dict(cached.get("times_s", {})).items()}
        choice = Choice(cached["kernel"], "cached", default, times)
    else:
        t0, waited0 = time.perf_counter(), timing.waiting_seconds()
        times = timing.measure(gemm, runnable) if len(runnable) > 1 else {runnable[0]: float("nan")}
        seconds, waited1 = time.perf_counter() - t0, timing.waiting_seconds()
        best = min(times, key=times.get)
        if default in times and times[default] <= (1 + KEEP_DEFAULT) * times[best]:    # ties included
            best = default
        # Measured while other work held the cores, a two-thread kernel waits for its second core
        # and a one-thread one wins: right for now, wrong for every later build on an idle
        # machine (a 512 x 256 x 1024 linear cached that way ran at half speed). Used, not cached.
        busy = None if None in (waited0, waited1) else (waited1 - waited0) / max(seconds, 1e-3)
        if busy is not None and busy > BUSY_SHARE:
            choice = Choice(best, f"measured while busy (threads waited {busy:.2f} s/s for a core), "
                            "not cached", default, times, seconds)
        else:
            choice = Choice(best, "measured", default, times, seconds)
            cache.write(path, {entry: {"kernel": best, "times_s": {n: (t if np.isfinite(t) else None)
                                                                    for n, t in times.items()}}})
    _MEMO[memo_key] = choice
    return choice


class Linears:
    """The linears of one engine: each one's kernel chosen (``choose``), its calls bound, its
    per-weight state (MKL's packs) made once, and every choice kept for ``report``."""

    def __init__(self, candidates: tuple[str, ...], default: Callable[[Gemm], str]):
        self.candidates = candidates
        self.default = default
        self.states: dict[tuple[str, int], object] = {}     # (kernel, id(weight)) -> prepared state
        self.choices: dict[str, Choice] = {}                 # gemm key -> choice

    def calls(self, x2, y2, w, b, b_tiled, residual) -> list:
        gemm = Gemm(y2.shape[0], *w.shape, transposed=not w.flags.c_contiguous, residual=residual is not None)
        unit = x2.strides[1] == y2.strides[1] == x2.itemsize
        candidates = self.candidates if unit else ("numpy",)
        choice = choose(gemm, candidates, self.default(gemm) if unit else "numpy")
        self.choices.setdefault(gemm.key, choice)      # a second linear of that shape: the memo, 0 s
        kernel = KERNELS[choice.kernel]
        state = None
        if kernel.prepare is not None:
            key = (kernel.library, id(w))
            if key not in self.states:
                self.states[key] = kernel.prepare(w)
            state = self.states[key]
        return bind(choice.kernel, x2, y2, w, b, b_tiled, residual, state)

    @property
    def state_bytes(self) -> int:
        return sum(getattr(s, "nbytes", 0) for s in self.states.values())

    def report(self) -> list[dict]:
        """Per GEMM: the kernel chosen, how, and what every candidate measured (microseconds)."""
        return [{"gemm": key, "kernel": c.kernel, "how": c.how, "default": c.default, "tuning_s": round(c.seconds, 4),
                 "candidates_us": {n: (None if not np.isfinite(t) else round(1e6 * t, 2))
                                   for n, t in c.times_s.items()}}
                for key, c in self.choices.items()]

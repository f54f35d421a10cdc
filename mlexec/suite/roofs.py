"""This machine's roofs, measured once per session: peak matmul rate and copy bandwidth."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Roofs:
    gflops: float        # large float32 matmul, all BLAS threads
    gbytes_per_s: float  # large copy, bytes read + written

    def fraction(self, flops: int, seconds: float) -> float:
        return flops / seconds / 1e9 / self.gflops


def _best(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate(n: int = 2048, copy_mib: int = 64, repeats: int = 5) -> Roofs:
    """Best of a few runs: roofs are what the machine can do, so take its best moment."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty_like(a)
    matmul = _best(lambda: np.matmul(a, b, out=c), repeats)
    src = np.ones(copy_mib * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy = _best(lambda: np.copyto(dst, src), repeats)
    return Roofs(gflops=2 * n**3 / matmul / 1e9, gbytes_per_s=2 * src.nbytes / copy / 1e9)

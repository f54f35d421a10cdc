"""This machine's roofs, measured once per session: peak matmul rate and copy bandwidth."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..timing import best_time


@dataclass(frozen=True)
class Roofs:
    gflops: float            # large float32 matmul, all threads, by the fastest library here
    gbytes_per_s: float      # large copy, bytes read + written
    matmul_by: str = "numpy"  # the kernel that set the matmul roof (``engines.kernels``)

    def fraction(self, flops: int, seconds: float) -> float:
        return flops / seconds / 1e9 / self.gflops

    def best(self, other: "Roofs") -> "Roofs":
        """The higher of each roof: a slow spell during one calibration must not lower it."""
        top = max(self, other, key=lambda r: r.gflops)
        return Roofs(top.gflops, max(self.gbytes_per_s, other.gbytes_per_s), top.matmul_by)


def _matmul_seconds(n: int, repeats: int) -> dict[str, float]:
    """Best seconds of an n x n x n float32 GEMM by each multi-thread kernel that runs here
    without allocating (``engines.kernels``: NumPy's matmul, SciPy's and MKL's gemm, oneDNN's
    matmul), each timed on its own: the roof is what the fastest library reaches on this CPU,
    which need not be NumPy's (docs/kernels.md)."""
    from engines import kernels
    from engines.ir.calls import tile

    gemm = kernels.Gemm(n, n, n)
    rng = np.random.default_rng(0)
    a, w = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    b = np.zeros(n, dtype=np.float32)
    c = np.empty_like(a)
    skip = kernels.unavailable()
    out = {}
    for name, kernel in kernels.KERNELS.items():
        if kernel.one_thread or kernel.allocates or name in skip or not kernel.offered_for(gemm):
            continue
        calls = kernels.bind(name, a, c, w, b, tile(b, n), None, kernel.prepare(w) if kernel.prepare else None)
        out[name] = best_time(lambda: [fn(*args) for fn, args in calls], repeats)
    return out


def calibrate(n: int = 2048, copy_mib: int = 64, repeats: int = 5) -> Roofs:
    """The roofs: the fastest kernel's n x n x n float32 GEMM rate and one thread's copy bandwidth
    (bytes read + written), each the best of ``repeats`` runs, because a roof is what the machine
    can do at its best moment. The copy is one thread's because splitting it over threads did not
    raise it reliably.
    Measured figures: docs/methodology.md#roofs-calibration"""
    matmul = _matmul_seconds(n, repeats)
    by = min(matmul, key=matmul.get)
    src = np.ones(copy_mib * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy = best_time(lambda: np.copyto(dst, src), repeats)
    return Roofs(gflops=2 * n**3 / matmul[by] / 1e9, gbytes_per_s=2 * src.nbytes / copy / 1e9, matmul_by=by)

"""The thread count peers run with: the BLAS pool size NumPy uses, so every engine gets the same cores."""
from __future__ import annotations

import os


def blas_threads() -> int:
    """Threads of the BLAS library in use (threadpoolctl), else the CPU count."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return os.cpu_count() or 1
    counts = [pool["num_threads"] for pool in threadpool_info() if pool.get("user_api") == "blas"]
    return max(counts) if counts else (os.cpu_count() or 1)

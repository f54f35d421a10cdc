"""Which kernels NumPy's OpenBLAS runs, chosen for the CPU at hand before NumPy loads it.

OpenBLAS (a DYNAMIC_ARCH build, as NumPy's wheels ship) picks its kernels from the CPU once, when
it loads, and takes ``OPENBLAS_CORETYPE`` from the environment instead when set. On AMD EPYC
hosts with AVX-512 (Zen 4) the 0.3.31 that NumPy 2.4 ships picks its Haswell (AVX2) kernels;
its SkylakeX (AVX-512) kernels ran an 8 x 256 x 256 sgemm in 6.0 µs against 17.2 µs and
128 x 1024 x 1024 in 0.83 ms against 1.39 ms there (docs/kernels.md). So on an AMD CPU whose
flags include the AVX-512 subsets those kernels use, ``choose()`` sets SkylakeX. It changes
nothing when ``OPENBLAS_CORETYPE`` is already set (that is the switch: set it to keep another
choice), on other CPUs, or when NumPy was imported first (too late: OpenBLAS has loaded), and
``CHOICE`` says which of these happened. No NumPy import here.
"""
from __future__ import annotations

import ctypes
import os
import sys

from .cpu import vendor_and_flags

ENV = "OPENBLAS_CORETYPE"
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}   # what SkylakeX's kernels use
CHOICE = "not chosen yet"


def decide(vendor: str, flags: set[str]) -> str | None:
    """The core type to ask for on this CPU, or None to leave OpenBLAS's own choice."""
    return "SkylakeX" if vendor == "AuthenticAMD" and AVX512 <= flags else None


def choose() -> str:
    """Set ``OPENBLAS_CORETYPE`` for this CPU where that helps; returns what was done (``CHOICE``)."""
    global CHOICE
    if ENV in os.environ:
        CHOICE = f"{ENV}={os.environ[ENV]} (set in the environment)"
    elif (core := decide(*vendor_and_flags())) is None:
        CHOICE = "OpenBLAS's own choice"
    elif "numpy" in sys.modules:
        CHOICE = f"OpenBLAS's own choice ({core} would be chosen, but NumPy was imported before engines)"
    else:
        os.environ[ENV] = core
        CHOICE = f"{ENV}={core} (AVX-512 on an AMD CPU; OpenBLAS would take its AVX2 kernels)"
    return CHOICE


def threads(package: str) -> tuple:
    """(set-threads, get-threads) of the OpenBLAS that ``package`` (numpy or scipy) loaded: the
    one in its wheel's ``<package>.libs`` folder, else the only OpenBLAS loaded."""
    from threadpoolctl import threadpool_info
    pools = [p for p in threadpool_info() if p.get("internal_api") == "openblas"]
    mine = [p for p in pools if f"{os.sep}{package}.libs{os.sep}" in p["filepath"]]
    for pool in mine or (pools if len(pools) == 1 else []):
        lib = ctypes.CDLL(pool["filepath"])
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_", "_64"):
                if hasattr(lib, f"{prefix}openblas_set_num_threads{suffix}"):
                    set_threads = lib[f"{prefix}openblas_set_num_threads{suffix}"]
                    set_threads.restype = None
                    return set_threads, lib[f"{prefix}openblas_get_num_threads{suffix}"]
    raise ImportError(f"cannot tell which OpenBLAS {package} uses")


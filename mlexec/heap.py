"""Pin glibc's malloc, so that an eager engine's allocations cost the same in every process.

glibc hands the free memory at the top of its heap back to the kernel once it
exceeds a trim threshold, and it moves that threshold (and the size from which
blocks get their own mmap) with the largest block freed so far. An eager
forward that frees a few MiB of temporaries may therefore get them back as
fresh pages on its next call, each one faulted in and zeroed by the kernel, or
not, depending on what else the process allocated and freed before.

Measured at transformer-b1-d256-s128: ``naive`` alone in its process took
1,100 minor page faults per forward (7.4 ms); the same engine in a process
that had built three other engines first took none (5.3 ms). A report with
every engine in one process caught naive in its fast state; a lone benchmark
caught it in its slow one.

``pin()`` turns trimming off and fixes the mmap threshold, so that, whatever
ran before, a warm eager forward faults no pages: naive at its fastest, the
conservative baseline for every ratio against it. Blocks above 32 MiB (glibc's
largest threshold) still get their own mmap on every call.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20                       # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2**31 - 1                      # the largest mallopt takes: 2 GiB, in effect never

_pinned: str | None = None


def pin() -> str:
    """Pin the heap (once per process) and say how; where malloc isn't glibc's, say that instead."""
    global _pinned
    if _pinned is None:
        _pinned = _pin()
    return _pinned


def _pin() -> str:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"as the platform's malloc does ({platform.system()} {platform.libc_ver()[0] or 'libc'})"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "as glibc's malloc does (mallopt refused to pin it)"
    return "glibc malloc pinned: no trimming, mmap from 32 MiB"

"""Intel MKL's runtime (``libmkl_rt``): found in the ``mkl`` wheel, loaded once per process on GNU
OpenMP, its GEMM entry points typed, and the CBLAS calls this project binds (sgemm on 2-D views,
packed GEMM, vector math).

MKL runs on GNU OpenMP (``MKL_Set_Threading_Layer``), the runtime oneDNN's CPU build links, so
that the two share one thread pool: with Intel's OpenMP loaded first, oneDNN's calls bound to it
and ignored the GNU runtime's thread count (docs/kernels.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from ..errors import EngineUnavailable
from . import openmp
from .package import package_file
from .threads import blas_threads

ROW_MAJOR, NO_TRANS, TRANS, PACKED, B_MATRIX = 101, 111, 112, 151, 162   # CBLAS enums (mkl_cblas.h)
_LP64 = 0                                                       # 32-bit integers
_GNU_OPENMP = 3                                                 # MKL_THREADING_GNU
# Matrices per call of MKL's strided batch, which allocates 312 B + 24 B a matrix for each call
# (memray): at most 696 B
BATCH_MATRICES = 16


def find() -> str | None:
    """libmkl_rt from the ``mkl`` wheel's files, else wherever the system keeps it."""
    return package_file("mkl", r"(lib)?mkl_rt(\.\d+)*\.(so(\.\d+)*|dll|dylib)") or ctypes.util.find_library("mkl_rt")


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL:
    """MKL's runtime with the packed-GEMM entry points typed, loaded once per process."""
    path = find()
    if path is None:
        raise EngineUnavailable("the packed engine needs Intel MKL (libmkl_rt); pip install -e .[mkl]")
    threads = blas_threads()                      # NumPy's pool, read before MKL's joins the count
    try:
        lib = ctypes.CDLL(path)
        lib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
        lib.MKL_Set_Interface_Layer(_LP64)
        lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
        lib.MKL_Set_Threading_Layer(_GNU_OPENMP)
    except (OSError, AttributeError) as exc:
        raise EngineUnavailable(f"the packed engine could not load MKL from {path}: {exc}") from exc
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    lib.cblas_sgemm_pack_get_size.argtypes = [i, i, i, i]
    lib.cblas_sgemm_pack_get_size.restype = ctypes.c_size_t
    lib.cblas_sgemm_pack.argtypes = [i, i, i, i, i, i, f, p, i, p]
    lib.cblas_sgemm_pack.restype = None
    lib.MKL_Set_Num_Threads.argtypes = [i]
    lib.MKL_Set_Num_Threads(threads)
    # The per-forward calls stay untyped: with argtypes, ctypes builds a converter object per
    # argument per call (840 B traced per gemm); untyped, it passes Python ints and prebuilt
    # ctypes objects straight through (288 B).
    for name in ("cblas_sgemm_compute", "cblas_sgemm_batch_strided", "cblas_sgemm", "cblas_sgemv",
                 "vsErf", "vsCdfNorm", "vsMul"):
        fn = lib[name]                      # a fresh, untyped function object
        fn.restype = None
        setattr(lib, name.removeprefix("cblas_"), fn)
    openmp.pin_workers()                          # MKL's GNU threading layer has loaded GNU OpenMP
    return lib


def erf_calls(lib, out, x, *_scratch) -> list:
    """erf(x) into out, which may be x (MKL's vector math runs element by element)."""
    return [(lib.vsErf, (x.size, ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data)))]


# Values per sample a block of ``gelu_erf_calls`` covers: its scratch. ViT-B/16's 197 x 3,072 at b1,
# AMD EPYC, two threads: blocks of 2^14 values took 1.52x the time of one call over all (MKL's vector
# math runs a small call on one thread), 2^16 1.43x, 2^17 1.05x; at b8, 1.00-1.05x from 2^14.
GELU_BLOCK = 1 << 17


def gelu_erf_calls(lib, out, x, scratch, *_t) -> list:
    """x Phi(x) in blocks of ``scratch``'s rows (``GELU_BLOCK`` values a sample): the normal CDF
    into the scratch, then times x into out, which may be x."""
    y2, x2, s2 = (a.reshape(-1, a.shape[-1]) for a in (out, x, scratch))
    calls = []
    for i in range(0, len(x2), len(s2)):
        xb, yb = x2[i:i + len(s2)], y2[i:i + len(s2)]
        px, py, ps = (ctypes.c_void_p(a.ctypes.data) for a in (xb, yb, s2))
        calls += [(lib.vsCdfNorm, (xb.size, px, ps)), (lib.vsMul, (xb.size, px, ps, py))]
    return calls


def sgemm_call(lib, a: np.ndarray, b: np.ndarray, out: np.ndarray):
    """MKL's sgemm for out = a @ b on 2-D float32 views, or None where a view's layout is not a
    BLAS matrix (neither axis contiguous, or a leading dimension shorter than a row)."""
    (m, k), n = a.shape, b.shape[1]
    layouts = [blas_layout(x) for x in (a, b, out)]
    if None in layouts or layouts[2][0] != NO_TRANS:
        return None
    (ta, lda), (tb, ldb), (_, ldc) = layouts
    ptr = ctypes.c_void_p
    return (lib.sgemm, (ROW_MAJOR, ta, tb, m, n, k, ctypes.c_float(1.0), ptr(a.ctypes.data), lda,
                        ptr(b.ctypes.data), ldb, ctypes.c_float(0.0), ptr(out.ctypes.data), ldc))


def batched_calls(lib, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list | None:
    """MKL's calls for out[i, h] = a[i, h] @ b[i, h] over (batch, heads) views: strided batches of
    BATCH_MATRICES heads at most, per sample (over all of them where the samples follow each other
    at the same stride), or one sgemm per head where the heads' outputs interleave
    (attention's context written into column blocks, which the strided batch refuses); None where
    a view's matrices are not BLAS matrices."""
    if all(m.strides[0] == m.strides[1] * m.shape[1] for m in (a, b, out)):    # the samples' heads as one stack
        a, b, out = (m.reshape(1, -1, *m.shape[2:]) for m in (a, b, out))
    layouts = [matrix_layout(m[0]) for m in (a, b, out)]
    if None in layouts or layouts[2][0] != NO_TRANS:
        return None
    (ta, lda, sa), (tb, ldb, sb), (_, ldc, sc) = layouts
    heads, m, k = a.shape[1:]
    n = b.shape[-1]
    one, zero, ptr = ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_void_p
    if sc >= ldc * m:
        return [(lib.sgemm_batch_strided, (ROW_MAJOR, ta, tb, m, n, k, one, ptr(a[i, h].ctypes.data), lda, sa,
                                           ptr(b[i, h].ctypes.data), ldb, sb, zero, ptr(out[i, h].ctypes.data), ldc,
                                           sc, min(BATCH_MATRICES, heads - h)))
                for i in range(a.shape[0]) for h in range(0, heads, BATCH_MATRICES)]
    return [sgemm_call(lib, a[i, h], b[i, h], out[i, h]) for i in range(a.shape[0]) for h in range(heads)]


def blas_layout(x: np.ndarray):
    """(transpose flag, leading dimension) of a 2-D view, or None. The stride of an axis of
    length 1 is arbitrary (NumPy reports 0 for a column it allocated aligned): not read."""
    (rows, cols), (row_stride, col_stride) = x.shape, (st // x.itemsize for st in x.strides)
    if cols == 1 or col_stride == 1:
        ld = row_stride if rows > 1 else cols
        return (NO_TRANS, ld) if ld >= max(1, cols) else None
    if rows == 1 or row_stride == 1:
        ld = col_stride
        return (TRANS, ld) if ld >= max(1, rows) else None
    return None


def matrix_layout(stack: np.ndarray):
    """(transpose flag, leading dimension, stride between matrices) of a (count, rows, cols) view
    in elements, or None when its matrices are not BLAS matrices (``blas_layout``)."""
    layout = blas_layout(stack[0])
    return None if layout is None else (*layout, stack.strides[0] // stack.itemsize)

"""packed: fused's steps, with every large linear on weights packed once for the GEMM kernel.

A BLAS gemm re-packs its operands into the kernel's blocked layout on every
call, and OpenBLAS's kernels are slow on the short, wide products of small
batches; ONNX Runtime packs constant weights once. This engine does the same
with Intel MKL's packed GEMM (``cblas_sgemm_pack`` once for
``kernels.PACK_ROWS`` = 128 rows, ``cblas_sgemm_compute`` per call, through
ctypes on the engine's NumPy buffers) or oneDNN's matmul on weights reordered
once into its blocked layout, for the linears where each measured fastest on
this machine (``engines.kernels``: MKL's packed GEMM and plain ``sgemm``,
oneDNN's matmul, each also on one thread, against NumPy's and SciPy's on one
thread; with ``MLEXEC_TUNE=0`` the fixed rule: MKL's packed GEMM for more than
one row above ``fused.blas_max_work`` multiply-adds). On CPUs that are not
Intel's, MKL runs at a fraction of its speed and oneDNN does not (AMD EPYC:
MKL's GEMMs 2-4x slower than oneDNN's, docs/kernels.md). Attention's
per-head products, layernorm's and softmax's row reductions, the convolutions'
GEMMs, and erf and GELU (MKL's vector math) run on MKL. MKL runs on GNU OpenMP,
the runtime oneDNN's CPU build links, so that one thread pool (sized like
NumPy's BLAS pool) runs the forward: two pools fight over the cores. No
allocation per forward after warm-up; the weights are held twice (folded for
the small paths, packed for the large). Needs the ``mkl`` extra (``onednn``
for oneDNN's matmul). Measurements behind each choice: docs/engines.md.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import re
from importlib import metadata

import numpy as np

from .base import EngineUnavailable
from . import kernels, ops
from .fused import FusedEngine
from .threads import blas_threads

_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162   # CBLAS enums (mkl_cblas.h)
_LP64 = 0                                                         # 32-bit integers
_GNU_OPENMP = 3                                                   # MKL_THREADING_GNU
_MKL = None


def _find_mkl_rt() -> str | None:
    """libmkl_rt from the ``mkl`` wheel's files, else wherever the system keeps it."""
    try:
        files = metadata.files("mkl") or ()
    except metadata.PackageNotFoundError:
        files = ()
    for f in files:
        if re.fullmatch(r"(lib)?mkl_rt(\.\d+)*\.(so(\.\d+)*|dll|dylib)", f.name):
            return str(f.locate())
    return ctypes.util.find_library("mkl_rt")


def _load_mkl() -> ctypes.CDLL:
    """MKL's runtime with the packed-GEMM entry points typed, loaded once per process."""
    global _MKL
    if _MKL is not None:
        return _MKL
    path = _find_mkl_rt()
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
    _MKL = lib
    return lib


class PackedEngine(FusedEngine):
    name = "packed"
    pack_rows = kernels.PACK_ROWS
    kernel_candidates = kernels.candidates("mkl", "onednn-primitives")   # OpenMP's pool, and any kernel on one thread

    def __init__(self, model, max_batch: int):
        self._mkl = _load_mkl()
        super().__init__(model, max_batch)
        self.weight_bytes += self._linears.state_bytes   # the packs of the linears that chose them

    def _default_kernel(self, gemm: kernels.Gemm) -> str:
        """Without tuning: MKL's packed GEMM for every linear of more than one row above
        blas_max_work, MKL's plain sgemm below: MKL's pool, the one the convolutions and
        attention products run on. (fused's choice, SciPy's or NumPy's OpenBLAS, put a second
        pool in the forward: ResNet-50's one 2-thread NumPy matmul, its last linear, slowed the
        next forward's MKL convolutions 2x while OpenBLAS's workers spun.)"""
        if gemm.rows == 1 or gemm.rows * gemm.k * gemm.n <= self.blas_max_work:
            return "mkl-gemm"
        return "mkl-packed"

    def _matvec_call(self, x, col, out):
        # On MKL, not NumPy's matmul: one thread pool (see the module docstring).
        item = x.itemsize
        if not x.strides[1] == col.strides[0] == item:
            return super()._matvec_call(x, col, out)
        rows, n = x.shape
        ptr = ctypes.c_void_p
        return (self._mkl.sgemv, (_ROW_MAJOR, _NO_TRANS, rows, n, ctypes.c_float(1.0), ptr(x.ctypes.data),
                                  x.strides[0] // item, ptr(col.ctypes.data), 1, ctypes.c_float(0.0),
                                  ptr(out.ctypes.data), out.strides[0] // item))

    def _batched_matmul_calls(self, a, b, out) -> list:
        # On MKL, not NumPy's matmul: one thread pool (see the module docstring).
        layouts = [_matrix_layout(m[0]) for m in (a, b, out)]
        if None in layouts or layouts[2][0] != _NO_TRANS:
            return super()._batched_matmul_calls(a, b, out)
        (ta, lda, sa), (tb, ldb, sb), (_, ldc, sc) = layouts
        heads, m, k = a.shape[1:]
        n = b.shape[-1]
        one, zero, ptr = ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_void_p
        if sc >= ldc * m:                 # one strided batch over the heads per sample
            return [(self._mkl.sgemm_batch_strided,
                     (_ROW_MAJOR, ta, tb, m, n, k, one, ptr(a[i].ctypes.data), lda, sa, ptr(b[i].ctypes.data),
                      ldb, sb, zero, ptr(out[i].ctypes.data), ldc, sc, heads))
                    for i in range(a.shape[0])]
        # The heads' outputs interleave (attention's context, written into column blocks), which
        # MKL's strided batch refuses: one gemm per head.
        return [_sgemm_call(self._mkl, a[i, h], b[i, h], out[i, h]) for i in range(a.shape[0]) for h in range(heads)]

    def _op_calls(self, op_calls, y, ins, prepared, scratch, attrs) -> list:
        # erf and GELU on MKL's vector math (its default high-accuracy mode, ~1 ulp): 0.22 ms for
        # 8 x 64 x 1024 floats where the op's 22 NumPy passes took 1.29 ms (docs/importing.md)
        vector_math = _VECTOR_MATH.get(op_calls)
        if vector_math is None or not all(a.flags.c_contiguous for a in (y, *ins)):
            return super()._op_calls(op_calls, y, ins, prepared, scratch, attrs)
        return vector_math(self._mkl, y, *ins)

    def _matmul_calls(self, a, b, out) -> list:
        # An op's own products (a convolution's GEMMs, a pool's or LRN's matrix products) on MKL
        # too, one sgemm per matrix of the stacks: one thread pool (see the module docstring).
        lead = out.shape[:-2]
        try:
            stacks = [np.broadcast_to(x, lead + x.shape[-2:]) for x in (a, b)]
        except ValueError:
            return super()._matmul_calls(a, b, out)
        calls = [_sgemm_call(self._mkl, stacks[0][i], stacks[1][i], out[i]) for i in np.ndindex(lead)]
        return super()._matmul_calls(a, b, out) if None in calls else calls


def _erf_calls(lib, out, x) -> list:
    return [(lib.vsErf, (x.size, ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data)))]


def _gelu_erf_calls(lib, out, x) -> list:
    """x Phi(x): the normal CDF into out, then times x (x is read after out is written: the op
    kind never runs in place)."""
    n, px, py = x.size, ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data)
    return [(lib.vsCdfNorm, (n, px, py)), (lib.vsMul, (n, px, py, py))]


_VECTOR_MATH = {ops.erf_calls: _erf_calls, ops.gelu_erf_calls: _gelu_erf_calls}


def _sgemm_call(lib, a: np.ndarray, b: np.ndarray, out: np.ndarray):
    """MKL's sgemm for out = a @ b on 2-D float32 views, or None where a view's layout is not a
    BLAS matrix (neither axis contiguous, or a leading dimension shorter than a row)."""
    (m, k), n = a.shape, b.shape[1]
    layouts = [_blas_layout(x) for x in (a, b, out)]
    if None in layouts or layouts[2][0] != _NO_TRANS:
        return None
    (ta, lda), (tb, ldb), (_, ldc) = layouts
    ptr = ctypes.c_void_p
    return (lib.sgemm, (_ROW_MAJOR, ta, tb, m, n, k, ctypes.c_float(1.0), ptr(a.ctypes.data), lda,
                        ptr(b.ctypes.data), ldb, ctypes.c_float(0.0), ptr(out.ctypes.data), ldc))


def _blas_layout(x: np.ndarray):
    """(transpose flag, leading dimension) of a 2-D view, or None. The stride of an axis of
    length 1 is arbitrary (NumPy reports 0 for a column it allocated aligned): not read."""
    (rows, cols), (row_stride, col_stride) = x.shape, (st // x.itemsize for st in x.strides)
    if cols == 1 or col_stride == 1:
        ld = row_stride if rows > 1 else cols
        return (_NO_TRANS, ld) if ld >= max(1, cols) else None
    if rows == 1 or row_stride == 1:
        ld = col_stride
        return (_TRANS, ld) if ld >= max(1, rows) else None
    return None


def _matrix_layout(stack: np.ndarray):
    """(transpose flag, leading dimension, stride between matrices) of a (count, rows, cols) view
    in elements, or None when its matrices are not BLAS matrices (``_blas_layout``)."""
    layout = _blas_layout(stack[0])
    return None if layout is None else (*layout, stack.strides[0] // stack.itemsize)

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

import numpy as np

from .. import kernels
from ..native import mkl
from .fused import FusedEngine


class PackedEngine(FusedEngine):
    name = "packed"
    # GNU OpenMP allocates a team (1,568 B) for every parallel region MKL opens on one thread, and
    # frees it on return: the peak of a pinned forward on an Intel Xeon (memray), whatever the shape
    peak_slack_bytes = 2048
    pack_rows = kernels.PACK_ROWS
    kernel_candidates = kernels.candidates("mkl", "onednn-primitives")   # OpenMP's pool, and any kernel on one thread
    openmp_pool = True

    def __init__(self, model, max_batch: int):
        self._mkl = self.vector_math = mkl.load()
        super().__init__(model, max_batch)

    def default_kernel(self, gemm: kernels.Gemm) -> str:
        """Without tuning: MKL's packed GEMM for every linear of more than one row above
        blas_max_work, MKL's plain sgemm below: MKL's pool, the one the convolutions and
        attention products run on. (fused's choice, SciPy's or NumPy's OpenBLAS, put a second
        pool in the forward: ResNet-50's one 2-thread NumPy matmul, its last linear, slowed the
        next forward's MKL convolutions 2x while OpenBLAS's workers spun.)"""
        if gemm.rows == 1 or gemm.work <= self.blas_max_work:
            return "mkl-gemm"
        return "mkl-packed"

    def matvec_call(self, x, col, out):
        # On MKL, not NumPy's matmul: one thread pool (see the module docstring).
        item = x.itemsize
        if not x.strides[1] == col.strides[0] == item:
            return super().matvec_call(x, col, out)
        rows, n = x.shape
        ptr = ctypes.c_void_p
        return (self._mkl.sgemv, (mkl.ROW_MAJOR, mkl.NO_TRANS, rows, n, ctypes.c_float(1.0), ptr(x.ctypes.data),
                                  x.strides[0] // item, ptr(col.ctypes.data), 1, ctypes.c_float(0.0),
                                  ptr(out.ctypes.data), out.strides[0] // item))

    def batched_matmul_calls(self, a, b, out) -> list:
        # On MKL, not NumPy's matmul: one thread pool (see the module docstring).
        return mkl.batched_calls(self._mkl, a, b, out) or super().batched_matmul_calls(a, b, out)

    def matmul_calls(self, a, b, out) -> list:
        # An op's own products (a convolution's GEMMs, a pool's or LRN's matrix products) on MKL
        # too, one sgemm per matrix of the stacks: one thread pool (see the module docstring).
        lead = out.shape[:-2]
        try:
            stacks = [np.broadcast_to(x, lead + x.shape[-2:]) for x in (a, b)]
        except ValueError:
            return super().matmul_calls(a, b, out)
        calls = [mkl.sgemm_call(self._mkl, stacks[0][i], stacks[1][i], out[i]) for i in np.ndindex(lead)]
        return super().matmul_calls(a, b, out) if None in calls else calls


"""oneDNN's integer primitives as this project calls them: descriptors of any data type, scales
given at run time, and the int8 matmul (s8 activations x s8 weights, accumulated in s32 by the
library, written as f32 with the weight scales per output channel, the activation scale, the bias,
a residual and a ReLU applied as each output block is written).

Builds on ``onednn`` (its library handle, ``Owned`` objects, the call machinery); imports nothing
of the engines above it. The C API is oneDNN 3.x's: scales are set by mask on the primitive's
attributes and passed at execution as ``ATTR_SCALES | argument``.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..memory import aligned_empty
from .onednn import DST, F32, Q_WEIGHTS, SRC, Dims, Dnnl, Owned, P, implementation, post_op_arg

S32, S8, U8 = 4, 5, 6                           # dnnl_data_type_t
DATA_TYPES = {np.dtype(np.float32): F32, np.dtype(np.int32): S32, np.dtype(np.int8): S8, np.dtype(np.uint8): U8}
ATTR_SCALES = 4096                              # DNNL_ARG_ATTR_SCALES
ATTR_ZERO_POINTS = 8192                         # DNNL_ARG_ATTR_ZERO_POINTS
PER_COLUMN = 1 << 1                             # scale mask: one scale per index of dim 1 (out channel)
PER_ROW = 1 << 0                                # one per index of dim 0 (a row of activations)
# dnnl_cpu_isa_t (dnnl_types.h): the bits every ISA with int8 dot products has, AVX-512's VNNI (and
# AMX above it: 0x67, 0xe7, 0x1ef, 0xfef, ...) or AVX2's (0xf, 0x1f)
AVX512_VNNI_BITS, AVX2_VNNI_BITS = 0x67, 0xF


def int8_dot_product(dnnl: Dnnl) -> bool:
    """Whether oneDNN's int8 kernels here multiply with dot-product instructions (VNNI, AMX),
    summing four u8 x s8 products in 32 bits. Without them (AVX2 alone: AMD EPYC 7003, older Xeons)
    they pair two products in a saturating 16-bit sum (``vpmaddubsw``): u8 activations above 127
    then overflow it (255 x 127 x 2 > 32767; measured here: a 64-term sum of 255 x 127 came out
    half of its value), and s8 ones run with weights halved (oneDNN's scale adjustment: ~1 % of
    the sum). ``ONEDNN_MAX_CPU_ISA=AVX2`` makes any x86 CPU answer False."""
    isa = dnnl.lib.dnnl_get_effective_cpu_isa()
    return isa & AVX512_VNNI_BITS == AVX512_VNNI_BITS or isa & AVX2_VNNI_BITS == AVX2_VNNI_BITS


class TypedOwned(Owned):
    """``Owned`` with descriptors of any data type (s8, s32, f32), from the array they describe."""

    def typed(self, dims, tag: int, dtype) -> P:
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_with_tag", len(dims), Dims(*dims),
                                              DATA_TYPES[np.dtype(dtype)], tag))

    def strided(self, a: np.ndarray) -> P:
        """The descriptor of ``a`` as it lies in memory, its own data type."""
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_with_strides", a.ndim, Dims(*a.shape),
                                              DATA_TYPES[a.dtype], Dims(*[s // a.itemsize for s in a.strides])))

    def quantized_attr(self, scales: dict[int, int], binaries: list, eltwises: tuple = (),
                       sum_: bool = False, zero_points: dict[int, int] | None = None) -> P:
        """Attributes: a user scratchpad, run-time scales and zero points (argument -> mask), then
        post-ops: the sum into the output (a residual already there) or the binary ones in order
        (``(algorithm, md)``, their operands at ``post_op_arg(i)``), then the eltwise ones
        ``(algorithm, alpha, beta)``. Zero points are s32, passed as ``ATTR_ZERO_POINTS | argument``."""
        attr = self.attr()
        d = self.dnnl
        for arg, mask in scales.items():
            d.check(d.lib.dnnl_primitive_attr_set_scales_mask(attr, arg, mask), "scales mask")
        for arg, mask in (zero_points or {}).items():
            d.check(d.lib.dnnl_primitive_attr_set_zero_points_mask(attr, arg, mask), "zero points mask")
        self.post_ops(attr, sum_, binaries, eltwises)
        return attr


def implementations(dnnl: Dnnl, make_pd) -> list[str]:
    """The implementations oneDNN offers for the primitive ``make_pd()`` describes, best first
    by its own ranking (``dnnl_primitive_desc_next_impl``)."""
    pd, names = make_pd(), []
    while True:
        names.append(implementation(dnnl, pd))
        if dnnl.lib.dnnl_primitive_desc_next_impl(pd) != 0:
            return names


def with_implementation(dnnl: Dnnl, pd, name: str):
    """``pd`` moved on to oneDNN's implementation ``name``; ValueError when it offers none such."""
    while implementation(dnnl, pd) != name:
        if dnnl.lib.dnnl_primitive_desc_next_impl(pd) != 0:
            raise ValueError(f"oneDNN offers no implementation {name!r} here")
    return pd


class QuantizedWeights:
    """One weight matrix's s8 values, held in the layout its primitives take: the plain (k, n) copy
    is dropped by ``settle()`` once one layout is made, so the engine holds one byte per weight; a
    primitive asking another layout gets it reordered from the first. Shared with workers."""

    def __init__(self, dnnl: Dnnl, plain: np.ndarray):
        self.owned = TypedOwned(dnnl)
        self.plain: np.ndarray | None = plain
        self.shape = plain.shape
        self.layouts: list[tuple[P, np.ndarray, object]] = []   # (md, the weights in it, view of the plain)
        weakref.finalize(self, self.owned.release)

    @property
    def nbytes(self) -> int:
        held = sum(a.nbytes for a in {id(a): a for _, a, _ in self.layouts}.values())
        return held + (0 if self.plain is None else self.plain.nbytes)

    def take(self, pd, keep: bool = True, view=lambda plain: plain) -> tuple[P, np.ndarray]:
        """(md, array): the weights in the layout the primitive of ``pd`` takes, its dimensions those
        of ``view(plain)`` (a matmul's (1, k, n) as they are; a 1x1 conv's (n, k, 1, 1), transposed);
        a layout made for a trial (``keep`` False) is not held."""
        dnnl, o = self.owned.dnnl, self.owned
        want = dnnl.lib.dnnl_primitive_desc_query_md(pd, Q_WEIGHTS, 0)
        for md, array, _ in self.layouts:
            if dnnl.lib.dnnl_memory_desc_equal(md, want):
                return md, array
        plain = view(self._plain())
        array = aligned_empty(-(-dnnl.lib.dnnl_memory_desc_get_size(want) // 4)).view(np.int8)
        md = o.clone(want)
        plain_md = o.strided(plain)
        dnnl.run_now(o, o.reorder_pd(plain_md, md, o.attr()), {SRC: (plain_md, plain), DST: (md, array)})
        # another primitive's layout may lie the same bytes out (an inner product's and a matmul's
        # blocking of one matrix, without s8 compensation): held once
        array = next((held for _, held, _ in self.layouts if np.array_equal(held, array)), array)
        if keep:
            self.layouts.append((md, array, view))
        return md, array

    def values(self) -> np.ndarray:
        """The plain (k, n) s8 values (a temporary copy once only a layout holds them)."""
        return self._plain()

    def _plain(self) -> np.ndarray:
        """The plain (k, n) values: the copy still held, or a temporary one reordered back from the
        first layout. oneDNN reorders between two of its layouts only in some directions (AMX's to
        VNNI's with s8 compensation: unimplemented in 3.2), from and to plain in every one."""
        if self.plain is not None:
            return self.plain
        md, array, view = self.layouts[0]
        plain = np.empty(self.shape, np.int8)
        o = self.owned
        plain_md = o.strided(view(plain))
        o.dnnl.run_now(o, o.reorder_pd(md, plain_md, o.attr()), {SRC: (md, array), DST: (plain_md, view(plain))})
        return plain

    def settle(self) -> None:
        """Drop the plain copy once a layout holds the weights."""
        if self.layouts:
            self.plain = None


ON_GRID = 1e-3     # |w / step - round(w / step)| of a dequantized integer: float32 rounding, far below


def quantize_columns(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(q, scales): ``w`` (k, n) as symmetric s8 with one scale per column (output channel),
    q = round(w / scale), scale = max |w[:, j]| / levels (1 for an all-zero column). In float64.

    Weights a quantized file dequantized with one scale for the whole tensor (``quantize_dynamic``'s
    default) lie on that scale's grid: they keep it, so q is the file's integers, not a second
    rounding of them (per channel, the file's scales are the ones found here anyway)."""
    w64 = np.asarray(w, dtype=np.float64)
    amax = np.max(np.abs(w64), axis=0)
    step = np.max(amax, initial=0.0) / levels
    if step > 0 and np.all(np.abs(w64 / step - np.rint(w64 / step)) < ON_GRID):
        return np.rint(w64 / step).astype(np.int8), np.full(w64.shape[1], step, dtype=np.float32)
    scales = np.where(amax > 0, amax / levels, 1.0)
    q = np.clip(np.rint(w64 / scales), -levels, levels).astype(np.int8)
    return q, scales.astype(np.float32)


__all__ = ["ATTR_SCALES", "ATTR_ZERO_POINTS", "PER_COLUMN", "PER_ROW", "QuantizedWeights", "S8", "S32", "TypedOwned", "U8",
           "implementation", "implementations", "int8_dot_product", "post_op_arg", "quantize_columns", "with_implementation"]

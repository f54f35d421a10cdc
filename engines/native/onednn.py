"""oneDNN's CPU library (``onednn-cpu-gomp``, on GNU OpenMP): loading it, its C API as this
project calls it through ctypes, the objects an engine owns, and its matmul as a kernel.

Owns: the library handle (``load``), ``dnnl_sgemm`` typed (``sgemm``), one CPU engine and
stream per process (``library``), the activation layout its convolutions pick on this CPU,
weights reordered once per layout (``Weights``), and ``matmul_calls`` and ``inner_product_calls``
(``engines.kernels``' ``onednn-matmul`` and ``onednn-ip``). Imports nothing of the engines above it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import weakref
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..errors import EngineUnavailable
from ..memory import aligned_empty
from . import openmp
from .package import package_file

PACKAGE = "onednn-cpu-gomp"       # oneDNN's CPU build on GNU OpenMP (the SYCL "onednn" wheel has no CPU engine)


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL:
    """libdnnl from the ``onednn-cpu-gomp`` wheel, else the system's; ImportError without it."""
    path = package_file(PACKAGE, r"libdnnl\.so\.\d+") or ctypes.util.find_library("dnnl")
    if path is None:
        raise ImportError("oneDNN is not installed (pip install -e .[onednn])")
    return ctypes.CDLL(path)


def sgemm():
    """``dnnl_sgemm``, typed to return its status."""
    fn = load().dnnl_sgemm
    fn.restype = ctypes.c_int
    return fn


# oneDNN 3.x C API enums (dnnl_types.h, dnnl_common_types.h)
F32, CPU, IN_ORDER, INFERENCE, CONV_DIRECT = 3, 1, 1, 96, 1
ANY, PLAIN = 1, {1: 2, 2: 3, 3: 4, 4: 5, 5: 6}      # format tags any; a, ab, abc, abcd, abcde by rank
# The activation layouts a conv may pick, as (format tag, channel block): NHWC (acdb), and
# nChw16c / nChw8c / nChw4c (aBcd16b/8b/4b: [N][C/b][H][W][b], channels padded to the block)
LAYOUTS = ((22, 1), (78, 16), (102, 8), (84, 4))
RELU, LINEAR, HARDSIGMOID, LOGISTIC, GELU_TANH, SWISH, CLIP, GELU_ERF, ROUND, HARDSWISH = (
    0x20, 0x26, 0x28, 0x29, 0x2B, 0x2C, 0x2E, 0x31, 0x32, 0x34)
SOFTMAX_ACCURATE = 0x30000
REDUCTION_MAX, REDUCTION_MIN = 0x2FFF2, 0x2FFF3
POOL_MAX, POOL_AVG_INCLUDE, POOL_AVG_EXCLUDE, LRN_ACROSS = 0x1FF, 0x2FF, 0x3FF, 0xAFF
SRC, SRC_1, WEIGHTS, BIAS, DST, SCRATCHPAD, MULTIPLE_SRC = 1, 2, 33, 41, 17, 80, 1024
MEAN, VARIANCE, SCALE, SHIFT = 49, 50, 51, 52
GLOBAL_STATS, USE_SCALE, USE_SHIFT, NORM_RELU = 0x1, 0x2, 0x4, 0x8
BINARY_ADD, BINARY_MUL, BINARY_MAX, BINARY_DIV, BINARY_SUB = 0x1FFF0, 0x1FFF1, 0x1FFF2, 0x1FFF4, 0x1FFF5
Q_IMPL, Q_WEIGHTS, Q_DST, Q_SCRATCHPAD = 8, 131, 133, 136
AVX512_CORE_BITS = 0x27                        # dnnl_cpu_isa_avx512_core: what every AVX-512 ISA has
USER_SCRATCHPAD = 1
Dims = ctypes.c_int64 * 12                             # DNNL_MAX_NDIMS
P = ctypes.c_void_p


def post_op_arg(index: int) -> int:
    """The execution argument of the second operand of the binary post-op at ``index`` in the chain
    (``DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1``)."""
    return 32768 * (index + 1) | 2


POST_OP_SRC1 = post_op_arg(0)


class BinaryPostOp(NamedTuple):
    """A binary post-op in a chain of eltwise ones: ``alg`` with a second operand, a constant
    (an array) where a step holds the chain, its memory descriptor where ``post_ops`` sets it."""
    alg: int
    operand: object


class Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", P)]


class DnnlError(RuntimeError):
    pass


class Dnnl:
    """libdnnl's C API as used here: one CPU engine and stream, and the channel block."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.dnnl_primitive_desc_query_md.restype = P
        lib.dnnl_primitive_desc_query_md.argtypes = [P, ctypes.c_int, ctypes.c_int]
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        lib.dnnl_memory_desc_get_size.argtypes = [P]
        lib.dnnl_memory_desc_equal.argtypes = [P, P]
        lib.dnnl_memory_set_data_handle.argtypes = [P, P]
        # dnnl_primitive_execute, untyped (prebuilt arguments pass through): ``execute`` raises on a
        # failed status; ``run`` checks nothing (0.08 us a call less, a tenth of a small primitive's
        # call, AMD EPYC), for calls whose first run went through ``execute``
        self.execute = lib["dnnl_primitive_execute"]
        self.execute.errcheck = _executed
        self.run = lib["dnnl_primitive_execute"]
        self.engine = self.new("dnnl_engine_create", CPU, 0)
        self.stream = self.new("dnnl_stream_create", self.engine, IN_ORDER)
        self.layout, self.block = self._probe_layout()

    def new(self, fn: str, *args) -> P:
        handle = P()
        self.check(getattr(self.lib, fn)(ctypes.byref(handle), *args), fn)
        return handle

    @staticmethod
    def check(status: int, what: str) -> None:
        if status:
            raise DnnlError(f"oneDNN {what} failed (status {status})")

    def scratchpad_md(self, pd) -> P:
        return P(self.lib.dnnl_primitive_desc_query_md(pd, Q_SCRATCHPAD, 0))

    def call(self, owned: "Owned", pd, args: dict[int, tuple], scratchpad: np.ndarray | None) -> tuple[tuple, P]:
        """The bound call ``(fn, args)`` that runs the primitive of ``pd`` on ``args`` (argument ->
        (md, array)), and its scratchpad's memory: on ``scratchpad``, or on nothing yet (its
        handle is then set before the call runs). The arrays live as long as the call."""
        mems = {arg: owned.memory(md, array) for arg, (md, array) in args.items()}
        pad = mems[SCRATCHPAD] = owned.memory(self.scratchpad_md(pd), scratchpad)
        array = (Arg * len(mems))(*(Arg(arg, mem) for arg, mem in mems.items()))
        array._keep = [scratchpad, *args.values()]
        return (self.execute, (owned.primitive(pd), self.stream, len(mems), array)), pad

    def run_now(self, owned: "Owned", pd, args: dict[int, tuple]) -> None:
        """Run the primitive of ``pd`` once, now, on a scratchpad of its own."""
        size = self.lib.dnnl_memory_desc_get_size(self.scratchpad_md(pd))
        (fn, call_args), _ = self.call(owned, pd, args, aligned_empty(-(-size // 4)))
        fn(*call_args)

    def _probe_layout(self) -> tuple[int, int]:
        """(format tag, channel block) of the layout oneDNN's conv picks here for a 3x3, 64-channel
        layer at 56 x 56 given format "any"; NCHW when it picks none of ``LAYOUTS``."""
        owned = Owned(self)
        dims = (1, 64, 56, 56)
        pd = owned.conv_pd(owned.md(dims, ANY), owned.md((64, 64, 3, 3), ANY), owned.md((64,), PLAIN[1]),
                           owned.md(dims, ANY), (1, 1), (0, 0), (1, 1), (1, 1), owned.attr())
        chosen = self.lib.dnnl_primitive_desc_query_md(pd, Q_DST, 0)
        layout = next((lb for lb in LAYOUTS if self.lib.dnnl_memory_desc_equal(chosen, owned.md(dims, lb[0]))),
                      (PLAIN[4], 1))
        owned.release()
        return layout


def avx512(dnnl: Dnnl) -> bool:
    """Whether oneDNN's kernels here are its AVX-512 ones (``ONEDNN_MAX_CPU_ISA=AVX2`` makes any
    x86 CPU answer False)."""
    return dnnl.lib.dnnl_get_effective_cpu_isa() & AVX512_CORE_BITS == AVX512_CORE_BITS


def implementation(dnnl: Dnnl, pd) -> str:
    """The implementation oneDNN chose for the primitive of ``pd`` (``brg:avx512_core``, ``jit:uni``,
    ``ref:any``, ...)."""
    impl = ctypes.c_char_p()
    dnnl.check(dnnl.lib.dnnl_primitive_desc_query(pd, Q_IMPL, 0, ctypes.byref(impl)), "implementation query")
    return impl.value.decode()


def _executed(status: int, fn, args) -> int:
    """ctypes' check of every ``dnnl_primitive_execute``: a failed call raises, it is not skipped."""
    if status:
        raise DnnlError(f"oneDNN primitive execution failed (status {status})")
    return status


class Owned:
    """oneDNN objects made for one engine, destroyed with it (``weakref.finalize``)."""

    _DESTROY = {"md": "dnnl_memory_desc_destroy", "pd": "dnnl_primitive_desc_destroy",
                "prim": "dnnl_primitive_destroy", "mem": "dnnl_memory_destroy",
                "attr": "dnnl_primitive_attr_destroy", "po": "dnnl_post_ops_destroy"}

    def __init__(self, dnnl: Dnnl):
        self.dnnl, self.handles = dnnl, []

    def _keep(self, kind: str, handle: P) -> P:
        self.handles.append((self._DESTROY[kind], handle))
        return handle

    def release(self) -> None:
        while self.handles:
            fn, handle = self.handles.pop()
            getattr(self.dnnl.lib, fn)(handle)

    def md(self, dims, tag: int) -> P:
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_with_tag", len(dims), Dims(*dims), F32, tag))

    def strided(self, a: np.ndarray) -> P:
        """The descriptor of ``a`` as it lies in memory, whatever its strides."""
        return self.with_strides(a.shape, [s // a.itemsize for s in a.strides])

    def with_strides(self, dims, strides) -> P:
        """Dimensions ``dims``, element i at sum(i_k * strides[k]) floats from the start."""
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_with_strides", len(dims), Dims(*dims), F32,
                                              Dims(*strides)))

    def submemory(self, parent, dims, offsets) -> P:
        """The part of ``parent`` of ``dims`` from ``offsets``, laid out as it lies in ``parent``
        (oneDNN refuses an offset inside a channel block of a blocked layout)."""
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_submemory", parent, Dims(*dims),
                                              Dims(*offsets)))

    def clone(self, md) -> P:
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_clone", P(md)))

    def attr(self, sum_: bool = False, eltwises: tuple = (), add=None) -> P:
        """Attributes: a user-managed scratchpad; post-ops: the residual sum (into the output), or
        the add of a tensor of descriptor ``add`` (``POST_OP_SRC1``), then the eltwise ones."""
        d = self.dnnl
        attr = self._keep("attr", d.new("dnnl_primitive_attr_create"))
        d.check(d.lib.dnnl_primitive_attr_set_scratchpad_mode(attr, USER_SCRATCHPAD), "scratchpad mode")
        self.post_ops(attr, sum_, [(BINARY_ADD, add)] if add else [], eltwises)
        return attr

    def post_ops(self, attr, sum_: bool, binaries: list, eltwises: tuple) -> None:
        """Set ``attr``'s post-ops, in order: the sum into the output (a residual already there),
        the binary ones (``(algorithm, md)``, their operands at ``DNNL_ARG_ATTR_MULTIPLE_POST_OP(i)
        | DNNL_ARG_SRC_1``, i the post-op's place in the whole chain), then ``eltwises``: the
        eltwise ones ``(algorithm, alpha, beta)`` (an activation, a quantization step's chain),
        with ``BinaryPostOp(algorithm, md)`` among them in their place; none: nothing set."""
        if not (sum_ or binaries or eltwises):
            return
        d = self.dnnl
        po = self._keep("po", d.new("dnnl_post_ops_create"))
        if sum_:
            d.check(d.lib.dnnl_post_ops_append_sum(po, ctypes.c_float(1.0), 0, 0), "sum post-op")
        for alg, md in binaries:
            d.check(d.lib.dnnl_post_ops_append_binary(po, alg, md), "binary post-op")
        for op in eltwises:
            if isinstance(op, BinaryPostOp):
                d.check(d.lib.dnnl_post_ops_append_binary(po, op.alg, op.operand), "binary post-op")
                continue
            alg, alpha, beta = op
            d.check(d.lib.dnnl_post_ops_append_eltwise(po, alg, ctypes.c_float(alpha), ctypes.c_float(beta)),
                    "eltwise post-op")
        d.check(d.lib.dnnl_primitive_attr_set_post_ops(attr, po), "post-ops")

    def conv_pd(self, src, w, b, dst, strides, dilations, pad_l, pad_r, attr) -> P:
        return self._keep("pd", self.dnnl.new(
            "dnnl_convolution_forward_primitive_desc_create", self.dnnl.engine, INFERENCE, CONV_DIRECT,
            src, w, b, dst, Dims(*strides), Dims(*dilations), Dims(*pad_l), Dims(*pad_r), attr))

    def matmul_pd(self, src, w, b, dst, attr) -> P:
        return self._keep("pd", self.dnnl.new("dnnl_matmul_primitive_desc_create", self.dnnl.engine, src, w, b, dst, attr))

    def inner_product_pd(self, src, w, b, dst, attr) -> P:
        return self._keep("pd", self.dnnl.new("dnnl_inner_product_forward_primitive_desc_create", self.dnnl.engine,
                                              INFERENCE, src, w, b, dst, attr))

    def pool_pd(self, alg, src, dst, strides, kernel, dilations, pad_l, pad_r, attr) -> P:
        return self._keep("pd", self.dnnl.new(
            "dnnl_pooling_forward_primitive_desc_create", self.dnnl.engine, INFERENCE, alg, src, dst,
            Dims(*strides), Dims(*kernel), Dims(*dilations), Dims(*pad_l), Dims(*pad_r), attr))

    def concat_pd(self, dst, srcs, attr) -> P:
        """Along the channel axis."""
        return self._keep("pd", self.dnnl.new("dnnl_concat_primitive_desc_create", self.dnnl.engine, dst, len(srcs), 1,
                                              (P * len(srcs))(*srcs), attr))

    def lrn_pd(self, src, dst, size: int, alpha: float, beta: float, k: float, attr) -> P:
        """Across channels: dst = src / (k + alpha / size · sum of src² over the window)^beta."""
        return self._keep("pd", self.dnnl.new(
            "dnnl_lrn_forward_primitive_desc_create", self.dnnl.engine, INFERENCE, LRN_ACROSS, src, dst,
            ctypes.c_int64(size), ctypes.c_float(alpha), ctypes.c_float(beta), ctypes.c_float(k), attr))

    def shuffle_pd(self, src, dst, group_size: int, attr) -> P:
        """Along the channel axis, seen as (C / group_size, group_size), transposed."""
        return self._keep("pd", self.dnnl.new("dnnl_shuffle_forward_primitive_desc_create", self.dnnl.engine,
                                              INFERENCE, src, dst, 1, ctypes.c_int64(group_size), attr))

    def eltwise_pd(self, alg: int, src, dst, alpha: float, beta: float, attr) -> P:
        return self._keep("pd", self.dnnl.new("dnnl_eltwise_forward_primitive_desc_create", self.dnnl.engine,
                                              INFERENCE, alg, src, dst, ctypes.c_float(alpha), ctypes.c_float(beta), attr))

    def softmax_pd(self, src, dst, axis: int, attr) -> P:
        """Along ``axis``, its maximum subtracted first (oneDNN's accurate softmax)."""
        return self._keep("pd", self.dnnl.new("dnnl_softmax_forward_primitive_desc_create", self.dnnl.engine, INFERENCE,
                                              SOFTMAX_ACCURATE, src, dst, axis, attr))

    def binary_pd(self, alg: int, src0, src1, dst, attr) -> P:
        """dst = src0 (alg) src1, src1 broadcast along its axes of size 1."""
        return self._keep("pd", self.dnnl.new("dnnl_binary_primitive_desc_create", self.dnnl.engine, alg, src0, src1,
                                              dst, attr))

    def batchnorm_pd(self, src, dst, epsilon: float, flags: int, attr) -> P:
        return self._keep("pd", self.dnnl.new("dnnl_batch_normalization_forward_primitive_desc_create",
                                              self.dnnl.engine, INFERENCE, src, dst, ctypes.c_float(epsilon),
                                              ctypes.c_uint(flags), attr))

    def layernorm_pd(self, src, dst, epsilon: float, flags: int, attr) -> P:
        """Over the last axis; its statistics computed in the call (none passed)."""
        return self._keep("pd", self.dnnl.new("dnnl_layer_normalization_forward_primitive_desc_create",
                                              self.dnnl.engine, INFERENCE, src, dst, None, ctypes.c_float(epsilon),
                                              ctypes.c_uint(flags), attr))

    def reduction_pd(self, alg: int, src, dst, attr) -> P:
        """dst = the maximum (``REDUCTION_MAX``) or minimum of src over the axes where dst has size 1."""
        return self._keep("pd", self.dnnl.new("dnnl_reduction_primitive_desc_create", self.dnnl.engine, alg, src, dst,
                                              ctypes.c_float(0.0), ctypes.c_float(0.0), attr))

    def reorder_pd(self, src, dst, attr) -> P:
        e = self.dnnl.engine
        return self._keep("pd", self.dnnl.new("dnnl_reorder_primitive_desc_create", src, e, dst, e, attr))

    def primitive(self, pd) -> P:
        return self._keep("prim", self.dnnl.new("dnnl_primitive_create", pd))

    def memory(self, md, array: np.ndarray | None) -> P:
        return self._keep("mem", self.dnnl.new("dnnl_memory_create", md, self.dnnl.engine,
                                                P(None if array is None else array.ctypes.data)))


class Weights:
    """Weights reordered for their primitives, each layout once (batch sizes and workers that take
    the same one share it); their descriptors are destroyed with the last holder."""

    def __init__(self, dnnl: Dnnl):
        self.owned = Owned(dnnl)
        self.layouts: dict[int, list] = {}      # id of the plain weights -> [(md, those weights reordered)]
        weakref.finalize(self, self.owned.release)

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for done in self.layouts.values() for _, array in done)

    def take(self, pd, plain_md, w: np.ndarray) -> tuple:
        """(md, array): ``w`` (described by ``plain_md``) in the layout the primitive of ``pd`` takes."""
        dnnl = self.owned.dnnl
        want = dnnl.lib.dnnl_primitive_desc_query_md(pd, Q_WEIGHTS, 0)
        done = self.layouts.setdefault(id(w), [])
        for md, array in done:
            if dnnl.lib.dnnl_memory_desc_equal(md, want):
                return md, array
        array = aligned_empty(-(-dnnl.lib.dnnl_memory_desc_get_size(want) // 4))
        md = self.owned.clone(want)
        dnnl.run_now(self.owned, self.owned.reorder_pd(plain_md, md, self.owned.attr()), {SRC: (plain_md, w), DST: (md, array)})
        done.append((md, array))
        return md, array


_NO_ALLOCATION = "brg"     # oneDNN's implementations that allocate nothing per call (its brgemm ones)


def _matmul_pd(owned: Owned, src, dst, k: int, n: int, add) -> tuple[P, P]:
    """(pd, bias md) of oneDNN's matmul from ``src`` (rows, k) to ``dst`` (rows, n), the weights'
    layout left to oneDNN, a tensor of descriptor ``add`` (or None) added by a binary post-op."""
    b_md = owned.md((1, n), PLAIN[2])
    return owned.matmul_pd(src, owned.md((k, n), ANY), b_md, dst, owned.attr(add=add)), b_md


def _inner_product_pd(owned: Owned, src, dst, k: int, n: int, add) -> tuple[P, P]:
    """As ``_matmul_pd``, on oneDNN's inner product (weights (n, k) in its layout)."""
    b_md = owned.md((n,), PLAIN[1])
    return owned.inner_product_pd(src, owned.md((n, k), ANY), b_md, dst, owned.attr(add=add)), b_md


class _LinearPrimitive(NamedTuple):
    """A primitive a linear may run on: its descriptor, and whether it takes the weights (k, n)
    transposed."""
    pd: Callable
    transposed: bool


# Below AVX-512 oneDNN 3.2 has brgemm kernels for the inner product alone: its matmul is
# ``gemm:jit`` there, which allocates on every call
_PRIMITIVES = {"matmul": _LinearPrimitive(_matmul_pd, False),
               "inner_product": _LinearPrimitive(_inner_product_pd, True)}


@functools.lru_cache(maxsize=None)
def implementation_for(primitive: str, rows: int, k: int, n: int, residual: bool) -> str:
    """The implementation oneDNN picks here for ``linear_calls``' ``primitive`` at these sizes.
    Its brgemm kernels (``brg:avx512_core``, ``brgemm:avx2``, ...) work in the user scratchpad;
    below AVX-512 oneDNN 3.2's matmul is ``gemm:jit:f32``, which allocates its packing buffers on
    every call (17 KB at 256 rows under memray, Intel Xeon with ONEDNN_MAX_CPU_ISA=AVX2)."""
    dnnl = library()
    owned = Owned(dnnl)
    try:
        src, dst = owned.md((rows, k), PLAIN[2]), owned.md((rows, n), PLAIN[2])
        pd, _ = _PRIMITIVES[primitive].pd(owned, src, dst, k, n, dst if residual else None)
        return implementation(dnnl, pd)
    finally:
        owned.release()


def matmul_implementation(rows: int, k: int, n: int, residual: bool) -> str:
    return implementation_for("matmul", rows, k, n, residual)


def matmul_fits(gemm) -> bool:
    """Whether oneDNN's matmul runs this ``kernels.Gemm`` allocating nothing per call."""
    return matmul_implementation(gemm.rows, gemm.k, gemm.n, gemm.residual).startswith(_NO_ALLOCATION)


def inner_product_fits(gemm) -> bool:
    """Whether oneDNN's inner product runs this ``kernels.Gemm`` allocating nothing per call."""
    return implementation_for("inner_product", gemm.rows, gemm.k, gemm.n, gemm.residual).startswith(_NO_ALLOCATION)


def primitive_weights(w: np.ndarray) -> Weights:
    """What ``matmul_calls`` and ``inner_product_calls`` keep per weight matrix: its layouts."""
    return Weights(library())


def linear_calls(primitive: str, x2, y2, w, b, residual, weights: Weights) -> list:
    """y2 = x2 @ w + b (+ residual) as one call of oneDNN's ``primitive`` ("matmul" or
    "inner_product"): w in the layout the primitive picks (reordered once, kept in ``weights``),
    the residual added as each output block is written (a binary post-op), a scratchpad of its
    own. Nothing is allocated per call where the implementation is a brgemm one (``*_fits``)."""
    dnnl = weights.owned.dnnl
    owned = Owned(dnnl)
    kind = _PRIMITIVES[primitive]
    src, dst = owned.strided(x2), owned.strided(y2)
    add = None if residual is None else owned.strided(residual)
    pd, b_md = kind.pd(owned, src, dst, *w.shape, add)
    args = {SRC: (src, x2), BIAS: (b_md, b), DST: (dst, y2),
            WEIGHTS: weights.take(pd, owned.strided(w.T if kind.transposed else w), w)}
    if residual is not None:
        args[POST_OP_SRC1] = (add, residual)
    size = dnnl.lib.dnnl_memory_desc_get_size(dnnl.scratchpad_md(pd))
    (fn, call_args), _ = dnnl.call(owned, pd, args, aligned_empty(-(-size // 4)))
    weakref.finalize(call_args[3], owned.release)     # the primitive lives as long as its call
    return [(fn, call_args)]


def matmul_calls(x2, y2, w, b, b_tiled, residual, weights: Weights) -> list:
    """``linear_calls`` on oneDNN's matmul (``kernels``' signature: ``b_tiled`` unused)."""
    return linear_calls("matmul", x2, y2, w, b, residual, weights)


def inner_product_calls(x2, y2, w, b, b_tiled, residual, weights: Weights) -> list:
    """``linear_calls`` on oneDNN's inner product: brgemm kernels on AVX2 too, where the matmul
    has none (a 4 x 768 x 3072 linear on cold weights, AMD EPYC without AVX-512, two threads:
    332 us, against 674 on the matmul's allocating ``gemm:jit`` and 1073 in NumPy on one thread)."""
    return linear_calls("inner_product", x2, y2, w, b, residual, weights)


@functools.lru_cache(maxsize=None)
def library() -> Dnnl:
    """oneDNN, loaded and probed once per process; EngineUnavailable saying how to get it."""
    try:
        lib = load()
    except (ImportError, OSError) as exc:
        raise EngineUnavailable(f"the onednn engine needs oneDNN's CPU library ({exc}); "
                                "pip install -e .[onednn]") from exc
    try:
        dnnl = Dnnl(lib)
    except (DnnlError, AttributeError) as exc:
        raise EngineUnavailable(f"the onednn engine could not start oneDNN: {exc}") from exc
    openmp.pin_workers(lib)
    return dnnl

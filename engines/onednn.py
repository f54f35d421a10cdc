"""onednn: fused's steps, with a CNN's convolutions, pools, LRN, channel concats and shuffles, and
the batchnorms and ReLUs between them, run as oneDNN primitives on activations held in the
layout oneDNN's convolutions take on this CPU, and the linears on oneDNN's matmul primitive
(``kernels``' ``onednn-matmul``, ``matmul_calls``).

im2col and one GEMM per conv (``packed``) ran ResNet-50 at 1.9x ONNX Runtime's time: MKL's
GEMMs alone, at 230-320 GFLOP/s on its shapes, took longer than ONNX Runtime's whole forward,
and the im2col copies, bias, residual and ReLU passes added 18 ms to them. oneDNN's direct
convolutions (``brgconv``) on activations in their own layout ran the same layers at 280-370
GFLOP/s, with the bias, the residual sum and the activation applied as each output block is
written (post-ops); on NCHW they fell back to an im2col GEMM (docs/engines.md).

Layout ("native" below). Asked of oneDNN once per process: a probe conv with format "any", and
the layout it picks (NHWC, or ``[N][C/b][H][W][b]`` with b = 16 or 8, channels padded to b). A
tensor a oneDNN step writes stays native; any other op that reads it reads an NCHW twin written
by a reorder step, and a conv that reads an NCHW tensor reads a native twin, except a conv on
fewer channels than a block (an RGB stem), which reads NCHW itself. Twins are planned buffers.

Memory. Every primitive's scratchpad is user-managed: one buffer per engine (and worker), the
largest any of its primitives asks; weights are reordered into each primitive's layout once.
Nothing is allocated per forward. Threads: oneDNN's CPU build on GNU OpenMP (the ``onednn``
extra, ``onednn-cpu-gomp``). A linear runs on oneDNN's matmul where that allocates nothing
(``matmul_fits``), else on a one-thread kernel, so that no second pool spins beside OpenMP's;
which is measured at build time (``engines.kernels``).
"""
from __future__ import annotations

import ctypes
import functools
import weakref

import numpy as np

from .base import EngineUnavailable
from .conv import _conv_attrs, _pool_window, _split_pool
from .fused import BIND, FusedEngine, FusedStep, _Lowering
from .kernels import candidates, on_one_thread, onednn_library
from .onnx_passes import fuse_conv_activation, fuse_conv_add
from .ops import aligned_empty

# oneDNN 3.x C API enums (dnnl_types.h, dnnl_common_types.h)
_F32, _CPU, _IN_ORDER, _INFERENCE, _CONV_DIRECT = 3, 1, 1, 96, 1
_ANY, _PLAIN = 1, {1: 2, 2: 3, 4: 5, 5: 6}            # format tags any; a, ab, abcd, abcde by rank
# The activation layouts a conv may pick, as (format tag, channel block): NHWC (acdb), and
# nChw16c / nChw8c / nChw4c (aBcd16b/8b/4b: [N][C/b][H][W][b], channels padded to the block)
_LAYOUTS = ((22, 1), (78, 16), (102, 8), (84, 4))
_RELU, _CLIP = 0x20, 0x2E
_POOL_MAX, _POOL_AVG_INCLUDE, _POOL_AVG_EXCLUDE, _LRN_ACROSS = 0x1FF, 0x2FF, 0x3FF, 0xAFF
_SRC, _WEIGHTS, _BIAS, _DST, _SCRATCHPAD, _MULTIPLE_SRC = 1, 33, 41, 17, 80, 1024
_MEAN, _VARIANCE, _SCALE, _SHIFT = 49, 50, 51, 52
_GLOBAL_STATS, _USE_SCALE, _USE_SHIFT, _NORM_RELU = 0x1, 0x2, 0x4, 0x8
_POST_OP_SRC1 = 32768 | 2                               # DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1
_BINARY_ADD = 0x1FFF0
_Q_IMPL, _Q_WEIGHTS, _Q_DST, _Q_SCRATCHPAD = 8, 131, 133, 136
_USER_SCRATCHPAD = 1
_Dims = ctypes.c_int64 * 12                             # DNNL_MAX_NDIMS
_P = ctypes.c_void_p


class _Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _P)]


class DnnlError(RuntimeError):
    pass


class _Dnnl:
    """libdnnl's C API as used here: one CPU engine and stream, and the channel block."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.dnnl_primitive_desc_query_md.restype = _P
        lib.dnnl_primitive_desc_query_md.argtypes = [_P, ctypes.c_int, ctypes.c_int]
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        lib.dnnl_memory_desc_get_size.argtypes = [_P]
        lib.dnnl_memory_desc_equal.argtypes = [_P, _P]
        lib.dnnl_memory_set_data_handle.argtypes = [_P, _P]
        self.execute = lib["dnnl_primitive_execute"]      # untyped: prebuilt arguments pass through
        self.execute.errcheck = _executed
        self.engine = self.new("dnnl_engine_create", _CPU, 0)
        self.stream = self.new("dnnl_stream_create", self.engine, _IN_ORDER)
        self.layout, self.block = self._probe_layout()

    def new(self, fn: str, *args) -> _P:
        handle = _P()
        self.check(getattr(self.lib, fn)(ctypes.byref(handle), *args), fn)
        return handle

    @staticmethod
    def check(status: int, what: str) -> None:
        if status:
            raise DnnlError(f"oneDNN {what} failed (status {status})")

    def scratchpad_md(self, pd) -> _P:
        return _P(self.lib.dnnl_primitive_desc_query_md(pd, _Q_SCRATCHPAD, 0))

    def call(self, owned: "_Owned", pd, args: dict[int, tuple], scratchpad: np.ndarray | None) -> tuple[tuple, _P]:
        """The bound call ``(fn, args)`` that runs the primitive of ``pd`` on ``args`` (argument ->
        (md, array)), and its scratchpad's memory: on ``scratchpad``, or on nothing yet (its
        handle is then set before the call runs). The arrays live as long as the call."""
        mems = {arg: owned.memory(md, array) for arg, (md, array) in args.items()}
        pad = mems[_SCRATCHPAD] = owned.memory(self.scratchpad_md(pd), scratchpad)
        array = (_Arg * len(mems))(*(_Arg(arg, mem) for arg, mem in mems.items()))
        array._keep = [scratchpad, *args.values()]
        return (self.execute, (owned.primitive(pd), self.stream, len(mems), array)), pad

    def run_now(self, owned: "_Owned", pd, args: dict[int, tuple]) -> None:
        """Run the primitive of ``pd`` once, now, on a scratchpad of its own."""
        size = self.lib.dnnl_memory_desc_get_size(self.scratchpad_md(pd))
        (fn, call_args), _ = self.call(owned, pd, args, aligned_empty(-(-size // 4)))
        fn(*call_args)

    def _probe_layout(self) -> tuple[int, int]:
        """(format tag, channel block) of the layout oneDNN's conv picks here for a 3x3, 64-channel
        layer at 56 x 56 given format "any"; NCHW when it picks none of ``_LAYOUTS``."""
        owned = _Owned(self)
        dims = (1, 64, 56, 56)
        pd = owned.conv_pd(owned.md(dims, _ANY), owned.md((64, 64, 3, 3), _ANY), owned.md((64,), _PLAIN[1]),
                           owned.md(dims, _ANY), (1, 1), (0, 0), (1, 1), (1, 1), owned.attr())
        chosen = self.lib.dnnl_primitive_desc_query_md(pd, _Q_DST, 0)
        layout = next((lb for lb in _LAYOUTS if self.lib.dnnl_memory_desc_equal(chosen, owned.md(dims, lb[0]))),
                      (_PLAIN[4], 1))
        owned.release()
        return layout


def _executed(status: int, fn, args) -> int:
    """ctypes' check of every ``dnnl_primitive_execute``: a failed call raises, it is not skipped."""
    if status:
        raise DnnlError(f"oneDNN primitive execution failed (status {status})")
    return status


class _Owned:
    """oneDNN objects made for one engine, destroyed with it (``weakref.finalize``)."""

    _DESTROY = {"md": "dnnl_memory_desc_destroy", "pd": "dnnl_primitive_desc_destroy",
                "prim": "dnnl_primitive_destroy", "mem": "dnnl_memory_destroy",
                "attr": "dnnl_primitive_attr_destroy", "po": "dnnl_post_ops_destroy"}

    def __init__(self, dnnl: _Dnnl):
        self.dnnl, self.handles = dnnl, []

    def _keep(self, kind: str, handle: _P) -> _P:
        self.handles.append((self._DESTROY[kind], handle))
        return handle

    def release(self) -> None:
        while self.handles:
            fn, handle = self.handles.pop()
            getattr(self.dnnl.lib, fn)(handle)

    def md(self, dims, tag: int) -> _P:
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_with_tag", len(dims), _Dims(*dims), _F32, tag))

    def strided(self, a: np.ndarray) -> _P:
        """The descriptor of ``a`` as it lies in memory, whatever its strides."""
        return self.with_strides(a.shape, [s // a.itemsize for s in a.strides])

    def with_strides(self, dims, strides) -> _P:
        """Dimensions ``dims``, element i at sum(i_k * strides[k]) floats from the start."""
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_create_with_strides", len(dims), _Dims(*dims), _F32,
                                              _Dims(*strides)))

    def clone(self, md) -> _P:
        return self._keep("md", self.dnnl.new("dnnl_memory_desc_clone", _P(md)))

    def attr(self, sum_: bool = False, eltwise: tuple | None = None, add=None) -> _P:
        """Attributes: a user-managed scratchpad; post-ops: the residual sum (into the output), or
        the add of a tensor of descriptor ``add`` (``_POST_OP_SRC1``), then the activation."""
        d = self.dnnl
        attr = self._keep("attr", d.new("dnnl_primitive_attr_create"))
        d.check(d.lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _USER_SCRATCHPAD), "scratchpad mode")
        if sum_ or eltwise or add:
            po = self._keep("po", d.new("dnnl_post_ops_create"))
            if sum_:
                d.check(d.lib.dnnl_post_ops_append_sum(po, ctypes.c_float(1.0), 0, 0), "sum post-op")
            if add:
                d.check(d.lib.dnnl_post_ops_append_binary(po, _BINARY_ADD, add), "binary post-op")
            if eltwise:
                alg, alpha, beta = eltwise
                d.check(d.lib.dnnl_post_ops_append_eltwise(po, alg, ctypes.c_float(alpha), ctypes.c_float(beta)),
                        "eltwise post-op")
            d.check(d.lib.dnnl_primitive_attr_set_post_ops(attr, po), "post-ops")
        return attr

    def conv_pd(self, src, w, b, dst, strides, dilations, pad_l, pad_r, attr) -> _P:
        return self._keep("pd", self.dnnl.new(
            "dnnl_convolution_forward_primitive_desc_create", self.dnnl.engine, _INFERENCE, _CONV_DIRECT,
            src, w, b, dst, _Dims(*strides), _Dims(*dilations), _Dims(*pad_l), _Dims(*pad_r), attr))

    def matmul_pd(self, src, w, b, dst, attr) -> _P:
        return self._keep("pd", self.dnnl.new("dnnl_matmul_primitive_desc_create", self.dnnl.engine, src, w, b, dst, attr))

    def pool_pd(self, alg, src, dst, strides, kernel, dilations, pad_l, pad_r, attr) -> _P:
        return self._keep("pd", self.dnnl.new(
            "dnnl_pooling_forward_primitive_desc_create", self.dnnl.engine, _INFERENCE, alg, src, dst,
            _Dims(*strides), _Dims(*kernel), _Dims(*dilations), _Dims(*pad_l), _Dims(*pad_r), attr))

    def concat_pd(self, dst, srcs, attr) -> _P:
        """Along the channel axis."""
        return self._keep("pd", self.dnnl.new("dnnl_concat_primitive_desc_create", self.dnnl.engine, dst, len(srcs), 1,
                                              (_P * len(srcs))(*srcs), attr))

    def lrn_pd(self, src, dst, size: int, alpha: float, beta: float, k: float, attr) -> _P:
        """Across channels: dst = src / (k + alpha / size · sum of src² over the window)^beta."""
        return self._keep("pd", self.dnnl.new(
            "dnnl_lrn_forward_primitive_desc_create", self.dnnl.engine, _INFERENCE, _LRN_ACROSS, src, dst,
            ctypes.c_int64(size), ctypes.c_float(alpha), ctypes.c_float(beta), ctypes.c_float(k), attr))

    def shuffle_pd(self, src, dst, group_size: int, attr) -> _P:
        """Along the channel axis, seen as (C / group_size, group_size), transposed."""
        return self._keep("pd", self.dnnl.new("dnnl_shuffle_forward_primitive_desc_create", self.dnnl.engine,
                                              _INFERENCE, src, dst, 1, ctypes.c_int64(group_size), attr))

    def eltwise_pd(self, alg: int, src, dst, alpha: float, beta: float, attr) -> _P:
        return self._keep("pd", self.dnnl.new("dnnl_eltwise_forward_primitive_desc_create", self.dnnl.engine,
                                              _INFERENCE, alg, src, dst, ctypes.c_float(alpha), ctypes.c_float(beta), attr))

    def batchnorm_pd(self, src, dst, epsilon: float, flags: int, attr) -> _P:
        return self._keep("pd", self.dnnl.new("dnnl_batch_normalization_forward_primitive_desc_create",
                                              self.dnnl.engine, _INFERENCE, src, dst, ctypes.c_float(epsilon),
                                              ctypes.c_uint(flags), attr))

    def reorder_pd(self, src, dst, attr) -> _P:
        e = self.dnnl.engine
        return self._keep("pd", self.dnnl.new("dnnl_reorder_primitive_desc_create", src, e, dst, e, attr))

    def primitive(self, pd) -> _P:
        return self._keep("prim", self.dnnl.new("dnnl_primitive_create", pd))

    def memory(self, md, array: np.ndarray | None) -> _P:
        return self._keep("mem", self.dnnl.new("dnnl_memory_create", md, self.dnnl.engine,
                                                _P(None if array is None else array.ctypes.data)))


class _Weights:
    """Weights reordered for their primitives, each layout once (batch sizes and workers that take
    the same one share it); their descriptors are destroyed with the last holder."""

    def __init__(self, dnnl: _Dnnl):
        self.owned = _Owned(dnnl)
        self.layouts: dict[int, list] = {}      # id of the plain weights -> [(md, those weights reordered)]
        weakref.finalize(self, self.owned.release)

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for done in self.layouts.values() for _, array in done)

    def take(self, pd, plain_md, w: np.ndarray) -> tuple:
        """(md, array): ``w`` (described by ``plain_md``) in the layout the primitive of ``pd`` takes."""
        dnnl = self.owned.dnnl
        want = dnnl.lib.dnnl_primitive_desc_query_md(pd, _Q_WEIGHTS, 0)
        done = self.layouts.setdefault(id(w), [])
        for md, array in done:
            if dnnl.lib.dnnl_memory_desc_equal(md, want):
                return md, array
        array = aligned_empty(-(-dnnl.lib.dnnl_memory_desc_get_size(want) // 4))
        md = self.owned.clone(want)
        dnnl.run_now(self.owned, self.owned.reorder_pd(plain_md, md, self.owned.attr()), {_SRC: (plain_md, w), _DST: (md, array)})
        done.append((md, array))
        return md, array


_NO_ALLOCATION = "brg"     # oneDNN's matmul implementations that allocate nothing per call


def _matmul_pd(owned: _Owned, src, dst, k: int, n: int, add) -> tuple[_P, _P]:
    """(pd, bias md) of oneDNN's matmul from ``src`` (rows, k) to ``dst`` (rows, n), the weights'
    layout left to oneDNN, a tensor of descriptor ``add`` (or None) added by a binary post-op."""
    b_md = owned.md((1, n), _PLAIN[2])
    return owned.matmul_pd(src, owned.md((k, n), _ANY), b_md, dst, owned.attr(add=add)), b_md


@functools.lru_cache(maxsize=None)
def matmul_implementation(rows: int, k: int, n: int, residual: bool) -> str:
    """The implementation oneDNN picks here for ``matmul_calls``' primitive at these sizes. Its
    brgemm kernels (``brg:avx512_core``, ...) work in the user scratchpad; below AVX-512 oneDNN 3.2
    picks ``gemm:jit:f32``, which allocates its packing buffers on every call (17 KB at 256 rows
    under memray, Intel Xeon with ONEDNN_MAX_CPU_ISA=AVX2)."""
    dnnl = library()
    owned = _Owned(dnnl)
    try:
        src, dst = owned.md((rows, k), _PLAIN[2]), owned.md((rows, n), _PLAIN[2])
        pd, _ = _matmul_pd(owned, src, dst, k, n, dst if residual else None)
        impl = ctypes.c_char_p()
        dnnl.check(dnnl.lib.dnnl_primitive_desc_query(pd, _Q_IMPL, 0, ctypes.byref(impl)), "implementation query")
        return impl.value.decode()
    finally:
        owned.release()


def matmul_fits(gemm) -> bool:
    """Whether oneDNN's matmul runs this ``kernels.Gemm`` allocating nothing per call."""
    return matmul_implementation(gemm.rows, gemm.k, gemm.n, gemm.residual).startswith(_NO_ALLOCATION)


def matmul_weights(w: np.ndarray) -> _Weights:
    """What ``matmul_calls`` keeps per weight matrix: its layouts."""
    return _Weights(library())


def matmul_calls(x2, y2, w, b, b_tiled, residual, weights: _Weights) -> list:
    """y2 = x2 @ w + b (+ residual) as one call of oneDNN's matmul primitive: w in the layout
    the primitive picks (reordered once, kept in ``weights``), the residual added as each output
    block is written (a binary post-op), a scratchpad of its own. Nothing is allocated per call.
    ``kernels``' signature: the bias is in the primitive, ``b_tiled`` unused."""
    dnnl = weights.owned.dnnl
    owned = _Owned(dnnl)
    src, dst = owned.strided(x2), owned.strided(y2)
    add = None if residual is None else owned.strided(residual)
    pd, b_md = _matmul_pd(owned, src, dst, *w.shape, add)
    args = {_SRC: (src, x2), _BIAS: (b_md, b), _DST: (dst, y2), _WEIGHTS: weights.take(pd, owned.strided(w), w)}
    if residual is not None:
        args[_POST_OP_SRC1] = (add, residual)
    size = dnnl.lib.dnnl_memory_desc_get_size(dnnl.scratchpad_md(pd))
    (fn, call_args), _ = dnnl.call(owned, pd, args, aligned_empty(-(-size // 4)))
    weakref.finalize(call_args[3], owned.release)     # the primitive lives as long as its call
    return [(fn, call_args)]


_DNNL: list = []


def library() -> _Dnnl:
    """oneDNN, loaded and probed once per process."""
    if not _DNNL:
        lib = onednn_library()
        if lib is None:
            raise EngineUnavailable("the onednn engine needs oneDNN's CPU library; pip install -e .[onednn]")
        try:
            _DNNL.append(_Dnnl(lib))
        except (DnnlError, AttributeError) as exc:
            raise EngineUnavailable(f"the onednn engine could not start oneDNN: {exc}") from exc
    return _DNNL[0]


class OneDnnEngine(FusedEngine):
    name = "onednn"
    # The linears on oneDNN's matmul, on the OpenMP pool that runs the convolutions, or on one
    # thread: a second pool (OpenBLAS's, MKL's) alternating with OpenMP's waits on its spinning
    # workers (engines.kernels)
    kernel_candidates = candidates("onednn-primitives")

    def __init__(self, model, max_batch: int):
        self._dnnl = library()
        self._channels: dict[str, int] = {}      # native buffer -> the tensor's channels
        self._twins: dict[tuple[str, bool], str] = {}   # (tensor, native) -> its buffer in that layout
        self._weights = _Weights(self._dnnl)     # shared with workers
        # oneDNN's conv takes a residual sum and an activation after any conv (engines.conv's
        # conv_add only after a 1x1 one): ShuffleNet's grouped 1x1 convs then their Sum and ReLU
        model = fuse_conv_activation(fuse_conv_add(model, fusable=lambda channels, attrs: True))
        super().__init__(model, max_batch)

    def _default_kernel(self, gemm) -> str:
        """Without tuning: oneDNN's matmul, where it allocates nothing per call; else SciPy's
        gemm on one thread (SciPy is fused's own requirement)."""
        return "onednn-matmul" if matmul_fits(gemm) else "scipy-1t"

    # NumPy's products (attention's per-head products, layernorm's and softmax's matvecs, an op's
    # own matmuls) on one OpenBLAS thread: on NumPy's two-thread pool they alternated with
    # OpenMP's and waited on its spinning workers
    def _matvec_call(self, x, col, out):
        return on_one_thread("numpy-threads", [super()._matvec_call(x, col, out)])[0]

    def _batched_matmul_calls(self, a, b, out) -> list:
        return on_one_thread("numpy-threads", super()._batched_matmul_calls(a, b, out))

    def _matmul_calls(self, a, b, out) -> list:
        return on_one_thread("numpy-threads", super()._matmul_calls(a, b, out))

    # --- lowering: which tensors are native, and the reorders between layouts --------------

    def _lower_op(self, lw, i: int, op) -> None:
        """oneDNN's steps where the op has them; else fused's, on NCHW inputs. The model's output
        in NCHW."""
        lower = _LOWER_DNNL.get(op.kind)
        if lower is None or not lower(self, lw, i, op):
            for reader in lw.ops[i:i + 2]:                 # the op, and a next op it may take in
                for t in reader.inputs:
                    if t in lw.where:
                        lw.where[t] = self._layout(lw, t, native=False)
            super()._lower_op(lw, i, op)
        elif op.output == lw.model.output:
            lw.where[op.output] = self._layout(lw, op.output, native=False)

    def _native_shape(self, shape) -> tuple[int, ...]:
        b = self._dnnl.block
        return (-(-shape[0] // b) * b, *shape[1:])

    def _new_native(self, name: str, shape) -> str:
        buffer = self._buffer(name, self._native_shape(shape))
        self._channels[buffer] = shape[0]
        return buffer

    def _layout(self, lw, tensor: str, native: bool) -> str:
        """The buffer holding ``tensor`` in the layout asked: where it is, or its twin, written by a
        reorder step the first time one is asked."""
        buffer = lw.where[tensor]
        if (buffer in self._channels) == native:
            return buffer
        if (tensor, native) not in self._twins:
            shape = lw.model.shapes[tensor]
            twin = (self._new_native(tensor + ".dnnl", shape) if native
                    else self._buffer(tensor + ".nchw", shape))
            self._twins[tensor, native], self._twins[tensor, not native] = twin, buffer
            lw.steps.append(FusedStep("dnnl_reorder", twin, (buffer,)))
        return self._twins[tensor, native]

    def _md(self, buffer: str, batch: int) -> _P:
        if buffer in self._channels:
            shape = (self._channels[buffer], *self.shapes[buffer][1:])
            return self._owned.md((batch, *shape), self._dnnl.layout)
        return self._owned.md((batch, *self.shapes[buffer]), _PLAIN[len(self.shapes[buffer]) + 1])

    def report(self) -> dict:
        """fused's report, with the activation layout and, per primitive, the implementation
        oneDNN chose on this CPU (``brgconv:avx512_core``, ``jit:avx2``, ...; ``ref`` is its
        slow reference code)."""
        layout = {_PLAIN[4]: "NCHW", 22: "NHWC"}.get(self._dnnl.layout, f"nChw{self._dnnl.block}c")
        return {**super().report(), "layout": layout, "primitives": list(self._primitives)}

    # --- binding ---------------------------------------------------------------------------

    def _own_memory(self) -> None:
        super()._own_memory()
        self._owned = _Owned(self._dnnl)             # this engine's (or worker's) primitives
        weakref.finalize(self, self._owned.release)
        self._scratchpad = aligned_empty(0)
        self._scratchpad_mems: list[tuple[_P, int]] = []   # (memory, bytes) of this engine's primitives
        self._primitives: list[dict] = []

    def _bind(self, batch: int):
        self._primitives = [p for p in self._primitives if p["batch"] != batch]
        bound = super()._bind(batch)
        need = max((n for _, n in self._scratchpad_mems), default=0)
        if need > self._scratchpad.nbytes:
            self._scratchpad = aligned_empty(-(-need // 4))
        for mem, _ in self._scratchpad_mems:
            self._dnnl.check(self._dnnl.lib.dnnl_memory_set_data_handle(mem, _P(self._scratchpad.ctypes.data)),
                             "scratchpad handle")
        return bound

    def _execute(self, pd, args: dict[int, tuple], step) -> tuple:
        """The call that runs the primitive of ``pd`` on ``args`` (argument -> (md, array)), its
        scratchpad on the engine's. The implementation oneDNN chose goes into ``report()``."""
        lib = self._dnnl.lib
        impl = ctypes.c_char_p()
        self._dnnl.check(lib.dnnl_primitive_desc_query(pd, _Q_IMPL, 0, ctypes.byref(impl)), "implementation query")
        batch = next(iter(args.values()))[1].shape[0]
        self._primitives.append({"step": step.out, "kind": step.kind.removeprefix("dnnl_"), "batch": batch,
                                 "implementation": impl.value.decode()})
        call, pad = self._dnnl.call(self._owned, pd, args, None)
        self._scratchpad_mems.append((pad, lib.dnnl_memory_desc_get_size(self._dnnl.scratchpad_md(pd))))
        return call


# --- lowering entries: True when the op became oneDNN steps -----------------------------------

def _activation(attrs) -> tuple | None:
    act = attrs.get("activation", "none")
    if act == "relu":
        return (_RELU, 0.0, 0.0)
    if act == "clip":
        return (_CLIP, float(attrs.get("clip_min", -np.inf)), float(attrs.get("clip_max", np.inf)))
    return None


def _lower_conv(eng: OneDnnEngine, lw: _Lowering, i: int, op) -> bool:
    """conv, conv_add (the residual summed into the output by a post-op: in the residual's own
    buffer when this is its last reader) and conv_maxpool (the conv into a native scratch, then the pool)."""
    shapes = lw.model.shapes
    channels = shapes[op.inputs[0]][0]
    conv, pool = _split_pool(op.attrs) if op.kind == "conv_maxpool" else (dict(op.attrs), None)
    src = eng._layout(lw, op.inputs[0], native=channels >= eng._dnnl.block)
    w, b = (lw.model.params[p] for p in op.params)
    w32 = np.ascontiguousarray(w, dtype=np.float32)
    b32 = np.ascontiguousarray(b, dtype=np.float32)
    reads, scratch, residual = [src], (), None
    out_shape = shapes[op.output]
    if op.kind == "conv_add":
        residual = op.inputs[1]
        reads.append(eng._layout(lw, residual, native=True))
    if residual is not None and lw.readers[residual][-1] == i and residual != lw.model.input:
        out = lw.where[op.output] = reads[1]               # summed in place: the residual's last read
    else:
        out = lw.where[op.output] = eng._new_native(op.output, out_shape)
    if pool is not None:
        win = _conv_attrs(conv)[0]
        scratch = (eng._new_native(op.output + ".conv", (w.shape[0], *win.out_size(*shapes[op.inputs[0]][1:]))),)
    attrs = {"conv": conv, "pool": pool, "residual": residual is not None}
    lw.steps.append(FusedStep("dnnl_conv", out, tuple(reads), scratch, (w32, b32), attrs))
    return True


def _lower_pool(eng: OneDnnEngine, lw: _Lowering, i: int, op) -> bool:
    """A max or average pool, or an LRN, of a tensor in oneDNN's layout; of an NCHW one it stays
    the ``engines.conv`` op, as does an average pool that counts pads in ceil_mode (oneDNN would
    count the overhang too) and an LRN of even size (its window is not centred)."""
    src = lw.where[op.inputs[0]]
    if src not in eng._channels:
        return False
    attrs = dict(op.attrs)
    if op.kind == "averagepool" and attrs.get("count_include_pad") and attrs.get("ceil_mode"):
        return False
    if op.kind == "lrn" and attrs["size"] % 2 == 0:
        return False
    out = lw.where[op.output] = eng._new_native(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_pool", out, (src,), attrs={"kind": op.kind, **attrs}))
    return True


def _lower_concat(eng: OneDnnEngine, lw: _Lowering, i: int, op) -> bool:
    """A channel concat of tensors all in oneDNN's layout (a fire or inception module's branches)."""
    srcs = [lw.where[t] for t in op.inputs]
    if op.attrs.get("axis") != 0 or set(op.attrs.get("order", "")) != {"t"} or not all(b in eng._channels for b in srcs):
        return False
    out = lw.where[op.output] = eng._new_native(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_concat", out, tuple(srcs)))
    return True


def _lower_shuffle(eng: OneDnnEngine, lw: _Lowering, i: int, op) -> bool:
    """A channel shuffle of a tensor in oneDNN's layout: Reshape (C, H, W) -> (g, C/g, H, W),
    Transpose (1, 0, 2, 3), Reshape back (ShuffleNet's), each read only by the next."""
    src = lw.where[op.inputs[0]]
    if src not in eng._channels or i + 2 >= len(lw.ops):
        return False
    t, back = lw.ops[i + 1], lw.ops[i + 2]
    shapes = lw.model.shapes
    chw, grouped = shapes[op.inputs[0]], shapes[op.output]
    if not (t.kind == "transpose" and back.kind == "reshape" and lw.next_reader(op) is t and lw.next_reader(t) is back
            and tuple(t.attrs.get("perm", ())) == (1, 0, 2, 3) and len(chw) == 3 and len(grouped) == 4
            and grouped[0] * grouped[1] == chw[0] and tuple(grouped[2:]) == tuple(chw[1:]) and shapes[back.output] == chw):
        return False
    lw.skip.update((i + 1, i + 2))
    out = lw.where[back.output] = eng._new_native(back.output, chw)
    lw.steps.append(FusedStep("dnnl_shuffle", out, (src,), attrs={"group_size": grouped[1]}))
    return True


def _lower_batchnorm(eng: OneDnnEngine, lw: _Lowering, i: int, op) -> bool:
    """A batchnorm (one no conv took in: after a concat, DenseNet's) of a tensor in oneDNN's
    layout, and the ReLU right after it that alone reads it, as one primitive."""
    src = lw.where[op.inputs[0]]
    if src not in eng._channels:
        return False
    nxt = lw.next_reader(op)
    relu = nxt is not None and nxt.kind == "relu" and i + 1 < len(lw.ops) and lw.ops[i + 1] is nxt
    if relu:
        lw.skip.add(i + 1)
    out = lw.where[(nxt if relu else op).output] = eng._new_native(op.output, lw.model.shapes[op.output])
    stats = tuple(np.ascontiguousarray(lw.model.params[p], dtype=np.float32) for p in op.params)
    lw.steps.append(FusedStep("dnnl_batchnorm", out, (src,), operands=stats,
                              attrs={"epsilon": float(op.attrs.get("epsilon", 1e-5)), "relu": relu}))
    return True


def _lower_relu(eng: OneDnnEngine, lw: _Lowering, i: int, op) -> bool:
    """A ReLU of a tensor in oneDNN's layout (one no conv took in: after a concat)."""
    src = lw.where[op.inputs[0]]
    if src not in eng._channels:
        return False
    out = lw.where[op.output] = eng._new_native(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_relu", out, (src,)))
    return True


_LOWER_DNNL = {"conv": _lower_conv, "conv_add": _lower_conv, "conv_maxpool": _lower_conv,
               "maxpool": _lower_pool, "averagepool": _lower_pool, "lrn": _lower_pool, "concat": _lower_concat,
               "reshape": _lower_shuffle, "relu": _lower_relu, "batchnorm": _lower_batchnorm}


# --- binding entries -----------------------------------------------------------------------

def _pool_call(eng: OneDnnEngine, step, attrs, src_md, src: np.ndarray, dst_md, dst: np.ndarray, hw) -> tuple:
    kind = attrs.pop("kind", "maxpool")
    include = bool(attrs.pop("count_include_pad", 0))
    win = _pool_window(attrs)
    alg = _POOL_MAX if kind == "maxpool" else (_POOL_AVG_INCLUDE if include else _POOL_AVG_EXCLUDE)
    o = eng._owned
    # oneDNN floors the output size: the right pads grown to reach a ceil_mode window
    pd = o.pool_pd(alg, src_md, dst_md, win.strides, win.kernel, tuple(d - 1 for d in win.dilations),
                   win.pads[:2], win.end_pads(*hw), o.attr())
    return eng._execute(pd, {_SRC: (src_md, src), _DST: (dst_md, dst)}, step)


def _bind_conv(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    batch, attrs, o = y.shape[0], step.attrs, eng._owned
    w, b = step.operands
    win, group, _ = _conv_attrs(attrs["conv"])
    hw = ins[0].shape[-2:]
    out_ch = w.shape[0]
    pooled = attrs["pool"] is not None                         # the conv into the scratch, then the pool
    dst_buffer, dst = (step.scratch[0], scratch[0]) if pooled else (step.out, y)
    dst_md = eng._md(dst_buffer, batch)
    src_md = eng._md(step.reads[0], batch)
    w_dims = (group, out_ch // group, *w.shape[1:]) if group > 1 else w.shape
    w_plain = o.md(w_dims, _PLAIN[len(w_dims)])
    b_md = o.md((out_ch,), _PLAIN[1])
    pd = o.conv_pd(src_md, o.md(w_dims, _ANY), b_md, dst_md, win.strides, tuple(d - 1 for d in win.dilations),
                   win.pads[:2], win.end_pads(*hw), o.attr(attrs["residual"], _activation(attrs["conv"])))
    w_md, w_native = eng._weights.take(pd, w_plain, w)
    calls = []
    if attrs["residual"] and step.reads[1] != step.out:       # the residual, copied into the output first
        calls.append((np.copyto, (y, ins[1])))
    calls.append(eng._execute(pd, {_SRC: (src_md, ins[0]), _WEIGHTS: (w_md, w_native), _BIAS: (b_md, b),
                                   _DST: (dst_md, dst)}, step))
    if pooled:
        calls.append(_pool_call(eng, step, dict(attrs["pool"]), dst_md, dst, eng._md(step.out, batch), y,
                                win.out_size(*hw)))
    return calls


def _one_input(eng: OneDnnEngine, step, y, ins, make_pd, src=None, dst=None, more=None) -> list:
    """The call of a primitive from the step's one input to its output: ``make_pd(owned, src md,
    dst md)``; the descriptors are the buffers' own unless given, ``more`` other arguments."""
    batch, o = y.shape[0], eng._owned
    src = eng._md(step.reads[0], batch) if src is None else src
    dst = eng._md(step.out, batch) if dst is None else dst
    return [eng._execute(make_pd(o, src, dst), {_SRC: (src, ins[0]), _DST: (dst, y), **(more or {})}, step)]


def _bind_pool(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    attrs = dict(step.attrs)
    if attrs["kind"] == "lrn":
        return _one_input(eng, step, y, ins, lambda o, src, dst: o.lrn_pd(
            src, dst, int(attrs["size"]), float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)),
            float(attrs.get("bias", 1.0)), o.attr()))
    batch = y.shape[0]
    return [_pool_call(eng, step, attrs, eng._md(step.reads[0], batch), ins[0], eng._md(step.out, batch), y,
                       ins[0].shape[-2:])]


def _reorder_pd(o: _Owned, src, dst) -> _P:
    return o.reorder_pd(src, dst, o.attr())


def _bind_reorder(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    return _one_input(eng, step, y, ins, _reorder_pd)


def _bind_concat(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    batch = y.shape[0]
    srcs = [eng._md(b, batch) for b in step.reads]
    dst = eng._md(step.out, batch)
    pd = eng._owned.concat_pd(dst, srcs, eng._owned.attr())
    return [eng._execute(pd, {_DST: (dst, y), **{_MULTIPLE_SRC + i: (md, x) for i, (md, x) in enumerate(zip(srcs, ins))}}, step)]


def _bind_shuffle(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """oneDNN's shuffle primitive on a blocked layout; on NHWC, where it has only its reference
    code, a reorder between two strided views of the pixels' channels: source channel i·m + j
    goes to j·g + i (m = C/g, the group size)."""
    m = step.attrs["group_size"]
    if eng._dnnl.block == 1:
        c, h, w = eng.shapes[step.out]
        g, o = c // m, eng._owned
        dims, outer = (y.shape[0], m, g, h, w), (h * w * c, w * c, c)    # NHWC strides of n, then h, w
        src = o.with_strides(dims, (outer[0], 1, m, *outer[1:]))
        dst = o.with_strides(dims, (outer[0], g, 1, *outer[1:]))
        return _one_input(eng, step, y, ins, _reorder_pd, src, dst)
    # oneDNN sees the channels as (C / G, G) and transposes them: ONNX's (g, C/g) is G = C/g
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.shuffle_pd(src, dst, m, o.attr()))


def _bind_relu(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.eltwise_pd(_RELU, src, dst, 0.0, 0.0, o.attr()))


def _bind_batchnorm(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    scale, bias, mean, var = step.operands
    flags = _GLOBAL_STATS | _USE_SCALE | _USE_SHIFT | (_NORM_RELU if step.attrs["relu"] else 0)
    per_channel = eng._owned.md(scale.shape, _PLAIN[1])
    stats = {_MEAN: (per_channel, mean), _VARIANCE: (per_channel, var), _SCALE: (per_channel, scale),
             _SHIFT: (per_channel, bias)}
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.batchnorm_pd(src, dst, step.attrs["epsilon"], flags,
                                                                            o.attr()), more=stats)


OneDnnEngine.binders = {**BIND, "dnnl_conv": _bind_conv, "dnnl_pool": _bind_pool, "dnnl_reorder": _bind_reorder,
                        "dnnl_concat": _bind_concat, "dnnl_shuffle": _bind_shuffle, "dnnl_relu": _bind_relu,
                        "dnnl_batchnorm": _bind_batchnorm}

"""onednn: fused's steps, with a CNN's convolutions, pools, LRN, channel concats, slices and shuffles, and
the batchnorms and ReLUs between them, run as oneDNN primitives on activations held in the
layout oneDNN's convolutions take on this CPU, and the linears on oneDNN's matmul or inner product
primitive (``kernels``' ``onednn-matmul`` and ``onednn-ip``), where measured fastest.

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
extra, ``onednn-cpu-gomp``). A linear runs on oneDNN's matmul or inner product where that
allocates nothing (``matmul_fits``, ``inner_product_fits``: below AVX-512 only the inner product
does), on MKL's GEMMs on the same pool, or on a one-thread kernel, so that no second pool spins
beside OpenMP's; which is measured at build time (``engines.kernels``).
"""
from __future__ import annotations

import functools
import math
import time
import weakref

import numpy as np

from ..ir.calls import rows2d
from ..ir.conv import activation_of, conv_attrs, pool_window, split_pool
from ..ir.ops import head_columns, mean_column, mean_square_calls, qkv_heads, sample_index
from ..importer.passes import fuse_conv_activation, fuse_conv_add, fuse_conv_fake_quant
from ..kernels import candidates, on_one_thread, pool_threads, tuning_enabled
from ..kernels.choice import confirmed_fastest, gaining_rival
from ..kernels.table import KERNELS, one_thread, run_calls
from ..kernels.timing import PARK_S, measure_forwards
from ..errors import EngineUnavailable
from ..memory import aligned_empty
from ..native import mkl, openmp
from ..native.onednn import (ANY, BIAS, BINARY_ADD, BINARY_DIV, BINARY_MAX, BINARY_MUL, BINARY_SUB, CLIP, DST, GELU_ERF, GELU_TANH,
                             GLOBAL_STATS, HARDSIGMOID, HARDSWISH, LOGISTIC, MEAN,
                             LINEAR, MULTIPLE_SRC, NORM_RELU, Owned, P, PLAIN, POOL_AVG_EXCLUDE, POOL_AVG_INCLUDE, POOL_MAX,
                             POST_OP_SRC1, BinaryPostOp,
                             RELU, ROUND, SCALE, SHIFT, SRC, SRC_1, SWISH, USE_SCALE, USE_SHIFT, VARIANCE, WEIGHTS,
                             Weights,
                             avx512, implementation, library, matmul_fits, post_op_arg)
from .compiled import seeded
from .fused import BIND, FusedEngine, FusedStep, Lowering


# A forward shorter than this is also timed with OpenMP at one thread, and runs so unless the pool
# is KEEP_DEFAULT faster: between two primitives the Python of the next call outlasts the workers'
# spin, so each primitive pays their wake-up. MobileNetV3-small exported at 64x64, batch 1: 0.905 ms
# on the two-thread pool, 0.655 ms on one (Intel Xeon; ONNX Runtime 0.53 ms). Longer forwards
# would cost their timing more than any wake-up they pay.
ONE_THREAD_FORWARD_S = 0.02
# A scalar op that no chain follows runs as oneDNN's chain step from this many values a sample,
# NumPy's one pass below. A lone x * 0.5 at b1 (AMD EPYC, the whole forward timed): 10.9 us on
# either at 4 Ki values, 39.0 against 29.1 us at 16 Ki, 548 against 319 us at 256 Ki. A quantized
# file's GELU divides by sqrt 2 a tensor that erf and the product both read: Swin-T's QDQ file ran
# 1.05x faster at b8 and 1.06x at b1 so (interleaved); float Swin-T (its query scale) 1.01x.
LONE_SCALAR_MIN = 1 << 14

# oneDNN's concat builds its argument list on the heap at every execution and frees it before it
# returns: 384 B + 32 B an argument (measured under memray, 17 to 21 arguments; DenseNet-121's
# concats of 25 tensors, 1,248 B). Not an array: it is added to the memory pass's slack.
CONCAT_BYTES, CONCAT_ARG_BYTES = 384, 32

# Multiply-adds from which a linear is offered MKL's GEMMs on the pool (``offered_kernels``)
MKL_POOL_MIN_WORK = 1 << 24
# Multiply-adds from which a batched product (attention's) runs on MKL's strided batch on the pool
# where oneDNN's matmul has no brgemm kernel (``batched_matmul_calls``). AMD EPYC without AVX-512,
# against NumPy on one thread: 1.5-2.1x at 8 heads x 64-128 tokens (1-34 M), 0.44x at 8 samples x
# 4 heads x 16 tokens (0.13 M: a pool's wake-up per sample)
MKL_BATCH_MIN_WORK = 1 << 19

# Attention runs in blocks of query rows whose scores, for the whole batch, take at most this
# many bytes (``_lower_attention``); a block is at least ATTENTION_MIN_ROWS rows, a multiple of
# them. Blocks of one core's L2 (1 MiB) ran 0.90-0.98x the whole scores at seq 512-1024 (more,
# smaller products); 8 MiB ran level with them, in a quarter of the AMD EPYC's L3
# (docs/results/2026-11-26-amd-epyc-attention-blocks.md).
ATTENTION_BLOCK_BYTES = 8 << 20
ATTENTION_MIN_ROWS = 16


class OneDnnEngine(FusedEngine):
    name = "onednn"
    # The linears on oneDNN's matmul or MKL's GEMMs (where the mkl extra is installed), both on
    # the OpenMP pool that runs the convolutions, or on one thread: a second pool (OpenBLAS's)
    # alternating with OpenMP's waits on its spinning workers (engines.kernels)
    kernel_candidates = candidates("onednn-primitives", "mkl")
    openmp_pool = True

    def __init__(self, model, max_batch: int):
        self.dnnl = library()
        self._channels: dict[str, int] = {}      # native buffer -> the tensor's channels
        self._twins: dict[tuple[str, bool], str] = {}   # (tensor, native) -> its buffer in that layout
        self._heads: dict[str, str] = {}        # qkv buffer -> its head-major copy (``_lower_attn_scores``)
        self.weights = Weights(self.dnnl)       # shared with workers
        # oneDNN's conv takes a residual sum and an activation after any conv (engines.ir.conv's
        # conv_add only after a 1x1 one): ShuffleNet's grouped 1x1 convs then their Sum and ReLU
        # and then a quantized file's quantization step of its output, as eltwise post-ops
        model = fuse_conv_activation(fuse_conv_add(model, fusable=lambda channels, attrs: True), tuple(ELTWISE))
        model = fuse_conv_fake_quant(model)
        self.forward_threads: dict[int, dict] = {}   # batch -> how its forward runs (shared with workers)
        super().__init__(model, max_batch)

    @functools.cached_property
    def vector_math(self):
        """MKL, if installed, for an erf that stays an op of its own (between a quantized file's
        steps; ``FusedEngine.op_calls``) and large batched products (``batched_matmul_calls``):
        loaded when such a step is bound, not for every engine."""
        try:
            return mkl.load()
        except EngineUnavailable:
            return None

    @property
    def peak_slack_bytes(self) -> int:
        args = [len(step.reads) + 2 for step in self.steps if step.kind == "dnnl_concat"]   # + dst, scratchpad
        return FusedEngine.peak_slack_bytes + (CONCAT_BYTES + CONCAT_ARG_BYTES * max(args) if args else 0)

    def offered_kernels(self, gemm) -> tuple[str, ...]:
        """MKL's GEMMs on the pool only from ``MKL_POOL_MIN_WORK`` multiply-adds: they matter where
        oneDNN's matmul allocates (AVX2 alone: its gemm:jit) and the linears would otherwise run on
        one thread (AMD EPYC 7003, in one process: ConvNeXt-T b8 0.57x -> 0.86x ONNX Runtime,
        Swin-T b1 0.59x -> 0.81x); offered on every product there, the tiny transformers ran 5-15 %
        slower (docs/importing.md)."""
        offered = super().offered_kernels(gemm)
        if gemm.work >= MKL_POOL_MIN_WORK:
            return offered
        return tuple(k for k in offered if KERNELS[k].library != "mkl" or KERNELS[k].one_thread)

    def default_kernel(self, gemm) -> str:
        """Without tuning: oneDNN's matmul, where it allocates nothing per call; else SciPy's
        gemm on one thread (SciPy is fused's own requirement)."""
        return "onednn-matmul" if matmul_fits(gemm) else "scipy-1t"

    # NumPy's products (attention's per-head products, layernorm's and softmax's matvecs, an op's
    # own matmuls) on one OpenBLAS thread: on NumPy's two-thread pool they alternated with
    # OpenMP's and waited on its spinning workers
    def matvec_call(self, x, col, out):
        return on_one_thread("numpy-threads", [super().matvec_call(x, col, out)])[0]

    def batched_matmul_calls(self, a, b, out) -> list:
        """Where oneDNN's matmul has no brgemm kernel (AVX2 alone) and MKL is installed, a (batch,
        heads) stack of products of ``MKL_BATCH_MIN_WORK`` multiply-adds or more on MKL's batch on
        the OpenMP pool; else (other ranks, broadcast operands) NumPy's on one thread."""
        stacked = a.ndim == b.ndim == out.ndim == 4 and a.shape[:2] == b.shape[:2] == out.shape[:2]
        large = stacked and math.prod(out.shape) * a.shape[-1] >= MKL_BATCH_MIN_WORK
        calls = mkl.batched_calls(self.vector_math, a, b, out) if large and self.vector_math else None
        return calls or on_one_thread("numpy-threads", super().batched_matmul_calls(a, b, out))

    def matmul_calls(self, a, b, out) -> list:
        """An op's own products (the ``attention`` kind's, grouped per key/value head) as the
        batched ones: MKL's batch where it takes them, else NumPy's on one thread."""
        return self.batched_matmul_calls(a, b, out)

    def bind_judged(self, batch: int):
        """The forward at ``batch`` with its linears judged (``BoundEngine``), then on OpenMP's pool
        or, unless the pool ran its own warm forward faster, all of it with OpenMP at one thread
        (``ONE_THREAD_FORWARD_S``; measured once per batch size and process, after PARK_S idle;
        ``gaining_rival``)."""
        bound = super().bind_judged(batch)
        if batch not in self.forward_threads:
            bound, linears = self._judge_pool_twins(batch, bound)
            self.forward_threads[batch] = {**self._judge_threads(batch, bound), **linears}
            if self.forward_threads[batch]["threads"] != 1:
                self._bound[batch] = bound
        elif self.forward_threads[batch]["threads"] == 1 and self.forward_threads[batch]["pool"] > 1:
            self._one_thread_bound(batch)
        return self._bound[batch]

    def _one_thread_bound(self, batch: int):
        """The forward at ``batch`` bound with OpenMP at one thread, run so: oneDNN sizes a
        primitive's work for the threads there are when it is made, and asks for as many."""
        with one_thread("openmp-threads"):
            bound = self.bind(batch)
        calls = [call for call in bound.calls if call[0] is not openmp.keep_aside]    # no worker to keep off
        self._bound[batch] = bound._replace(calls=tuple(on_one_thread("openmp-threads", calls)))
        return self._bound[batch]

    def _judge_pool_twins(self, batch: int, bound) -> tuple:
        """The forward at ``batch`` with every linear that runs on one thread moved to its kernel
        on the pool (``Linears.pool_twins``), where that whole forward ran KEEP_DEFAULT faster in
        two timings (``confirmed_fastest``); else as chosen. Each linear judged alone or among
        one-thread neighbours pays the workers' wake-up; all on the pool, they stay awake between
        them (LeViT 1.22-1.51x faster, AMD EPYC AVX2; docs/kernels.md, "Together on the pool").
        Returns the bound forward and what was judged."""
        twins = self.linears.pool_twins() if tuning_enabled() else {}
        if not twins:
            return bound, {}
        with self.linears.lock:
            variants = {"as chosen": seeded(bound)}
            self.linears.forced.update(twins)
            on_pool = self.bind(batch)
            variants["on the pool"] = seeded(on_pool)
            best, timings = confirmed_fastest(lambda: measure_forwards(variants), "as chosen")
            if best == "on the pool":
                bound = on_pool
            else:                   # bound again: a bind keeps (and reports) only its own primitives
                for key in twins:
                    del self.linears.forced[key]
                self.linears.drop_unused()
                bound = self.bind(batch)
        return bound, {"linears_on_the_pool": sorted(twins) if best == "on the pool" else [],
                       "linears_forward_us": [{n: t * 1e6 for n, t in times.items()} for times in timings]}

    def _judge_threads(self, batch: int, bound) -> dict:
        try:
            pool = pool_threads("openmp-threads")
        except RuntimeError as exc:
            return {"threads": None, "pool": None, "how": f"OpenMP's threads unknown: {exc}"}
        if pool == 1 or not tuning_enabled():
            return {"threads": pool, "pool": pool, "how": "one-thread pool" if pool == 1 else "default"}
        forward = seeded(bound)
        run_calls(forward)
        t0 = time.perf_counter()
        run_calls(forward)
        once = time.perf_counter() - t0
        if once > ONE_THREAD_FORWARD_S:
            return {"threads": pool, "pool": pool, "how": f"a {once * 1e3:.0f} ms forward: on the pool"}
        variants = {"pool": forward, "one thread": seeded(self._one_thread_bound(batch))}
        time.sleep(PARK_S)                   # another engine's pool, warmed just before, parks first
        # the pool where it pays for itself in one of up to four spread timings; a tie runs on one thread
        best, timings = gaining_rival(lambda: measure_forwards(variants), "one thread", "pool")
        return {"threads": 1 if best == "one thread" else pool, "pool": pool, "how": "measured in the forward",
                "forward_us": [{name: t * 1e6 for name, t in times.items()} for times in timings]}

    # --- lowering: which tensors are native, and the reorders between layouts --------------

    def lower_op(self, lw, i: int, op) -> None:
        """oneDNN's steps where the op has them; else fused's, on NCHW inputs. The model's output
        in NCHW."""
        lower = _LOWER_DNNL.get(op.kind)
        if lower is None or not lower(lw, i, op):
            for reader in lw.ops[i:i + 2]:                 # the op, and a next op it may take in
                for t in reader.inputs:
                    if t in lw.where:
                        lw.where[t] = self.layout(lw, t, native=False)
            super().lower_op(lw, i, op)
        elif op.output == lw.model.output:
            lw.where[op.output] = self.layout(lw, op.output, native=False)

    def _native_shape(self, shape) -> tuple[int, ...]:
        b = self.dnnl.block
        return (-(-shape[0] // b) * b, *shape[1:])

    def new_native(self, lw: Lowering, name: str, shape, base: str | None = None) -> str:
        """A new buffer for a (C, H, W) tensor in oneDNN's layout, channels padded to its block
        (``base``: the bytes of that buffer, ``Lowering.alias``)."""
        native = self._native_shape(shape)
        buffer = lw.buffer(name, native) if base is None else lw.alias(name, native, base)
        self._channels[buffer] = shape[0]
        return buffer

    def channels_of(self, buffer: str) -> int:
        """The channels of the tensor a native buffer holds (its buffer pads them to a block)."""
        return self._channels[buffer]

    def is_native(self, buffer: str) -> bool:
        """Whether ``buffer`` holds its tensor in oneDNN's layout."""
        return buffer in self._channels

    def layout(self, lw, tensor: str, native: bool) -> str:
        """The buffer holding ``tensor`` in the layout asked: where it is, or its twin, written by a
        reorder step the first time one is asked; where both layouts put the same bytes in the same
        order (one pixel, whole channel blocks: a global pool's output before the classifier), the
        twin is the buffer itself read the other way, and nothing is copied."""
        buffer = lw.where[tensor]
        if (buffer in self._channels) == native:
            return buffer
        if (tensor, native) not in self._twins:
            shape = lw.model.shapes[tensor]
            if len(shape) == 3 and shape[1:] == (1, 1) and shape[0] % self.dnnl.block == 0:     # the same bytes
                twin = (self.new_native(lw, tensor + ".dnnl", shape, buffer) if native
                        else lw.alias(tensor + ".nchw", shape, buffer))
            else:
                twin = self.new_native(lw, tensor + ".dnnl", shape) if native else lw.buffer(tensor + ".nchw", shape)
                lw.steps.append(FusedStep("dnnl_reorder", twin, (buffer,)))
            self._twins[tensor, native], self._twins[tensor, not native] = twin, buffer
        return self._twins[tensor, native]

    def md(self, buffer: str, batch: int) -> P:
        """oneDNN's memory descriptor of ``buffer`` at ``batch``, in the layout it is held in."""
        if buffer in self._channels:
            shape = (self._channels[buffer], *self.shapes[buffer][1:])
            return self.owned.md((batch, *shape), self.dnnl.layout)
        return self.owned.md((batch, *self.shapes[buffer]), PLAIN[len(self.shapes[buffer]) + 1])

    def kernel_copies_bytes(self) -> int:
        """The linears' copies, and the weights reordered for the convolutions and other primitives."""
        weights = getattr(self, "weights", None)
        return super().kernel_copies_bytes() + (0 if weights is None else weights.nbytes)

    def report(self) -> dict:
        """fused's report, with the activation layout and, per primitive, the implementation
        oneDNN chose on this CPU (``brgconv:avx512_core``, ``jit:avx2``, ...; ``ref`` is its
        slow reference code)."""
        layout = {PLAIN[4]: "NCHW", 22: "NHWC"}.get(self.dnnl.layout, f"nChw{self.dnnl.block}c")
        return {**super().report(), "layout": layout, "primitives": list(self._primitives),
                "forward_threads": {str(b): dict(v) for b, v in self.forward_threads.items()}}

    # --- binding ---------------------------------------------------------------------------

    def own_memory(self) -> None:
        super().own_memory()
        self.owned = Owned(self.dnnl)             # this engine's (or worker's) primitives
        weakref.finalize(self, self.owned.release)
        self._scratchpad = aligned_empty(0)
        self._scratchpad_mems: list[tuple[P, int]] = []   # (memory, bytes) of this engine's primitives
        self._first_runs: list[tuple] = []                 # checked calls of the primitives being bound
        self._primitives: list[dict] = []
        self._binding = 0                                  # the batch being bound

    def bind(self, batch: int):
        """fused's ``bind``, then every primitive bound run once with its status checked (a failed
        one raises here), the forward's calls unchecked."""
        self._primitives = [p for p in self._primitives if p["batch"] != batch]
        self._first_runs.clear()
        self._binding = batch                      # what ``execute`` records: views hide it
        bound = super().bind(batch)
        need = max((n for _, n in self._scratchpad_mems), default=0)
        if need > self._scratchpad.nbytes:
            self._scratchpad = aligned_empty(-(-need // 4))
        for mem, _ in self._scratchpad_mems:
            self.dnnl.check(self.dnnl.lib.dnnl_memory_set_data_handle(mem, P(self._scratchpad.ctypes.data)),
                             "scratchpad handle")
        run_calls(self._first_runs)
        self._first_runs.clear()
        return bound

    def execute(self, pd, args: dict[int, tuple], step) -> tuple:
        """The call that runs the primitive of ``pd`` on ``args`` (argument -> (md, array)), its
        scratchpad on the engine's, its status unchecked (``bind`` checks its first run). The
        implementation oneDNN chose goes into ``report()``."""
        lib = self.dnnl.lib
        self._primitives.append({"step": step.out, "kind": step.kind.removeprefix("dnnl_"), "batch": self._binding,
                                 "implementation": implementation(self.dnnl, pd)})
        call, pad = self.dnnl.call(self.owned, pd, args, None)
        self._scratchpad_mems.append((pad, lib.dnnl_memory_desc_get_size(self.dnnl.scratchpad_md(pd))))
        self._first_runs.append(call)
        return self.dnnl.run, call[1]


# --- lowering entries: True when the op became oneDNN steps -----------------------------------

# The activations oneDNN runs as an eltwise primitive or a conv's post-op: (algorithm, alpha, beta)
# from the conv-style activation attributes (``ir.conv.activation_of``)
ELTWISE = {
    "relu": lambda a: (RELU, 0.0, 0.0),
    "clip": lambda a: (CLIP, float(a.get("clip_min", -np.inf)), float(a.get("clip_max", np.inf))),
    "hardswish": lambda a: (HARDSWISH, 1.0 / 6.0, 0.5),
    "hardsigmoid": lambda a: (HARDSIGMOID, a["act_alpha"], a["act_beta"]),
    "sigmoid": lambda a: (LOGISTIC, 0.0, 0.0),
    "silu": lambda a: (SWISH, 1.0, 0.0),                  # x · sigmoid(alpha x)
    "gelu": lambda a: (GELU_TANH, 0.0, 0.0),
    "gelu_erf": lambda a: (GELU_ERF, 0.0, 0.0),
}
# Row-wise ops oneDNN runs on plain (batch, ...) buffers too, in one pass where NumPy takes several:
# a transformer's GELU (8 NumPy passes, 60 us of a 780 us forward at b1 d256 s64, one thread),
# attention's softmax (44 us), and the gated activations: MobileNetV3's hardswish between its
# classifier's linears (5 NumPy calls) ran the b1 forward 1.04x faster as one primitive (AMD EPYC)
PLAIN_DNNL = ("gelu", "gelu_erf", "softmax", "hardswish", "hardsigmoid", "sigmoid", "silu")


def fake_quant_chain(scale: float, zero_point: int, lo: int, hi: int) -> tuple:
    """A static quantization step (``ir.ops``' ``fake_quant``) as oneDNN eltwise ops: x / scale
    (times its inverse), rounded half to even, clipped to [lo, hi] less the zero point, times scale;
    as ONNX Runtime quantizes, round(x / s) + zp saturated, then dequantizes."""
    return ((LINEAR, 1.0 / scale, 0.0), (ROUND, 0.0, 0.0), (CLIP, float(lo - zero_point), float(hi - zero_point)),
            (LINEAR, scale, 0.0))


def eltwises(attrs) -> tuple:
    """A step's eltwise post-ops from its conv-style attributes: the activation (``ELTWISE``),
    then a quantization step it took in (``fuse_conv_fake_quant``)."""
    act = attrs.get("activation", "none")
    chain = () if act == "none" else (ELTWISE[act](attrs),)
    fq = attrs.get("fake_quant")
    return chain + (fake_quant_chain(**fq) if fq else ())


def _lower_conv(lw: Lowering, i: int, op) -> bool:
    """conv, conv_add (the residual summed into the output by a post-op: in the residual's own
    buffer when this is its last reader) and conv_maxpool (the conv into a native scratch, then the pool)."""
    eng = lw.engine
    shapes = lw.model.shapes
    channels = shapes[op.inputs[0]][0]
    conv, pool = split_pool(op.attrs) if op.kind == "conv_maxpool" else (dict(op.attrs), None)
    src = eng.layout(lw, op.inputs[0], native=channels >= eng.dnnl.block)
    w, b = (lw.model.params[p] for p in op.params)
    w32 = np.ascontiguousarray(w, dtype=np.float32)
    b32 = np.ascontiguousarray(b, dtype=np.float32)
    reads, scratch, residual = [src], (), None
    out_shape = shapes[op.output]
    if op.kind == "conv_add":
        residual = op.inputs[1]
        reads.append(eng.layout(lw, residual, native=True))
    if residual is not None and lw.readers[residual][-1] == i and residual != lw.model.input:
        out = lw.where[op.output] = reads[1]               # summed in place: the residual's last read
    else:
        out = lw.where[op.output] = eng.new_native(lw, op.output, out_shape)
    if pool is not None:
        win = conv_attrs(conv)[0]
        scratch = (eng.new_native(lw, op.output + ".conv", (w.shape[0], *win.out_size(*shapes[op.inputs[0]][1:]))),)
    attrs = {"conv": conv, "pool": pool, "residual": residual is not None}
    lw.steps.append(FusedStep("dnnl_conv", out, tuple(reads), scratch, (w32, b32), attrs))
    return True


def _lower_pool(lw: Lowering, i: int, op) -> bool:
    """A max or average pool, or an LRN, as oneDNN's primitive in its layout. An NCHW input
    (PoolFormer's pools read a group norm's output) is reordered to it first: on NCHW oneDNN has
    only its scalar ``simple_nchw`` pool, and NumPy's makes one pass per window tap (PoolFormer
    1.37-1.65x faster than on NumPy's passes, 1.17-1.39x than on ``simple_nchw``; AMD EPYC AVX2,
    docs/importing.md). An average pool that counts pads in ceil_mode (oneDNN would
    count the overhang too) and an LRN of even size (its window is not centred) stay that op."""
    eng = lw.engine
    attrs = dict(op.attrs)
    if op.kind == "averagepool" and attrs.get("count_include_pad") and attrs.get("ceil_mode"):
        return False
    if op.kind == "lrn" and attrs["size"] % 2 == 0:
        return False
    src = eng.layout(lw, op.inputs[0], native=True)
    chain, last = _following_eltwises(lw, i) if op.kind != "lrn" else ((), op)
    out = lw.where[last.output] = eng.new_native(lw, last.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_pool", out, (src,), attrs={"kind": op.kind, **attrs, "eltwises": chain}))
    return True


def _lower_concat(lw: Lowering, i: int, op) -> bool:
    """A channel concat of tensors all in oneDNN's layout (a fire or inception module's branches)."""
    eng = lw.engine
    srcs = [lw.where[t] for t in op.inputs]
    if op.attrs.get("axis") != 0 or set(op.attrs.get("order", "")) != {"t"} or not all(map(eng.is_native, srcs)):
        return False
    out = lw.where[op.output] = eng.new_native(lw, op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_concat", out, tuple(srcs)))
    return True


def _lower_shuffle(lw: Lowering, i: int, op) -> bool:
    """A channel shuffle of a tensor in oneDNN's layout: Reshape (C, H, W) -> (g, C/g, H, W),
    Transpose (1, 0, 2, 3), Reshape back (ShuffleNet's), each read only by the next."""
    eng = lw.engine
    src = lw.where[op.inputs[0]]
    if not eng.is_native(src) or i + 2 >= len(lw.ops):
        return False
    t, back = lw.ops[i + 1], lw.ops[i + 2]
    shapes = lw.model.shapes
    chw, grouped = shapes[op.inputs[0]], shapes[op.output]
    if not (t.kind == "transpose" and back.kind == "reshape" and lw.next_reader(op) is t and lw.next_reader(t) is back
            and tuple(t.attrs.get("perm", ())) == (1, 0, 2, 3) and len(chw) == 3 and len(grouped) == 4
            and grouped[0] * grouped[1] == chw[0] and tuple(grouped[2:]) == tuple(chw[1:]) and shapes[back.output] == chw):
        return False
    lw.skip.update((i + 1, i + 2))
    out = lw.where[back.output] = eng.new_native(lw, back.output, chw)
    lw.steps.append(FusedStep("dnnl_shuffle", out, (src,), attrs={"group_size": grouped[1]}))
    return True


def _lower_slice(lw: Lowering, i: int, op) -> bool:
    """A channel range of a tensor in oneDNN's layout (ShuffleNet v2's split in two), the rest of
    each axis whole: a reorder of that part of it into a buffer of its own, in the same layout. On
    a blocked layout only from a multiple of the block (oneDNN takes no part of a block)."""
    eng = lw.engine
    src = lw.where[op.inputs[0]]
    index = op.attrs.get("index", ())
    shape = lw.model.shapes[op.inputs[0]]
    if not eng.is_native(src):
        return _lower_slice_transposed(lw, op)
    if len(index) != 3 or len(shape) != 3:
        return False
    (start, stop, step), *rest = index
    whole = all(tuple(r) == (0, n, 1) for r, n in zip(rest, shape[1:]))
    if step != 1 or not whole or not 0 <= start < stop <= shape[0] or start % eng.dnnl.block:
        return False
    out = lw.where[op.output] = eng.new_native(lw, op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_slice", out, (src,), attrs={"start": start, "channels": stop - start}))
    return True


def _lower_slice_transposed(lw: Lowering, op) -> bool:
    """A part of a plain tensor that a transpose alone reads (Swin's q, k and v taken out of the
    (windows, tokens, 3, heads, dim) projection, each then moved heads first): one reorder from
    the input read through the part and the permutation (``dnnl_transpose`` with its ``index``),
    where NumPy's copy and a reorder made two passes."""
    move = lw.next_reader(op)
    if move is None or move.kind != "transpose" or any(not isinstance(e, int) and e[2] < 1 for e in op.attrs["index"]):
        return False                    # (oneDNN takes no negative stride)
    lw.skip.add(lw.readers[op.output][0])
    out = lw.where[move.output] = lw.buffer(move.output, lw.model.shapes[move.output])
    lw.steps.append(FusedStep("dnnl_transpose", out, (lw.where[op.inputs[0]],),
                              attrs={"perm": tuple(move.attrs["perm"]), "index": op.attrs["index"]}))
    return True


def _lower_batchnorm(lw: Lowering, i: int, op) -> bool:
    """A batchnorm (one no conv took in: after a concat, DenseNet's) of a tensor in oneDNN's
    layout, and the ReLU right after it that alone reads it, as one primitive."""
    eng = lw.engine
    src = lw.where[op.inputs[0]]
    if not eng.is_native(src):
        return False
    nxt = lw.next_reader(op)
    relu = nxt is not None and nxt.kind == "relu" and i + 1 < len(lw.ops) and lw.ops[i + 1] is nxt
    if relu:
        lw.skip.add(i + 1)
    out = lw.where[(nxt if relu else op).output] = eng.new_native(lw, op.output, lw.model.shapes[op.output])
    stats = tuple(np.ascontiguousarray(lw.model.params[p], dtype=np.float32) for p in op.params)
    lw.steps.append(FusedStep("dnnl_batchnorm", out, (src,), operands=stats,
                              attrs={"epsilon": float(op.attrs.get("epsilon", 1e-5)), "relu": relu}))
    return True


def _lower_layernorm(lw: Lowering, i: int, op) -> bool:
    """A layernorm over a plain tensor's last axis: oneDNN's layer normalization, one call where
    NumPy's took 9-12 (GPT-2's exports, b8: 30 us each, 3.4 with oneDNN; AMD EPYC 7003). Where a
    linear alone reads it, gamma and beta fold into that linear as fused folds them and the
    primitive standardizes only; else they are its scale and shift (ConvNeXt's channels-last
    blocks between a quantized file's steps)."""
    src, nxt = lw.where[op.inputs[0]], lw.next_reader(op)
    if lw.engine.is_native(src) or len(lw.model.shapes[op.output]) > 4:
        return False
    gamma_beta = tuple(np.ascontiguousarray(lw.model.params[p], dtype=np.float32) for p in op.params)
    if nxt is not None and nxt.kind == "linear":
        lw.folded_ln[op.output], gamma_beta = gamma_beta, ()
        out = lw.output(op.output, lw.model.shapes[op.output])
    else:
        out = lw.where[op.output] = _output(lw, op, src, False)
    lw.steps.append(FusedStep("dnnl_layernorm", out, (src,), operands=gamma_beta, attrs={"eps": float(op.attrs["eps"])}))
    return True


def _lower_rmsnorm(lw: Lowering, i: int, op) -> bool:
    """An rmsnorm of a plain tensor: the row means of its squares on NumPy (a product, then a
    matvec on one thread), then oneDNN's layer normalization given them as the variance and a
    mean of zeros (``GLOBAL_STATS``), gamma its scale: three calls where NumPy's took eight.
    oneDNN 3.2 has no RMS flag, and its lp-norm reduction, which would square and sum in one
    call, runs its reference code."""
    src = lw.where[op.inputs[0]]
    if lw.engine.is_native(src) or len(lw.model.shapes[op.output]) > 4:
        return False
    gamma = np.ascontiguousarray(lw.model.params[op.params[0]], dtype=np.float32).reshape(-1)
    scratch = lw.row_scratch(op)
    out = lw.where[op.output] = _output(lw, op, src, False)
    lw.steps.append(FusedStep("dnnl_rmsnorm", out, (src,), scratch, (gamma, mean_column(gamma.size)),
                              {"eps": float(op.attrs["eps"])}))
    return True


def _lower_eltwise(lw: Lowering, i: int, op) -> bool:
    """An activation (``ELTWISE``) of a tensor in oneDNN's layout that no conv took in (after a
    concat, a residual sum, a squeeze-excite scale), or a GELU of a plain one; in place where
    nothing else reads its input. Followed by more activations or quantize steps (a QDQ file's
    sigmoid of SiLU), all of them as one binary primitive's post-ops: oneDNN's eltwise primitive
    with post-ops is its reference code."""
    eng = lw.engine
    src = lw.where[op.inputs[0]]
    native = eng.is_native(src)
    if not native and op.kind not in PLAIN_DNNL:
        return False
    attrs = activation_of(op.kind, op.attrs) or {"activation": op.kind}      # a GELU is no conv's activation
    if native:              # with the activations and quantize steps after it: one jit binary, max(x, x)
        chain, last = _following_eltwises(lw, i, eltwises(attrs), source=op.inputs[0])
        if last is not op:
            _chain_step(lw, op, src, last, chain)
            return True
    out = lw.where[op.output] = _output(lw, op, src, native)
    lw.steps.append(FusedStep("dnnl_eltwise", out, (src,), attrs=attrs))
    return True


def _lower_fake_quant(lw: Lowering, i: int, op) -> bool:
    """A static quantization step (a quantized file's QDQ pair) that no conv took in (after a
    residual sum, a pool, the input's reorder, a channels-last op): one oneDNN primitive running
    ``fake_quant_chain``, in oneDNN's layout (where NumPy would take the tensor out of it and
    back), or on a plain buffer."""
    src = lw.where[op.inputs[0]]
    if op.attrs.get("scale") is None or len(lw.model.shapes[op.output]) > 4:
        return False
    # On a plain buffer too: one pass where NumPy's five took 25 us for 64 x 16 x 16 (a ConvNeXt
    # block's channels-last steps)
    chain, last = _following_eltwises(lw, i, fake_quant_chain(**op.attrs))
    _chain_step(lw, op, src, last, chain)
    return True


def _scalar_linear(op) -> tuple | None:
    """x + c, x - c, c - x, x · c or x / c (a ``binary`` op with a scalar) as oneDNN's linear
    eltwise (alpha x + beta); None for another op or c / x. x / c becomes x · (1/c), which may
    differ from it by an ulp (GELU's x / sqrt 2 between a quantized file's steps)."""
    c = op.attrs.get("scalar") if op.kind == "binary" and len(op.inputs) == 1 and not op.params else None
    if c is None:
        return None
    c, swap = float(c), bool(op.attrs.get("swap"))
    alpha_beta = {"add": (1.0, c), "mul": (c, 0.0), "sub": (-1.0, c) if swap else (1.0, -c),
                  "div": None if swap or c == 0 else (1.0 / c, 0.0)}.get(op.attrs.get("fn"))
    return None if alpha_beta is None else (LINEAR, *alpha_beta)


def _lower_scalar(lw: Lowering, i: int, op) -> bool:
    """A scalar op followed by activations, quantize steps or more scalar ops (a quantized file's
    GELU: x / sqrt 2, then x + 1, x · 0.5, each before a quantize step): one chain step of their
    post-ops (``_chain_step``); alone, NumPy's one pass below ``LONE_SCALAR_MIN`` values a
    sample, the chain step (on the pool) from there."""
    src = lw.where[op.inputs[0]]
    linear = _scalar_linear(op)
    if linear is None or len(lw.model.shapes[op.output]) > 4:
        return False
    chain, last = _following_eltwises(lw, i, (linear,))
    if last is op and math.prod(lw.model.shapes[op.output]) < LONE_SCALAR_MIN:
        return False
    _chain_step(lw, op, src, last, chain)
    return True


def _chain_step(lw: Lowering, op, src: str, last, chain: tuple) -> None:
    """Eltwise post-ops ``chain`` of ``op``'s input ``src`` into ``last``'s output as one step: a
    binary max(x, x) taking them, as oneDNN's eltwise primitive with post-ops is its reference code
    (``ref:any``, 50 us a call) and its binary one takes them in its jit kernel. The output: in
    oneDNN's layout out of place (int8 may have it write 8-bit integers, ``planned.int8``), else
    in place where ``op`` alone reads ``src`` and nothing followed it, else a new plain buffer."""
    shape = lw.model.shapes[last.output]
    out = lw.engine.new_native(lw, last.output, shape) if lw.engine.is_native(src) else \
        _output(lw, op, src, False) if last is op else lw.buffer(last.output, shape)
    lw.where[last.output] = out
    lw.steps.append(FusedStep("dnnl_binary", out, (src, src), attrs={"alg": BINARY_MAX, "eltwises": chain}))


def _following_eltwises(lw: Lowering, i: int, chain: tuple = (), source: str | None = None) -> tuple[tuple, object]:
    """The activations (``ELTWISE``), static quantization steps and scalar ops (``_scalar_linear``)
    after op i, each the only reader of the one before (wherever it lies in the order: each
    reads nothing else, so it may run earlier), the model's output not among them: ``chain``
    with their post-ops appended, and the last op taken (op i where none); they are lowered into
    op i's primitive (``lw.skip``). Not GELU's tanh form without AVX-512: oneDNN 3.2's own
    gelu_tanh post-op after int8's 512 x 1024 product (transformer d256, b8) took 1.46 ms where the
    product's 512 x 768 twin without it took 0.10 (AVX2 AMD EPYC); there it is its own step
    (``_gelu_tanh_calls``). ``source``: op i's input, where a product by it may follow
    (``_times_source``)."""
    return _following(lw, i, chain, binaries=False, source=source)


def following_post_ops(lw: Lowering, i: int) -> tuple[tuple, object]:
    """``_following_eltwises`` of op i, on through binary ops with a constant along the last axis
    (a quantized file's bias Add between the quantize steps after its MatMul): their post-ops in
    order, the binary ones as ``BinaryPostOp``, and the last op taken (op i where none)."""
    return _following(lw, i, (), binaries=True)


def _following(lw: Lowering, i: int, chain: tuple, binaries: bool, source: str | None = None) -> tuple[tuple, object]:
    op = lw.ops[i]
    while (nxt := lw.next_reader(op)) is not None and nxt.output != lw.model.output:   # that one goes out in NCHW
        if nxt.kind in ELTWISE:
            post_op = ELTWISE[nxt.kind](activation_of(nxt.kind, nxt.attrs))
            if post_op[0] == GELU_TANH and not avx512(lw.engine.dnnl):
                break               # its own step, ``_gelu_tanh_calls`` (above)
            chain += (post_op,)
        elif nxt.kind == "fake_quant" and nxt.attrs.get("scale") is not None:
            chain += fake_quant_chain(**nxt.attrs)
        elif (linear := _scalar_linear(nxt)) is not None:
            chain += (linear,)
        elif binaries and (binary := _constant_binary(lw, nxt)) is not None:
            chain += (binary,)
        elif _times_source(lw, op, nxt, source):
            chain += (BinaryPostOp(BINARY_MUL, SOURCE),)
        else:
            break
        lw.skip.add(lw.readers[op.output][0])
        op = nxt
    return chain, op


def _constant_binary(lw: Lowering, op) -> BinaryPostOp | None:
    """``op`` as a post-op where it adds a constant along its output's last axis to its one
    input, or multiplies that by it."""
    alg = {"add": BINARY_ADD, "mul": BINARY_MUL}.get(op.attrs.get("fn")) if op.kind == "binary" else None
    shape = lw.model.shapes[op.output]
    if alg is None or (len(op.inputs), len(op.params), op.attrs.get("width")) != (1, 1, shape[-1]):
        return None
    const = lw.model.params[op.params[0]]
    return BinaryPostOp(alg, np.ascontiguousarray(const, np.float32)) if const.shape == shape[-1:] else None


# A binary post-op's second operand that is the step's own first source (``_times_source``)
SOURCE = "source"


def _times_source(lw: Lowering, op, nxt, source: str | None) -> bool:
    """Whether ``nxt`` multiplies ``op``'s output by ``source``, the chain's own input, of its
    shape: SiLU's x · sigmoid(x) in a quantized file, where the sigmoid's quantize step keeps it
    from the import's ``silu``. As a post-op on x, the product is one binary call less per SiLU
    (EfficientNet-B0: 49 of its 140 binary calls at b1)."""
    return (source is not None and nxt.kind == "binary" and nxt.attrs.get("fn") == "mul" and not nxt.params
            and sorted(nxt.inputs) == sorted((op.output, source)) and op.output != source
            and lw.model.shapes[source] == lw.model.shapes[nxt.output])


def with_source(chain: tuple, md: P, x: np.ndarray) -> tuple[tuple, dict]:
    """``chain`` with each post-op on the step's own source (``SOURCE``) given that source's
    descriptor ``md``, and their execution arguments (``x``)."""
    ours = [at for at, op in enumerate(chain) if isinstance(op, BinaryPostOp) and op.operand is SOURCE]
    return (tuple(BinaryPostOp(op.alg, md) if at in ours else op for at, op in enumerate(chain)),
            {post_op_arg(at): (md, x) for at in ours})


def constant_md(owned: Owned, const: np.ndarray, ndim: int) -> P:
    """The descriptor of a constant over the trailing axes of an ``ndim``-axis tensor, broadcast
    along the leading ones."""
    return owned.md((1,) * (ndim - const.ndim) + const.shape, PLAIN[ndim])


def bound_post_ops(owned: Owned, chain: tuple, first: int, ndim: int) -> tuple[tuple, dict]:
    """``chain`` as ``Owned.post_ops`` takes it, each ``BinaryPostOp``'s constant described
    (``constant_md``), and the execution arguments of those constants; ``first``: the chain's
    first place among the primitive's post-ops."""
    bound, args = [], {}
    for at, op in enumerate(chain, first):
        if isinstance(op, BinaryPostOp):
            md = constant_md(owned, op.operand, ndim)
            args[post_op_arg(at)] = (md, op.operand)
            op = BinaryPostOp(op.alg, md)
        bound.append(op)
    return tuple(bound), args


def chain_calls(eng: OneDnnEngine, step, y: np.ndarray, chain: tuple, x: np.ndarray | None = None) -> list:
    """``chain`` (``following_post_ops``) applied to ``x`` into ``y``, or to ``y`` in place:
    oneDNN's binary max(x, x) taking it as post-ops, as ``_chain_step``'s steps run."""
    x = y if x is None else x
    src, dst = eng.owned.strided(x), eng.owned.strided(y)
    bound, args = bound_post_ops(eng.owned, chain, 0, y.ndim)
    pd = eng.owned.binary_pd(BINARY_MAX, src, src, dst, eng.owned.attr(eltwises=bound))
    return [eng.execute(pd, {SRC: (src, x), SRC_1: (src, x), DST: (dst, y), **args}, step)]


def _output(lw: Lowering, op, src: str, native: bool) -> str:
    if lw.in_place(op):
        return src
    return (lw.engine.new_native(lw, op.output, lw.model.shapes[op.output]) if native
            else lw.buffer(op.output, lw.model.shapes[op.output]))


def _lower_softmax(lw: Lowering, i: int, op) -> bool:
    """A softmax along the last axis of a plain buffer (attention's): oneDNN's, in one pass."""
    src = lw.where[op.inputs[0]]
    if lw.engine.is_native(src) or len(lw.model.shapes[op.output]) > 4:
        return False
    out = lw.where[op.output] = _output(lw, op, src, False)
    lw.steps.append(FusedStep("dnnl_softmax", out, (src,)))
    return True


def _only_reader(lw: Lowering, i: int, kind: str):
    """Op i + 1 when it is of ``kind`` and the only reader of op i's output."""
    if i + 1 >= len(lw.ops) or lw.ops[i + 1].kind != kind:
        return None
    nxt = lw.ops[i + 1]
    alone = lw.next_reader(lw.ops[i]) is nxt and len(lw.readers[lw.ops[i].output]) == 1
    return nxt if alone and nxt.output != lw.model.output else None


def _global_mean(lw: Lowering, i: int, op, src: str, hw) -> bool:
    """A global average pool of a native tensor (``op``: its last op, at index i), as oneDNN's pool
    over the whole plane."""
    chain, last = _following_eltwises(lw, i)
    out = lw.where[last.output] = lw.engine.new_native(lw, last.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_pool", out, (src,), attrs={"kind": "averagepool", "kernel_shape": tuple(hw),
                                                               "eltwises": chain}))
    return True


def _lower_global_pool(lw: Lowering, i: int, op) -> bool:
    src = lw.where[op.inputs[0]]
    if op.kind != "globalaveragepool" or not lw.engine.is_native(src):
        return False
    return _global_mean(lw, i, op, src, lw.model.shapes[op.inputs[0]][1:])


def _lower_rows_mean(lw: Lowering, i: int, op) -> bool:
    """Reshape (C, H, W) -> (C, H·W), the rows' mean, reshape -> (C, 1, 1), each read only by the
    next (the dynamo exporter's squeeze-excite pooling): one global average pool."""
    src = lw.where[op.inputs[0]]
    mean = _only_reader(lw, i, "reduce_mean")
    back = mean is not None and _only_reader(lw, i + 1, "reshape")
    shapes = lw.model.shapes
    chw = shapes[op.inputs[0]]
    if not (back and lw.engine.is_native(src) and len(chw) == 3 and shapes[op.output] == (chw[0], chw[1] * chw[2])
            and shapes[mean.output] == (chw[0], 1) and shapes[back.output] == (chw[0], 1, 1)):
        return False
    lw.skip.update((i + 1, i + 2))
    return _global_mean(lw, i + 2, back, src, chw[1:])


# oneDNN's binary algorithms for the IR's ``add`` and ``binary`` of two activations
BINARY_ALGS = {"add": BINARY_ADD, "mul": BINARY_MUL, "sub": BINARY_SUB, "div": BINARY_DIV}
SUM_KINDS = ("add", "sum")      # the IR's sums of activations: ONNX's Add of two, and its Sum


def binary_of_activations(shapes: dict, op) -> bool:
    """Whether ``op`` combines two (C, H, W) activations of its output's shape and no constant:
    what ``_lower_binary`` makes oneDNN's binary primitive, where one of them is in its layout."""
    return not op.params and op.attrs.get("scalar") is None and op.attrs.get("width") is None and \
        len(op.inputs) == 2 and all(len(shapes[t]) == 3 and shapes[t] == shapes[op.output] for t in op.inputs)


def _lower_binary(lw: Lowering, i: int, op) -> bool:
    """A sum (``add``, or a ``sum`` of two: ONNX's Sum), difference, product or quotient of two
    (C, H, W) activations, one in oneDNN's layout (a residual no conv took in, SiLU's x · sigmoid(x)):
    oneDNN's binary primitive, both in its layout; on plain rows, ``_lower_plain_binary``'s. A
    broadcast gate is ``_lower_channel_scale``'s."""
    eng, shapes = lw.engine, lw.model.shapes
    if op.attrs.get("scalar") is not None:
        return _lower_scalar(lw, i, op)
    alg = BINARY_ALGS.get("add" if op.kind in SUM_KINDS else op.attrs.get("fn"))
    if alg is None:
        return False
    if not binary_of_activations(shapes, op) or not any(eng.is_native(lw.where[t]) for t in op.inputs):
        return _lower_plain_binary(lw, i, op, alg)
    reads = tuple(eng.layout(lw, t, native=True) for t in op.inputs)
    chain, last = _following_eltwises(lw, i)
    out = lw.where[last.output] = eng.new_native(lw, last.output, shapes[op.output])
    lw.steps.append(FusedStep("dnnl_binary", out, reads, attrs={"alg": alg, "eltwises": chain}))
    return True


def _lower_plain_binary(lw: Lowering, i: int, op, alg: int) -> bool:
    """A product, quotient or difference of two plain activations of the output's shape, or a
    plain activation and a constant along its trailing axes (a bias, a layer scale, Swin's
    relative position bias over heads x window x window), with the eltwise ops after it (a
    quantized file's steps between ConvNeXt's channels-last linears): oneDNN's binary
    primitive, the constant broadcast along the leading axes (its jit code), those ops its
    post-ops: one pass where NumPy and a chain step took two. Alone it stays NumPy's one pass; a
    sum of two stays ``add``'s."""
    eng, shapes = lw.engine, lw.model.shapes
    shape = shapes[op.output]
    if op.kind in SUM_KINDS or len(shape) > 4 or any(eng.is_native(lw.where[t]) for t in op.inputs):
        return False
    if op.params:
        const, trailing = lw.model.params[op.params[0]], _trailing(shape, op.attrs.get("width"))
        if (len(op.inputs), len(op.params)) != (1, 1) or trailing is None or const.size != math.prod(trailing) \
                or (op.attrs.get("swap") and alg not in (BINARY_ADD, BINARY_MUL)):
            return False
        operands = (np.ascontiguousarray(const, dtype=np.float32).reshape(trailing),)
    elif len(op.inputs) == 2 and all(shapes[t] == shape for t in op.inputs) and not (op.attrs.get("width") or op.attrs.get("swap")):
        operands = ()
    else:
        return False
    chain, last = _following_eltwises(lw, i)
    if last is op:
        return False
    out = lw.where[last.output] = lw.buffer(last.output, shapes[last.output])
    lw.steps.append(FusedStep("dnnl_binary", out, tuple(lw.where[t] for t in op.inputs), operands=operands,
                              attrs={"alg": alg, "eltwises": chain}))
    return True


def _trailing(shape: tuple, width: int | None) -> tuple | None:
    """The trailing axes of ``shape`` that hold ``width`` elements, or None where none do."""
    for k in range(1, len(shape) + 1):
        if math.prod(shape[-k:]) >= (width or 0):
            return tuple(shape[-k:]) if math.prod(shape[-k:]) == width else None
    return None


def _lower_reshape(lw: Lowering, i: int, op) -> bool:
    return _lower_shuffle(lw, i, op) or _lower_rows_mean(lw, i, op)


def _lower_channel_scale(lw: Lowering, i: int, op) -> bool:
    """Expand (C, 1, 1) -> (C, H, W) read only by a product with a (C, H, W) tensor (a
    squeeze-excite gate): oneDNN's binary multiply, the gate broadcast over the plane."""
    mul = _only_reader(lw, i, "binary")
    shapes = lw.model.shapes
    if mul is None or mul.attrs.get("fn") != "mul" or len(mul.inputs) != 2:
        return False
    other = mul.inputs[1] if mul.inputs[0] == op.output else mul.inputs[0]
    gate, full = shapes[op.inputs[0]], shapes[other]
    if len(full) != 3 or gate != (full[0], 1, 1) or shapes[mul.output] != full or not lw.engine.is_native(lw.where[other]):
        return False
    eng = lw.engine
    reads = (lw.where[other], eng.layout(lw, op.inputs[0], native=True))
    lw.skip.add(i + 1)
    out = lw.where[mul.output] = eng.new_native(lw, mul.output, full)
    lw.steps.append(FusedStep("dnnl_binary", out, reads, attrs={"alg": BINARY_MUL}))
    return True


def _lower_transpose(lw: Lowering, i: int, op) -> bool:
    """On NHWC, (C, H, W) -> (H, W, C) of a tensor in oneDNN's layout, and (H, W, C) -> (C, H, W)
    of a plain one, move nothing: the output is the input's bytes read the other way
    (``Lowering.alias``), where this transpose alone reads its input (a later write into either
    would reach the other). ConvNeXt's blocks run channels-last between two such transposes. Any
    other transpose of a plain buffer (Swin's window partitions) is oneDNN's reorder of the input
    read through the permutation: jit code on the pool, twice NumPy's copy (AMD EPYC)."""
    eng, src, perm = lw.engine, lw.where[op.inputs[0]], tuple(op.attrs["perm"])
    shape = lw.model.shapes[op.output]
    if eng.dnnl.block == 1 and lw.only_reader.get(op.inputs[0]) is op and src != "input":
        if perm == (1, 2, 0) and eng.is_native(src):
            lw.where[op.output] = lw.alias(op.output, shape, src)
            return True
        if perm == (2, 0, 1) and len(shape) == 3 and not eng.is_native(src):
            lw.where[op.output] = eng.new_native(lw, op.output + ".dnnl", shape, base=src)
            return True
    if eng.is_native(src):
        return False
    out = lw.where[op.output] = lw.buffer(op.output, shape)
    lw.steps.append(FusedStep("dnnl_transpose", out, (src,), attrs={"perm": perm}))
    return True


def _lower_matmul(lw: Lowering, i: int, op) -> bool:
    """A product of two plain activations with the same leading axes (attention that is not the
    fused kind: Swin's windows, a decoder's rotary heads), with the activations and quantize
    steps after it: oneDNN's batched matmul (``_batched_matmul``), those its post-ops, where
    NumPy's matmul ran one small GEMM per matrix on one thread."""
    shapes, eng = lw.model.shapes, lw.engine
    a, b = (shapes[t] for t in op.inputs)
    if min(len(a), len(b)) < 2 or a[:-2] != b[:-2] or any(eng.is_native(lw.where[t]) for t in op.inputs):
        return False
    chain, last = _following_eltwises(lw, i)
    out = lw.where[last.output] = lw.buffer(last.output, shapes[last.output])
    lw.steps.append(FusedStep("dnnl_matmul", out, tuple(lw.where[t] for t in op.inputs), attrs={"eltwises": chain}))
    return True


def _alone_reader(lw: Lowering, tensor: str) -> int | None:
    """The index of the one op that reads ``tensor``, unless another reads it or it is the output."""
    readers = lw.readers.get(tensor, ())
    return readers[0] if len(readers) == 1 and tensor != lw.model.output else None


def _attention_mask(lw: Lowering, op, heads: int, seq: int) -> np.ndarray | None:
    """A constant added to the scores (a causal or padding mask, T5's position bias) as a
    (1, heads or 1, seq or 1, seq) array the scores broadcast against; None for another op."""
    width = op.attrs.get("width")
    if op.kind != "binary" or op.attrs.get("fn") != "add" or len(op.params) != 1 or len(op.inputs) != 1 \
            or width is None or op.attrs.get("scalar") is not None:
        return None
    mask = np.ascontiguousarray(lw.model.params[op.params[0]], np.float32)
    if width == seq:
        return mask.reshape(1, 1, 1, seq)
    if width in (seq * seq, heads * seq * seq):
        return mask.reshape(1, -1, seq, seq)
    return None


def _attention_chain(lw: Lowering, scores) -> tuple[np.ndarray | None, list[int], object] | None:
    """scores -> (+ constant mask) -> softmax -> attn_context, each read by the next alone: the
    mask (or None), the indices of the ops after the scores, and the context op."""
    heads, (seq, _) = scores.attrs["heads"], lw.model.shapes[scores.inputs[0]]
    after, mask, k = [], None, _alone_reader(lw, scores.output)
    if k is not None and lw.ops[k].kind == "binary":
        mask = _attention_mask(lw, lw.ops[k], heads, seq)
        if mask is None:
            return None
        after.append(k)
        k = _alone_reader(lw, lw.ops[k].output)
    if k is None or lw.ops[k].kind != "softmax":
        return None
    after.append(k)
    probs, k = lw.ops[k].output, _alone_reader(lw, lw.ops[k].output)
    if k is None or lw.ops[k].kind != "attn_context" or lw.ops[k].inputs != (probs, scores.inputs[0]):
        return None
    return mask, after + [k], lw.ops[k]


def block_rows(batch: int, heads: int, seq: int) -> int:
    """Query rows per attention block: all of them where the batch's scores fit in
    ATTENTION_BLOCK_BYTES, else as many as fit, a multiple of ATTENTION_MIN_ROWS (at least that)."""
    fit = ATTENTION_BLOCK_BYTES // (4 * batch * heads * seq)
    return seq if fit >= seq else max(ATTENTION_MIN_ROWS, fit - fit % ATTENTION_MIN_ROWS)


def _lower_attention(lw: Lowering, scores, chain, heads_buffer: str, rows: int) -> None:
    """The rest of an attention as one step over blocks of query rows (``_bind_attention``): per
    block, q @ kᵀ (+ the mask), softmax and probs @ v while the block is in cache, so that the
    (heads, seq, seq) scores and probabilities are never written whole where they outgrow
    ATTENTION_BLOCK_BYTES (16 MiB each at seq 1024, 4 heads)."""
    mask, after, context = chain
    heads, (seq, width) = scores.attrs["heads"], lw.model.shapes[scores.inputs[0]]
    scratch = () if rows == seq else (lw.buffer(scores.output + ".rows", (rows * width // 3,)),)  # a block's context
    scratch += (lw.buffer(scores.output + ".block", (heads * rows * seq,)),)
    out = lw.output(context.output, lw.model.shapes[context.output])
    lw.skip.update(after)
    lw.steps.append(FusedStep("dnnl_attention", out, (heads_buffer,), scratch, () if mask is None else (mask,),
                              attrs={"heads": heads, "rows": rows}))


def _lower_attn_scores(lw: Lowering, i: int, op) -> bool:
    """Attention on oneDNN's batched matmul: one step gathers q, k and v head-major from the
    (seq, 3·dim) qkv tensor (``_bind_attn_heads``); then q @ kᵀ with k read transposed from it.
    The scale is in q's weights already (fused's ``lw.scaled``). On qkv's strided views oneDNN
    offers only its allocating gemm; on head-major blocks its brgemm kernels (scratchpad
    user-managed), on the OpenMP pool where NumPy's products ran on one thread beside it: at b8
    d256 s128 (AMD EPYC) the gather, scores and context took 1.9 ms that way, 0.4 ms this way.
    Where the scores go only through a constant mask and the softmax into the context, the rest
    is one step (``_lower_attention``), else the scores alone, the context step reading v from
    the gathered copy."""
    if op.inputs[0] not in lw.scaled:
        return False
    qkv = lw.where[op.inputs[0]]
    (seq, width), heads = lw.model.shapes[op.inputs[0]], op.attrs["heads"]
    chain = _attention_chain(lw, op)
    rows = seq if chain is None else block_rows(lw.engine.max_batch, heads, seq)
    gathered = lw.engine._heads[qkv] = lw.buffer(op.output + ".heads", (seq * width,))
    lw.steps.append(FusedStep("dnnl_attn_heads", gathered, (qkv,), attrs={"heads": heads, "rows": rows}))
    if chain is not None:
        _lower_attention(lw, op, chain, gathered, rows)
        return True
    out = lw.output(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_attn_scores", out, (gathered,), attrs=dict(op.attrs)))
    return True


def _lower_attn_context(lw: Lowering, i: int, op) -> bool:
    """probs @ v per head, v from the scores step's head-major copy, each head into its column block."""
    heads = lw.engine._heads.get(lw.where[op.inputs[1]])
    if heads is None:
        return False
    out = lw.output(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_attn_context", out, (lw.where[op.inputs[0]], heads), attrs=dict(op.attrs)))
    return True


def _lower_grouped_attention(lw: Lowering, i: int, op) -> bool:
    """The ``attention`` kind (a decoder's: head-major q, k, v, key/value heads in groups) as
    oneDNN calls over a scores scratch (``_bind_grouped_attention``), where its own calls are
    NumPy passes (the softmax's several, the mask's row blocks)."""
    if any(lw.engine.is_native(lw.where[t]) for t in op.inputs):
        return False                                  # a tensor in a conv's layout: the kind's own calls
    heads, seq, _ = lw.model.shapes[op.inputs[0]]
    scores = lw.buffer(op.output + ".scores", (heads * seq * lw.model.shapes[op.inputs[1]][1],))
    mask = tuple(np.ascontiguousarray(lw.model.params[p], np.float32) for p in op.params)
    out = lw.output(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("dnnl_grouped_attention", out, tuple(lw.where[t] for t in op.inputs), (scores,), mask,
                              attrs=dict(op.attrs)))
    return True


_LOWER_DNNL = {"conv": _lower_conv, "conv_add": _lower_conv, "conv_maxpool": _lower_conv,
               "maxpool": _lower_pool, "averagepool": _lower_pool, "layernorm": _lower_layernorm, "lrn": _lower_pool, "concat": _lower_concat,
               "rmsnorm": _lower_rmsnorm,
               "reshape": _lower_reshape, "batchnorm": _lower_batchnorm, "globalaveragepool": _lower_global_pool,
               "expand": _lower_channel_scale, "slice": _lower_slice, "add": _lower_binary, "sum": _lower_binary,
               "binary": _lower_binary,
               "softmax": _lower_softmax, "transpose": _lower_transpose,
               "attn_scores": _lower_attn_scores, "attn_context": _lower_attn_context,
               "attention": _lower_grouped_attention,
               "fake_quant": _lower_fake_quant, "matmul": _lower_matmul, **{kind: _lower_eltwise for kind in ELTWISE}}


# --- binding entries -----------------------------------------------------------------------

def pool_call(eng: OneDnnEngine, step, attrs, src_md, src: np.ndarray, dst_md, dst: np.ndarray, hw) -> tuple:
    kind = attrs.pop("kind", "maxpool")
    include = bool(attrs.pop("count_include_pad", 0))
    chain = attrs.pop("eltwises", ())
    win = pool_window(attrs)
    alg = POOL_MAX if kind == "maxpool" else (POOL_AVG_INCLUDE if include else POOL_AVG_EXCLUDE)
    o = eng.owned
    # oneDNN floors the output size: the right pads grown to reach a ceil_mode window
    pd = o.pool_pd(alg, src_md, dst_md, win.strides, win.kernel, tuple(d - 1 for d in win.dilations),
                   win.pads[:2], win.end_pads(*hw), o.attr(eltwises=chain))
    return eng.execute(pd, {SRC: (src_md, src), DST: (dst_md, dst)}, step)


def bind_conv(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    batch, attrs, o = y.shape[0], step.attrs, eng.owned
    w, b = step.operands
    win, group, _ = conv_attrs(attrs["conv"])
    hw = ins[0].shape[-2:]
    out_ch = w.shape[0]
    pooled = attrs["pool"] is not None                         # the conv into the scratch, then the pool
    dst_buffer, dst = (step.scratch[0], scratch[0]) if pooled else (step.out, y)
    dst_md = eng.md(dst_buffer, batch)
    src_md = eng.md(step.reads[0], batch)
    w_dims = (group, out_ch // group, *w.shape[1:]) if group > 1 else w.shape
    w_plain = o.md(w_dims, PLAIN[len(w_dims)])
    b_md = o.md((out_ch,), PLAIN[1])
    pd = o.conv_pd(src_md, o.md(w_dims, ANY), b_md, dst_md, win.strides, tuple(d - 1 for d in win.dilations),
                   win.pads[:2], win.end_pads(*hw), o.attr(attrs["residual"], eltwises(attrs["conv"])))
    w_md, w_native = eng.weights.take(pd, w_plain, w)
    calls = []
    if attrs["residual"] and step.reads[1] != step.out:       # the residual, copied into the output first
        calls.append((np.copyto, (y, ins[1])))
    calls.append(eng.execute(pd, {SRC: (src_md, ins[0]), WEIGHTS: (w_md, w_native), BIAS: (b_md, b),
                                   DST: (dst_md, dst)}, step))
    if pooled:
        calls.append(pool_call(eng, step, dict(attrs["pool"]), dst_md, dst, eng.md(step.out, batch), y,
                                win.out_size(*hw)))
    return calls


def _one_input(eng: OneDnnEngine, step, y, ins, make_pd, src=None, dst=None, more=None) -> list:
    """The call of a primitive from the step's one input to its output: ``make_pd(owned, src md,
    dst md)``; the descriptors are the buffers' own unless given, ``more`` other arguments."""
    batch, o = y.shape[0], eng.owned
    src = eng.md(step.reads[0], batch) if src is None else src
    dst = eng.md(step.out, batch) if dst is None else dst
    return [eng.execute(make_pd(o, src, dst), {SRC: (src, ins[0]), DST: (dst, y), **(more or {})}, step)]


def bind_pool(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    attrs = dict(step.attrs)
    if attrs["kind"] == "lrn":
        return _one_input(eng, step, y, ins, lambda o, src, dst: o.lrn_pd(
            src, dst, int(attrs["size"]), float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)),
            float(attrs.get("bias", 1.0)), o.attr()))
    batch = y.shape[0]
    return [pool_call(eng, step, attrs, eng.md(step.reads[0], batch), ins[0], eng.md(step.out, batch), y,
                       ins[0].shape[-2:])]


def _reorder_pd(o: Owned, src, dst) -> P:
    return o.reorder_pd(src, dst, o.attr())


def _bind_reorder(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    return _one_input(eng, step, y, ins, _reorder_pd)


def _bind_slice(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """A reorder from the channels' part of the source (a submemory) to the output."""
    batch = y.shape[0]
    dst = eng.md(step.out, batch)
    dims = (batch, step.attrs["channels"], *y.shape[2:])
    src = eng.owned.submemory(eng.md(step.reads[0], batch), dims, (0, step.attrs["start"], 0, 0))
    return _one_input(eng, step, y, ins, _reorder_pd, src, dst)


def _bind_transpose(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """A reorder from the input, or its part ``index``, read through the permutation (its view's
    strided descriptor, on the same bytes) to the plain output."""
    x = ins[0][sample_index(step.attrs["index"])] if "index" in step.attrs else ins[0]
    src = eng.owned.strided(x.transpose(0, *(a + 1 for a in step.attrs["perm"])))
    return _one_input(eng, step, y, (x,), _reorder_pd, src, eng.owned.strided(y))


def bind_concat(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    batch = y.shape[0]
    srcs = [eng.md(b, batch) for b in step.reads]
    dst = eng.md(step.out, batch)
    pd = eng.owned.concat_pd(dst, srcs, eng.owned.attr())
    return [eng.execute(pd, {DST: (dst, y), **{MULTIPLE_SRC + i: (md, x) for i, (md, x) in enumerate(zip(srcs, ins))}}, step)]


def _bind_shuffle(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """oneDNN's shuffle primitive on a blocked layout; on NHWC, where it has only its reference
    code, a reorder between two strided views of the pixels' channels: source channel i·m + j
    goes to j·g + i (m = C/g, the group size)."""
    m = step.attrs["group_size"]
    if eng.dnnl.block == 1:
        c, h, w = eng.shapes[step.out]
        g, o = c // m, eng.owned
        dims, outer = (y.shape[0], m, g, h, w), (h * w * c, w * c, c)    # NHWC strides of n, then h, w
        src = o.with_strides(dims, (outer[0], 1, m, *outer[1:]))
        dst = o.with_strides(dims, (outer[0], g, 1, *outer[1:]))
        return _one_input(eng, step, y, ins, _reorder_pd, src, dst)
    # oneDNN sees the channels as (C / G, G) and transposes them: ONNX's (g, C/g) is G = C/g
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.shuffle_pd(src, dst, m, o.attr()))


def _bind_eltwise(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    (alg, alpha, beta), *rest = eltwises(step.attrs)              # one primitive, the rest its post-ops
    if alg == GELU_TANH and not avx512(eng.dnnl) and not eng.is_native(step.reads[0]):
        return _gelu_tanh_calls(eng, step, y, ins, tuple(rest))
    return _one_input(eng, step, y, ins,
                      lambda o, src, dst: o.eltwise_pd(alg, src, dst, alpha, beta, o.attr(eltwises=tuple(rest))))


def gelu_tanh_chain() -> tuple:
    """GELU's tanh form, 0.5x(1 + tanh(c(x + 0.044715x^3))) with c = sqrt(2/pi), is x * logistic(2c(x
    + 0.044715x^3)): after x * x, these post-ops, the second operand of each product x (``SOURCE``)."""
    c = 2 * math.sqrt(2 / math.pi)
    return (LINEAR, c * 0.044715, c), BinaryPostOp(BINARY_MUL, SOURCE), (LOGISTIC, 0.0, 0.0), BinaryPostOp(BINARY_MUL, SOURCE)


def _gelu_tanh_calls(eng: OneDnnEngine, step, y, ins, rest: tuple) -> list:
    """GELU's tanh form without AVX-512: oneDNN's binary x * x and ``gelu_tanh_chain`` as post-ops,
    then the step's further ones: one pass, as exact, where oneDNN 3.2's own gelu_tanh on AVX2 took
    158 us for 128 x 256 on one thread against 38, and 22.2 ms against 6.3 for 1576 x 3072 (AMD
    EPYC 7003). On AVX-512 oneDNN's own stays (not measured there)."""
    batch, o, x = y.shape[0], eng.owned, ins[0]
    src, dst = eng.md(step.reads[0], batch), eng.md(step.out, batch)
    chain, args = with_source(gelu_tanh_chain(), src, x)
    more, more_args = bound_post_ops(o, rest, len(chain), y.ndim)
    pd = o.binary_pd(BINARY_MUL, src, src, dst, o.attr(eltwises=chain + more))
    return [eng.execute(pd, {SRC: (src, x), SRC_1: (src, x), DST: (dst, y), **args, **more_args}, step)]


def _bind_softmax(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.softmax_pd(src, dst, y.ndim - 1, o.attr()))


def bind_binary(eng: OneDnnEngine, step, y, ins, scratch, dst=None, chain=None) -> list:
    """The binary primitive's call; ``dst`` (md, array) and ``chain`` (its post-ops) where they
    are not the step's own (an 8-bit output: ``planned.int8``)."""
    batch, o = y.shape[0], eng.owned
    src0 = eng.md(step.reads[0], batch)
    if step.operands:              # a constant along the trailing axes (``_lower_plain_binary``), broadcast
        b = step.operands[0]
        src1 = constant_md(o, b, y.ndim)
    else:
        src1, b = eng.md(step.reads[1], batch), ins[1]
    dst = dst or (eng.md(step.out, batch), y)
    chain, args = with_source(step.attrs.get("eltwises", ()) if chain is None else chain, src0, ins[0])
    pd = o.binary_pd(step.attrs["alg"], src0, src1, dst[0], o.attr(eltwises=chain))
    return [eng.execute(pd, {SRC: (src0, ins[0]), SRC_1: (src1, b), DST: dst, **args}, step)]


def _bind_batchnorm(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    scale, bias, mean, var = step.operands
    flags = GLOBAL_STATS | USE_SCALE | USE_SHIFT | (NORM_RELU if step.attrs["relu"] else 0)
    per_channel = eng.owned.md(scale.shape, PLAIN[1])
    stats = {MEAN: (per_channel, mean), VARIANCE: (per_channel, var), SCALE: (per_channel, scale),
             SHIFT: (per_channel, bias)}
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.batchnorm_pd(src, dst, step.attrs["epsilon"], flags,
                                                                            o.attr()), more=stats)


def _bind_layernorm(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """oneDNN's layer normalization, with gamma and beta as its scale and shift where the step
    holds them (none: folded into the linear that reads it)."""
    flags, more = 0, {}
    if step.operands:
        gamma, beta = step.operands
        per_column = eng.owned.md(gamma.shape, PLAIN[1])
        flags, more = USE_SCALE | USE_SHIFT, {SCALE: (per_column, gamma), SHIFT: (per_column, beta)}
    return _one_input(eng, step, y, ins, lambda o, src, dst: o.layernorm_pd(src, dst, step.attrs["eps"], flags,
                                                                            o.attr()), more=more)


def _bind_rmsnorm(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    gamma, col = step.operands
    x2, y2, tmp, stat = (rows2d(a) for a in (ins[0], y, *scratch))
    rows, o = len(x2), eng.owned
    src, dst, stats, per_column = o.strided(x2), o.strided(y2), o.md((rows,), PLAIN[1]), o.md(gamma.shape, PLAIN[1])
    pd = o.layernorm_pd(src, dst, step.attrs["eps"], GLOBAL_STATS | USE_SCALE, o.attr())
    zeros = np.zeros(rows, np.float32)                 # the mean the normalization subtracts
    return [*mean_square_calls(x2, tmp, stat, lambda a, out: eng.matmul_calls(a, col, out)),
            eng.execute(pd, {SRC: (src, x2), DST: (dst, y2), MEAN: (stats, zeros),
                             VARIANCE: (stats, stat.reshape(rows)), SCALE: (per_column, gamma)}, step)]


def _heads_gathered(flat: np.ndarray, heads: int, rows: int, batch: int, seq: int, dim: int):
    """The gathered buffer of ``_bind_attn_heads``: q's blocks of rows, each (batch, heads, n,
    head_dim) whole, as [(first row, n, block)], then k and v (batch, heads, seq, head_dim).
    One block: (3, batch, heads, seq, head_dim), q, k, v head-major."""
    flat, hd = flat.reshape(-1), dim // heads
    q = [(r, min(rows, seq - r)) for r in range(0, seq, rows)]
    q = [(r, n, flat[batch * r * dim:batch * (r + n) * dim].reshape(batch, heads, n, hd)) for r, n in q]
    k, v = flat[batch * seq * dim:].reshape(2, batch, heads, seq, hd)
    return q, k, v


def _batched_matmul(eng: OneDnnEngine, step, a: np.ndarray, b: np.ndarray, out: np.ndarray, add=None,
                    chain: tuple = ()) -> list:
    """out = a @ b (+ add, broadcast), then the eltwise post-ops ``chain``, over the leading axes
    on oneDNN's brgemm kernels (any strides they take), the add a post-op where they take it (not
    a broadcast along the first axis: oneDNN runs that in ref:any, 3 ms for 8 µs of work), else
    after it (``_add_calls``); where they take neither (AVX2 alone), the engine's NumPy product on
    one thread, then the add, then the chain as its own primitive."""
    o = eng.owned
    src, w, dst = o.strided(a), o.strided(b), o.strided(out)
    for add_inside in ((True, False) if add is not None else (False,)):
        add_md = o.strided(add) if add_inside else None
        chain_inside = add is None or add_inside          # the chain follows the add
        pd = o.matmul_pd(src, w, None, dst, o.attr(add=add_md, eltwises=chain if chain_inside else ()))
        if implementation(eng.dnnl, pd).startswith("brg"):
            args = {SRC: (src, a), WEIGHTS: (w, b), DST: (dst, out)}
            if add_inside:
                args[POST_OP_SRC1] = (add_md, add)
            calls = [eng.execute(pd, args, step)]
            break
    else:
        calls, chain_inside = eng.batched_matmul_calls(a, b, out), False
    if add is not None and not add_inside:
        calls += _add_calls(eng, step, out, add)
    if chain and not chain_inside:
        calls += chain_calls(eng, step, out, chain)
    return calls


def _add_calls(eng: OneDnnEngine, step, out: np.ndarray, add: np.ndarray) -> list:
    """out += add, ``add`` broadcast along any axes of ``out``: oneDNN's binary primitive in place,
    one jit call, where NumPy's add with a broadcast operand allocates its buffers, and one NumPy
    add per block without one took 512 calls for a (8, 1, 1, 16) mask over (8, 4, 16, 16) scores:
    326 us against 7.7 (AMD EPYC 7003). Where oneDNN has only its reference code (a block of a
    per-head mask's rows, strided), those NumPy adds."""
    o, add = eng.owned, add.reshape((1,) * (out.ndim - add.ndim) + add.shape)
    dst, src1 = o.strided(out), o.strided(add)
    pd = o.binary_pd(BINARY_ADD, dst, src1, dst, o.attr())
    if implementation(eng.dnnl, pd).startswith("jit"):
        return [eng.execute(pd, {SRC: (dst, out), SRC_1: (src1, add), DST: (dst, out)}, step)]
    lead = max((k + 1 for k, (a, b) in enumerate(zip(add.shape, out.shape)) if a != b), default=0)
    blocks = [(ix, tuple(i if a > 1 else 0 for i, a in zip(ix, add.shape))) for ix in np.ndindex(out.shape[:lead])]
    return [(np.add, (out[ix], add[ia], out[ix])) for ix, ia in blocks]


def _bind_matmul(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    return _batched_matmul(eng, step, ins[0], ins[1], y, chain=step.attrs["eltwises"])


def _reorder(eng: OneDnnEngine, step, src: np.ndarray, dst: np.ndarray) -> tuple:
    """The call of a reorder between two strided views of one shape."""
    o = eng.owned
    src_md, dst_md = o.strided(src), o.strided(dst)
    return eng.execute(_reorder_pd(o, src_md, dst_md), {SRC: (src_md, src), DST: (dst_md, dst)}, step)


def _bind_attn_heads(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """qkv's q, k and v into the gathered layout of ``_heads_gathered``: one reorder, or k and v
    in one and each block of q's rows in one."""
    (qkv,), heads, rows = ins, step.attrs["heads"], step.attrs["rows"]
    batch, seq, width = qkv.shape
    split = qkv_heads(qkv, heads)
    q, k, v = _heads_gathered(y, heads, rows, batch, seq, width // 3)
    if len(q) == 1:
        return [_reorder(eng, step, split, y.reshape(split.shape))]
    kv = y.reshape(-1)[batch * seq * width // 3:].reshape(split[1:].shape)
    return [_reorder(eng, step, split[1:], kv), *(_reorder(eng, step, split[0][:, :, r:r + n], part)
                                                  for r, n, part in q)]


def _bind_attn_scores(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    batch, heads, seq, _ = y.shape
    [(_, _, q)], k, _ = _heads_gathered(ins[0], heads, seq, batch, seq, ins[0].shape[1] // (3 * seq))
    return _batched_matmul(eng, step, q, k.swapaxes(-1, -2), y)


def _bind_attn_context(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    (probs, gathered), heads = ins, step.attrs["heads"]
    batch, seq, dim = y.shape
    _, _, v = _heads_gathered(gathered, heads, seq, batch, seq, dim)
    return _batched_matmul(eng, step, probs, v, head_columns(y, heads))


def _bind_attention(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """Per block of q's rows, for the whole batch: scores = q @ kᵀ (+ mask) into the block
    scratch, oneDNN's softmax in place, then block @ v into the rows' head columns of y; with
    several blocks through a scratch moved into y (oneDNN's brgemm matmul takes a row block only
    where each matrix of its batch lies whole: a row block of y's head columns, or of a (heads,
    seq, head_dim) array, sends it to its allocating gemm:jit; hence also the gathered blocks).
    A mask shared by the heads is added as a post-op over (1, batch·heads), the one broadcast
    oneDNN's brgemm takes besides one along the keys."""
    heads, rows = step.attrs["heads"], step.attrs["rows"]
    batch, seq, dim = y.shape
    blocks, k, v = _heads_gathered(ins[0], heads, rows, batch, seq, dim)
    mask, context = step.operands[0] if step.operands else None, head_columns(y, heads)
    calls = []
    for r, n, q in blocks:
        scores = scratch[-1].reshape(-1)[:batch * heads * n * seq].reshape(batch, heads, n, seq)
        add = None if mask is None else mask[:, :, r:r + n] if mask.shape[2] == seq else mask
        operands = (q, k.swapaxes(-1, -2), scores)
        if add is not None and add.shape[1] == 1 and batch > 1:       # as (1, batch·heads, n, seq)
            operands = (q.reshape(1, -1, n, q.shape[-1]), k.reshape(1, -1, *k.shape[2:]).swapaxes(-1, -2),
                        scores.reshape(1, -1, n, seq))
        calls += [*_batched_matmul(eng, step, *operands, add), _softmax_in_place(eng, step, scores)]
        if len(blocks) == 1:
            calls += _batched_matmul(eng, step, scores, v, context)
        else:
            part = scratch[0].reshape(-1)[:q.size].reshape(q.shape)
            calls += [*_batched_matmul(eng, step, scores, v, part), _reorder(eng, step, part, context[:, :, r:r + n])]
    return calls


def _bind_grouped_attention(eng: OneDnnEngine, step, y, ins, scratch) -> list:
    """Per key/value head, its group of query heads at once: scores = q @ kᵀ, times the scale (a
    post-op where brgemm takes one), the mask added (oneDNN's binary, broadcast), softmax in
    place, then scores @ v into y."""
    (q, k, v), scale = ins, step.attrs["scale"]
    batch, kv_heads, kv_seq, _ = k.shape
    scores = scratch[0].reshape(batch, q.shape[1], q.shape[2], kv_seq)
    grouped = [t.reshape(batch, kv_heads, -1, t.shape[-1]) for t in (q, scores, y)]
    calls = _batched_matmul(eng, step, grouped[0], k.swapaxes(-1, -2), grouped[1],
                            chain=() if scale == 1.0 else ((LINEAR, scale, 0.0),))
    for mask in step.operands:
        calls += _add_calls(eng, step, scores, mask.reshape(_trailing(scores.shape, mask.size)))
    return [*calls, _softmax_in_place(eng, step, scores), *_batched_matmul(eng, step, grouped[1], v, grouped[2])]


def _softmax_in_place(eng: OneDnnEngine, step, x: np.ndarray) -> tuple:
    """The call of oneDNN's softmax over the last axis of ``x``, in place."""
    o = eng.owned
    md = o.strided(x)
    return eng.execute(o.softmax_pd(md, md, x.ndim - 1, o.attr()), {SRC: (md, x), DST: (md, x)}, step)


OneDnnEngine.binders = {**BIND, "dnnl_conv": bind_conv, "dnnl_pool": bind_pool, "dnnl_reorder": _bind_reorder,
                        "dnnl_concat": bind_concat, "dnnl_slice": _bind_slice, "dnnl_shuffle": _bind_shuffle,
                        "dnnl_transpose": _bind_transpose, "dnnl_matmul": _bind_matmul,
                        "dnnl_eltwise": _bind_eltwise,
                        "dnnl_binary": bind_binary, "dnnl_softmax": _bind_softmax,
                        "dnnl_batchnorm": _bind_batchnorm, "dnnl_layernorm": _bind_layernorm, "dnnl_rmsnorm": _bind_rmsnorm,
                        "dnnl_attn_heads": _bind_attn_heads, "dnnl_attn_scores": _bind_attn_scores, "dnnl_attn_context": _bind_attn_context,
                        "dnnl_attention": _bind_attention, "dnnl_grouped_attention": _bind_grouped_attention}

"""int8: ``onednn``'s steps, with every linear and convolution run as oneDNN's integer primitives
on weights quantized once.

Weights: symmetric s8, one scale per output channel (max |w| over the channel / 127), quantized
once at construction from the weights as ``fused`` folds them (layernorm's affine, gelu's 0.5,
attention's 1/sqrt(d) already in them), then held only in the layout the primitive takes: one
byte per weight plus a float scale per channel.

Activations: quantized at each linear's or conv's input at run time, into planned buffers
(``lw.buffer``: the planner reuses them like any activation): the maxima (and minima) by oneDNN
reductions, then one oneDNN reorder that scales, rounds and casts: s8 with max |x| / 127,
or u8 with max x / 255 where the input is a ReLU's output (twice the resolution). One scale per
row for a linear (per token), per sample for a conv. Per row rather than per tensor: lower error
on every model of the zoo, up to 18 % slower at many rows, and a row's result does not depend on
the other rows of the batch (docs/int8.md).

The products: oneDNN's matmul and convolution primitives, 8-bit x s8 accumulated in s32 (AMX
tiles or AVX-512 VNNI), written as f32 with the weight scales applied in the primitive and, as
each output block is written, post-ops: the row scales (a binary multiply by a (rows, 1) column),
the bias, a residual and the activation. No s32 array exists in engine memory. Each matmul shape
runs on the brgemm implementation (AMX or VNNI) and the threads (OpenMP's pool or one) measured
fastest here at build time (``MLEXEC_TUNE=0``: a fixed rule). On a CPU with neither (AVX2 alone,
``saturating``) a linear is a 1x1 int8 convolution over its rows, u8 activations take 127 levels,
a signed one u8 levels around zero point 128 (``shifted``), and weights beside those or a file's
u8 grid 64, so that no 16-bit pair sum overflows (docs/int8.md).

What stays float32, and why: layernorm's standardize, softmax, gelu, attention's per-head
products (activation x activation, both made at run time: quantizing both per call costs passes
the small products do not pay back), pools, batchnorms and the other CNN ops (no weights to
shrink, and oneDNN runs them on the f32 layout the convs write; a conv then a max pool is the
int8 conv, then onednn's pool step). The float steps keep the float engines' error; the
engine's bar is ``abs_tol``/``rel_tol`` below, derived from measurement on the zoo.

Nothing is allocated per forward. Needs oneDNN's CPU library (the ``onednn`` extra).
"""
from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, replace

import numpy as np

from ..base import EngineUnavailable
from ..ir.calls import maximum, rows2d, tiled_calls, zero_rows
from ..importer.passes import grid_of
from ..ir.conv import conv_attrs
from ..ir.models import QUANTIZED_ABS_TOL, QUANTIZED_REL_TOL
from ..ir.ops import U8_LEVELS    # a ReLU's output as u8: [0, 255], twice the resolution
from ..native.onednn import (ANY, BIAS, BINARY_ADD, BINARY_MAX, BINARY_MUL, CLIP, DST, LINEAR, MULTIPLE_SRC, PLAIN,
                              REDUCTION_MAX, REDUCTION_MIN, RELU, SRC, SRC_1, WEIGHTS, BinaryPostOp, library)
from ..native.onednn_int8 import (ATTR_SCALES, ATTR_ZERO_POINTS, PER_ROW, QuantizedWeights, TypedOwned, implementation,
                                  implementations,
                                  int8_dot_product, post_op_arg, quantize_columns, with_implementation)
from ..kernels import Choice, cached_or_measured, on_one_core, on_one_thread, pool_threads, tuning_enabled
from ..kernels.table import one_thread
from ..kernels.timing import measure_forwards
from ..memory import aligned_empty
from .fused import LINEAR_STEPS, FusedStep, Lowering
from .onednn import (SUM_KINDS, OneDnnEngine, bind_binary as bind_float_binary, bind_concat as bind_float_concat,
                     bind_conv as bind_float_conv,
                     bind_pool as bind_float_pool, binary_of_activations, bound_post_ops, chain_calls, eltwises,
                     fake_quant_chain, following_post_ops, pool_call)

LEVELS = 127                    # symmetric s8: [-127, 127], zero exactly representable
NARROW_LEVELS = 64              # s8 weights beside a u8 source off zero where pairs saturate (weight_levels)
SHIFT = np.array([128], np.int32)   # the zero point of a signed input's u8 levels where pairs saturate (shifted)
TINY = np.float32(1e-30)        # an all-zero row's scale: its values quantize to 0 without a 0/0
ONE_THREAD = "openmp-threads"   # the pool a small linear's matmul runs on at one thread
# oneDNN's int8 matmul implementations a linear may run on: its brgemm kernels on AMX tiles and on
# AVX-512 VNNI, which work in the user scratchpad (its gemm:jit allocates per call, its ref is slow)
BRGEMM = ("brg:avx512_core_amx", "brg:avx512_core_vnni")
# The same kernels as oneDNN's int8 inner product (``InnerProductForm``), offered beside them where
# a linear has one source scale
INNER_PRODUCT = ("brgemm:avx512_core_amx", "brgemm:avx512_core_vnni")
# Where the CPU has no int8 dot products (``saturating``), the 1x1 int8 convolutions a linear runs
# as instead (``ConvForm``): oneDNN's jit ones, which work in the user scratchpad
CONV_FORM = ("jit_uni_int8_1x1:avx2", "jit_uni_int8:avx2")
AMX_ROWS = 16                   # an AMX tile's rows
ONE_THREAD_MAX_WORK = 1 << 22   # multiply-adds up to which a matmul runs on one thread untuned
# From this many multiply-adds, a timing in which no pool variant gained over its one-thread twin
# ran without the pool's second core (``kernels.on_one_core``: the pool runs, nothing is cached).
# AMD EPYC, 2 cores, fresh caches: at 1 x 1024 x 1024 and up the pool ran 1.36-1.98x its one thread
# in a fast phase and 0.96-1.04x in a slow one, where one thread was cached and then ran 1.75x as
# long in every later fast phase; at 1 x 512 x 512 and 8 x 256 x 256 it gained 1.18-1.25x at best.
LONE_CORE_WORK = 1 << 20
CONV_KINDS = ("conv", "conv_add", "conv_maxpool")
PER_OUT_CHANNEL = 1 << 0         # scale mask of conv weights (oc, ic, kh, kw): one per output channel
PER_GROUP_CHANNEL = 1 << 0 | 1 << 1   # of grouped ones (g, oc / g, ...): one per (group, channel)
PER_COLUMN_3D = 1 << 2          # scale mask of (1, k, n) weights: one per output channel
# An s8 input of up to this many values (a sample's, at lowering; the batch's, at binding) gets
# its scale as the maximum of |x| written into its scratch (NumPy's absolute, then one oneDNN
# reduction); above it, from -min x and max x (two reductions). The scale and the reorder, one
# thread, AMD EPYC: 0.3 us faster at 256-2,048 values (1.55 against 1.87 us at one row of 256),
# 0.2 us at 4,096-16,384, level from 32,768. 16 KiB: within any L1 data cache.
MAGNITUDE_MAX = 1 << 12


@dataclass(frozen=True)
class QuantizedLinear:
    """A linear's prepared operands: the s8 weights (``QuantizedWeights``), their per-output-channel
    scales (n,), and the float32 bias (n,)."""
    weights: QuantizedWeights
    scales: np.ndarray
    bias: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.weights.nbytes + self.scales.nbytes + self.bias.nbytes

    def dequantized(self) -> np.ndarray:
        """The weights as float32 (k, n), q x scale: for a product no int8 kernel takes."""
        return self.weights.values().reshape(self.weights.shape[-2:]).astype(np.float32) * self.scales

    def tiled_bias(self, rows: int, folded_grid: tuple | None = None) -> np.ndarray:
        """The bias of the product in float32, (rows, n): the held one, or where it took in the
        zero point of the source's ``folded_grid`` (``_zero_point_folded``) the bias before that,
        as float activations carry their zero point themselves."""
        bias = self.bias
        if folded_grid:
            q = self.weights.values().reshape(self.weights.shape[-2:])
            bias = (bias + _zero_point_term(q, self.scales, folded_grid)).astype(np.float32)
        return np.ascontiguousarray(np.broadcast_to(bias, (rows, len(bias))))


class Int8Engine(OneDnnEngine):
    name = "int8"
    # The bar the engine is held to against the float64 reference (tests, analyzer, report): not
    # the float engines' 1e-4. Measured on the zoo (docs/int8.md, 540 forwards: mlp d64-4096,
    # mlp-deep d48-1024, transformer d32-512, batches 1-32): worst max abs error 0.125 on outputs
    # up to 6.3, worst relative L2 error 2.5 % (mlp-deep, six quantized layers); the bars are
    # twice the worst figure.
    abs_tol = QUANTIZED_ABS_TOL
    rel_tol = QUANTIZED_REL_TOL
    quantized = True
    # Activation scales: one per row (True) or one per tensor (False); measured, docs/int8.md
    row_scales = True
    # What a warm forward may allocate: onednn's bookkeeping (``peak_slack_bytes``); 488-528 B
    # under memray at tests/test_zero_alloc.py's corners since oneDNN finds the scales (NumPy's row
    # maxima took 1.1 KiB)
    forced_variant: "Variant | None" = None      # one variant for every matmul (measurements, tests)

    def __init__(self, model, max_batch: int):
        try:
            library()
        except EngineUnavailable as exc:
            raise EngineUnavailable(f"the int8 engine runs its linears and convs on oneDNN's int8 primitives "
                                    f"({exc})") from exc
        self.quantized_linears: list[QuantizedLinear] = []
        super().__init__(model, max_batch)
        for linear in self.quantized_linears:          # bound at max_batch: the plain s8 copies can go
            linear.weights.settle()
        self.weight_bytes = sum(a.nbytes for step in self.steps for a in step.operands
                                if isinstance(a, (np.ndarray, QuantizedLinear)))

    # --- lowering: fused's linear step (weights folded), then quantized -----------------------

    def lower_op(self, lw: Lowering, i: int, op) -> None:
        """onednn's steps for the op, then its linear or conv step in int8 (found among the steps it
        appended: a reorder of the model's output may follow it)."""
        if _requantized(lw, op):
            lw.where[op.output] = lw.where[op.inputs[0]]
            return
        start = len(lw.steps)
        super().lower_op(lw, i, op)
        if op.kind == "maxpool" and lw.steps[start:] and lw.steps[-1].kind == "dnnl_pool":
            self._integer_pool(lw, op)
            return
        if op.kind in SUM_KINDS:
            _integer_operands(lw, op, start)
            return
        kinds = LINEAR_STEPS if op.kind == "linear" else ("dnnl_conv",) if op.kind in CONV_KINDS else ()
        at = next((j for j in range(len(lw.steps) - 1, start - 1, -1) if lw.steps[j].kind in kinds), None)
        if at is None:
            if op.kind == "linear":
                raise AssertionError(f"linear {op.output!r} lowered to {[s.kind for s in lw.steps[start:]]}")
            return
        step = lw.steps[at]
        if op.kind == "linear":
            took = i if step.kind == "linear" else lw.readers[op.output][0]     # the ReLU or residual sum it took in
            epilogue, last = following_post_ops(lw, took)
            if _requantized(lw, last):      # the linears after it quantize onto its grid themselves
                epilogue = epilogue[:-len(fake_quant_chain(**last.attrs))]
            step = self._quantized_step(lw, step, _file_grid(lw, op.inputs[0]))
            if last is not lw.ops[took]:    # the quantize steps and bias after it: its post-ops, in its output
                lw.where[last.output] = step.out
                step = replace(step, attrs={**step.attrs, "epilogue": epilogue})
            lw.steps[at] = step
        elif step.attrs["pool"] is None:
            lw.steps[at:at + 1] = self._quantized_conv(lw, op, step)
        else:
            # a conv then a max pool (onednn's one step): the int8 conv into the native scratch
            # onednn declared for it, then onednn's pool step from there
            conv = replace(step, out=step.scratch[0], scratch=(), attrs={**step.attrs, "pool": None})
            pool = FusedStep("dnnl_pool", step.out, (conv.out,), attrs={"kind": "maxpool", **step.attrs["pool"]})
            lw.steps[at:at + 1] = [*self._quantized_conv(lw, op, conv), pool]

    def _integer_pool(self, lw: Lowering, op) -> None:
        """A max pool of a tensor whose writer can write its grid's integers, that only convs read
        after it (``_takes_integers``): it pools those integers (the max of the levels is the
        level of the max), and its readers read them."""
        step, grid = lw.steps[-1], _file_grid(lw, op.inputs[0])
        writer = _integer_writer(lw, step.reads[0], op.inputs[0], grid)
        copy, made = (None, []) if writer is not None else self._integer_copy(lw, op.inputs[0], step.reads[0], grid)
        if copy is not None:                            # pools the integers quantized for its neighbours
            lw.steps[-1:] = [*made, replace(step, reads=(copy,))]
        elif writer is not None:
            _mark_integer(lw, writer, grid)
        else:
            return
        _mark_integer(lw, len(lw.steps) - 1, grid)

    def _integer_copy(self, lw: Lowering, tensor: str, buffer: str, grid: tuple | None) -> tuple[str | None, list]:
        """(buffer, steps): the buffer of ``tensor``'s integers on ``grid``, quantized once for
        readers that all take them (convs, and max pools only such convs read) where its writer
        cannot write them itself, and the ``int8_quantize`` step that writes it, to go before the
        first reader that asks (none for the others). GoogLeNet's pools between stages feed three
        convs and a pool each, which quantized the same tensor three times. (None, []) where fewer
        than two read it, not every reader takes the integers, or it is not in oneDNN's layout."""
        readers = lw.readers.get(tensor, ())
        if grid is None or tensor == lw.model.output or not self.is_native(buffer) or len(readers) < 2 or \
                not all(_takes_integers(lw, lw.ops[r], tensor) for r in readers):
            return None, []
        copy = tensor + ".q8"
        if copy in self.shapes:
            return copy, []
        self.new_native(lw, copy, lw.model.shapes[tensor])
        return copy, [FusedStep("int8_quantize", copy, (buffer,), attrs={"grid": grid})]

    def _quantized_conv(self, lw: Lowering, op, step: FusedStep) -> list[FusedStep]:
        """The int8 form of onednn's conv step: weights quantized per output channel; scratch for
        the input's 8-bit copy (in the input's layout, 4 per float slot), its minimum and its
        scale, one each per sample."""
        w32, b32 = step.operands
        win, group, _ = conv_attrs(step.attrs["conv"])
        grid = _file_grid(lw, op.inputs[0])
        unsigned = grid[2] == 0 if grid else _non_negative(lw, step.reads[0])
        shift = shifted(grid, unsigned)
        q, scales = quantize_columns(w32.reshape(w32.shape[0], -1).T, weight_levels(grid, shift))
        plain = np.ascontiguousarray(q.T).reshape(w32.shape)
        if group > 1:                                   # oneDNN's grouped weights: (g, oc / g, ic / g, kh, kw)
            plain = plain.reshape(group, w32.shape[0] // group, *w32.shape[1:])
        unpadded = max(win.pads[:2] + win.end_pads(*lw.model.shapes[op.inputs[0]][-2:])) == 0
        folded = bool(grid and grid[1] and unpadded)
        bias = _zero_point_folded(b32, q, scales, grid) if folded else b32
        linear = QuantizedLinear(QuantizedWeights(self.dnnl, plain), scales, np.ascontiguousarray(bias, np.float32))
        self.quantized_linears.append(linear)
        src_shape = self.shapes[step.reads[0]]
        size = math.prod(src_shape)
        writer = _integer_writer(lw, step.reads[0], op.inputs[0], grid)
        copy, made = (None, []) if writer is not None else self._integer_copy(lw, op.inputs[0], step.reads[0], grid)
        reads, scratch = step.reads, ()
        if writer is not None:                          # it writes this conv's 8-bit input itself
            _mark_integer(lw, writer, grid)
        elif copy is not None:                          # quantized once for it and its neighbours
            reads = (copy, *step.reads[1:])
        else:
            scratch = (lw.buffer(op.output + ".q8", (-(-size // 4),)),
                       lw.buffer(op.output + ".min", _minima_shape((size,), (1,), signed=not (grid or unsigned))),
                       lw.buffer(op.output + ".amax", (1,)))
        conv = FusedStep("int8_conv", step.out, reads, scratch, (linear,),
                         {**step.attrs, "channels": lw.model.shapes[op.inputs[0]][0], "group": group, "grid": grid,
                          "unsigned": unsigned, "shifted": shift, "integer_input": scratch == (),
                          "zero_point_folded": folded})
        return [*made, conv]

    def _quantized_step(self, lw: Lowering, step: FusedStep, grid: tuple | None) -> FusedStep:
        """The int8 form of a fused linear step: its folded float weights quantized per output
        channel; scratch for the activations' 8-bit copy (4 per float slot), their row minima and
        their row scales. ``grid``: a quantized file's step its input lies on (``_file_grid``)."""
        w32, b32 = step.operands[:2]
        unsigned = grid[2] == 0 if grid else _non_negative(lw, step.reads[0])
        shift = shifted(grid, unsigned)
        q, scales = quantize_columns(w32, weight_levels(grid, shift))
        folded = bool(grid and grid[1])                 # a product has no pads: always exact, always done
        bias = _zero_point_folded(b32, q, scales, grid) if folded else b32
        linear = QuantizedLinear(QuantizedWeights(self.dnnl, _one(q)), scales, np.ascontiguousarray(bias, np.float32))
        self.quantized_linears.append(linear)
        src_shape = self.shapes[step.reads[0]]
        lead, k = src_shape[:-1], src_shape[-1]
        rows = lead if self.row_scales else (1,) * len(lead)
        scratch = (lw.buffer(step.out + ".q8", (*lead, -(-k // 4))),
                   lw.buffer(step.out + ".min", _minima_shape(src_shape, (*rows, 1), signed=not (grid or unsigned))),
                   lw.buffer(step.out + ".amax", (*rows, 1)))
        return FusedStep("int8_linear", step.out, step.reads, scratch, (linear,),
                         {"relu": step.kind == "linear_relu", "residual": step.kind == "linear_add", "grid": grid,
                          "unsigned": unsigned, "shifted": shift, "zero_point_folded": folded})

    # --- binding -----------------------------------------------------------------------------

    def own_memory(self) -> None:
        super().own_memory()
        self.typed = TypedOwned(self.dnnl)     # this engine's (or worker's) int8 primitives
        self.chosen: dict[tuple, Variant] = {}  # matmul key -> the variant it runs (its report)
        self.measured: dict[tuple, Choice] = {}  # matmul key -> how it was chosen, each candidate's seconds
        self.float_products: set[str] = set()   # "rows x k x n" that no int8 kernel takes: run in float
        self.dequantized_convs: dict[int, np.ndarray] = {}    # the convs among them: id(QuantizedLinear) -> float weights
        weakref.finalize(self, self.typed.release)

    def variant(self, key: tuple, brgemm: list[str], trial) -> Variant:
        """How the int8 matmul of ``key`` (rows, k, n, source type, relu, residual, row scales,
        post-ops after them) runs: among ``brgemm`` (the implementations oneDNN offers for it) on
        OpenMP's pool and on one thread (``trial(variant)`` gives a variant's calls), the one the
        kernel cache holds for it on this machine, else measured and cached as the float kernels
        are (``kernels.cached_or_measured``: a process measured it once per build, and its
        choice moved from process to process on a busy 2-core host), but not a timing without the
        pool's second core (``LONE_CORE_WORK``); without tuning
        (``MLEXEC_TUNE=0``) ``default_variant``. ``forced_variant``, where set, wins."""
        if self.forced_variant is not None:
            return self.forced_variant
        offered = {str(v): v for v in (Variant(impl, one) for impl in brgemm for one in (False, True))}
        variant = default_variant(*key[:3], list(offered.values()))
        if tuning_enabled():
            entry = "int8|" + "|".join(map(str, key)) + "|" + ",".join(offered)
            self.measured[key] = choice = cached_or_measured(
                entry, list(offered), str(variant), lambda: measure_forwards({n: trial(v) for n, v in offered.items()}),
                lambda times: on_one_core(math.prod(key[:3]), times, str(variant), LONE_CORE_WORK))
            variant = offered[choice.kernel]
        self.chosen[key] = variant
        return variant

    def report(self) -> dict:
        """onednn's report, with how the int8 linears' activations are scaled and, per matmul shape
        (rows x k x n), the variant that runs it and what each measured."""
        matmuls = []
        for key, variant in self.chosen.items():
            choice = self.measured.get(key, Choice(str(variant), "default", str(variant)))
            matmuls.append({"gemm": "x".join(map(str, key[:3])), "source": key[3], "variant": str(variant),
                            "how": choice.how, "candidates_us": {n: round(t * 1e6, 2) if np.isfinite(t) else None
                                                                 for n, t in choice.times_s.items()}})
        return {**super().report(), "activation_scales": "row" if self.row_scales else "tensor",
                "quantized_linears": len(self.quantized_linears), "float_products": sorted(self.float_products),
                "int8_matmuls": matmuls}


def _minima_shape(sample, minima, signed: bool) -> tuple:
    """The shape of a quantized input's second scratch: its minima, or for a small s8 input
    (``MAGNITUDE_MAX``) the sample whole, where ``quantize_calls`` writes |x|."""
    return tuple(sample) if signed and math.prod(sample) <= MAGNITUDE_MAX else tuple(minima)


def _file_grid(lw: Lowering, tensor: str) -> tuple[float, int, int] | None:
    """(scale, zero point, lowest level) where ``tensor`` lies on a quantized file's static 8-bit
    grid (``importer.passes.grid_of``): the int8 step reading it quantizes with the file's scale
    and zero point, so its integers are the file's and its products those ONNX Runtime's integer
    kernels compute."""
    a = grid_of(lw.writer, tensor)
    return None if a is None else _fake_quant_grid(a)


def _fake_quant_grid(a: dict) -> tuple[float, int, int] | None:
    """A quantization step's (scale, zero point, lowest level) where its levels are 8-bit ones. An
    s8 grid is the u8 one 128 levels up where pairs saturate (``saturating``): the same values,
    which oneDNN multiplies there as they are, while it halves the weights of an s8 source."""
    if (a["lo"], a["hi"]) not in ((0, 255), (-128, 127)):
        return None
    if a["lo"] < 0 and saturating():
        return a["scale"], a["zero_point"] + 128, 0
    return a["scale"], a["zero_point"], a["lo"]


def weight_levels(grid: tuple | None, shifted_source: bool = False) -> int:
    """The levels of a product's s8 weights: 127, or where u8 x s8 pairs saturate (``saturating``)
    and its input is a file's u8 grid or a ``shifted`` one, 64, ONNX Runtime's ``reduce_range``
    (255 x 64 x 2 fits 16 bits). A file quantized so for such a CPU keeps its integers; another is
    requantized."""
    return NARROW_LEVELS if (grid and grid[2] == 0 or shifted_source) and saturating() else LEVELS


def shifted(grid: tuple | None, unsigned: bool) -> bool:
    """Whether a signed input quantized at run time (no file grid) takes u8 levels around zero point
    ``SHIFT`` (the s8 ones 128 up: the same values; oneDNN subtracts it) where pairs saturate
    (``saturating``), its weights 64 levels (``weight_levels``). From an s8 source oneDNN halves
    weights already rounded to 127 levels, rounding twice: AVX2 AMD EPYC, relative L2 error at b8
    2.47 -> 2.05 % (mlp d1024), 1.86 -> 1.50 % (transformer d256); the transformer's forward
    1.03-1.24x faster, the mlp's level (docs/int8.md)."""
    return not grid and not unsigned and saturating()


def _integer_writer(lw: Lowering, buffer: str, tensor: str, grid: tuple | None) -> int | None:
    """The index of the step that writes ``buffer`` (``tensor``), where it can write the tensor's
    integers on ``grid`` instead of its float values, and only convs read the tensor, each as its
    quantized input, in this layout: an int8 conv that took in the file's step of that grid,
    reads on a grid itself (so runs the batch in one call) and sums no residual into its output;
    a max pool of integers (``_integer_pool``); a concat of parts whose convs can write them
    (``_concat_writers``); or a binary primitive of floats, not in place, into
    oneDNN's layout, whose buffer nothing else reads (``_bind_binary``: x / scale + zero point as
    its last post-op, oneDNN's store rounding and saturating as the file's step does). oneDNN 3.2's
    pooling writes no 8-bit output from floats."""
    at = next((j for j in range(len(lw.steps) - 1, -1, -1) if lw.steps[j].out == buffer), None)
    if grid is None or at is None or tensor == lw.model.output or lw.where[tensor] != buffer:
        return None
    w = lw.steps[at]
    if w.kind == "int8_conv":
        writes = _conv_writes_integers(w)
    elif w.kind == "dnnl_pool":         # a max pool of integers (``_integer_pool``)
        writes = w.attrs.get("dst_grid") == grid
    elif w.kind == "dnnl_concat":       # of parts whose convs write the concat's grid (``_concat_writers``)
        writes = _concat_writers(lw, at) is not None
    else:
        writes = w.kind == "dnnl_binary" and w.out not in w.reads and \
            lw.engine.is_native(buffer) and _held_only_for(lw, buffer, tensor)
    if not writes or _file_grid(lw, tensor) != grid:
        return None
    readers = lw.readers.get(tensor, ())
    return at if readers and all(_takes_integers(lw, lw.ops[r], tensor, sums=True) for r in readers) else None


def _concat_writers(lw: Lowering, at: int) -> list[int] | None:
    """The steps that write each part of the concat step ``at``, where each is an int8 conv that
    reads on a grid, sums no residual and took in its part's quantize step, and writes a buffer
    that only this concat reads: each can then write its part's integers on the concat's grid,
    after its own step (``_bind_int8_conv``). SqueezeNet's fire modules were joined as floats and
    the next squeeze conv quantized the whole again."""
    concat = lw.steps[at]
    op = next((i for i, o in enumerate(lw.ops) if o.kind == "concat" and lw.where.get(o.output) == concat.out), None)
    if op is None or tuple(lw.where.get(t) for t in lw.ops[op].inputs) != concat.reads or \
            len(set(concat.reads)) != len(concat.reads):
        return None
    writers = []
    for part, tensor in zip(concat.reads, lw.ops[op].inputs):
        j = next((j for j in range(at - 1, -1, -1) if lw.steps[j].out == part), None)
        if j is None or lw.steps[j].kind != "int8_conv" or not _conv_writes_integers(lw.steps[j]) or \
                lw.readers.get(tensor) != [op] or not _held_only_for(lw, part, tensor):
            return None
        writers.append(j)
    return writers


def _conv_writes_integers(step: FusedStep) -> bool:
    """Whether an int8 conv step can write its output's integers: it reads on a grid (so runs the
    batch in one call), sums no residual into its output and took in its output's quantize step."""
    return bool(step.attrs["grid"]) and not step.attrs["residual"] and "fake_quant" in step.attrs["conv"]


def _held_only_for(lw: Lowering, buffer: str, tensor: str) -> bool:
    """Whether nothing but ``tensor``'s readers reads what ``buffer`` holds: every other value it
    holds (the value before a file's step left out, ``_requantized``) is read only by such a step."""
    held = {t for t, b in lw.where.items() if b == buffer}
    return all(t == tensor or all(lw.ops[r].kind == "fake_quant" and lw.ops[r].output in held
                                  for r in lw.readers.get(t, ())) for t in held)


def _integer_chain(chain: tuple, grid: tuple) -> tuple:
    """A float step's post-ops when it writes ``grid``'s integers: x / scale + zero point last
    (oneDNN's store to 8 bits rounds half to even and saturates to the levels), in place of the
    grid's own step where the chain ends in it."""
    step = _grid_step(grid)
    return (chain[:-4] if chain[-4:] == step else chain) + ((LINEAR, 1.0 / grid[0], float(grid[1])),)


def _grid_step(grid: tuple) -> tuple:
    """The quantize step of ``grid`` (scale, zero point, lowest of its 256 levels) as post-ops."""
    return fake_quant_chain(*grid[:2], grid[2], grid[2] + 255)


def _takes_integers(lw: Lowering, op, tensor: str, sums: bool = False) -> bool:
    """Whether ``op`` can read ``tensor`` as its grid's integers: a conv, as its quantized input,
    or a max pool of it that only such convs read after (``Int8Engine._integer_pool``); with
    ``sums``, also a residual sum that onednn lowers to its binary primitive, as its
    ``_integer_slot``."""
    if sums and op.kind in SUM_KINDS:
        return tensor == _integer_slot(lw, op)
    if not _first_input(op, tensor):
        return False
    if op.kind in CONV_KINDS:           # in oneDNN's layout (fewer channels than a block: an NCHW twin)
        return lw.model.shapes[tensor][0] >= lw.engine.dnnl.block
    readers = lw.readers.get(op.output, ())
    return op.kind == "maxpool" and op.output != lw.model.output and bool(readers) and \
        all(lw.ops[r].kind in CONV_KINDS and _takes_integers(lw, lw.ops[r], op.output) for r in readers)


def _integer_slot(lw: Lowering, op) -> str | None:
    """The operand of a residual sum of two (C, H, W) activations (onednn's binary add) that may be
    read as its grid's integers: one at most, since oneDNN 3.2's binary writing floats has jit code
    only for a float first source (an 8-bit one ran its reference code, 100-500x slower); the one
    more ops read, whose other readers (a block's next convs) then need no quantize pass. (SiLU's
    product, which read its quantized sigmoid's integers so, is in the sigmoid's step since
    2026-12-07: ``onednn._times_source``.)"""
    if not binary_of_activations(lw.model.shapes, op) or op.inputs[0] == op.inputs[1]:
        return None
    return max(op.inputs, key=lambda t: len(lw.readers.get(t, ())))


def _integer_operands(lw: Lowering, op, start: int) -> None:
    """A residual sum that onednn lowered to its binary primitive (from step ``start``)
    reads its ``_integer_slot``'s integers where that operand's writer can write them and every
    reader takes them (``_integer_writer``): ``src_grids``, that grid at its operand's place
    (``_bind_binary``). MobileNetV2's block outputs, read by the next block's first conv and its
    sum, were written as floats, and that conv quantized them again."""
    slot = _integer_slot(lw, op)
    if slot is None:
        return
    at = next((j for j in range(start, len(lw.steps)) if lw.steps[j].kind == "dnnl_binary"), None)
    k, grid = op.inputs.index(slot), _file_grid(lw, slot)
    writer = _integer_writer(lw, lw.where[slot] if at is None else lw.steps[at].reads[k], slot, grid)
    if writer is None:
        return
    if at is None or lw.steps[at].attrs["alg"] != BINARY_ADD:   # its writer writes integers for it
        raise AssertionError(f"{op.output!r}: a binary of {slot!r}'s integers lowered to {lw.steps[start:]}")
    _mark_integer(lw, writer, grid)
    grids = (grid, None) if k == 0 else (None, grid)
    lw.steps[at] = replace(lw.steps[at], attrs={**lw.steps[at].attrs, "src_grids": grids})


def _mark_integer(lw: Lowering, at: int, grid: tuple) -> None:
    """Step ``at`` writes its output's integers on ``grid`` (``dst_grid``); a concat, its parts'
    writers too."""
    for j in (_concat_writers(lw, at) or []) if lw.steps[at].kind == "dnnl_concat" else []:
        _mark_integer(lw, j, grid)
    lw.steps[at] = replace(lw.steps[at], attrs={**lw.steps[at].attrs, "dst_grid": grid})


def _requantized(lw: Lowering, op) -> bool:
    """Whether ``op`` is a file's quantization step that only int8 linears and convs read, as their
    quantized input, directly or through max pools that only they read: each quantizes on the same
    grid (``_file_grid``), which gives the same integers from the value before the step as after it
    (a max commutes with rounding to a grid); the step is then left out."""
    return op.kind == "fake_quant" and _file_grid(lw, op.output) is not None and _quantized_readers(lw, op)


def _quantized_readers(lw: Lowering, op) -> bool:
    """Whether ``op``'s output is read, and only as the quantized input of int8 linears and convs
    or of max pools whose outputs only those read (GoogLeNet's inception outputs)."""
    readers = [lw.ops[r] for r in lw.readers.get(op.output, ())]
    return op.output != lw.model.output and bool(readers) and all(
        _first_input(r, op.output) and (r.kind in ("linear", *CONV_KINDS) or r.kind == "maxpool" and _quantized_readers(lw, r))
        for r in readers)


def _first_input(op, tensor: str) -> bool:
    """Whether ``op`` reads ``tensor`` as its first input, and only there (a quantized step's input)."""
    return op.inputs.index(tensor) == 0 and op.inputs.count(tensor) == 1


def _zero_point_folded(bias: np.ndarray, q: np.ndarray, scales: np.ndarray, grid: tuple) -> np.ndarray:
    """The bias of an unpadded conv whose input lies on ``grid`` with its zero point taken in:
    sum_k w_k (x_k - zp) = sum_k w_k x_k - zp sum_k w_k, so each output channel's bias less
    x scale x zp x its weight scale x its weights' sum (``q``: (k, out) s8). Exact only where every
    input value is a real one: no pad reads the level of 0. oneDNN's run-time source zero point
    costs a compensation pass per call, and a zero one still does."""
    return bias.astype(np.float64) - _zero_point_term(q, scales, grid)


def _zero_point_term(q: np.ndarray, scales: np.ndarray, grid: tuple) -> np.ndarray:
    """x scale x zero point x each output channel's weight scale x its weights' sum, float64."""
    return grid[0] * grid[1] * scales.astype(np.float64) * q.astype(np.int64).sum(axis=0)


def _grid_operands(grid: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The file's scale (1,) float32 and zero point (1,) int32, as oneDNN's run-time arguments."""
    return np.array([grid[0]], np.float32), np.array([grid[1]], np.int32)


def _non_negative(lw: Lowering, buffer: str) -> bool:
    """Whether ``buffer`` holds no negative value: written last by a linear or conv with its ReLU
    (or a Clip from 0, ReLU6), a ReLU, or a pool or concat of such buffers (a quantized reader then
    takes it as u8)."""
    writer = next((s for s in reversed(lw.steps) if s.out == buffer), None)
    if writer is None:
        return False
    if writer.kind == "int8_linear":
        return writer.attrs["relu"]
    if writer.kind in ("int8_conv", "dnnl_conv"):
        act = writer.attrs["conv"]
        return act.get("activation") == "relu" or (act.get("activation") == "clip" and act.get("clip_min", -1) >= 0)
    if writer.kind == "dnnl_eltwise":
        return writer.attrs.get("activation") == "relu"
    if writer.kind in ("dnnl_pool", "dnnl_concat"):
        return writer.attrs.get("kind") != "lrn" and all(_non_negative(lw, r) for r in writer.reads if r != buffer)
    return False


@functools.lru_cache(maxsize=None)
def saturating() -> bool:
    """Whether oneDNN's int8 kernels here sum u8 x s8 products in pairs in 16 bits, saturating
    (``onednn_int8.int8_dot_product``: AVX2 without VNNI). There u8 activations take 127 levels,
    not 255 (127 x 127 x 2 fits 16 bits: the sums are exact), weights beside a ``shifted`` source or
    a file's u8 grid 64 (``weight_levels``), and linears run as 1x1 convolutions (``ConvForm``)."""
    return not int8_dot_product(library())


def levels_of(q: np.ndarray) -> int:
    return U8_LEVELS if q.dtype == np.uint8 and not saturating() else LEVELS


def quantize_calls(eng: "Int8Engine", step, x2: np.ndarray, q: np.ndarray, lo: np.ndarray, amax: np.ndarray,
                   per_row: bool, zero_point: np.ndarray | None = None) -> list:
    """The calls that write ``q`` (rows, k) = round(x2 / scale) and leave the scale in ``amax``:
    s8 with scale = max |x| / 127 (u8 with ``zero_point`` added: ``shifted``), or for a u8 ``q``
    (x2 known non-negative) max x / 255, per row
    (``amax`` (rows, 1)) or over the tensor (``amax`` (1, 1)). ``lo`` holds |x2| where it has room
    for x2 whole and x2 is small (``MAGNITUDE_MAX``), else the negated minima.

    The scales are oneDNN reductions, made and run on one thread, each writing its result already
    divided by the levels (and at least ``TINY``, so that an all-zero row divides nothing by 0)
    through its post-ops: u8, one maximum; s8, |x| by NumPy then one maximum, or, for a large
    input, -min x then max x with max(., -min) as a post-op. Against NumPy's reductions, ``out=``
    and positional (1.3-1.7 us of call overhead at one row of 256), one thread, AMD EPYC: 1.6-1.9x
    faster at 1-8 rows of 256-4096, 2.5x at 512 x 256. The scaling, rounding and cast are one
    oneDNN reorder with a destination scale per row: 17 against ~130 us for NumPy's divide, rint
    and cast at 512 x 256, and no float scratch. |x2| / scale <= the top level, so the cast never
    saturates."""
    inverse = 1.0 / levels_of(q)
    top = ((LINEAR, inverse, 0.0), (CLIP, float(TINY), np.inf))      # x / levels, at least TINY
    signed = q.dtype != np.uint8 or zero_point is not None
    small = signed and lo.size >= x2.size and x2.size <= MAGNITUDE_MAX
    if small:                                          # max |x| from one reduction of |x|
        magnitude = lo.reshape(-1)[:x2.size].reshape(x2.shape)
        calls = [(np.absolute, (x2, magnitude))] + _reduction(eng, step, REDUCTION_MAX, magnitude, amax, [], top)
    elif signed:                                       # max |x| = max(max x, -min x)
        lo = lo.reshape(-1)[:amax.size].reshape(amax.shape)
        calls = (_reduction(eng, step, REDUCTION_MIN, x2, lo, [], ((LINEAR, -1.0, 0.0),))
                 + _reduction(eng, step, REDUCTION_MAX, x2, amax, [lo], top))
    else:
        calls = _reduction(eng, step, REDUCTION_MAX, x2, amax, [], top)
    return calls + _scaled_cast(eng, step, x2, q, amax.reshape(-1), per_row, zero_point)


def _reduction(eng: "Int8Engine", step, alg: int, x2: np.ndarray, out: np.ndarray, maxima: list, chain: tuple) -> list:
    """oneDNN's reduction ``alg`` of ``x2`` into ``out`` (its axes of size 1 reduced), then the
    maximum with each of ``maxima`` (``out``'s shape) and the eltwise ``chain``; made and run on
    one thread."""
    o = eng.typed
    src, dst = o.strided(x2), o.strided(out)
    described = [(o.strided(m), m) for m in maxima]
    attr = o.quantized_attr({}, [(BINARY_MAX, md) for md, _ in described], chain)
    args = {SRC: (src, x2), DST: (dst, out), **{post_op_arg(i): d for i, d in enumerate(described)}}
    scale = replace(step, kind="int8_scale")            # its own line in report()["primitives"]
    return _on_one_thread(x2, lambda: [eng.execute(o.reduction_pd(alg, src, dst, attr), args, scale)])


def _scaled_cast(eng: "Int8Engine", step, x2: np.ndarray, q: np.ndarray, scales: np.ndarray, per_row: bool,
                 zero_point: np.ndarray | None = None) -> list:
    """q = x2 / scales (per row, or one for all) + zero_point, rounded to nearest even and
    saturated: oneDNN's reorder f32 -> 8 bits with run-time destination scales, made and run on one
    thread."""
    o = eng.typed
    src, dst = o.strided(x2), o.strided(q)
    attr = o.quantized_attr({DST: PER_ROW if per_row else 0}, [], zero_points=None if zero_point is None else {DST: 0})
    args = {SRC: (src, x2), DST: (dst, q), ATTR_SCALES | DST: (o.typed(scales.shape, PLAIN[1], np.float32), scales)}
    if zero_point is not None:
        args[ATTR_ZERO_POINTS | DST] = (o.typed((1,), PLAIN[1], np.int32), zero_point)
    quantize = replace(step, kind="int8_quantize")       # its own line in report()["primitives"]
    return _on_one_thread(x2, lambda: [eng.execute(o.reorder_pd(src, dst, attr), args, quantize)])


def _on_one_thread(x2: np.ndarray, make) -> list:
    """A quantize primitive's calls (``make()``), made on one thread. Of more rows they also run on
    one thread (the wrapper); of one row they run as they are: oneDNN's reorder then keeps the one
    thread it was made for, and its reduction has one unit of work and runs it on the calling
    thread, no parallel region, while the wrapper's three pool calls cost 1-3 us a linear in a
    forward (docs/int8.md). Made on the pool, a one-row reorder of 2,048 values or more split
    itself over the pool's threads: 3.8 against 1.0 us at 2,048, 4.3 against 1.3 at 4,096
    (AMD EPYC, the pool awake)."""
    return _on_variant(ONE_THREAD_VARIANT, make, wrapped=x2.shape[0] > 1)


def default_variant(rows: int, k: int, n: int, offered: list["Variant"]) -> "Variant":
    """Without tuning: AMX from a tile's 16 rows, VNNI below; on one thread up to
    ``ONE_THREAD_MAX_WORK`` multiply-adds (where the pool's wake-up costs more than the second core
    gives, docs/int8.md)."""
    want = Variant("brg:avx512_core_amx" if rows >= AMX_ROWS else "brg:avx512_core_vnni",
                   rows * k * n <= ONE_THREAD_MAX_WORK)
    return want if want in offered else offered[0]


def _one(a: np.ndarray) -> np.ndarray:
    """``a`` (rows, cols) as (1, rows, cols), the new axis with a true stride (NumPy gives a new axis
    stride 0, which oneDNN's brgemm matmul does not take)."""
    return np.lib.stride_tricks.as_strided(a, (1, *a.shape), (a.shape[0] * a.strides[0], *a.strides))


@dataclass(frozen=True)
class Variant:
    """How one int8 matmul runs: oneDNN's implementation (``brg:avx512_core_amx``, ...) and
    whether on OpenMP's pool or on one thread (the primitive then made on one thread too: oneDNN
    splits the work for the threads it sees when it is made)."""
    implementation: str
    one_thread: bool

    def __str__(self) -> str:
        return self.implementation + ("-1t" if self.one_thread else "")


ONE_THREAD_VARIANT = Variant("", True)     # the quantize reorders: one thread, oneDNN's own choice


@dataclass(frozen=True)
class Matmul:
    """One int8 linear's matmul at one batch size: its descriptors and arguments, every array a
    view bound in advance; ``pd(variant)`` describes it, ``calls(pd, weights)`` runs it."""
    owned: TypedOwned
    src: object
    dst: object
    bias_md: object
    attr: object
    args: dict
    k: int
    n: int

    def describe(self):
        """The primitive descriptor, oneDNN's first implementation (each form its own primitive)."""
        o = self.owned
        return o.matmul_pd(self.src, o.typed((1, self.k, self.n), ANY, np.int8), self.bias_md, self.dst, self.attr)

    @staticmethod
    def weight_view(plain: np.ndarray) -> np.ndarray:
        """The plain (1, k, n) s8 weights with the dimensions this form's primitive takes."""
        return plain

    def pd(self, variant: Variant | None):
        pd = self.describe()
        return pd if variant is None else with_implementation(self.owned.dnnl, pd, variant.implementation)

    def arguments(self, pd, weights: QuantizedWeights, keep: bool = True) -> dict:
        return {**self.args, WEIGHTS: weights.take(pd, keep, self.weight_view)}

    def offered(self, names: tuple[str, ...]) -> list[str]:
        """The implementations among ``names`` oneDNN offers for this form, best first."""
        return [name for name in implementations(self.owned.dnnl, self.describe) if name in names]


def _matmul(eng: Int8Engine, step, q, y2, amax, ins) -> Matmul:
    """The descriptors and arguments of the step's matmul: (1, rows, k) x (1, k, n) -> (1, rows, n).
    On a file's grid, one source scale; its zero point is in the bias (``_zero_point_folded``).

    3-D because oneDNN 3.2's brgemm matmul takes a (1, rows, 1) binary operand (the row scales),
    while on the 2-D form a (rows, 1) one fell back to its reference code (``ref:any``, hundreds
    of times slower)."""
    (linear,), attrs, o = step.operands, step.attrs, eng.typed
    k, n = linear.weights.shape[-2:]
    bias = linear.bias.reshape(1, 1, n)
    src, dst = o.strided(_one(q)), o.strided(_one(y2))
    args = {SRC: (src, _one(q)), DST: (dst, _one(y2)),
            ATTR_SCALES | WEIGHTS: (o.typed((n,), PLAIN[1], np.float32), linear.scales)}
    binaries = []
    if eng.row_scales and not attrs["grid"]:           # per-row scales, then the bias, as post-ops
        binaries += [(BINARY_MUL, _one(amax)), (BINARY_ADD, bias)]
        scales, bias_md = {WEIGHTS: PER_COLUMN_3D}, None
    else:                                              # one scale for the tensor, the bias in the primitive
        scales, bias_md = {SRC: 0, WEIGHTS: PER_COLUMN_3D}, o.strided(bias)
        args[BIAS] = (bias_md, bias)
        args[ATTR_SCALES | SRC] = (o.typed((1,), PLAIN[1], np.float32), amax.reshape(1))
    if attrs["residual"]:
        binaries.append((BINARY_ADD, _one(rows2d(ins[1]))))
    described, chain, more = _post_ops(o, attrs, binaries, 3)
    args.update(more)
    return Matmul(o, src, dst, bias_md, o.quantized_attr(scales, described, chain), args, k, n)


def _post_ops(o: TypedOwned, attrs: dict, binaries: list, ndim: int) -> tuple[list, tuple, dict]:
    """A step's post-ops on an ``ndim``-axis output: the binary ones ``binaries`` ((algorithm,
    array)), then its ReLU and its epilogue; as ``quantized_attr`` takes them (binaries, eltwise
    chain) and with their execution arguments."""
    described = [(alg, o.strided(a), a) for alg, a in binaries]
    args = {post_op_arg(i): (md, a) for i, (_, md, a) in enumerate(described)}
    relu = ((RELU, 0.0, 0.0),) if attrs["relu"] else ()
    epilogue, more = bound_post_ops(o, attrs.get("epilogue", ()), len(described) + len(relu), ndim)
    return [(alg, md) for alg, md, _ in described], relu + epilogue, {**args, **more}


def _float_linear(eng: Int8Engine, step, x2, y2, ins) -> list:
    """A product no int8 kernel of oneDNN takes here (its brgemm kernels only; the others allocate
    per call or are reference code): the same quantized weights, dequantized once, in a float32
    NumPy product with the bias, residual and ReLU; named in ``report()["float_products"]``. On a
    file's grid, the input's quantize step first (``_requantized`` left it to the int8 product),
    into a copy made at binding (the input's buffer may hold what another op reads unquantized)."""
    (linear,), attrs = step.operands, step.attrs
    eng.float_products.add("x".join(map(str, (x2.shape[0], *linear.weights.shape[-2:]))))
    calls = []
    if attrs["grid"]:
        on_grid = aligned_empty(x2.shape)
        calls, x2 = chain_calls(eng, step, on_grid, _grid_step(attrs["grid"]), x2), on_grid
    w = linear.dequantized()
    bias = linear.tiled_bias(len(y2), attrs["grid"] if attrs["zero_point_folded"] else None)
    calls += [(np.matmul, (x2, w, y2))] + tiled_calls(np.add, y2, bias)
    if attrs["residual"]:
        calls.append((np.add, (y2, rows2d(ins[1]), y2)))
    if attrs["relu"]:
        calls += tiled_calls(maximum, y2, zero_rows(y2.shape[1]))
    if attrs.get("epilogue"):
        calls += chain_calls(eng, step, y2, attrs["epilogue"])
    return calls


def _on_variant(variant: Variant, make, wrapped: bool = True) -> list:
    """``make()`` (which returns the calls of primitives) run as the variant asks: on one thread, the
    primitives then made on one thread and their calls run on one thread (unless not ``wrapped``),
    or as they are."""
    if not variant.one_thread or pool_threads(ONE_THREAD) == 1:    # already on one thread: no wrapper
        return make()
    with one_thread(ONE_THREAD):
        made = make()
    return on_one_thread(ONE_THREAD, made) if wrapped else made


def _trial_calls(mm: Matmul, variant: Variant, weights: QuantizedWeights) -> list:
    """The matmul's calls on a scratchpad of its own, for timing (its weights' layout not kept)."""
    def make():
        pd = mm.pd(variant)
        dnnl = mm.owned.dnnl
        size = dnnl.lib.dnnl_memory_desc_get_size(dnnl.scratchpad_md(pd))
        call, _ = dnnl.call(mm.owned, pd, mm.arguments(pd, weights, keep=False), aligned_empty(-(-size // 4) or 1))
        return [call]
    return _on_variant(variant, make)


def _bind_int8_linear(eng: Int8Engine, step, y, ins, scratch) -> list:
    """The quantize calls, then one int8 matmul writing f32 (weight scales in the primitive; the
    row scales, the bias, a residual and a ReLU as post-ops), on the variant chosen for its shape."""
    (linear,), attrs = step.operands, step.attrs
    x2, y2 = rows2d(ins[0]), rows2d(y)
    k, n = linear.weights.shape[-2:]
    q = rows2d(scratch[0]).view(np.uint8 if attrs["unsigned"] or attrs["shifted"] else np.int8)[:, :k]
    lo, amax = rows2d(scratch[1]), rows2d(scratch[2])
    shift = SHIFT if attrs["shifted"] else None     # a shifted source's zero point (a file's: below)
    zero_point = shift
    if attrs["grid"]:                                  # the file's scale and zero point
        amax, zero_point = _grid_operands(attrs["grid"])
    elif not eng.row_scales:
        lo, amax = lo[:1], amax[:1]                    # one scale for the whole batch
    forms, rescale = _forms(eng, step, q, y2, amax, ins, shift)
    if not forms:           # e.g. ONNX's 1 x 25 x 25 test products: no brgemm kernel takes them
        return _float_linear(eng, step, x2, y2, ins)
    quantize = (_scaled_cast(eng, step, x2, q, amax, False, zero_point) if attrs["grid"]
                else quantize_calls(eng, step, x2, q, lo, amax, eng.row_scales, zero_point))
    scaling = "grid" if attrs["grid"] else eng.row_scales
    source = "u8+128" if attrs["shifted"] else q.dtype.name
    variant = eng.variant((x2.shape[0], k, n, source, attrs["relu"], attrs["residual"], scaling,
                           len(attrs.get("epilogue", ()))), list(forms),
                          lambda v: _trial_calls(forms[v.implementation], v, linear.weights))
    form = forms.get(variant.implementation, next(iter(forms.values())))   # a forced variant (tests)

    def make():
        pd = form.pd(variant)
        return [eng.execute(pd, form.arguments(pd, linear.weights), step)]
    product = _on_variant(variant, make)
    return quantize + product + (_rescale_calls(eng, step, y2, amax, ins) if rescale else [])


def _forms(eng: Int8Engine, step, q, y2, amax, ins, shift) -> tuple[dict[str, Matmul], bool]:
    """(implementation -> the form that runs on it, whether ``_rescale_calls`` must follow): the
    matmul on oneDNN's brgemm kernels, and with one source scale its inner product on theirs
    (``InnerProductForm``); where pairs saturate (``saturating``), the 1x1 convolution instead.
    Empty where no such kernel takes the product."""
    mm = _matmul(eng, step, q, y2, amax, ins)
    brgemm = mm.offered(BRGEMM)
    if not brgemm and saturating():
        for rescale in (False, True) if _conv_takes_all(step, q, eng.row_scales) else (True,):
            conv = _conv_form(eng, step, q, y2, amax, ins, rescale, shift)
            if names := conv.offered(CONV_FORM):
                return dict.fromkeys(names, conv), rescale
        return {}, False
    forms = dict.fromkeys(brgemm, mm)
    if brgemm and _one_source_scale(step, q, eng.row_scales):
        ip = _inner_product_form(eng, step, q, y2, amax, ins)
        forms.update(dict.fromkeys(ip.offered(INNER_PRODUCT), ip))
    return forms, False


def _plain_as_conv(plain: np.ndarray) -> np.ndarray:
    """A linear's plain (1, k, n) s8 weights as a 1x1 conv's (n, k, 1, 1): the same bytes."""
    k, n = plain.shape[-2:]
    return np.lib.stride_tricks.as_strided(plain, (n, k, 1, 1), (1, n, n * k, n * k))


@dataclass(frozen=True)
class ConvForm(Matmul):
    """One int8 linear as oneDNN's 1x1 int8 convolution over its rows, where the CPU has no int8
    dot products (``saturating``): there oneDNN's int8 matmul is ``gemm:jit`` (1 x 4096 x 4096 in
    69 ms against 2.2 ms for NumPy's float product, AMD EPYC 7003 with AVX2, and it allocates per
    call) while its 1x1 int8 conv ran the mlp's d4096 pair in 1.5 ms. The rows (rows, k) are the
    pixels of an NHWC (1, k, 1, rows) image: the same bytes. The conv writes the products times the
    weight scales, nothing more: with a per-row operand or a bias as a post-op oneDNN took its
    reference code (100-1000x slower); ``_rescale_calls`` applies them after. No bias operand."""

    weight_view = staticmethod(_plain_as_conv)

    def describe(self):
        o = self.owned
        return o.conv_pd(self.src, o.typed((self.n, self.k, 1, 1), ANY, np.int8), self.bias_md, self.dst,
                         (1, 1), (0, 0), (0, 0), (0, 0), self.attr)


def _plain_as_inner_product(plain: np.ndarray) -> np.ndarray:
    """A linear's plain (1, k, n) s8 weights as an inner product's (n, k): the same bytes."""
    return plain.reshape(plain.shape[-2:]).T


@dataclass(frozen=True)
class InnerProductForm(Matmul):
    """One int8 linear with one source scale (``_one_source_scale``) as oneDNN's int8 inner
    product: (rows, k) x (n, k) -> (rows, n), the scales, the bias, a residual, the ReLU and the
    epilogue in the primitive. The same brgemm kernels as the matmul with another blocking; 2-D,
    so no per-row operand (on 2-D outputs oneDNN 3.2 runs that as its reference code). Against
    the matmul at one row, one process, interleaved, AMD EPYC with AVX-512 VNNI: 1.3x at 256 x 256,
    1.0-1.1x at 1,024-4,096 (docs/int8.md); measured per shape like the matmul's variants."""

    weight_view = staticmethod(_plain_as_inner_product)

    def describe(self):
        o = self.owned
        return o.inner_product_pd(self.src, o.typed((self.n, self.k), ANY, np.int8), self.bias_md, self.dst,
                                  self.attr)


def _inner_product_form(eng: Int8Engine, step, q: np.ndarray, y2: np.ndarray, amax: np.ndarray,
                        ins) -> InnerProductForm:
    """The linear as an ``InnerProductForm``: one source scale (a file's grid or ``amax``), weight
    scales per output channel, the bias (a file's zero point folded in, ``_zero_point_folded``)."""
    (linear,), attrs, o = step.operands, step.attrs, eng.typed
    n = len(linear.scales)
    src, dst, bias_md = o.strided(q), o.strided(y2), o.strided(linear.bias)
    args = {SRC: (src, q), DST: (dst, y2), BIAS: (bias_md, linear.bias),
            ATTR_SCALES | SRC: (o.typed((1,), PLAIN[1], np.float32), amax.reshape(1)),
            ATTR_SCALES | WEIGHTS: (o.typed((n,), PLAIN[1], np.float32), linear.scales)}
    residual = [(BINARY_ADD, rows2d(ins[1]))] if attrs["residual"] else []
    described, chain, more = _post_ops(o, attrs, residual, 2)
    args.update(more)
    attr = o.quantized_attr({SRC: 0, WEIGHTS: PER_OUT_CHANNEL}, described, chain)
    return InnerProductForm(o, src, dst, bias_md, attr, args, q.shape[1], n)


def _pixels(a: np.ndarray) -> np.ndarray:
    """Rows (rows, c) as the pixels of an NHWC image (1, c, 1, rows): the same bytes."""
    rows, c = a.shape
    step, item = a.strides
    return np.lib.stride_tricks.as_strided(a, (1, c, 1, rows), (rows * step, item, rows * step, step))


def _one_source_scale(step, x2: np.ndarray, row_scales: bool) -> bool:
    """Whether one scale quantizes all of a linear's rows: a file's grid, a tensor's scale, or one row."""
    return bool(step.attrs["grid"]) or not row_scales or x2.shape[0] == 1


def _conv_takes_all(step, x2: np.ndarray, row_scales: bool) -> bool:
    """Whether a linear's ``ConvForm`` can take its source scale, bias, residual, ReLU and epilogue
    itself: one source scale and no constant in the epilogue (a per-column constant would need the
    conv's channel axis)."""
    return (_one_source_scale(step, x2, row_scales)
            and not any(isinstance(op, BinaryPostOp) for op in step.attrs.get("epilogue", ())))


def _conv_form(eng: Int8Engine, step, q: np.ndarray, y2: np.ndarray, amax: np.ndarray, ins,
               rescale: bool, zero_point: np.ndarray | None) -> ConvForm:
    """The linear as a ``ConvForm``: writing the products times the weight scales, for
    ``_rescale_calls`` to finish (``rescale``), or, with one source scale (``_conv_takes_all``),
    the whole step: the scales, the bias, a residual, the ReLU and the epilogue in the primitive
    (mlp b1 d256, AVX2 AMD EPYC 7003: a forward in 29.4 us against 43.4 with the rescale step).
    A ``shifted`` source's ``zero_point`` is oneDNN's run-time one: it subtracts it exactly."""
    (linear,), attrs, o = step.operands, step.attrs, eng.typed
    n = len(linear.scales)
    pixels, out = _pixels(q), _pixels(y2)
    src, dst = o.strided(pixels), o.strided(out)
    args = {SRC: (src, pixels), DST: (dst, out),
            ATTR_SCALES | WEIGHTS: (o.typed((n,), PLAIN[1], np.float32), linear.scales)}
    zero_points = None
    if zero_point is not None:                      # a shifted source's (a file's is in the bias)
        zero_points = {SRC: 0}
        args[ATTR_ZERO_POINTS | SRC] = (o.typed((1,), PLAIN[1], np.int32), zero_point)
    if rescale:
        attr = o.quantized_attr({WEIGHTS: PER_OUT_CHANNEL}, [], zero_points=zero_points)
        return ConvForm(o, src, dst, None, attr, args, q.shape[1], n)
    bias_md = o.strided(linear.bias)
    args[BIAS] = (bias_md, linear.bias)
    args[ATTR_SCALES | SRC] = (o.typed((1,), PLAIN[1], np.float32), amax.reshape(1))
    residual = [(BINARY_ADD, _pixels(rows2d(ins[1])))] if attrs["residual"] else []
    described, chain, more = _post_ops(o, attrs, residual, 4)
    args.update(more)
    attr = o.quantized_attr({SRC: 0, WEIGHTS: PER_OUT_CHANNEL}, described, chain, zero_points=zero_points)
    return ConvForm(o, src, dst, bias_md, attr, args, q.shape[1], n)


def _rescale_calls(eng: Int8Engine, step, y2: np.ndarray, amax: np.ndarray, ins) -> list:
    """y2 *= ``amax``, the row scales (rows, 1) or the tensor's or the file's one scale, then the
    bias, a residual, the ReLU and the epilogue, as one oneDNN binary primitive and its post-ops,
    in place (``ConvForm``)."""
    (linear,), attrs, o = step.operands, step.attrs, eng.typed
    scale = amax.reshape(-1, 1)
    binaries = [(BINARY_ADD, linear.bias.reshape(1, -1))]
    if attrs["residual"]:
        binaries.append((BINARY_ADD, rows2d(ins[1])))
    described, chain, more = _post_ops(o, attrs, binaries, 2)
    attr = o.quantized_attr({}, described, chain)
    y_md, s_md = o.strided(y2), o.strided(scale)
    args = {SRC: (y_md, y2), SRC_1: (s_md, scale), DST: (y_md, y2), **more}
    return [eng.execute(o.binary_pd(BINARY_MUL, y_md, s_md, y_md, attr), args, replace(step, kind="int8_rescale"))]


def _dense(buffer: np.ndarray, batch: int, size: int, dtype) -> np.ndarray:
    """The first batch x size 8-bit values of a float buffer, (batch, size), dense: oneDNN's
    layout of an 8-bit tensor of that batch."""
    return buffer.reshape(-1).view(dtype)[:batch * size].reshape(batch, size)


def _bind_int8_conv(eng: Int8Engine, step, y, ins, scratch) -> list:
    """Each sample quantized with its own scale (as a linear's rows are; a ``shifted`` one as u8
    around its zero point, which the conv subtracts), then one int8 conv
    primitive made for one sample and run on each: weight and source scales in the primitive,
    the bias, a residual (sum post-op, the residual copied into the output first where it is not
    the output's own buffer) and the activation applied as it writes f32 in the layout.

    On a file's grid: the batch quantized with the file's scale and zero point, one call for it,
    or no quantize at all where the conv before wrote these integers (``integer_input``); and a
    conv whose readers take its output's integers (``dst_grid``) writes them, with the file's
    scale and zero point as oneDNN's destination ones, instead of floats."""
    (linear,), attrs, o = step.operands, step.attrs, eng.typed
    batch = y.shape[0]
    win, group, _ = conv_attrs(attrs["conv"])
    hw = ins[0].shape[-2:]
    x2 = ins[0].reshape(batch, -1)
    q2, amax, zero_point, calls = _conv_source(eng, step, x2, ins, scratch)
    n = batch if attrs["grid"] else 1
    native = eng.is_native(step.reads[0])
    src = o.typed((n, attrs["channels"], *hw), eng.dnnl.layout if native else PLAIN[4], q2.dtype)
    dst, out, more = eng.md(step.out, n), y, {}
    scales, zero_points = {SRC: 0, WEIGHTS: PER_GROUP_CHANNEL if group > 1 else PER_OUT_CHANNEL}, {}
    conv = attrs["conv"]
    if zero_point is not None and zero_point.any() and not attrs["zero_point_folded"]:    # else none to apply
        zero_points[SRC] = 0
        more[ATTR_ZERO_POINTS | SRC] = (o.typed((1,), PLAIN[1], np.int32), zero_point)
    if attrs.get("dst_grid"):                          # its integers, not the floats of its file step
        out_scale, out_zero = _grid_operands(attrs["dst_grid"])
        dst, out = _integer_output(eng, step.out, attrs["dst_grid"], y)
        scales[DST], zero_points[DST] = 0, 0
        more.update({ATTR_SCALES | DST: (o.typed((1,), PLAIN[1], np.float32), out_scale),
                     ATTR_ZERO_POINTS | DST: (o.typed((1,), PLAIN[1], np.int32), out_zero)})
        if _fake_quant_grid(conv["fake_quant"]) == attrs["dst_grid"]:    # else its step, then the concat's grid
            conv = {k: v for k, v in conv.items() if k != "fake_quant"}
    w_dims = linear.weights.shape
    b_md = o.typed((w_dims[0] * (w_dims[1] if group > 1 else 1),), PLAIN[1], np.float32)
    attr = o.quantized_attr(scales, [], eltwises(conv), sum_=attrs["residual"], zero_points=zero_points or None)
    pd = o.conv_pd(src, o.typed(w_dims, ANY, np.int8), b_md, dst, win.strides, tuple(d - 1 for d in win.dilations),
                   win.pads[:2], win.end_pads(*hw), attr)
    if not attrs["grid"]:
        if implementation(eng.dnnl, pd).startswith("ref") and not attrs.get("dst_grid"):
            return _float_conv(eng, step, y, ins, scratch)
        calls = quantize_calls(eng, step, x2, q2, scratch[1], amax, True, zero_point)
    if attrs["residual"] and step.reads[1] != step.out:
        calls.append((np.copyto, (y, ins[1])))
    weights = linear.weights.take(pd)
    scale_md, one_scale = o.typed((len(linear.scales),), PLAIN[1], np.float32), o.typed((1,), PLAIN[1], np.float32)
    for i in range(0, batch, n):          # one call per sample, each on its own scale; on a grid, one call
        calls.append(eng.execute(pd, {SRC: (src, q2[i:i + n]),
                                      WEIGHTS: weights, BIAS: (b_md, linear.bias), DST: (dst, out[i:i + n]),
                                      ATTR_SCALES | SRC: (one_scale, amax[i]),
                                      ATTR_SCALES | WEIGHTS: (scale_md, linear.scales), **more}, step))
    return calls


def _conv_source(eng: Int8Engine, step, x2: np.ndarray, ins, scratch) -> tuple:
    """(q2, scales, zero point, calls) of an int8 conv's 8-bit input (batch, values): on a file's
    grid, the batch's integers with the file's scale and zero point, quantized by ``calls`` (none
    where the conv before wrote them); else the scratch each sample is quantized into (its calls
    made once the conv is known to run), its per-sample scales, and a ``shifted`` one's zero point."""
    attrs, (batch, size) = step.attrs, x2.shape
    dtype = np.uint8 if attrs["unsigned"] or attrs["shifted"] else np.int8
    if not attrs["grid"]:
        return scratch[0].view(dtype)[:, :size], scratch[2], SHIFT if attrs["shifted"] else None, []
    scale, zero_point = _grid_operands(attrs["grid"])
    q2 = _dense(ins[0] if attrs["integer_input"] else scratch[0], batch, size, dtype)
    calls = [] if attrs["integer_input"] else _scaled_cast(eng, step, x2, q2, scale, False, zero_point)
    return q2, np.broadcast_to(scale, (batch, 1)), zero_point, calls


def _float_conv(eng: Int8Engine, step, y, ins, scratch) -> list:
    """A conv oneDNN has only reference int8 code for here (without int8 dot products, AVX2: its
    jit kernels take grouped convs only of whole vectors of channels, and ShuffleNet's have 6 or
    34 a group), bound as onednn's float conv on the same quantized weights, dequantized once;
    named in ``report()["float_products"]``."""
    (linear,) = step.operands
    w = eng.dequantized_convs.get(id(linear))
    if w is None:
        out_ch = len(linear.scales)
        w = linear.weights.values().reshape(out_ch, -1).astype(np.float32) * linear.scales[:, None]
        w = eng.dequantized_convs[id(linear)] = w.reshape(out_ch, -1, *step.attrs["conv"]["kernel_shape"])
    eng.float_products.add(f"conv {step.out}")
    return bind_float_conv(eng, replace(step, kind="dnnl_conv", operands=(w, linear.bias)), y, ins, scratch)


def _bind_quantize(eng: Int8Engine, step, y, ins, scratch) -> list:
    """A tensor's integers on its grid (``Int8Engine._integer_copy``): the file's scale and zero
    point, one oneDNN reorder for the batch, into the dense 8-bit view of the copy's buffer."""
    grid, batch = step.attrs["grid"], y.shape[0]
    scale, zero_point = _grid_operands(grid)
    x2 = ins[0].reshape(batch, -1)
    q2 = _dense(y, batch, x2.shape[1], np.uint8 if grid[2] == 0 else np.int8)
    return _scaled_cast(eng, step, x2, q2, scale, False, zero_point)


def _integer_output(eng: Int8Engine, buffer: str, grid: tuple, y) -> tuple:
    """The descriptor and dense 8-bit view of native ``buffer`` (view ``y``) holding the integers
    of ``grid`` (scale, zero point, lowest level)."""
    out_type = np.uint8 if grid[2] == 0 else np.int8
    dst = eng.typed.typed((y.shape[0], eng.channels_of(buffer), *y.shape[2:]), eng.dnnl.layout, out_type)
    return dst, _dense(y, y.shape[0], math.prod(y.shape[1:]), out_type)


def _bind_binary(eng: Int8Engine, step, y, ins, scratch) -> list:
    """onednn's binary step; where it writes its grid's integers (``dst_grid``), its post-ops end
    in x / scale + zero point (``_integer_chain``). An add reading an operand's integers
    (``src_grids``) takes them as its second source, scaled by their grid's scale, and subtracts
    scale x zero point as its first post-op (oneDNN's binary takes source scales, not zero
    points)."""
    grids, out_grid = step.attrs.get("src_grids", (None, None)), step.attrs.get("dst_grid")
    k = next((k for k, grid in enumerate(grids) if grid), None)     # the integer operand; a sum's commute
    chain = tuple(step.attrs.get("eltwises", ()))
    if k is not None and grids[k][1]:           # a zero point to take off
        chain = ((LINEAR, 1.0, -grids[k][0] * grids[k][1]),) + chain
    if out_grid is not None:
        chain = _integer_chain(chain, out_grid)
    dst = None if out_grid is None else _integer_output(eng, step.out, out_grid, y)
    if k is None:
        return bind_float_binary(eng, step, y, ins, scratch, dst=dst, chain=chain)
    o, grid, batch = eng.typed, grids[k], y.shape[0]
    attr = o.quantized_attr({SRC_1: 0}, [], chain)
    args = {SRC: (eng.md(step.reads[1 - k], batch), ins[1 - k]), SRC_1: _integer_output(eng, step.reads[k], grid, ins[k]),
            ATTR_SCALES | SRC_1: (o.typed((1,), PLAIN[1], np.float32), _grid_operands(grid)[0]),
            DST: dst or (eng.md(step.out, batch), y)}
    pd = o.binary_pd(step.attrs["alg"], args[SRC][0], args[SRC_1][0], args[DST][0], attr)
    return [eng.execute(pd, args, step)]


def _bind_concat(eng: Int8Engine, step, y, ins, scratch) -> list:
    """onednn's concat step; where its parts' convs wrote its grid's integers (``dst_grid``,
    ``_concat_writers``), a concat of those 8-bit parts into its 8-bit output."""
    grid = step.attrs.get("dst_grid")
    if grid is None:
        return bind_float_concat(eng, step, y, ins, scratch)
    dst = _integer_output(eng, step.out, grid, y)
    srcs = [_integer_output(eng, b, grid, x) for b, x in zip(step.reads, ins)]
    pd = eng.typed.concat_pd(dst[0], [md for md, _ in srcs], eng.typed.attr())
    return [eng.execute(pd, {DST: dst, **{MULTIPLE_SRC + i: src for i, src in enumerate(srcs)}}, step)]


def _bind_pool(eng: Int8Engine, step, y, ins, scratch) -> list:
    """onednn's pool step; a max pool of integers (``dst_grid``) reads and writes them, 8-bit."""
    if not step.attrs.get("dst_grid"):
        return bind_float_pool(eng, step, y, ins, scratch)
    grid = step.attrs["dst_grid"]                       # the input's grid too: a max pool keeps it
    (dst, out), (src, q) = _integer_output(eng, step.out, grid, y), _integer_output(eng, step.reads[0], grid, ins[0])
    attrs = {k: v for k, v in step.attrs.items() if k != "dst_grid"}
    return [pool_call(eng, step, attrs, src, q, dst, out, ins[0].shape[-2:])]


Int8Engine.binders = {**OneDnnEngine.binders, "int8_linear": _bind_int8_linear, "int8_conv": _bind_int8_conv,
                      "int8_quantize": _bind_quantize, "dnnl_binary": _bind_binary, "dnnl_pool": _bind_pool,
                      "dnnl_concat": _bind_concat}

"""int8: ``onednn``'s steps, with every linear run as oneDNN's int8 matmul on weights quantized once.

Weights: symmetric s8, one scale per output channel (max |w| over the column / 127), quantized
once at construction from the weights as ``fused`` folds them (layernorm's affine, gelu's 0.5,
attention's 1/sqrt(d) already in them), then held only in the layout the matmul takes: one byte
per weight plus a float scale per column.

Activations: quantized at each linear's input at run time, symmetric s8 with one scale per row
(per token; max |x| over the row / 127), into planned buffers (``lw.buffer``, so the planner
reuses them between linears like any activation): NumPy ``out=`` calls for the row maxima, the
scaling, the rounding and the cast. Per row rather than per tensor: the error was lower on every
model of the zoo and the speed the same, and a row's result does not depend on the other rows of
the batch (docs/int8.md).

The product: oneDNN's matmul primitive, s8 x s8 accumulated in s32 (AMX or VNNI instructions where
the CPU has them), written as f32 with the weight scales applied in the primitive and, as each
output block is written, post-ops: the row scales (a binary multiply by a (rows, 1) column), the
bias (a binary add of a (1, n) row), a residual add and a ReLU. The quantized product never exists
as an s32 array in engine memory.

What stays float32, and why: layernorm's standardize, softmax, gelu, attention's per-head
products (activation x activation, both produced at run time: quantizing both per call costs
passes that the small products do not pay back), and every op that is no linear (a CNN's
convolutions, pools and the rest run as ``onednn`` runs them: int8 convolutions are not done
yet). Their error budget is the float engines' 1e-4; the int8 linears' is stated as
``abs_tol``/``rel_tol`` below, derived from measurement on the zoo (docs/int8.md).

Nothing is allocated per forward. Needs oneDNN's CPU library (the ``onednn`` extra).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..base import EngineUnavailable
from ..ir.calls import maximum, rows2d
from ..native.onednn import ANY, BIAS, BINARY_ADD, DST, PLAIN, RELU, SRC, WEIGHTS, library
from ..native.onednn_int8 import (ATTR_SCALES, QuantizedWeights, TypedOwned, post_op_arg,
                                  quantize_columns)
from .fused import FusedStep, Lowering
from .onednn import OneDnnEngine

LEVELS = 127                    # symmetric s8: [-127, 127], zero exactly representable
U8_LEVELS = 255                 # a ReLU's output as u8: [0, 255], twice the resolution
TINY = np.float32(1e-30)        # an all-zero row's scale: its values quantize to 0 without a 0/0
BINARY_MUL = 0x1FFF1            # dnnl_binary_mul
LINEAR_KINDS = ("linear", "linear_relu", "linear_add")
PER_COLUMN_3D = 1 << 2          # scale mask of (1, k, n) weights: one per output channel


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


class Int8Engine(OneDnnEngine):
    name = "int8"
    # The bar the engine is held to against the float64 reference (tests, analyzer, report): not
    # the float engines' 1e-4. Measured on the zoo (docs/int8.md, 540 forwards: mlp d64-4096,
    # mlp-deep d48-1024, transformer d32-512, batches 1-32): worst max abs error 0.125 on outputs
    # up to 6.3, worst relative L2 error 2.5 % (mlp-deep, six quantized layers); the bars are
    # twice the worst figure.
    abs_tol = 0.25
    rel_tol = 0.05
    # Activation scales: one per row (True) or one per tensor (False); measured, docs/int8.md
    row_scales = True

    def __init__(self, model, max_batch: int):
        try:
            library()
        except EngineUnavailable as exc:
            raise EngineUnavailable(f"the int8 engine runs its linears on oneDNN's int8 matmul ({exc})") from exc
        self.quantized: list[QuantizedLinear] = []
        super().__init__(model, max_batch)
        for linear in self.quantized:          # bound at max_batch: the plain s8 copies can go
            linear.weights.settle()
        self.weight_bytes = sum(a.nbytes for step in self.steps for a in step.operands
                                if isinstance(a, (np.ndarray, QuantizedLinear)))

    # --- lowering: fused's linear step (weights folded), then quantized -----------------------

    def lower_op(self, lw: Lowering, i: int, op) -> None:
        super().lower_op(lw, i, op)
        if op.kind == "linear":
            step = lw.steps[-1]
            if step.kind not in LINEAR_KINDS:
                raise AssertionError(f"linear {op.output!r} lowered to {step.kind!r}")
            lw.steps[-1] = self._quantized_step(lw, step)

    def _quantized_step(self, lw: Lowering, step: FusedStep) -> FusedStep:
        """The int8 form of a fused linear step: its folded float weights quantized per output
        channel; scratch for the activations' s8 copy (4 per float slot), their |x| and their row
        scales."""
        w32, b32 = step.operands[:2]
        q, scales = quantize_columns(w32, LEVELS)
        linear = QuantizedLinear(QuantizedWeights(self.dnnl, _one(q)), scales, np.ascontiguousarray(b32, np.float32))
        self.quantized.append(linear)
        src_shape = self.shapes[step.reads[0]]
        lead, k = src_shape[:-1], src_shape[-1]
        rows = lead if self.row_scales else (1,) * len(lead)
        scratch = (lw.buffer(step.out + ".q8", (*lead, -(-k // 4))),
                   lw.buffer(step.out + ".abs", src_shape),
                   lw.buffer(step.out + ".amax", (*rows, 1)))
        return FusedStep("int8_linear", step.out, step.reads, scratch, (linear,),
                         {"relu": step.kind == "linear_relu", "residual": step.kind == "linear_add",
                          "unsigned": _non_negative(lw, step.reads[0])})

    # --- binding -----------------------------------------------------------------------------

    def own_memory(self) -> None:
        super().own_memory()
        self.typed = TypedOwned(self.dnnl)     # this engine's (or worker's) int8 primitives
        weakref.finalize(self, self.typed.release)

    def report(self) -> dict:
        """onednn's report, with the data types and scales of the int8 linears."""
        return {**super().report(), "activation_scales": "row" if self.row_scales else "tensor",
                "quantized_linears": len(self.quantized)}


def _non_negative(lw: Lowering, buffer: str) -> bool:
    """Whether ``buffer`` is written last by a linear with its ReLU (so it holds no negative value)."""
    writer = next((s for s in reversed(lw.steps) if s.out == buffer), None)
    return writer is not None and writer.kind == "int8_linear" and writer.attrs["relu"]


def quantize_calls(x2: np.ndarray, q: np.ndarray, tmp: np.ndarray, amax: np.ndarray, per_row: bool) -> list:
    """The calls that write ``q`` (rows, k) = round(x2 / scale) and leave the scale in ``amax``:
    s8 with scale = max |x| / 127, or for a u8 ``q`` (x2 known non-negative) max x / 255, per row
    (``amax`` (rows, 1)) or over the tensor (``amax`` (1, 1)). |x2| / scale <= the top level, so the
    cast never saturates; ``tmp`` holds |x|, the scales, then the scaled values. A (rows, 1)
    operand broadcast in a ufunc made NumPy buffer it (17 KB at 256 x 16); ``np.copyto`` does not."""
    levels = U8_LEVELS if q.dtype == np.uint8 else LEVELS
    axis = 1 if per_row else None
    amax_calls = ([(np.max, (x2, axis, amax, True))] if q.dtype == np.uint8
                  else [(np.abs, (x2, tmp)), (np.max, (tmp, axis, amax, True))])
    return [*amax_calls, (maximum, (amax, TINY, amax)), (np.multiply, (amax, np.float32(1.0 / levels), amax)),
            (np.copyto, (tmp, amax)),           # the scales broadcast without the ufunc's buffer
            (np.divide, (x2, tmp, tmp)), (np.rint, (tmp, tmp)), (_cast, (q, tmp))]


def _one(a: np.ndarray) -> np.ndarray:
    """``a`` (rows, cols) as (1, rows, cols), the new axis with a true stride (NumPy gives a new axis
    stride 0, which oneDNN's brgemm matmul does not take)."""
    return np.lib.stride_tricks.as_strided(a, (1, *a.shape), (a.shape[0] * a.strides[0], *a.strides))


def _cast(q: np.ndarray, tmp: np.ndarray) -> None:
    np.copyto(q, tmp, casting="unsafe")


def _bind_int8_linear(eng: Int8Engine, step, y, ins, scratch) -> list:
    """The quantize calls, then one int8 matmul writing f32: weight scales in the primitive; the
    row scales, the bias, a residual and a ReLU as post-ops.

    The matmul is described in 3-D, (1, rows, k) x (1, k, n): oneDNN 3.2's brgemm matmul takes a
    (1, rows, 1) binary operand there, while on the 2-D form a (rows, 1) one fell back to its
    reference code (``ref:any``, hundreds of times slower)."""
    (linear,), attrs, o = step.operands, step.attrs, eng.typed
    x2, y2 = rows2d(ins[0]), rows2d(y)
    k, n = linear.weights.shape[-2:]
    q = rows2d(scratch[0]).view(np.uint8 if attrs["unsigned"] else np.int8)[:, :k]
    tmp, amax = rows2d(scratch[1]), rows2d(scratch[2])
    if not eng.row_scales:
        amax = amax[:1]                                # one scale for the whole batch
    calls = quantize_calls(x2, q, tmp, amax, eng.row_scales)
    bias = linear.bias.reshape(1, 1, n)
    src, dst = o.strided(_one(q)), o.strided(_one(y2))
    binaries, operands = [], []
    if eng.row_scales:                                 # per-row scales, then the bias, as post-ops
        binaries += [(BINARY_MUL, o.strided(_one(amax))), (BINARY_ADD, o.strided(bias))]
        operands += [_one(amax), bias]
        scales, bias_md = {WEIGHTS: PER_COLUMN_3D}, None
    else:                                              # one scale for the tensor, the bias in the primitive
        scales, bias_md = {SRC: 0, WEIGHTS: PER_COLUMN_3D}, o.strided(bias)
    if attrs["residual"]:
        residual = _one(rows2d(ins[1]))
        binaries.append((BINARY_ADD, o.strided(residual)))
        operands.append(residual)
    attr = o.quantized_attr(scales, binaries, (RELU, 0.0, 0.0) if attrs["relu"] else None)
    pd = o.matmul_pd(src, o.typed((1, k, n), ANY, np.int8), bias_md, dst, attr)
    args = {SRC: (src, _one(q)), WEIGHTS: linear.weights.take(pd), DST: (dst, _one(y2)),
            ATTR_SCALES | WEIGHTS: (o.typed((n,), PLAIN[1], np.float32), linear.scales)}
    args.update({post_op_arg(i): (md, a) for i, ((_, md), a) in enumerate(zip(binaries, operands))})
    if bias_md is not None:
        args[BIAS] = (bias_md, bias)
        args[ATTR_SCALES | SRC] = (o.typed((1,), PLAIN[1], np.float32), amax.reshape(1))
    calls.append(eng.execute(pd, args, step))
    return calls


Int8Engine.binders = {**OneDnnEngine.binders, "int8_linear": _bind_int8_linear}

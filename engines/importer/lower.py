"""Lowering an ONNX graph's nodes to IR ops: one rule per op type, in ``LOWER``.

A rule sees the node being lowered through a ``Lowering``: its inputs as
activations (``Act``: an IR tensor and where its batch axis is) or folded
constants (NumPy arrays at batch 1), and its measured output shapes. It emits
IR ops whose attributes are per sample (``emit``) and says which IR tensor
holds each output (``result``). A node of a supported type used in a way the
rule cannot lower raises ``Unsupported`` with the reason; ``lower`` collects
every such problem. Adding an ONNX op type is one entry in ``LOWER``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..ir.models import Op
from .values import Act, Unsupported

@dataclass
class Lowering:
    """What the lowering rules write into: IR ops, parameters, and the value of every ONNX name."""
    ops: list[Op] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    origin: dict[str, tuple[str, ...]] = field(default_factory=dict)
    values: dict[str, object] = field(default_factory=dict)       # name -> Act | np.ndarray
    acts: dict[str, Act] = field(default_factory=dict)            # measured: name -> Act
    node: object = None                                           # the node being lowered
    opset: int = 0
    opset_import: tuple = ()                                      # the file's, for a node run on its own
    read: set = field(default_factory=set)                        # names some node or the graph output reads
    evaluated: dict = field(default_factory=dict)                 # every value at batch 1 (ONNX's evaluator)

    def emit(self, kind: str, inputs, out_shape, params=(), name=None, **attrs) -> str:
        name = name or self._fresh(self.node.output[0])
        self.shapes[name] = tuple(int(d) for d in out_shape)
        self.ops.append(Op(kind, tuple(inputs), name, tuple(params), attrs))
        self.origin[name] = (self.node.name or self.node.output[0],)
        return name

    def param(self, array, hint: str) -> str:
        name = self._fresh(hint)
        self.params[name] = np.array(array, dtype=np.float32, order="C")     # an own, writable copy
        return name

    def _fresh(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.shapes or name in self.params:
            i += 1
            name = f"{hint}.{i}"
        return name

    def out(self, index: int = 0) -> Act:
        """The measured output of the current node."""
        return self.acts[self.node.output[index]]

    def result(self, act_name: str, index: int = 0) -> None:
        """The IR tensor holding the node's output ``index`` (a view if shapes differ)."""
        target = self.out(index)
        if self.shapes[act_name] != target.per_sample:
            act_name = self.emit("reshape", [act_name], target.per_sample, shape=target.per_sample,
                                 name=self._fresh(self.node.output[index]))
        self.values[self.node.output[index]] = Act(act_name, target.shape, target.bpos)

    def attr(self, name, default=None):
        from onnx import helper
        for a in self.node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def dtype(self, name: str) -> np.dtype:
        """The ONNX element type of a value, as its batch-1 evaluation has it (activations included:
        the IR holds them all as float32, a bool as 0.0/1.0)."""
        return np.asarray(self.evaluated[name]).dtype if name in self.evaluated else np.dtype(np.float32)

    def const(self, i: int, what: str) -> np.ndarray | None:
        """Input i as a constant (None when absent); an activation there is unsupported."""
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        v = self.values[self.node.input[i]]
        if isinstance(v, Act):
            raise Unsupported(f"its {what} is computed from the input; only constants are supported there")
        return v


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _as_act(L: Lowering, v, out: Act) -> str:
    """An activation operand broadcast to the node's output: itself, or an ``expand`` of it."""
    rank = len(out.shape)
    aligned = (1,) * (rank - len(v.shape)) + v.shape
    bpos = None if v.bpos is None else v.bpos + rank - len(v.shape)
    if bpos != out.bpos:
        raise Unsupported("it broadcasts the batch axis against another axis")
    per_sample = aligned if bpos is None else aligned[:bpos] + aligned[bpos + 1:]
    if per_sample == out.per_sample:
        return v.name
    return L.emit("expand", [v.name], out.per_sample, name=L._fresh(v.name + ".expand"),
                  aligned=per_sample, shape=out.per_sample)


def _const_operand(L: Lowering, c: np.ndarray, out: Act) -> dict:
    """A constant operand of an elementwise op as ``binary``'s attrs and params: a scalar, or
    the shortest vector that repeats along the output's trailing elements."""
    c = np.asarray(c, dtype=np.float64)
    if c.size == 1:
        return {"scalar": float(c.reshape(()))}
    c = _per_sample_const(L, c, out)
    aligned = c.shape
    target = out.per_sample
    lead = 0
    while lead < len(aligned) and aligned[lead] == 1:
        lead += 1
    if aligned[lead:] != target[lead:]:            # not one trailing block: materialise it
        lead = 0
    block = np.broadcast_to(c, (1,) * lead + target[lead:]).reshape(-1)
    return {"params": [L.param(block, L.node.output[0] + ".c")], "width": int(block.size)}


COMMUTATIVE = {"add", "mul", "max", "min", "equal", "not_equal"}


def lower_binary(L: Lowering, fn: str, kind: str = "binary"):
    """An elementwise op of two operands (``binary``, ``extremum`` or ``compare``, by ``fn``)."""
    a, b = (L.values[n] for n in L.node.input[:2])
    out = L.out()
    if isinstance(a, Act) and isinstance(b, Act):
        ins = [_as_act(L, a, out), _as_act(L, b, out)]
        if fn == "add" and kind == "binary":
            return L.result(L.emit("add", ins, out.per_sample))
        return L.result(L.emit(kind, ins, out.per_sample, fn=fn))
    act, c, swap = (a, b, False) if isinstance(a, Act) else (b, a, True)
    src = _as_act(L, act, out)
    extra = _const_operand(L, c, out)
    params = extra.pop("params", ())
    if fn in COMMUTATIVE:
        swap = False                              # commutative: one form for the passes to match
    L.result(L.emit(kind, [src], out.per_sample, params, fn=fn, swap=swap, **extra))


def lower_mod(L: Lowering):
    """Mod: ``fmod`` (C's, the sign of the dividend) when fmod=1, else ``mod`` (the divisor's)."""
    lower_binary(L, "fmod" if L.attr("fmod", 0) else "mod")


def lower_not(L: Lowering):
    """Not of a 0/1 mask: 1 - x."""
    x = L.values[L.node.input[0]]
    L.result(L.emit("binary", [x.name], x.per_sample, fn="sub", scalar=1.0, swap=True))


def lower_hardsigmoid(L: Lowering):
    x = L.values[L.node.input[0]]
    L.result(L.emit("hardsigmoid", [x.name], x.per_sample, alpha=float(L.attr("alpha", 0.2)),
                    beta=float(L.attr("beta", 0.5))))


def _per_sample_const(L: Lowering, c, out: Act) -> np.ndarray:
    """A constant operand broadcast against the node's output, with the output's per-sample rank
    (leading 1s; the batch axis, which it must not vary along, dropped)."""
    c = np.asarray(c, dtype=np.float64)
    rank = len(out.shape)
    if c.ndim > rank:
        raise Unsupported("a constant operand has more axes than the result")
    aligned = (1,) * (rank - c.ndim) + c.shape
    if out.bpos is not None:
        if aligned[out.bpos] != 1:
            raise Unsupported("a constant operand varies along the batch axis")
        aligned = aligned[:out.bpos] + aligned[out.bpos + 1:]
    return c.reshape(aligned)


def _emit_where(L: Lowering, operands) -> str:
    """A ``where`` of (cond, a, b), each an Act, a constant array or a scalar constant."""
    out = L.out()
    order, tensors, params, scalars = "", [], [], []
    for v in operands:
        if isinstance(v, Act):
            tensors.append(_as_act(L, v, out))
            order += "t"
        elif np.size(v) == 1:
            scalars.append(float(np.asarray(v, dtype=np.float64).reshape(())))
            order += "s"
        else:
            params.append(L.param(_per_sample_const(L, v, out), L.node.output[0] + ".c"))
            order += "p"
    return L.emit("where", tensors, out.per_sample, params, order=order, scalars=tuple(scalars))


def lower_where(L: Lowering):
    """Where(cond, a, b); cond is a 0/1 mask, read as "non-zero"."""
    L.result(_emit_where(L, [L.values[n] for n in L.node.input[:3]]))


def lower_trilu(L: Lowering):
    """Trilu of an activation: a ``where`` with the constant triangle as its condition."""
    x = L.values[L.node.input[0]]
    x.axis(-1), x.axis(-2)                         # Unsupported when the batch is one of the two
    k = L.const(1, "k")
    k = 0 if k is None else int(np.asarray(k).reshape(()))
    ones = np.ones(x.shape[-2:])
    mask = np.triu(ones, k) if L.attr("upper", 1) else np.tril(ones, k)
    L.result(_emit_where(L, [mask, x, 0.0]))


INTEGER_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}        # TensorProto's UINT8 ... INT64, UINT32, UINT64


def lower_cast(L: Lowering):
    """A Cast (or CastLike: to its second input's type) of an activation. Every IR tensor is float32 (a bool as 0.0/1.0, an integer exact
    up to 2**24): to float32, from bool or integers to integers, and from bool to bool is the
    same values; to bool from anything else is ``x != 0``. A float to an integer type (which
    truncates) or to another float type is refused."""
    from onnx import TensorProto, helper
    source = L.dtype(L.node.input[0])
    to = L.attr("to") if L.node.op_type == "Cast" else helper.np_dtype_to_tensor_dtype(L.dtype(L.node.input[1]))
    x = L.values[L.node.input[0]]
    whole = source == np.bool_ or np.issubdtype(source, np.integer)
    if to == TensorProto.FLOAT or (to in INTEGER_TYPES and whole) or (to == TensorProto.BOOL and source == np.bool_):
        return L.result(x.name)
    if to == TensorProto.BOOL:
        return L.result(L.emit("compare", [x.name], x.per_sample, fn="not_equal", scalar=0.0))
    raise Unsupported(f"a Cast of a {source} activation to {TensorProto.DataType.Name(to)} "
                      f"(only to float32, to bool, and from bool or integers to integers)")


def lower_unary(kind: str, **attrs):
    def rule(L: Lowering):
        x = L.values[L.node.input[0]]
        L.result(L.emit(kind, [x.name], x.per_sample, **attrs))
    return rule


def lower_alias(L: Lowering):
    """Identity, Dropout at inference: the output is the input."""
    if L.node.op_type == "Dropout" and len(L.node.output) > 1 and L.node.output[1] in L.read:
        raise Unsupported("its mask output is used")
    x = L.values[L.node.input[0]]
    L.result(x.name)


def lower_view(L: Lowering):
    """Reshape, Flatten, Squeeze, Unsqueeze: the same elements in another shape (a view)."""
    x = L.values[L.node.input[0]]
    L.result(x.name)


def lower_clip(L: Lowering):
    x = L.values[L.node.input[0]]
    if L.opset < 11:
        lo, hi = L.attr("min"), L.attr("max")
    else:
        lo, hi = (L.const(i, name) for i, name in ((1, "min"), (2, "max")))
    as_float = lambda v: None if v is None else float(np.asarray(v).reshape(()))   # noqa: E731
    L.result(L.emit("clip", [x.name], x.per_sample, lo=as_float(lo), hi=as_float(hi)))


def lower_fake_quant(L: Lowering):
    """``engines.importer.quantized``'s FakeQuantize: the IR's ``fake_quant`` with the same attributes."""
    x = L.values[L.node.input[0]]
    L.result(L.emit("fake_quant", [x.name], L.shapes[x.name], **{a.name: L.attr(a.name) for a in L.node.attribute}))


def lower_gelu(L: Lowering):
    x = L.values[L.node.input[0]]
    kind = "gelu" if L.attr("approximate", b"none") in (b"tanh", "tanh") else "gelu_erf"
    L.result(L.emit(kind, [x.name], x.per_sample))


def lower_matmul(L: Lowering):
    a, b = (L.values[n] for n in L.node.input[:2])
    out = L.out()
    if isinstance(a, Act) and isinstance(b, Act):
        if len(a.per_sample) != len(b.per_sample) or len(a.per_sample) < 2:
            raise Unsupported("a product of activations of different ranks")
        stack = out.per_sample[:-2]
        return L.result(L.emit("matmul", [_stacked(L, v, stack) for v in (a, b)], out.per_sample))
    if not isinstance(a, Act) or np.ndim(b) != 2 or a.bpos == len(a.shape) - 1:
        return _matmul_const(L, a if isinstance(a, Act) else b, b if isinstance(a, Act) else a, not isinstance(a, Act))
    w = L.param(b, L.node.output[0] + ".w")
    zero = L.param(np.zeros(b.shape[1]), L.node.output[0] + ".b")
    L.result(L.emit("linear", [a.name], out.per_sample, [w, zero]))


def _stacked(L: Lowering, v: Act, stack: tuple) -> str:
    """A product's activation operand with the product's stack of matrices: itself, or an
    ``expand`` of its unit axes (multi-query attention's one key head against every query head)."""
    if v.per_sample[:-2] == stack:
        return v.name
    shape = stack + v.per_sample[-2:]
    return L.emit("expand", [v.name], shape, name=L._fresh(v.name + ".expand"), aligned=v.per_sample, shape=shape)


def _matmul_const(L: Lowering, x: Act, c, swap: bool):
    """x @ c (c @ x when ``swap``) for a constant c of any rank, broadcasting their stacks as
    ONNX's MatMul does (a 1-D c promoted to a matrix and its unit axis then dropped): a
    ``matmul_const``. The batch axis must be one of x's stacked axes, along which c is 1."""
    c = np.asarray(c, dtype=np.float64)
    if c.ndim == 1:
        c = c[None, :] if swap else c[:, None]
    rank = max(len(x.shape), c.ndim)
    if len(x.shape) < 2:
        raise Unsupported("a product of a vector activation and a constant")
    bpos = None if x.bpos is None else x.bpos + rank - len(x.shape)
    if bpos is not None and bpos >= rank - 2:
        raise Unsupported("the batch axis is one of the matrix axes of a product with a constant")
    c = c.reshape((1,) * (rank - c.ndim) + c.shape)
    if bpos is not None:
        if c.shape[bpos] != 1:
            raise Unsupported("a constant operand varies along the batch axis")
        c = c.reshape(c.shape[:bpos] + c.shape[bpos + 1:])
    aligned = (1,) * (c.ndim - len(x.per_sample)) + x.per_sample
    stack = np.broadcast_shapes(aligned[:-2], c.shape[:-2])
    out = stack + ((c.shape[-2], aligned[-1]) if swap else (aligned[-2], c.shape[-1]))
    w = L.param(c, L.node.output[0] + ".w")
    L.result(L.emit("matmul_const", [x.name], out, [w], aligned=aligned, swap=swap))


def lower_gemm(L: Lowering):
    a = L.values[L.node.input[0]]
    if not isinstance(a, Act):
        raise Unsupported("its A operand is a constant")
    src = a.name
    if L.attr("transA", 0):
        if a.bpos is not None:      # A^T would move the batch axis; a fixed batch read whole has none
            raise Unsupported("its A operand is transposed, batch axis and all")
        src = L.emit("transpose", [a.name], a.per_sample[::-1], name=L._fresh(a.name + ".t"), perm=(1, 0))
    b = L.const(1, "B")
    c = L.const(2, "C")
    alpha, beta = float(L.attr("alpha", 1.0)), float(L.attr("beta", 1.0))
    w = (b.T if L.attr("transB", 0) else b).astype(np.float64) * alpha
    n = w.shape[1]
    bias = np.zeros(n) if c is None else np.asarray(c, dtype=np.float64)
    rows = None
    if bias.size not in (1, n) or (bias.ndim == 2 and bias.shape[0] != 1):
        if a.bpos is not None:      # rows are samples: a per-row C would differ per sample
            raise Unsupported("its C operand varies per row")
        rows, bias = bias * beta, np.zeros(n)        # no batch axis: added after the product
    bias = np.broadcast_to(bias.reshape(-1), (n,)) * beta
    name, out = L.node.output[0], L.out()
    y = L.emit("linear", [src], out.per_sample, [L.param(w, name + ".w"), L.param(bias, name + ".b")])
    if rows is not None:
        extra = _const_operand(L, rows, out)
        y = L.emit("binary", [y], out.per_sample, extra.pop("params", ()), fn="add", swap=False, **extra)
    L.result(y)


def _trailing(L: Lowering, x: Act, axes: list[int]) -> tuple[str, int]:
    """x with the per-sample ``axes`` moved last and flattened into one: (tensor, width)."""
    shape = x.per_sample
    keep = [i for i in range(len(shape)) if i not in axes]
    name = x.name
    if keep + axes != list(range(len(shape))):
        perm = keep + axes
        name = L.emit("transpose", [name], [shape[i] for i in perm], name=L._fresh(x.name + ".t"), perm=tuple(perm))
    width = math.prod(shape[i] for i in axes)
    flat = tuple(shape[i] for i in keep) + (width,)
    if L.shapes[name] != flat:
        name = L.emit("reshape", [name], flat, name=L._fresh(x.name + ".rows"), shape=flat)
    return name, width


def _reduced_rows(L: Lowering) -> str | None:
    """The reduced axes of the node's input moved last and flattened into rows (``_trailing``);
    None when ``noop_with_empty_axes`` leaves the input as it is."""
    x = L.values[L.node.input[0]]
    axes = L.attr("axes")
    if axes is None and len(L.node.input) > 1 and L.node.input[1]:
        axes = _ints(L.const(1, "axes"))
    if not axes:
        if L.attr("noop_with_empty_axes", 0):
            return None
        if x.bpos is not None:
            raise Unsupported("it reduces every axis, the batch axis included")
        axes = range(len(x.shape))         # no batch axis (a fixed batch read whole): all of it
    return _trailing(L, x, sorted({x.axis(a) for a in axes}))[0]


def _then(L: Lowering, kind: str | None, name: str) -> str:
    """``kind`` applied elementwise to ``name`` ("square": x·x), or ``name`` for None."""
    if kind is None:
        return name
    if kind == "square":
        return L.emit("binary", [name, name], L.shapes[name], fn="mul")
    return L.emit(kind, [name], L.shapes[name])


def lower_reduce(kind: str, pre: str | None = None, post: str | None = None):
    """A reduction over any axes but the batch's: ``pre`` on every element, ``kind`` over the rows
    of the reduced axes, ``post`` on the result (ReduceL2: square, reduce_sum, sqrt)."""
    def rule(L: Lowering):
        rows = _reduced_rows(L)
        if rows is None:                   # noop_with_empty_axes: pre and post, elementwise
            return L.result(_then(L, post, _then(L, pre, L.values[L.node.input[0]].name)))
        y = _then(L, pre, rows)
        L.result(_then(L, post, L.emit(kind, [y], L.shapes[y][:-1] + (1,))))
    return rule


def lower_reduce_log_sum_exp(L: Lowering):
    """log(sum(exp(x - m))) + m over the rows, m their maximum: no overflow for large x."""
    rows = _reduced_rows(L)
    if rows is None:
        return L.result(L.values[L.node.input[0]].name)
    shape = L.shapes[rows]
    peak = L.emit("reduce_max", [rows], shape[:-1] + (1,))
    wide = L.emit("expand", [peak], shape, aligned=shape[:-1] + (1,), shape=shape)
    e = L.emit("exp", [L.emit("binary", [rows, wide], shape, fn="sub")], shape)
    total = L.emit("log", [L.emit("reduce_sum", [e], shape[:-1] + (1,))], shape[:-1] + (1,))
    L.result(L.emit("add", [total, peak], shape[:-1] + (1,)))


def lower_rowwise(kind: str):
    """A kind over the last axis (``softmax``, ``hardmax``) applied along ONNX's ``axis``: off the
    last axis transposed there and back; before opset 13 over every axis from ``axis`` on, as one row."""
    def rule(L: Lowering):
        x = L.values[L.node.input[0]]
        axis = x.axis(L.attr("axis", -1 if L.opset >= 13 else 1))
        last = len(x.per_sample) - 1
        if L.opset < 13 and axis != last:
            rows = x.per_sample[:axis] + (math.prod(x.per_sample[axis:]),)
            flat = L.emit("reshape", [x.name], rows, name=L._fresh(x.name + ".rows"), shape=rows)
            return L.result(L.emit(kind, [flat], rows, name=L._fresh(L.node.output[0] + ".rows")))
        if axis == last:
            return L.result(L.emit(kind, [x.name], x.per_sample))
        perm = [i for i in range(len(x.per_sample)) if i != axis] + [axis]
        back = tuple(int(i) for i in np.argsort(perm))
        moved = L.emit("transpose", [x.name], [x.per_sample[i] for i in perm], name=L._fresh(x.name + ".t"),
                       perm=tuple(perm))
        y = L.emit(kind, [moved], L.shapes[moved], name=L._fresh(L.node.output[0] + ".t"))
        L.result(L.emit("transpose", [y], x.per_sample, perm=back))
    return rule


def lower_log_softmax(L: Lowering):
    """x - m - log(sum(exp(x - m))) over an axis, m the row's maximum (exact where log(softmax)
    would give -inf); off the last axis transposed there and back, before opset 13 over every
    axis from ``axis`` on as one row (as ``lower_softmax``)."""
    x = L.values[L.node.input[0]]
    axis = x.axis(L.attr("axis", -1 if L.opset >= 13 else 1))
    shape, last = x.per_sample, len(x.per_sample) - 1
    perm = list(range(len(shape)))
    if L.opset < 13:
        rows_shape = shape[:axis] + (math.prod(shape[axis:]),)
        rows = L.emit("reshape", [x.name], rows_shape, name=L._fresh(x.name + ".rows"), shape=rows_shape)
    elif axis != last:
        perm = [i for i in perm if i != axis] + [axis]
        rows = L.emit("transpose", [x.name], [shape[i] for i in perm], name=L._fresh(x.name + ".t"), perm=tuple(perm))
    else:
        rows = x.name
    wide = L.shapes[rows]
    column = wide[:-1] + (1,)
    peak = L.emit("expand", [L.emit("reduce_max", [rows], column)], wide, aligned=column, shape=wide)
    shifted = L.emit("binary", [rows, peak], wide, fn="sub")
    total = L.emit("log", [L.emit("reduce_sum", [L.emit("exp", [shifted], wide)], column)], column)
    y = L.emit("binary", [shifted, L.emit("expand", [total], wide, aligned=column, shape=wide)], wide, fn="sub")
    if L.opset >= 13 and axis != last:
        y = L.emit("transpose", [y], shape, perm=tuple(int(i) for i in np.argsort(perm)))
    L.result(y)


def lower_leaky_relu(L: Lowering):
    """x >= 0 ? x : alpha x, as max(x, alpha x) for alpha <= 1 and min(x, alpha x) above."""
    x = L.values[L.node.input[0]]
    alpha = float(L.attr("alpha", 0.01))
    scaled = L.emit("binary", [x.name], x.per_sample, fn="mul", scalar=alpha, swap=False)
    L.result(L.emit("extremum", [x.name, scaled], x.per_sample, fn="max" if alpha <= 1 else "min"))


def lower_shrink(L: Lowering):
    """Shrink: x + bias below -lambd, x - bias above lambd, 0 between; two masks and two ``where``."""
    x = L.values[L.node.input[0]]
    lambd, bias, shape = float(L.attr("lambd", 0.5)), float(L.attr("bias", 0.0)), x.per_sample
    below = L.emit("compare", [x.name], shape, fn="less", scalar=-lambd, swap=False)
    above = L.emit("compare", [x.name], shape, fn="greater", scalar=lambd, swap=False)
    lifted = L.emit("binary", [x.name], shape, fn="add", scalar=bias, swap=False)
    lowered = L.emit("binary", [x.name], shape, fn="sub", scalar=bias, swap=False)
    upper = L.emit("where", [above, lowered], shape, order="tts", scalars=(0.0,))
    L.result(L.emit("where", [below, lifted, upper], shape, order="ttt"))


def lower_swish(L: Lowering):
    """Swish (opset 24): x · sigmoid(alpha x); SiLU as exporters write it is Sigmoid then Mul."""
    x = L.values[L.node.input[0]]
    alpha = float(L.attr("alpha", 1.0))
    src = x.name if alpha == 1.0 else L.emit("binary", [x.name], x.per_sample, fn="mul", scalar=alpha, swap=False)
    L.result(L.emit("binary", [x.name, L.emit("sigmoid", [src], x.per_sample)], x.per_sample, fn="mul"))


def lower_layernorm(L: Lowering):
    x = L.values[L.node.input[0]]
    if any(o for o in L.node.output[1:]):
        raise Unsupported("its mean or inverse standard deviation output is used")
    axis = x.axis(L.attr("axis", -1))
    axes = list(range(axis, len(x.per_sample)))
    name, width = _trailing(L, x, axes)
    scale = np.broadcast_to(L.const(1, "scale"), x.per_sample[axis:]).reshape(-1)
    bias = L.const(2, "bias")
    bias = np.zeros(width) if bias is None else np.broadcast_to(bias, x.per_sample[axis:]).reshape(-1)
    out = L.node.output[0]
    L.result(L.emit("layernorm", [name], L.shapes[name], [L.param(scale, out + ".g"), L.param(bias, out + ".b")],
                    eps=float(L.attr("epsilon", 1e-5))))


def lower_instancenorm(L: Lowering):
    """InstanceNormalization over (N, C, ...) (wav2vec 2.0's GroupNorm with a group per channel):
    each channel standardized over its spatial axes, a ``layernorm`` of unit scale over rows of
    (C, spatial), then the per-channel scale and bias as two ``binary`` ops."""
    x = L.values[L.node.input[0]]
    if x.bpos != 0 or len(x.per_sample) < 2:
        raise Unsupported(f"its input is not (N, C, ...) with the batch first (shape {x.shape})")
    rows, width = _trailing(L, x, list(range(1, len(x.per_sample))))
    out = L.node.output[0]
    y = L.emit("layernorm", [rows], L.shapes[rows], [L.param(np.ones(width), out + ".g"),
                                                     L.param(np.zeros(width), out + ".b")],
               eps=float(L.attr("epsilon", 1e-5)))
    L.result(_scale_and_shift(L, y, L.const(1, "scale"), L.const(2, "B")))


def _scale_and_shift(L: Lowering, y: str, scale, shift) -> str:
    """y * scale + shift, each one value per channel (axis 1 of the node's output), as ``binary``
    steps; a unit scale or a zero shift is no step (GroupNorm as exported: an instance norm of
    scale 1 and B 0)."""
    per_channel = (1, -1) + (1,) * (len(L.out().shape) - 2)
    for fn, c, identity in (("mul", scale, 1.0), ("add", shift, 0.0)):
        if np.all(np.asarray(c) == identity):
            continue
        extra = _const_operand(L, np.reshape(c, per_channel), L.out())
        y = L.emit("binary", [y], L.shapes[y], extra.pop("params", ()), fn=fn, swap=False, **extra)
    return y


def lower_rmsnorm(L: Lowering):
    """RMSNormalization (opset 23): x / sqrt(mean(x^2) + eps) * scale over the axes from ``axis`` on,
    as generic kinds over rows of those axes (a row mean is a matrix-vector product)."""
    x = L.values[L.node.input[0]]
    axis = x.axis(L.attr("axis", -1))
    rows, width = _trailing(L, x, list(range(axis, len(x.per_sample))))
    wide = L.shapes[rows]
    column = wide[:-1] + (1,)
    mean = L.emit("reduce_mean", [L.emit("binary", [rows, rows], wide, fn="mul")], column)
    shifted = L.emit("binary", [mean], column, fn="add", scalar=float(L.attr("epsilon", 1e-5)), swap=False)
    inverse = L.emit("reciprocal", [L.emit("sqrt", [shifted], column)], column)
    normed = L.emit("binary", [rows, L.emit("expand", [inverse], wide, aligned=column, shape=wide)], wide, fn="mul")
    scale = np.broadcast_to(L.const(1, "scale"), x.per_sample[axis:]).reshape(-1)
    L.result(L.emit("binary", [normed], wide, [L.param(scale, L.node.output[0] + ".g")], fn="mul", swap=False,
                    width=width))


def lower_lp_normalization(L: Lowering):
    """LpNormalization (p 1 or 2): x over its L1 or L2 norm along ``axis``, the axis moved last
    and back (as ``lower_rowwise``); rows of norms by ``reduce_sum``. A zero norm divides by 1
    (its row is zeros: ONNX gives 0, not NaN)."""
    x = L.values[L.node.input[0]]
    p = int(L.attr("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"p={p} (only 1 and 2)")
    axis = x.axis(L.attr("axis", -1))
    shape = x.per_sample
    perm = [i for i in range(len(shape)) if i != axis] + [axis]
    rows = x.name
    if perm != sorted(perm):
        rows = L.emit("transpose", [x.name], [shape[i] for i in perm], name=L._fresh(x.name + ".t"), perm=tuple(perm))
    wide = L.shapes[rows]
    column = wide[:-1] + (1,)
    terms = L.emit("binary", [rows, rows], wide, fn="mul") if p == 2 else L.emit("abs", [rows], wide)
    norm = L.emit("reduce_sum", [terms], column)
    norm = L.emit("sqrt", [norm], column) if p == 2 else norm
    norm = L.emit("add", [norm, L.emit("compare", [norm], column, fn="equal", scalar=0.0, swap=False)], column)
    y = L.emit("binary", [rows, L.emit("expand", [norm], wide, aligned=column, shape=wide)], wide, fn="div")
    if perm != sorted(perm):
        y = L.emit("transpose", [y], shape, perm=tuple(int(i) for i in np.argsort(perm)))
    L.result(y)


def lower_compress(L: Lowering):
    """Compress by a constant condition along an axis: a ``take`` of the kept indices (no axis:
    of the flattened sample, in a file read with no batch axis)."""
    x = L.values[L.node.input[0]]
    keep = np.flatnonzero(np.asarray(L.const(1, "condition")).reshape(-1))
    axis = L.attr("axis")
    src, axis = (x.name, x.axis(axis)) if axis is not None else (None, 0)
    if src is None:
        if x.bpos is not None:
            raise Unsupported("it flattens the batch axis (no axis given)")
        size = (math.prod(x.per_sample),)
        src = L.emit("reshape", [x.name], size, name=L._fresh(x.name + ".flat"), shape=size)
    shape = list(L.shapes[src])
    keep = keep[keep < shape[axis]]
    shape[axis] = keep.size
    L.result(L.emit("take", [src], tuple(shape), name=L._fresh(L.node.output[0] + ".take"), axis=axis,
                    indices=tuple(int(i) for i in keep)))


def lower_transpose(L: Lowering):
    x = L.values[L.node.input[0]]
    perm = L.attr("perm") or list(range(len(x.shape)))[::-1]
    if x.bpos is not None:
        perm = [p if p < x.bpos else p - 1 for p in perm if p != x.bpos]
    if perm == sorted(perm):                       # only the batch axis moved: the same memory
        return L.result(x.name)
    L.result(L.emit("transpose", [x.name], [x.per_sample[p] for p in perm], perm=tuple(perm)))


def lower_expand(L: Lowering):
    x = L.values[L.node.input[0]]
    L.result(_as_act(L, x, L.out()))


def _slice_index(L: Lowering, x: Act, axes, starts, ends, steps) -> tuple:
    index = [(0, n, 1) for n in x.per_sample]
    for axis, start, end, step in zip(axes, starts, ends, steps):
        full = x.shape[axis]
        if x.bpos is not None and (axis % len(x.shape)) == x.bpos:
            if slice(start, end, step).indices(full) != (0, full, 1):
                raise Unsupported("it slices the batch axis")
            continue
        a = x.axis(axis)
        begin, stop, stride = slice(start, end, step).indices(x.per_sample[a])
        index[a] = (begin, None if stop < 0 else stop, stride)    # -1 here means "past the front"
    return tuple(index)


def lower_slice(L: Lowering):
    x = L.values[L.node.input[0]]
    if L.opset < 10:
        starts, ends = L.attr("starts"), L.attr("ends")
        axes, steps = L.attr("axes") or list(range(len(starts))), [1] * len(starts)
    else:
        starts, ends = _ints(L.const(1, "starts")), _ints(L.const(2, "ends"))
        axes = L.const(3, "axes")
        axes = list(range(len(starts))) if axes is None else _ints(axes)
        steps = L.const(4, "steps")
        steps = [1] * len(starts) if steps is None else _ints(steps)
    index = _slice_index(L, x, axes, starts, ends, steps)
    L.result(L.emit("slice", [x.name], L.out().per_sample, index=index))


def lower_split(L: Lowering):
    x = L.values[L.node.input[0]]
    axis = x.axis(L.attr("axis", 0))
    length = x.per_sample[axis]
    sizes = L.attr("split")
    if sizes is None and len(L.node.input) > 1 and L.node.input[1]:
        sizes = _ints(L.const(1, "split"))
    if not sizes:
        parts = len(L.node.output)
        sizes = [-(-length // parts)] * parts
        sizes[-1] = length - sum(sizes[:-1])
    at = 0
    for i, (name, size) in enumerate(zip(L.node.output, sizes)):
        index = [(0, n, 1) for n in x.per_sample]
        index[axis] = (at, at + size, 1)
        at += size
        if name:
            L.result(L.emit("slice", [x.name], L.out(i).per_sample, name=L._fresh(name), index=tuple(index)), i)


def lower_gather(L: Lowering):
    x = L.values[L.node.input[0]]
    if not isinstance(x, Act):
        raise Unsupported("it gathers from a constant by computed indices (an embedding)")
    idx = np.asarray(L.const(1, "indices"))
    axis = x.axis(L.attr("axis", 0))
    n = x.per_sample[axis]
    if np.any((idx < -n) | (idx >= n)):
        raise Unsupported("its indices are out of range")
    idx = np.where(idx < 0, idx + n, idx)
    if idx.ndim == 0:                              # one index: a slice that drops the axis
        index = [(0, m, 1) for m in x.per_sample]
        index[axis] = int(idx)
        return L.result(L.emit("slice", [x.name], L.out().per_sample, index=tuple(index)))
    flat = L.emit("take", [x.name], x.per_sample[:axis] + (idx.size,) + x.per_sample[axis + 1:],
                  name=L._fresh(L.node.output[0] + ".take"), axis=axis, indices=tuple(_ints(idx)))
    L.result(flat)


def lower_gather_elements(L: Lowering):
    """GatherElements of an activation by constant indices: the per-sample elements it picks, as
    flat positions worked out at import, one ``take`` from the flattened sample."""
    x = L.values[L.node.input[0]]
    if not isinstance(x, Act):
        raise Unsupported("it gathers from a constant by computed indices")
    idx = np.asarray(L.const(1, "indices"), dtype=np.int64)
    axis = x.axis(L.attr("axis", 0))
    if x.bpos is not None:
        if idx.shape[x.bpos] != 1:
            raise Unsupported("its indices vary along the batch axis")
        idx = idx.reshape(idx.shape[:x.bpos] + idx.shape[x.bpos + 1:])
    n = x.per_sample[axis]
    if np.any((idx < -n) | (idx >= n)):
        raise Unsupported("its indices are out of range")
    positions = np.arange(math.prod(x.per_sample)).reshape(x.per_sample)
    positions = positions[tuple(slice(None) if d == axis else slice(0, m) for d, m in enumerate(idx.shape))]
    flat = np.take_along_axis(positions, np.where(idx < 0, idx + n, idx), axis=axis).reshape(-1)
    size = (math.prod(x.per_sample),)
    rows = L.emit("reshape", [x.name], size, name=L._fresh(x.name + ".flat"), shape=size)
    L.result(L.emit("take", [rows], (flat.size,), name=L._fresh(L.node.output[0] + ".take"), axis=0,
                    indices=tuple(_ints(flat))))


SCATTER = {"add": (np.add, 0.0, "binary"), "mul": (np.multiply, 1.0, "binary"),
           "max": (np.maximum, -np.inf, "extremum"), "min": (np.minimum, np.inf, "extremum")}


def _scatter_targets(L: Lowering, shape) -> np.ndarray:
    """The flat positions a ScatterElements or ScatterND writes, shaped as its updates."""
    idx = np.asarray(L.const(1, "indices"), dtype=np.int64)
    positions = np.arange(math.prod(shape)).reshape(shape)
    if L.node.op_type == "ScatterND":
        k = idx.shape[-1]
        idx = np.where(idx < 0, idx + np.array(shape[:k]), idx)
        return positions[tuple(idx[..., j] for j in range(k))]
    axis = L.attr("axis", 0) % len(shape)
    where = list(np.indices(idx.shape))
    where[axis] = np.where(idx < 0, idx + shape[axis], idx)
    return positions[tuple(where)]


def lower_scatter(L: Lowering):
    """ScatterElements and ScatterND of constant updates at constant indices into an activation,
    in a file read with no batch axis: the written elements are constants made at import, a
    ``where`` (no reduction) or a ``binary`` / ``extremum`` with a constant (add, mul, max, min:
    the updates to one element combined at import, the identity elsewhere)."""
    x, out = L.values[L.node.input[0]], L.out()
    if x.bpos is not None:
        raise Unsupported("its indices address the batch axis (only files read with no batch axis)")
    updates = np.asarray(L.const(2, "updates"), dtype=np.float64)
    targets = _scatter_targets(L, x.shape).reshape(-1)
    reduction = L.attr("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction == "none":
        values, mask = np.zeros(math.prod(x.shape)), np.zeros(math.prod(x.shape))
        values[targets], mask[targets] = updates.reshape(-1), 1.0
        return L.result(_emit_where(L, [mask.reshape(x.shape), values.reshape(x.shape), x]))
    ufunc, identity, kind = SCATTER[reduction]
    c = np.full(math.prod(x.shape), identity)
    ufunc.at(c, targets, updates.reshape(-1))
    extra = _const_operand(L, c.reshape(x.shape), out)
    L.result(L.emit(kind, [x.name], out.per_sample, extra.pop("params", ()), fn=reduction, swap=False, **extra))


def lower_concat(L: Lowering):
    out = L.out()
    acts = [v for v in (L.values[n] for n in L.node.input) if isinstance(v, Act)]
    axis = acts[0].axis(L.attr("axis"))
    order, tensors, params = "", [], []
    for name in L.node.input:
        v = L.values[name]
        if isinstance(v, Act):
            if len(v.shape) != len(out.shape) or v.bpos != out.bpos:
                raise Unsupported("its operands hold the batch axis in different places")
            tensors.append(v.name)
            order += "t"
        else:
            c = np.asarray(v)
            if out.bpos is not None:
                if c.shape[out.bpos] != 1:
                    raise Unsupported("a constant operand varies along the batch axis")
                c = c.reshape(c.shape[:out.bpos] + c.shape[out.bpos + 1:])
            if c.shape[axis] == 0:
                continue
            params.append(L.param(c, L.node.output[0] + ".part"))
            order += "p"
    L.result(L.emit("concat", tensors, out.per_sample, params, axis=axis, order=order))


# --- convolutional networks: onto engines.ir.conv's kinds (docs/cnn.md has the mapping) ---------

def _problems(found: list[str]) -> None:
    """Every reason a node cannot be lowered, at once."""
    if found:
        raise Unsupported("; ".join(found))


def _window_attrs(L: Lowering, x, kernel, problems: list[str], ranks=(1, 2)) -> dict:
    """kernel_shape, strides, pads, dilations of a 2-D window, refusing what the kinds cannot run.
    A 1-D window over (N, C, L) is the 2-D window of height 1 over (N, C, 1, L) (``_unit_height``);
    a 3-D one (where ``ranks`` has 3: pools) stays 3-D (``_pool_3d``)."""
    kernel = tuple(int(k) for k in kernel)
    rank = len(kernel)
    if isinstance(x, Act) and (len(x.per_sample) != rank + 1 or x.bpos != 0):
        problems.append(f"its input has rank {len(x.shape)} (only windows over (N, C, ...), the batch first); "
                        f"a {rank}-D kernel {kernel}")
    if rank not in ranks:
        problems.append(f"a {rank}-D kernel (only {' and '.join(f'{r}-D' for r in ranks)})")
    strides, dilations = tuple(L.attr("strides", [1] * rank)), tuple(L.attr("dilations", [1] * rank))
    pads = tuple(L.attr("pads", [0] * (2 * rank)))
    auto_pad = L.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "") and len(strides) == len(dilations) == rank:
        pads = _auto_pads(auto_pad, x.shape[-rank:], kernel, strides, dilations)
    if len(strides) != rank or len(pads) != 2 * rank or len(dilations) != rank:
        problems.append(f"strides, pads or dilations not of a {rank}-D window")
    elif rank == 1:
        kernel, strides, pads, dilations = (1, *kernel), (1, *strides), (0, pads[0], 0, pads[1]), (1, *dilations)
    return dict(kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations)


def _auto_pads(auto_pad: str, size, kernel, strides, dilations) -> tuple[int, ...]:
    """ONNX's auto_pad as explicit (begins..., ends...) pads: VALID none; SAME_UPPER and SAME_LOWER
    pad to ceil(size / stride) outputs, the odd element at the end (UPPER) or the beginning (LOWER)."""
    if auto_pad == "VALID":
        return (0,) * (2 * len(kernel))
    total = [max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n) for n, k, s, d in zip(size, kernel, strides, dilations)]
    begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    return tuple(begin) + tuple(t - b for t, b in zip(total, begin))


def _unit_height(L: Lowering, x: Act) -> str:
    """x (C, L) per sample as (C, 1, L), a view, for a 1-D window run as a 2-D one; 2-D as it is."""
    if len(x.per_sample) != 2:
        return x.name
    channels, length = x.per_sample
    return L.emit("reshape", [x.name], (channels, 1, length), name=L._fresh(x.name + ".2d"), shape=(channels, 1, length))


def _unit_height_out(L: Lowering, x: Act) -> tuple[int, ...]:
    """The node's output per sample, with the unit height of a 1-D window put in."""
    out = L.out().per_sample
    return (out[0], 1, out[1]) if len(x.per_sample) == 2 else out


def lower_conv(L: Lowering):
    x = L.values[L.node.input[0]]
    problems = []
    w = L.const(1, "weights")
    b = L.const(2, "bias")
    attrs = _window_attrs(L, x, L.attr("kernel_shape") or np.shape(w)[2:], problems)
    group = int(L.attr("group", 1))
    channels = x.per_sample[0]
    if np.ndim(w) in (3, 4) and group == channels > 1 and w.shape[0] != channels:
        problems.append(f"depthwise with a channel multiplier ({w.shape[0]} outputs from {channels} channels)")
    _problems(problems)
    b = np.zeros(w.shape[0]) if b is None else b
    w = np.reshape(w, (*np.shape(w)[:2], 1, np.shape(w)[2])) if np.ndim(w) == 3 else w     # 1-D: height 1
    out = L.node.output[0]
    L.result(L.emit("conv", [_unit_height(L, x)], _unit_height_out(L, x),
                    [L.param(w, out + ".w"), L.param(b, out + ".b")], group=group, **attrs))


def _transpose_pads(L: Lowering, x: Act, kernel, strides, dilations) -> list[int]:
    """ConvTranspose's leading pads as ONNX's evaluator takes them: given, from auto_pad SAME_*
    and the output's size, or none."""
    pads = L.attr("pads")
    auto_pad = L.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    rank = len(kernel)
    if pads is not None or auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return list(pads[:rank]) if pads is not None else [0] * rank
    size, extra = x.shape[2:], L.attr("output_padding", [0] * rank)
    target = L.attr("output_shape") or [n * s for n, s in zip(size, strides)]
    total = [s * (n - 1) + e + (k - 1) * d + 1 - o for n, s, e, k, d, o in zip(size, strides, extra, kernel, dilations, target)]
    return [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]


def lower_conv_transpose(L: Lowering):
    """ConvTranspose over (N, C, H, W) or (N, C, L) (at height 1) as the ``conv`` it equals: of the
    input with stride-1 zeros between its pixels (``stride_zeros``), padded by d (k - 1) less the
    leading pad before and up to the measured output's size after, by the flipped kernel with its
    two channel axes swapped per group, at stride 1."""
    x, w = L.values[L.node.input[0]], np.asarray(L.const(1, "weights"), dtype=np.float64)
    rank, group = w.ndim - 2, int(L.attr("group", 1))
    if rank not in (1, 2) or x.bpos != 0 or len(x.per_sample) != rank + 1:
        raise Unsupported(f"a {rank}-D kernel over {x.shape} (only 1-D and 2-D, the batch first)")
    kernel = tuple(int(k) for k in (L.attr("kernel_shape") or w.shape[2:]))
    strides, dilations = tuple(L.attr("strides", [1] * rank)), tuple(L.attr("dilations", [1] * rank))
    lead = [d * (k - 1) - p for k, d, p in zip(kernel, dilations, _transpose_pads(L, x, kernel, strides, dilations))]
    size, out = x.shape[2:], L.out().shape[2:]
    trail = [o + d * (k - 1) - (n - 1) * s - 1 - a for o, d, k, n, s, a in zip(out, dilations, kernel, size, strides, lead)]
    cin, cog = w.shape[:2]
    if min(lead + trail) < 0 or (group == cin > 1 and cog > 1):
        raise Unsupported(f"pads past the kernel's reach ({lead}, {trail}) or a channel multiplier per group")
    flipped = w[(slice(None), slice(None), *(slice(None, None, -1),) * rank)]
    w = flipped.reshape(group, cin // group, cog, *kernel).swapaxes(1, 2).reshape(group * cog, cin // group, *kernel)
    b = L.const(2, "bias")
    b = np.zeros(group * cog) if b is None else b
    if rank == 1:
        w, kernel, strides, dilations = w[:, :, None], (1, *kernel), (1, *strides), (1, *dilations)
        lead, trail = [0, *lead], [0, *trail]
    src = _unit_height(L, x)
    if strides != (1, 1):
        shape = L.shapes[src][:1] + tuple((n - 1) * s + 1 for n, s in zip(L.shapes[src][1:], strides))
        src = L.emit("stride_zeros", [src], shape, name=L._fresh(L.node.output[0] + ".zeros"), strides=strides)
    name = L.node.output[0]
    L.result(L.emit("conv", [src], _unit_height_out(L, x), [L.param(w, name + ".w"), L.param(b, name + ".b")],
                    kernel_shape=kernel, strides=(1, 1), pads=(*lead, *trail), dilations=dilations, group=group))


def _pool_3d(L: Lowering, kind: str, src: str, shape, attrs: dict) -> str:
    """A 3-D max or average pool over (C, D, H, W) as two 2-D ones: over (H, W) of the C·D planes,
    then over D of (C, D, OH·OW). Exact: a box's maximum is the maximum over D of the planes'
    maxima, and its average the average of averages (its element count, pads and ceil_mode's
    overhang too, is the product of the counts along each axis)."""
    k, s, p, d = attrs["kernel_shape"], attrs["strides"], attrs["pads"], attrs["dilations"]
    rest = {key: v for key, v in attrs.items() if key not in ("kernel_shape", "strides", "pads", "dilations")}
    channels, depth, h, w = shape
    planes = L.emit("reshape", [src], (channels * depth, h, w), name=L._fresh(src + ".planes"), shape=(channels * depth, h, w))
    first = L.emit(kind, [planes], (channels * depth, *_pooled((h, w), k[1:], s[1:], p[1:3] + p[4:], d[1:], rest)),
                   name=L._fresh(L.node.output[0] + ".hw"), kernel_shape=k[1:], strides=s[1:], pads=(p[1], p[2], p[4], p[5]),
                   dilations=d[1:], **rest)
    oh, ow = L.shapes[first][1:]
    rows = L.emit("reshape", [first], (channels, depth, oh * ow), name=L._fresh(first + ".d"), shape=(channels, depth, oh * ow))
    od = _pooled((depth, 1), (k[0], 1), (s[0], 1), (p[0], 0, p[3], 0), (d[0], 1), rest)[0]
    return L.emit(kind, [rows], (channels, od, oh * ow), kernel_shape=(k[0], 1), strides=(s[0], 1), pads=(p[0], 0, p[3], 0),
                  dilations=(d[0], 1), **rest)


def _pooled(size, kernel, strides, pads, dilations, rest) -> tuple[int, int]:
    """The output (H, W) of a 2-D pool (pads top, left, bottom, right), as the kinds count it."""
    from ..ir.conv import Window
    return Window.of(kernel, strides, pads, dilations, rest.get("ceil_mode", 0)).out_size(*size)


def lower_pool(kind: str):
    def rule(L: Lowering):
        x = L.values[L.node.input[0]]
        problems = []
        attrs = _window_attrs(L, x, L.attr("kernel_shape"), problems, ranks=(1, 2, 3))
        attrs["ceil_mode"] = int(L.attr("ceil_mode", 0))
        if kind == "maxpool":
            if L.attr("storage_order", 0):
                problems.append("storage_order=1")
            if len(L.node.output) > 1 and L.node.output[1]:
                problems.append("its Indices output is used")
        else:
            attrs["count_include_pad"] = int(L.attr("count_include_pad", 0))
        _problems(problems)
        if len(attrs["kernel_shape"]) == 3:
            return L.result(_pool_3d(L, kind, x.name, x.per_sample, attrs))
        L.result(L.emit(kind, [_unit_height(L, x)], _unit_height_out(L, x), **attrs))
    return rule


def lower_global_pool(L: Lowering):
    x = L.values[L.node.input[0]]
    if len(x.per_sample) not in (2, 3):
        raise Unsupported(f"its input has rank {len(x.shape)} (only (N, C, L) and (N, C, H, W))")
    L.result(L.emit("globalaveragepool", [_unit_height(L, x)], _unit_height_out(L, x)))


def lower_lp_pool(L: Lowering):
    """LpPool: (sum of |x|^p over each window)^(1/p), as |x|^p, an average pool that counts its
    pads times the window's size (a sum; zero pads add nothing), and the power 1/p."""
    x = L.values[L.node.input[0]]
    p, problems = int(L.attr("p", 2)), []
    attrs = _window_attrs(L, x, L.attr("kernel_shape"), problems, ranks=(1, 2, 3))
    if L.attr("ceil_mode", 0):
        problems.append("ceil_mode=1 (its last windows would count fewer elements)")
    _problems(problems)
    three = len(attrs["kernel_shape"]) == 3
    src = x.name if three else _unit_height(L, x)
    shape = L.shapes[src]
    y = src if p == 2 else L.emit("abs", [src], shape)
    y = L.emit("binary", [y, y], shape, fn="mul") if p == 2 else \
        y if p == 1 else L.emit("binary", [y], shape, fn="pow", scalar=float(p), swap=False)
    if three:
        y = _pool_3d(L, "averagepool", y, shape, dict(attrs, count_include_pad=1, ceil_mode=0))
    else:
        y = L.emit("averagepool", [y], _unit_height_out(L, x), count_include_pad=1, ceil_mode=0, **attrs)
    out = L.shapes[y]
    y = L.emit("binary", [y], out, fn="mul", scalar=float(math.prod(attrs["kernel_shape"])), swap=False)
    L.result(y if p == 1 else L.emit("sqrt", [y], out) if p == 2 else
             L.emit("binary", [y], out, fn="pow", scalar=1.0 / p, swap=False))


def lower_global_max_pool(L: Lowering):
    """GlobalMaxPool over (N, C, ...): each channel's maximum, a ``reduce_max`` over rows of its
    spatial axes."""
    x = L.values[L.node.input[0]]
    if x.bpos != 0 or len(x.per_sample) < 2:
        raise Unsupported(f"its input is not (N, C, ...) with the batch first (shape {x.shape})")
    rows, _ = _trailing(L, x, list(range(1, len(x.per_sample))))
    L.result(L.emit("reduce_max", [rows], L.shapes[rows][:-1] + (1,)))


def lower_tile(L: Lowering):
    """Tile: each axis of size d repeated r times is an (r, d) pair of axes, an ``expand`` of a
    unit axis before it, viewed back as r·d. The batch axis is not repeated."""
    x = L.values[L.node.input[0]]
    repeats = _ints(L.const(1, "repeats"))
    if x.bpos is not None and repeats[x.bpos] != 1:
        raise Unsupported("it repeats the batch axis")
    if x.bpos is not None:
        repeats = repeats[:x.bpos] + repeats[x.bpos + 1:]
    aligned = tuple(v for d in x.per_sample for v in (1, d))
    shape = tuple(v for r, d in zip(repeats, x.per_sample) for v in (r, d))
    L.result(L.emit("expand", [x.name], shape, name=L._fresh(L.node.output[0] + ".tiles"), aligned=aligned,
                    shape=shape))


RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor",
                "cubic_coeff_a": -0.75, "exclude_outside": 0, "antialias": 0, "keep_aspect_ratio_policy": "stretch"}


def _resize_inputs(L: Lowering):
    """(roi, scales, sizes) of a Resize, each None when absent or empty."""
    named = [(None, None), (1, "scales"), (None, None)] if L.opset < 11 else [(1, "roi"), (2, "scales"), (3, "sizes")]
    values = [None if i is None else L.const(i, what) for i, what in named]
    return [None if v is None or np.size(v) == 0 else np.asarray(v).reshape(-1) for v in values]


def lower_resize(L: Lowering):
    """Resize of static shapes: one constant matrix per resized axis (``engines.importer.resize``),
    a ``linear`` along the last axis and a ``matmul_const`` from the left along any other; then
    tf_crop_and_resize's extrapolation_value, a constant, added where a sample falls outside."""
    from .resize import axis_maps
    x, out = L.values[L.node.input[0]], L.out()
    roi, scales, sizes = _resize_inputs(L)
    axes = L.attr("axes")
    axes = list(range(len(x.shape))) if axes is None else [a % len(x.shape) for a in axes]
    attrs = {k: L.attr(k, v) for k, v in RESIZE_ATTRS.items()}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    try:
        maps = axis_maps(x.shape, out.shape, axes=axes, scales=scales, sizes=sizes, roi=roi, **attrs)
    except (ValueError, ImportError, AttributeError, TypeError) as exc:
        raise Unsupported(f"its weights cannot be made ({type(exc).__name__}: {exc})") from exc
    y, shape, name = x.name, x.per_sample, L.node.output[0]
    for m in maps:
        a, n = x.axis(m.axis), len(m.matrix)
        new = shape[:a] + (n,) + shape[a + 1:]
        if a == len(shape) - 1:
            y = L.emit("linear", [y], new, [L.param(m.matrix.T, name + ".w"), L.param(np.zeros(n), name + ".b")],
                       name=L._fresh(name + ".resize"))
        else:
            pre, post = math.prod(shape[:a]), math.prod(shape[a + 1:])
            y = L.emit("matmul_const", [y], (pre, n, post), [L.param(m.matrix, name + ".w")], swap=True,
                       name=L._fresh(name + ".resize"), aligned=(pre, shape[a], post))
            y = L.emit("reshape", [y], new, name=L._fresh(name + ".view"), shape=new)
        shape = new
    value = float(L.attr("extrapolation_value", 0.0))
    inside = np.ones(out.shape)
    for m in maps:
        inside = inside * (1 - m.outside).reshape([-1 if i == m.axis else 1 for i in range(len(out.shape))])
    if value and not inside.all():
        extra = _const_operand(L, value * (1 - inside), out)
        y = L.emit("binary", [y], shape, extra.pop("params", ()), fn="add", swap=False, **extra)
    L.result(y)


def lower_grid_sample(L: Lowering):
    """GridSample with a constant grid, the same for every sample: a fixed linear map of each
    channel's image (``engines.importer.probe``), a ``linear`` over rows of the channels."""
    from .probe import MAX_ELEMENTS, channel_map
    x, out = L.values[L.node.input[0]], L.out()
    grid = L.const(1, "grid")
    if np.shape(grid)[0] != 1:
        raise Unsupported(f"its grid {np.shape(grid)} differs per sample")
    spatial, out_spatial = x.shape[2:], out.shape[2:]
    size, width = math.prod(spatial), math.prod(out_spatial)
    if x.bpos not in (0, None) or size * max(size, width) > MAX_ELEMENTS:
        raise Unsupported(f"its input {x.shape} is not (N, C, ...) with the batch first, or too large a map")
    w = channel_map(L.node, L.opset_import, spatial, [grid])
    rows = x.per_sample[:-len(spatial)] + (size,)
    flat = L.emit("reshape", [x.name], rows, name=L._fresh(x.name + ".rows"), shape=rows)
    name = L.node.output[0]
    L.result(L.emit("linear", [flat], rows[:-1] + (width,), [L.param(w.T, name + ".w"),
                                                            L.param(np.zeros(width), name + ".b")]))


def lower_upsample(L: Lowering):
    """Upsample (opsets 7 to 9), nearest by whole scales: each element repeated along each axis,
    an ``expand`` of a unit axis after each (as ``lower_tile``'s before), viewed back."""
    x = L.values[L.node.input[0]]
    scales = L.attr("scales") if L.opset < 9 else L.const(1, "scales")
    scales = [float(v) for v in np.asarray(scales).reshape(-1)]
    mode = L.attr("mode", b"nearest")
    if mode not in (b"nearest", "nearest") or any(v != int(v) or v < 1 for v in scales):
        raise Unsupported(f"mode {mode!r} with scales {scales} (only nearest by whole scales)")
    repeats = [int(v) for v in scales]
    if x.bpos is not None:
        if repeats[x.bpos] != 1:
            raise Unsupported("it repeats the batch axis")
        repeats = repeats[:x.bpos] + repeats[x.bpos + 1:]
    aligned = tuple(v for d in x.per_sample for v in (d, 1))
    shape = tuple(v for r, d in zip(repeats, x.per_sample) for v in (d, r))
    L.result(L.emit("expand", [x.name], shape, name=L._fresh(L.node.output[0] + ".repeats"), aligned=aligned,
                    shape=shape))


def lower_selection(L: Lowering):
    """An op that only moves its input's elements by constant indices (ReverseSequence, GatherND,
    MaxUnpool): where each output element comes from, by running the op on the elements'
    positions (``engines.importer.probe.selection``); one ``take`` of the flattened sample, and a
    ``where`` for the zeros it writes. With a batch axis, the positions are probed at batch 1 and
    2, and every sample must be moved alike within itself (Falcon's multi-query attention picks
    its key head so, the batch one axis further in)."""
    from .probe import MAX_ELEMENTS, selection
    x, out = L.values[L.node.input[0]], L.out()
    if math.prod(x.shape) * (1 if x.bpos is None else 2) > MAX_ELEMENTS:      # probed at batch 2 too
        raise Unsupported(f"its input {x.shape} is too large to probe")
    constants = [L.const(i, f"input {i}") for i in range(1, len(L.node.input))]
    picked = selection(L.node, L.opset_import, x.shape, constants)
    if picked is None:
        raise Unsupported("it combines elements (not only moves them)")
    if x.bpos is not None and not _moves_within_samples(L, x, out, constants, picked):
        raise Unsupported("its indices address the batch axis (it moves elements between samples)")
    size = (math.prod(x.per_sample),)
    flat = L.emit("reshape", [x.name], size, name=L._fresh(x.name + ".flat"), shape=size)
    y = L.emit("take", [flat], (picked.size,), name=L._fresh(L.node.output[0] + ".take"), axis=0,
               indices=tuple(int(i) for i in np.maximum(picked, 0)))
    y = L.emit("reshape", [y], out.per_sample, name=L._fresh(y + ".shaped"), shape=out.per_sample)
    if np.any(picked < 0):
        y = _emit_where(L, [(picked >= 0).reshape(out.shape).astype(np.float64), Act(y, out.shape, out.bpos), 0.0])
    L.result(y)


def _moves_within_samples(L: Lowering, x: Act, out: Act, constants: list, picked: np.ndarray) -> bool:
    """Whether the selection ``picked`` (probed at batch 1, where flat positions are per-sample
    ones) is what the op does to each sample at batch 2: sample b's outputs from sample b's
    inputs, at the same places."""
    from .probe import selection
    if out.bpos is None:
        return False
    two = x.shape[:x.bpos] + (2,) + x.shape[x.bpos + 1:]
    try:
        at_two = selection(L.node, L.opset_import, two, constants)
    except Exception:                # indices made for one sample (MaxUnpool's) fail on two
        return False
    if at_two is None or at_two.size != 2 * picked.size:
        return False
    by_sample = np.moveaxis(np.arange(math.prod(two)).reshape(two), x.bpos, 0).reshape(2, -1)
    expected = np.where(picked >= 0, by_sample[:, np.maximum(picked, 0)], -1)
    out_two = out.shape[:out.bpos] + (2,) + out.shape[out.bpos + 1:]
    return np.array_equal(np.moveaxis(at_two.reshape(out_two), out.bpos, 0).reshape(2, -1), expected)


def lower_col2im(L: Lowering):
    """Col2Im with constant shapes: a fixed linear map of each sample's columns (overlapping
    blocks add up), ONNX's evaluator run on a batch of one-hot samples; one ``linear`` of the
    flattened sample."""
    from .probe import MAX_ELEMENTS, run_alone
    x, out = L.values[L.node.input[0]], L.out()
    if x.bpos != 0:
        raise Unsupported(f"its input {x.shape} is not batch first")
    size, width = math.prod(x.per_sample), math.prod(out.per_sample)
    if size * max(size, width) > MAX_ELEMENTS:
        raise Unsupported(f"too large a map ({size} to {width} elements)")
    constants = [L.const(i, what) for i, what in ((1, "image_shape"), (2, "block_shape"))]
    w = run_alone(L.node, L.opset_import, np.eye(size).reshape(size, *x.per_sample), constants).reshape(size, width)
    rows = L.emit("reshape", [x.name], (size,), name=L._fresh(x.name + ".flat"), shape=(size,))
    name = L.node.output[0]
    L.result(L.emit("linear", [rows], (width,), [L.param(w, name + ".w"), L.param(np.zeros(width), name + ".b")]))


def lower_batchnorm(L: Lowering):
    """(N, C, H, W) with the batch first: ``batchnorm`` (which the passes fold into a conv). Any
    other rank from 2 (BatchNorm1d over (N, C) or (N, C, L), the batch first or merged into N): its
    per-channel scale and shift, folded at import, as two ``binary`` ops along ONNX's axis 1."""
    x = L.values[L.node.input[0]]
    problems = []
    if len(x.shape) < 2:
        problems.append(f"its input has rank {len(x.shape)} (channels are axis 1)")
    if L.attr("training_mode", 0) or any(o for o in L.node.output[1:]):
        problems.append("training mode (its running statistics are outputs)")
    _problems(problems)
    consts = [L.const(i, what) for i, what in enumerate(("", "scale", "bias", "mean", "var")) if i]
    eps = float(L.attr("epsilon", 1e-5))
    if len(x.per_sample) != 3 or x.bpos != 0:                  # x * a + b, a and b per channel
        scale, bias, mean, var = (np.asarray(c, np.float64) for c in consts)
        a = scale / np.sqrt(var + eps)
        return L.result(_scale_and_shift(L, x.name, a, bias - mean * a))
    out = L.node.output[0]
    params = [L.param(c, f"{out}.{what}") for c, what in zip(consts, ("scale", "bias", "mean", "var"))]
    L.result(L.emit("batchnorm", [x.name], x.per_sample, params, epsilon=eps))


def lower_lrn(L: Lowering):
    x = L.values[L.node.input[0]]
    if len(x.per_sample) != 3:
        raise Unsupported(f"its input has rank {len(x.shape)} (only (N, C, H, W))")
    L.result(L.emit("lrn", [x.name], x.per_sample, size=int(L.attr("size")), alpha=float(L.attr("alpha", 1e-4)),
                    beta=float(L.attr("beta", 0.75)), bias=float(L.attr("bias", 1.0))))


VARIADIC = {"add": (np.add, "binary"), "max": (np.maximum, "extremum"), "min": (np.minimum, "extremum")}


def lower_variadic(fn: str, mean: bool = False):
    """Sum, Mean, Max and Min of any number of operands, with ONNX's broadcasting: activations
    expanded to the output's shape and combined (one ``sum`` for a sum, else a chain of pairs);
    the constants combined at import into one operand; Mean then scaled by 1/n. Max and Min of
    two are ``lower_binary``'s (one form for the passes)."""
    def rule(L: Lowering):
        xs = [L.values[n] for n in L.node.input if n]
        if fn != "add" and len(xs) == 2:
            return lower_binary(L, fn, "extremum")
        out, (ufunc, kind) = L.out(), VARIADIC[fn]
        names = [_as_act(L, v, out) for v in xs if isinstance(v, Act)]
        consts = [np.asarray(v, dtype=np.float64) for v in xs if not isinstance(v, Act)]
        y = names[0]
        if fn == "add" and len(names) > 1:
            y = L.emit("sum", names, out.per_sample)
        for other in ([] if fn == "add" else names[1:]):
            y = L.emit(kind, [y, other], out.per_sample, fn=fn)
        if consts:
            extra = _const_operand(L, functools.reduce(ufunc, consts), out)
            y = L.emit(kind, [y], out.per_sample, extra.pop("params", ()), fn=fn, swap=False, **extra)
        if mean:
            y = L.emit("binary", [y], out.per_sample, fn="mul", scalar=1.0 / len(xs), swap=False)
        L.result(y)
    return rule


def _pad_widths(L: Lowering, x: Act) -> list[tuple[int, int]]:
    """(begin, end) of every ONNX axis: the pads attribute (before opset 11) or input, over the
    ``axes`` input's axes when it is given (opset 18)."""
    if L.opset < 11:
        pads = [int(p) for p in L.attr("pads")]
    else:
        pads = _ints(L.const(1, "pads"))
    rank = len(x.shape)
    axes = L.const(3, "axes") if L.opset >= 18 else None
    axes = list(range(rank)) if axes is None else [a % rank for a in _ints(axes)]
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + len(axes)])
    return widths


def lower_pad(L: Lowering):
    """Pad with a constant, over every axis or the ``axes`` given. (Negative pads, which crop,
    never get here: ONNX's evaluator, which runs the graph first, refuses them.)"""
    x = L.values[L.node.input[0]]
    mode = L.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        raise Unsupported(f"mode={mode} (only constant)")
    value = L.attr("value", 0.0) if L.opset < 11 else L.const(2, "constant_value")
    value = 0.0 if value is None else float(np.asarray(value).reshape(()))
    widths = _pad_widths(L, x)
    if x.bpos is not None:
        if widths[x.bpos] != (0, 0):
            raise Unsupported(f"pads {widths[x.bpos]} on the batch axis")
        widths = widths[:x.bpos] + widths[x.bpos + 1:]
    if min(min(w) for w in widths) < 0:
        raise Unsupported(f"negative pads {widths}")
    if max(max(w) for w in widths) == 0:
        return L.result(x.name)
    pads = (0, *(a for a, _ in widths), 0, *(b for _, b in widths))      # the kind's: rows axis first
    L.result(L.emit("pad", [x.name], L.out().per_sample, pads=pads, value=value, mode="constant"))


BINARY_OPS = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}
COMPARE_OPS = {"Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
               "GreaterOrEqual": "greater_equal"}

# ONNX op type -> rule(L) that lowers one node whose input depends on the model's input.
LOWER: dict[str, Callable[[Lowering], None]] = {
    **{op: functools.partial(lower_binary, fn=fn) for op, fn in BINARY_OPS.items()},
    "Relu": lower_unary("relu"),
    "Exp": lower_unary("exp"),
    "Sqrt": lower_unary("sqrt"),
    "Tanh": lower_unary("tanh"),
    "Neg": lower_unary("neg"),
    "Erf": lower_unary("erf"),
    "Sigmoid": lower_unary("sigmoid"),
    "Reciprocal": lower_unary("reciprocal"),
    "Abs": lower_unary("abs"),
    "Log": lower_unary("log"),
    **{op: lower_unary(op.lower()) for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
                                              "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign")},
    "HardSigmoid": lower_hardsigmoid,
    "HardSwish": lower_unary("hardswish"),
    "IsNaN": lower_unary("isnan"),
    "Max": lower_variadic("max"),
    "Min": lower_variadic("min"),
    "Sum": lower_variadic("add"),
    "Mean": lower_variadic("add", mean=True),
    **{op: functools.partial(lower_binary, fn=fn, kind="compare") for op, fn in COMPARE_OPS.items()},
    "Not": lower_not,
    "And": functools.partial(lower_binary, fn="mul"),
    "Or": functools.partial(lower_binary, fn="max", kind="extremum"),
    "Xor": functools.partial(lower_binary, fn="not_equal", kind="compare"),
    "Where": lower_where,
    "Trilu": lower_trilu,
    "Clip": lower_clip,
    "Gelu": lower_gelu,
    "FakeQuantize": lower_fake_quant,
    "Identity": lower_alias,
    "Dropout": lower_alias,
    "Cast": lower_cast,
    "CastLike": lower_cast,
    "Reshape": lower_view,
    "Flatten": lower_view,
    "Squeeze": lower_view,
    "Unsqueeze": lower_view,
    "MatMul": lower_matmul,
    "Gemm": lower_gemm,
    "Softmax": lower_rowwise("softmax"),
    "Hardmax": lower_rowwise("hardmax"),
    "LogSoftmax": lower_log_softmax,
    "LeakyRelu": lower_leaky_relu,
    "Swish": lower_swish,
    "Shrink": lower_shrink,
    "LayerNormalization": lower_layernorm,
    "InstanceNormalization": lower_instancenorm,
    "RMSNormalization": lower_rmsnorm,
    "ReduceMean": lower_reduce("reduce_mean"),
    "ReduceSum": lower_reduce("reduce_sum"),
    "ReduceMax": lower_reduce("reduce_max"),
    "ReduceMin": lower_reduce("reduce_min"),
    "ReduceProd": lower_reduce("reduce_prod"),
    "ReduceSumSquare": lower_reduce("reduce_sum", pre="square"),
    "ReduceL1": lower_reduce("reduce_sum", pre="abs"),
    "ReduceL2": lower_reduce("reduce_sum", pre="square", post="sqrt"),
    "ReduceLogSum": lower_reduce("reduce_sum", post="log"),
    "ReduceLogSumExp": lower_reduce_log_sum_exp,
    "Transpose": lower_transpose,
    "Expand": lower_expand,
    "Slice": lower_slice,
    "Split": lower_split,
    "Gather": lower_gather,
    "GatherElements": lower_gather_elements,
    "Compress": lower_compress,
    "ScatterElements": lower_scatter,
    "ScatterND": lower_scatter,
    "LpNormalization": lower_lp_normalization,
    "Mod": lower_mod,
    "Concat": lower_concat,
    "Conv": lower_conv,
    "ConvTranspose": lower_conv_transpose,
    "MaxPool": lower_pool("maxpool"),
    "AveragePool": lower_pool("averagepool"),
    "GlobalAveragePool": lower_global_pool,
    "GlobalMaxPool": lower_global_max_pool,
    "LpPool": lower_lp_pool,
    "Tile": lower_tile,
    "Resize": lower_resize,
    "Upsample": lower_upsample,
    **{op: lower_selection for op in ("ReverseSequence", "GatherND", "MaxUnpool")},
    "Col2Im": lower_col2im,
    "GridSample": lower_grid_sample,
    "BatchNormalization": lower_batchnorm,
    "LRN": lower_lrn,
    "Pad": lower_pad,
}


from .recurrent import RECURRENT  # noqa: E402  (RNN, GRU, LSTM: built on this module's Lowering)

LOWER.update(RECURRENT)


def _lower_node(L: Lowering, node, problems: list[str], failed: set[str]) -> None:
    """One node by its ``LOWER`` rule; a problem, and a stand-in for its outputs, if it cannot be."""
    L.node = node
    try:
        LOWER[node.op_type](L)
    except Unsupported as exc:
        problems.append(f"node {node.name or node.output[0]!r}: {node.op_type} is supported, but not here: {exc}")
        for o in node.output:          # a stand-in of the measured shape: the nodes after it are checked too
            if o in L.acts:
                L.shapes[o + ".unlowered"] = L.acts[o].per_sample
                L.values[o] = Act(o + ".unlowered", L.acts[o].shape, L.acts[o].bpos)
    except KeyError as exc:
        problems.append(f"node {node.name or node.output[0]!r}: {node.op_type}: missing value {exc}")
        failed.update(node.output)


def lower(proto, input_name: str, one: dict, acts: dict[str, Act]) -> tuple[Lowering, list[str]]:
    """IR ops for every node that depends on the input; the problems of those that could not."""
    opsets = {o.domain or "": o.version for o in proto.opset_import}
    L = Lowering(acts=acts, opset=opsets.get("", 0), opset_import=tuple(proto.opset_import), evaluated=one,
                 read={i for n in proto.graph.node for i in n.input} | {o.name for o in proto.graph.output})
    x = acts[input_name]
    L.shapes[input_name] = x.per_sample
    L.values[input_name] = Act(input_name, x.shape, x.bpos)
    for t in proto.graph.initializer:
        L.values[t.name] = one.get(t.name)
    problems, failed = [], set()
    for node in proto.graph.node:
        if not any(o in acts for o in node.output if o):
            for o in node.output:                                  # folded: its batch-1 value
                if o:
                    L.values[o] = one.get(o)
        elif any(i in failed for i in node.input if i):
            failed.update(node.output)
        else:
            _lower_node(L, node, problems, failed)
    output = proto.graph.output[0].name
    if not problems and not isinstance(L.values.get(output), Act):
        problems.append(f"the output {output!r} does not depend on the input's data (a constant)")
    return L, problems

"""Graph passes over an imported ``Model``: small pure functions, Model -> Model.

Each keeps the model's float64 output (``Model.reference``) unchanged; the
tests check exactly that on graphs where the pattern matches and where it
almost does. A pattern is rewritten only where it matches exactly (the same
constants to float32 precision, every intermediate read only inside the
pattern); anything else stays as the generic ops it was imported as.

They are hand-written on purpose: they match after the importer has folded every constant and
all shape arithmetic, so both of PyTorch's exporters arrive in one form. onnxscript's rewriter,
measured on every export we have, took 8-600x their time and missed every TorchScript export's
attention and GPT-2's GELU (docs/importing.md, "The passes").
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..ir.models import Model, Op
from ..ir.ops import GELU_C, OPS, split_heads
from ..ir.conv import POOL_PREFIX, activation_of, conv_lowering, fold_batchnorm as fold_conv_batchnorm, residual_fusable


def live_ops(ops, output: str) -> list[Op]:
    """The ops that the output depends on, in order: dead-node removal."""
    needed, keep = {output}, []
    for op in reversed(ops):
        if op.output in needed:
            needed.update(op.inputs)
            keep.append(op)
    return keep[::-1]


def _rebuild(model: Model, ops, params=None, origin=None, shapes=None) -> Model:
    """The model with these ops, and only the params, shapes and origins they use (``shapes``:
    those of new tensors)."""
    params = model.params if params is None else params
    used = {p for op in ops for p in op.params}
    names = {model.input, *(op.output for op in ops)}
    return replace(model, ops=tuple(ops), params={k: v for k, v in params.items() if k in used},
                   shapes={k: v for k, v in {**model.shapes, **(shapes or {})}.items() if k in names},
                   origin={k: v for k, v in (origin or model.origin).items() if k in names})


def remove_dead(model: Model) -> Model:
    return _rebuild(model, live_ops(model.ops, model.output))


def _readers(ops) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            readers.setdefault(t, []).append(i)
    return readers


def _scalar_is(op: Op, fn: str, value: float) -> bool:
    s = op.attrs.get("scalar")
    return (op.kind == "binary" and op.attrs.get("fn") == fn and s is not None
            and not op.attrs.get("swap") and math.isclose(s, value, rel_tol=1e-6))


def fold_bias(model: Model) -> Model:
    """``linear`` then an add of a constant vector of its width (or a scalar), read only there:
    the constant joins the bias (MatMul + Add become one ``linear``)."""
    ops, readers = list(model.ops), _readers(model.ops)
    params, origin = dict(model.params), dict(model.origin)
    for i, op in enumerate(ops):
        if op is None or op.kind != "linear" or len(readers.get(op.output, ())) != 1 or op.output == model.output:
            continue
        j = readers[op.output][0]
        add = ops[j]
        width = model.shapes[op.output][-1]
        if not (add.kind == "binary" and add.attrs.get("fn") == "add" and add.inputs == (op.output,)
                and (add.attrs.get("width") == width or add.attrs.get("scalar") is not None)):
            continue
        extra = add.attrs["scalar"] if add.params == () else params[add.params[0]]
        bias = params[op.params[1]].astype(np.float64) + extra
        name = op.params[1] + "+"
        params[name] = bias.astype(np.float32)
        ops[i] = None
        ops[j] = Op("linear", op.inputs, add.output, (op.params[0], name), {})
        origin[add.output] = origin.get(op.output, ()) + origin.get(add.output, ())
    return _rebuild(model, [op for op in ops if op is not None], params, origin) if None in ops else model


def _added_block(op: Op, params) -> np.ndarray | None:
    """What an add of a constant adds, as a flat float64 block repeating along the sample (a
    scalar: a block of one), else None."""
    if op.kind != "binary" or op.attrs.get("fn") != "add" or op.attrs.get("swap") or len(op.inputs) != 1:
        return None
    return _constant_block(op, params)


def _constant_block(op: Op, params) -> np.ndarray | None:
    """A ``binary``'s constant operand as the flat float64 block it repeats along the sample (a
    scalar: a block of one), else None."""
    if op.attrs.get("scalar") is not None:
        return np.array([op.attrs["scalar"]], np.float64)
    return params[op.params[0]].astype(np.float64).reshape(-1) if len(op.params) == 1 else None


# A Where that puts a constant this negative (float32's lowest, as exporters write a causal mask)
# where a constant condition is false is an add of 0 or that constant: in float32, x + c rounds
# to c for any |x| below 1e31.
MASK_FILL_MAX = -1e30


def where_mask_as_add(model: Model) -> Model:
    """Where(c, x, fill) with c a constant condition over the trailing axes of x and ``fill`` at
    most MASK_FILL_MAX (GPT-Neo's causal mask on its scores) becomes x + (c ? 0 : fill), an add
    of a constant, as a folded mask is elsewhere (``fold_constant_adds`` may join it to the
    padding mask after it; ``fuse_grouped_attention`` takes it). Only where every row of c keeps
    a true entry: a fully masked row's softmax would otherwise read x + fill, not fill."""
    params, ops, changed = dict(model.params), [], False
    for op in model.ops:
        fill = op.attrs.get("scalars", (0.0,))[0] if op.kind == "where" and op.attrs.get("order") == "pts" else 0.0
        cond = model.params[op.params[0]] if fill <= MASK_FILL_MAX and len(op.params) == 1 else None
        shape = model.shapes[op.output]
        lead = 0 if cond is None else next((i for i, n in enumerate(cond.shape) if n != 1), cond.ndim)
        if cond is None or cond.ndim != len(shape) or cond.shape[lead:] != shape[lead:] or \
                not (cond.reshape(-1, shape[-1]) != 0).any(axis=1).all():
            ops.append(op)
            continue
        mask = np.where(cond != 0, 0.0, fill).reshape(-1)
        ops.append(Op("binary", op.inputs, op.output, (_new_param(params, op.output + ".mask", mask),),
                      {"fn": "add", "swap": False, "width": mask.size}))
        changed = True
    return _rebuild(model, ops, params) if changed else model


def fold_constant_adds(model: Model) -> Model:
    """An add of a constant, read only by another add of a constant, whose blocks repeat one
    within the other: one add of their sum (T5's eager attention adds its position bias, then
    its padding mask, to the scores; ``fuse_attention`` then keeps one mask)."""
    def merge(first, second, params):
        a, b = _added_block(first, params), _added_block(second, params)
        if a is None or b is None or second.inputs != (first.output,):
            return None
        small, large = sorted((a, b), key=len)
        if len(large) % len(small):
            return None
        total = np.tile(small, len(large) // len(small)) + large
        if len(total) == 1:
            return Op("binary", first.inputs, second.output, (), {"fn": "add", "swap": False,
                                                                   "scalar": float(total[0])})
        name = _new_param(params, (second.params or first.params)[0] + ".sum", total)
        return Op("binary", first.inputs, second.output, (name,), {"fn": "add", "swap": False, "width": len(total)})
    return _absorb(model, merge)


def fuse_gelu_erf(model: Model) -> Model:
    """x · (1 + erf(x / √2)) · 0.5, as exporters write GELU, becomes one ``gelu_erf``."""
    ops, readers = list(model.ops), _readers(model.ops)
    by_out = {op.output: i for i, op in enumerate(ops)}
    origin = dict(model.origin)

    def only(t):                     # the one op reading t, if t is read once
        r = readers.get(t, ())
        return ops[r[0]] if len(r) == 1 and ops[r[0]] is not None and t != model.output else None

    for i, scale in enumerate(ops):
        if scale is None or not (_scalar_is(scale, "div", math.sqrt(2)) or _scalar_is(scale, "mul", math.sqrt(0.5))):
            continue
        x = scale.inputs[0]
        erf = only(scale.output)
        plus = erf and erf.kind == "erf" and only(erf.output)
        if not plus or not _scalar_is(plus, "add", 1.0):
            continue
        times = only(plus.output)
        if not (times and times.kind == "binary" and times.attrs.get("fn") == "mul"
                and sorted(times.inputs) == sorted((x, plus.output))):
            continue
        half = only(times.output)
        if not (half and _scalar_is(half, "mul", 0.5)):
            continue
        chain = [scale, erf, plus, times, half]
        for op in chain:
            ops[by_out[op.output]] = None
        ops[by_out[half.output]] = Op("gelu_erf", (x,), half.output)
        origin[half.output] = sum((model.origin.get(op.output, ()) for op in chain), ())
    return _rebuild(model, [op for op in ops if op is not None], origin=origin) if None in ops else model


class _TanhGelu(NamedTuple):
    """0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))): x, and the ops from the cube to the end."""
    x: str
    ops: tuple[Op, ...]


def _cubic_term(add: Op, by_out) -> tuple[str, list[Op]] | None:
    """(x, [cube, 0.044715 · cube]) when ``add`` is x + 0.044715 · x³ (x³ as Pow 3 or x · x · x)."""
    if add.kind != "add" or len(add.inputs) != 2:
        return None
    for x, c in (add.inputs, add.inputs[::-1]):
        scaled = by_out.get(c)
        cube = scaled is not None and _scalar_is(scaled, "mul", 0.044715) and by_out.get(scaled.inputs[0])
        if not cube:
            continue
        if _scalar_is(cube, "pow", 3.0) and cube.inputs == (x,):
            return x, [cube, scaled]
        square = cube.kind == "binary" and cube.attrs.get("fn") == "mul" and x in cube.inputs and \
            by_out.get(cube.inputs[1] if cube.inputs[0] == x else cube.inputs[0])
        if square and square.kind == "binary" and square.attrs.get("fn") == "mul" and square.inputs == (x, x):
            return x, [square, cube, scaled]
    return None


def _match_tanh_gelu(tanh: Op, by_out, only) -> _TanhGelu | None:
    """The GELU around ``tanh``, its last op a product by 0.5 (of x, or of the whole)."""
    inner = by_out.get(tanh.inputs[0])
    add = inner is not None and _scalar_is(inner, "mul", GELU_C) and by_out.get(inner.inputs[0])
    cubic = add and _cubic_term(add, by_out)
    plus = cubic and only(tanh.output)
    if not plus or not _scalar_is(plus, "add", 1.0):
        return None
    x, front = cubic
    times = only(plus.output)
    if times is None or times.kind != "binary" or times.attrs.get("fn") != "mul" or len(times.inputs) != 2:
        return None
    other = times.inputs[1] if times.inputs[0] == plus.output else times.inputs[0]
    chain = [*front, add, inner, tanh, plus, times]
    if other == x:                                        # x · (1 + tanh) · 0.5
        half = only(times.output)
        return _TanhGelu(x, (*chain, half)) if half is not None and _scalar_is(half, "mul", 0.5) else None
    half = by_out.get(other)                               # (0.5 · x) · (1 + tanh)
    if half is None or not _scalar_is(half, "mul", 0.5) or half.inputs != (x,) or only(half.output) is not times:
        return None
    return _TanhGelu(x, (half, *chain))


def fuse_gelu_tanh(model: Model) -> Model:
    """GELU's tanh form as exporters write it (GPT-2's ``gelu_new``): 0.5 · x · (1 + tanh(√(2/π) ·
    (x + 0.044715 · x³))), every intermediate read once inside it, becomes one ``gelu``."""
    ops, readers = list(model.ops), _readers(model.ops)
    by_out = {op.output: op for op in ops}
    origin = dict(model.origin)

    def only(t):                     # the one op reading t, if t is read once
        r = readers.get(t, ())
        return ops[r[0]] if len(r) == 1 and t != model.output else None

    gone: set[str] = set()
    for tanh in [op for op in model.ops if op.kind == "tanh"]:
        found = _match_tanh_gelu(tanh, by_out, only)
        if found is None or _escapes({op.output for op in found.ops[:-1]}, {op.output for op in found.ops},
                                     ops, readers, model):
            continue
        last = found.ops[-1]
        gone |= {op.output for op in found.ops[:-1]}
        ops[ops.index(last)] = Op("gelu", (found.x,), last.output)
        origin[last.output] = sum((model.origin.get(op.output, ()) for op in found.ops), ())
    return _rebuild(model, [op for op in ops if op.output not in gone], origin=origin) if gone else model


def _producer(by_out, t, kind: str) -> Op | None:
    """The op that writes ``t``, if it is of ``kind``."""
    op = by_out.get(t)
    return op if op is not None and op.kind == kind else None


def _binary(by_out, t, fn: str) -> Op | None:
    """The op that writes ``t``, if it is the elementwise binary ``fn``."""
    op = _producer(by_out, t, "binary")
    return op if op is not None and op.attrs.get("fn") == fn else None


def _unexpanded(by_out, t) -> str:
    """What an ``expand`` that writes ``t`` broadcasts (a (rows, 1) statistic), else ''."""
    e = _producer(by_out, t, "expand")
    return e.inputs[0] if e is not None else ""


def _escapes(names, inner: set[str], ops, readers, model: Model, *allowed: Op) -> bool:
    """Whether a tensor of ``names`` is the model's output or is read by an op other than the
    pattern's own (those writing ``inner``) and those ``allowed`` (its last, say)."""
    return model.output in names or any(ops[i].output not in inner and not any(ops[i] is a for a in allowed)
                                        for t in names for i in readers.get(t, ()))


def _squares(op: Op, t: str) -> bool:
    """Whether ``op`` squares ``t``: Pow 2, or t * t."""
    return (_scalar_is(op, "pow", 2.0) and op.inputs == (t,)) or \
        (op.kind == "binary" and op.attrs.get("fn") == "mul" and op.inputs == (t, t) and not op.params)


class _Standardized(NamedTuple):
    """div = (x - mean(x)) / sqrt(mean(d²) + eps), and the ops that compute it before the divide."""
    x: str
    eps: float
    ops: tuple[Op, ...]


def _standardized(div: Op, by_out) -> _Standardized | None:
    d = div.inputs[0]
    root = _producer(by_out, _unexpanded(by_out, div.inputs[1]), "sqrt")
    plus = root and _binary(by_out, root.inputs[0], "add")
    var = plus and plus.attrs.get("scalar") is not None and _producer(by_out, plus.inputs[0], "reduce_mean")
    sq = var and by_out.get(var.inputs[0])
    sub = _binary(by_out, d, "sub")
    if not (sq and sub and len(sub.inputs) == 2):
        return None
    x, mean = sub.inputs[0], _producer(by_out, _unexpanded(by_out, sub.inputs[1]), "reduce_mean")
    if not (_squares(sq, d) and mean and mean.inputs == (x,)):
        return None
    return _Standardized(x, plus.attrs["scalar"],
                         (mean, by_out[sub.inputs[1]], sub, sq, var, plus, root, by_out[div.inputs[1]]))


def _match_layernorm(shift: Op, by_out, model: Model) -> tuple[_Standardized, Op, Op] | None:
    """(the standardization, its divide, gamma's multiply) under ``shift``, beta's add, where
    gamma and beta are constant vectors of the row's width."""
    scale = _binary(by_out, shift.inputs[0], "mul")
    div = scale and _binary(by_out, scale.inputs[0], "div")
    width = model.shapes[shift.output][-1]
    if not (div and len(div.inputs) == 2 and scale.attrs.get("width") == width == shift.attrs["width"]):
        return None
    std = _standardized(div, by_out)
    return None if std is None else (std, div, scale)


def fuse_layernorm(model: Model) -> Model:
    """LayerNorm as exporters decompose it before opset 17, over the last axis:
    d = x - mean(x); y = d / sqrt(mean(d^2) + eps) * gamma + beta  (Pow 2 or d * d),
    becomes one ``layernorm``; gamma and beta are constant vectors of the row's width."""
    ops, origin = list(model.ops), dict(model.origin)
    by_out, readers = {op.output: op for op in ops}, _readers(ops)
    for shift in [op for op in ops if op.kind == "binary" and op.attrs.get("fn") == "add"
                  and op.attrs.get("width") is not None]:
        found = _match_layernorm(shift, by_out, model)
        if found is None:
            continue
        std, div, scale = found
        chain = [*std.ops, div, scale]
        inner = {op.output for op in chain}
        if _escapes(inner, inner, ops, readers, model, shift):
            continue                    # an intermediate is read outside the pattern
        ops = [op for op in ops if op.output not in inner]
        ops[ops.index(shift)] = Op("layernorm", (std.x,), shift.output, (scale.params[0], shift.params[0]),
                                   {"eps": std.eps})
        origin[shift.output] = sum((model.origin.get(op.output, ()) for op in (*chain, shift)), ())
        by_out, readers = {op.output: op for op in ops}, _readers(ops)
    return _rebuild(model, ops, origin=origin) if len(ops) < len(model.ops) else model


class _RmsScaled(NamedTuple):
    """mul = x * 1/sqrt(mean(x²) + eps), and the ops that compute the factor."""
    x: str
    eps: float
    ops: tuple[Op, ...]


def _inverse_root(op: Op | None) -> bool:
    """A Reciprocal, or 1 / a tensor."""
    return op is not None and (op.kind == "reciprocal" or (
        op.kind == "binary" and op.attrs.get("fn") == "div" and op.attrs.get("swap")
        and op.attrs.get("scalar") is not None and math.isclose(op.attrs["scalar"], 1.0, rel_tol=1e-6)))


def _rms_scaled(mul: Op, by_out) -> _RmsScaled | None:
    """x * r where r = 1/sqrt(mean(x²) + eps) over the last axis (x² a Pow 2 or x * x), r perhaps
    broadcast by an expand; either operand order."""
    if mul.kind != "binary" or mul.attrs.get("fn") != "mul" or len(mul.inputs) != 2 or mul.params:
        return None
    for x, r in (mul.inputs, mul.inputs[::-1]):
        spread = _producer(by_out, r, "expand")
        inv = by_out.get(spread.inputs[0] if spread else r)
        root = _producer(by_out, inv.inputs[0], "sqrt") if _inverse_root(inv) else None
        plus = root and _binary(by_out, root.inputs[0], "add")
        mean = plus and plus.attrs.get("scalar") is not None and _producer(by_out, plus.inputs[0], "reduce_mean")
        sq = mean and by_out.get(mean.inputs[0])
        if sq and _squares(sq, x):
            return _RmsScaled(x, plus.attrs["scalar"], tuple(o for o in (sq, mean, plus, root, inv, spread) if o))
    return None


def _gamma_scale(users: list[Op], t: str, width: int) -> Op | None:
    """The one reader of ``t``, if it multiplies it by a constant vector of the row's width."""
    if len(users) != 1:
        return None
    (op,) = users
    ok = op.kind == "binary" and op.attrs.get("fn") == "mul" and op.attrs.get("width") == width and op.inputs == (t,)
    return op if ok else None


def fuse_rmsnorm(model: Model) -> Model:
    """RMSNorm as exporters decompose it, over the last axis (T5's LayerNorm; Llama's, Qwen2's,
    Mistral's RMSNorm): y = x * 1/sqrt(mean(x²) + eps) (a Reciprocal or 1 / ..., broadcast or
    not), then, where it alone reads it, times gamma, a constant vector of the row's width:
    one ``rmsnorm`` (gamma all ones where there is none)."""
    ops, params, origin = list(model.ops), dict(model.params), dict(model.origin)
    by_out, readers = {op.output: op for op in ops}, _readers(ops)
    for mul in [op for op in ops if op.kind == "binary" and op.attrs.get("fn") == "mul" and len(op.inputs) == 2]:
        found = _rms_scaled(mul, by_out)
        if found is None:
            continue
        width = model.shapes[mul.output][-1]
        scale = _gamma_scale([ops[i] for i in readers.get(mul.output, ())], mul.output, width)
        last = scale or mul
        chain = [*found.ops, mul] if scale else list(found.ops)
        inner = {op.output for op in chain}
        if _escapes(inner, inner, ops, readers, model, last):
            continue                    # an intermediate is read outside the pattern
        given = params[scale.params[0]].reshape(width) if scale else np.ones(width)
        gamma = _new_param(params, last.output + ".gamma", given)
        ops = [op for op in ops if op.output not in inner]
        ops[ops.index(last)] = Op("rmsnorm", (found.x,), last.output, (gamma,), {"eps": found.eps})
        origin[last.output] = sum((model.origin.get(op.output, ()) for op in (*chain, last)), ())
        by_out, readers = {op.output: op for op in ops}, _readers(ops)
    return _rebuild(model, ops, params, origin) if len(ops) < len(model.ops) else model


def _half(op: Op | None, x: str, shape: tuple, first: bool) -> bool:
    """Whether ``op`` slices x's first (or second) half along its last axis, all else whole."""
    if op is None or op.kind != "slice" or op.inputs != (x,):
        return False
    *rest, last = op.attrs["index"]
    h = shape[-1] // 2
    return (shape[-1] % 2 == 0 and tuple(last) == ((0, h, 1) if first else (h, shape[-1], 1))
            and all(tuple(r) == (0, n, 1) for r, n in zip(rest, shape[:-1])))


def _rotated(cat: Op | None, by_out, model: Model) -> tuple[str, tuple[Op, ...]] | None:
    """(x, the ops) where ``cat`` = rotate_half(x) = concat(-x2, x1) on the last axis."""
    if cat is None or cat.kind != "concat" or len(cat.inputs) != 2 or cat.attrs.get("order") != "tt":
        return None
    neg, lo = _producer(by_out, cat.inputs[0], "neg"), by_out.get(cat.inputs[1])
    hi = neg and by_out.get(neg.inputs[0])
    x = lo.inputs[0] if lo is not None and lo.inputs else None
    shape = model.shapes.get(x)
    halves = shape is not None and _half(lo, x, shape, True) and _half(hi, x, shape, False)
    if not halves or cat.attrs["axis"] != len(shape) - 1:
        return None
    return x, (hi, neg, lo, cat)


def _rotary_terms(add: Op, by_out, model: Model):
    """((x, the rotation's ops), x * cos, rotate_half(x) * sin) summed by ``add``, either order;
    cos and sin constants of one width."""
    for a, b in (add.inputs, add.inputs[::-1]):
        mc, ms = _binary(by_out, a, "mul"), _binary(by_out, b, "mul")
        rot = ms and len(ms.params) == 1 and len(ms.inputs) == 1 and _rotated(by_out.get(ms.inputs[0]), by_out, model)
        if rot and mc.params and mc.inputs == (rot[0],) and mc.attrs.get("width") == ms.attrs.get("width") is not None:
            return rot, mc, ms
    return None


def fuse_rotary(model: Model) -> Model:
    """Rotary position embedding as the decoders' exports write it (Llama, Qwen2, Mistral):
    x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) on the last axis, cos and
    sin constants over the trailing axes: one ``rotary`` op, sin stored with its first half
    negated (the halves swapped then times it)."""
    ops, params, origin = list(model.ops), dict(model.params), dict(model.origin)
    by_out, readers = {op.output: op for op in ops}, _readers(ops)
    for add in [op for op in ops if op.kind == "add" and len(op.inputs) == 2]:
        found = _rotary_terms(add, by_out, model)
        if found is None:
            continue
        (x, moves), mc, ms = found
        d, width = model.shapes[x][-1], mc.attrs["width"]
        chain = [*moves, mc, ms]
        inner = {op.output for op in chain}
        if width % d or _escapes(inner, inner, ops, readers, model, add):
            continue
        signed = np.array(params[ms.params[0]], dtype=np.float32).reshape(-1, d)
        signed[:, :d // 2] *= -1
        sin = _new_param(params, add.output + ".sin", signed.reshape(-1))
        ops = [op for op in ops if op.output not in inner]
        ops[ops.index(add)] = Op("rotary", (x,), add.output, (mc.params[0], sin), {})
        origin[add.output] = sum((model.origin.get(op.output, ()) for op in (*chain, add)), ())
        by_out, readers = {op.output: op for op in ops}, _readers(ops)
    return _rebuild(model, ops, params, origin) if len(ops) < len(model.ops) else model


MOVES = ("reshape", "transpose", "slice", "take")     # kinds that only move elements


def _moves(op: Op) -> bool:
    """Whether ``op`` only moves elements: a kind of ``MOVES``, or a ``concat`` of one tensor (a
    copy: GPT-2's TorchScript export joins an empty key/value cache to k and v)."""
    return op.kind in MOVES or (op.kind == "concat" and op.attrs.get("order") == "t" and not op.params)


def _scale_of(op: Op) -> float | None:
    """The factor of a multiply or divide by a scalar, else None."""
    s, fn = op.attrs.get("scalar"), op.attrs.get("fn")
    if op.kind != "binary" or s is None or op.attrs.get("swap"):
        return None
    return s if fn == "mul" else 1.0 / s if fn == "div" and s != 0 else None


class _Moves(NamedTuple):
    """Element moves and scalar scalings back from a tensor to its source."""
    ops: list[Op]
    scale: float
    source: str


def _moves_from(t: str, by_out) -> _Moves:
    """Walk back from t through element moves and scalar scalings."""
    chain, scale = [], 1.0
    while t in by_out:
        op = by_out[t]
        factor = _scale_of(op)
        if not _moves(op) and factor is None:
            break
        chain.append(op)
        scale *= 1.0 if factor is None else factor
        t = op.inputs[0]
    return _Moves(chain[::-1], scale, t)


def _replay(chain, x: np.ndarray) -> np.ndarray:
    """The element moves of chain applied to x (the scalings skipped): where each element comes from."""
    for op in chain:
        if _moves(op):
            x = OPS[op.kind].eager(x, **op.attrs)
    return x


def _parallel_projections(sources, model: Model, by_out, readers) -> list[Op] | None:
    """Three distinct ``linear`` ops of one input and one width, each read once: q, k and v
    projected separately (as in BERT), which the zoo's attention takes as one (seq, 3·dim) qkv."""
    proj = [by_out.get(s) for s in sources]
    if len(set(sources)) != 3 or any(p is None or p.kind != "linear" or len(readers.get(p.output, ())) != 1
                                     for p in proj):
        return None
    if len({p.inputs for p in proj}) != 1 or len({model.shapes[s] for s in sources}) != 1 \
            or len(model.shapes[sources[0]]) != 2:
        return None
    return proj


class _AroundSoftmax(NamedTuple):
    """What surrounds an attention's softmax: the scores' matmul, its scaling, a constant mask
    added to the scaled scores, the NaN guard after the softmax, and the matmul by v."""
    scores: Op
    scaled: Op | None
    mask: Op | None
    guard: tuple[Op, Op] | None          # (IsNaN, Where)
    context: Op


def _mask_add(op: Op | None, readers) -> Op | None:
    """``op`` if it adds a constant block (a folded attention mask) to a tensor read only by it."""
    if op is None or op.kind != "binary" or op.attrs.get("fn") != "add" or len(op.params) != 1:
        return None
    return op if len(readers.get(op.inputs[0], [])) == 1 else None


def _nan_guard(soft: Op, ops, readers) -> tuple[Op, Op] | None:
    """(IsNaN, Where) when the softmax's output is read only as Where(IsNaN(p), 0, p): the guard
    exporters put after SDPA's softmax against fully masked rows."""
    users = [ops[i] for i in readers.get(soft.output, [])]
    isnan = next((u for u in users if u.kind == "isnan"), None)
    where = next((u for u in users if u.kind == "where"), None)
    if len(users) != 2 or isnan is None or where is None or len(readers.get(isnan.output, [])) != 1:
        return None
    plain = where.inputs == (isnan.output, soft.output) and not where.params
    return (isnan, where) if plain and where.attrs.get("order") == "tst" and \
        tuple(where.attrs.get("scalars", ())) == (0.0,) else None


def _around_softmax(soft: Op, ops, by_out, readers) -> _AroundSoftmax | None:
    """A matmul into the softmax (perhaps scaled, perhaps a constant mask added), and the one
    matmul that reads its probabilities (perhaps NaN-guarded) as its left operand."""
    mask = _mask_add(by_out.get(soft.inputs[0]), readers)
    scores, scaled = by_out.get(mask.inputs[0] if mask else soft.inputs[0]), None
    if scores is not None and _scale_of(scores) is not None and len(readers.get(scores.output, [])) == 1:
        scaled, scores = scores, by_out.get(scores.inputs[0])
    guard = _nan_guard(soft, ops, readers)
    probs = guard[1].output if guard else soft.output
    users = readers.get(probs, [])
    if scores is None or scores.kind != "matmul" or len(users) != 1 or ops[users[0]].kind != "matmul":
        return None
    context = ops[users[0]]
    if context.inputs[0] != probs or len(readers.get(scores.output, [])) != 1:
        return None
    return _AroundSoftmax(scores, scaled, mask, guard, context)


def _unguarded_rows(block: np.ndarray, seq: int) -> bool:
    """Whether every row of a mask block (rows of ``seq`` keys) leaves a finite score: no NaN, no
    +inf, and a finite entry in each row. Then a softmax of finite scores plus the mask has no NaN
    row, and Where(IsNaN(p), 0, p) is the identity."""
    if block.size % seq:
        return False
    rows = block.reshape(-1, seq)
    return not np.isnan(rows).any() and not np.isposinf(rows).any() and bool(np.isfinite(rows).any(axis=1).all())


@dataclass(frozen=True)
class _Attention:
    """One matched self-attention: softmax(scaled q @ k^T (+ mask)) @ v, moved back to (seq, dim).
    ``mask`` and ``guard`` are those that stay as their own ops; ``dropped`` are those that go (a
    mask of zeros, a guard that cannot fire)."""
    soft: Op
    scores: Op                   # q @ k^T
    scaled: Op | None            # a scalar scaling of the scores, if there is one
    mask: Op | None              # the constant mask added to the scores, kept
    guard: tuple[Op, Op] | None  # the NaN guard after the softmax, kept
    dropped: tuple[Op, ...]      # a zero mask, a guard that is the identity
    context: Op                  # probs @ v
    moves: tuple[_Moves, _Moves, _Moves]   # q, k, v from their source
    merged: list[Op] | None      # three projections to merge into one qkv linear, or None
    qkv: str                     # the (seq, 3·dim) tensor attention reads
    heads: int
    after: list[Op]              # the moves of the context back to (seq, dim)
    out: str                     # the tensor they write
    scale: dict                  # attn_scores' ``scale`` attribute: {} for 1/sqrt(head_dim)

    @property
    def scores_out(self) -> str:
        """The tensor ``attn_scores`` writes: what the kept mask, or else the softmax, reads."""
        return self.mask.inputs[0] if self.mask is not None else self.soft.inputs[0]

    @property
    def probs(self) -> str:
        """The tensor ``attn_context`` reads: the kept guard's output, or else the softmax's."""
        return self.guard[1].output if self.guard is not None else self.soft.output


def _mask_and_guard(around: _AroundSoftmax, model: Model, seq: int):
    """(the mask kept, the guard kept, the ops dropped): a mask of zeros goes; the guard goes when
    no row of the scores can be all -inf (no mask, or a mask that leaves every row a finite entry)."""
    mask, guard, dropped = around.mask, around.guard, []
    block = None if mask is None else model.params[mask.params[0]]
    if block is not None and not np.any(block):
        mask, block = None, None
        dropped.append(around.mask)
    if guard is not None and (block is None or _unguarded_rows(block, seq)):
        dropped += guard
        guard = None
    return mask, guard, tuple(dropped)


def _heads_layout(moves, merged, seq: int, width: int, heads: int) -> bool:
    """Whether q, k and v's moves give exactly the zoo's head layout (``ops.split_heads``), k
    transposed, replayed on element indices."""
    index = np.arange(seq * width, dtype=np.float64).reshape(1, seq, width)
    starts = [index] * 3 if merged is None else [index[..., i * width // 3:(i + 1) * width // 3] for i in range(3)]
    q, k, v = (np.ascontiguousarray(a) for a in split_heads(index, heads))
    try:
        return (np.array_equal(_replay(moves[0].ops, starts[0]), q)
                and np.array_equal(_replay(moves[1].ops, starts[1]), k.swapaxes(-1, -2))
                and np.array_equal(_replay(moves[2].ops, starts[2]), v))
    except (ValueError, IndexError):
        return False


def _moves_back(context: Op, ops, readers, model: Model, seq: int, dim: int, heads: int) -> tuple[list[Op], str] | None:
    """The moves after the context, each read once, that take it from heads back to (seq, dim)
    exactly (``ops.head_columns``' order), and the tensor they write."""
    after, t = [], context.output
    while len(readers.get(t, [])) == 1 and _moves(ops[readers[t][0]]) and model.shapes[t] != (seq, dim):
        after.append(ops[readers[t][0]])
        t = after[-1].output
    heads_out = np.arange(seq * dim, dtype=np.float64).reshape(1, heads, seq, dim // heads)
    if model.shapes[t] != (seq, dim) or not np.array_equal(
            _replay(after, heads_out), heads_out.transpose(0, 2, 1, 3).reshape(1, seq, dim)):
        return None
    return after, t


def _match_attention(soft: Op, ops, model: Model, by_out, readers) -> _Attention | None:
    around = _around_softmax(soft, ops, by_out, readers)
    if around is None:
        return None
    scores, scaled, context = around.scores, around.scaled, around.context
    moves = tuple(_moves_from(t, by_out) for t in (*scores.inputs, context.inputs[1]))
    sources = tuple(m.source for m in moves)
    merged = _parallel_projections(sources, model, by_out, readers)
    qkv = sources[0] if merged is None else sources[0] + ".qkv"
    shape = model.shapes.get(sources[0], ()) if merged is None else \
        (model.shapes[sources[0]][0], 3 * model.shapes[sources[0]][1])
    if not ((len(set(sources)) == 1 or merged) and len(shape) == 2 and shape[1] % 3 == 0 and moves[2].scale == 1.0):
        return None
    (seq, width), score_shape = shape, model.shapes[scores.output]
    heads = score_shape[0] if len(score_shape) == 3 else 0
    if not heads or (width // 3) % heads or score_shape != (heads, seq, seq):
        return None
    scale = moves[0].scale * moves[1].scale * (1.0 if scaled is None else _scale_of(scaled))
    if not math.isfinite(scale) or not _heads_layout(moves, merged, seq, width, heads):
        return None
    back = _moves_back(context, ops, readers, model, seq, width // 3, heads)
    if back is None:
        return None
    found = _Attention(soft, scores, scaled, *_mask_and_guard(around, model, seq), context, moves, merged, qkv,
                       heads, *back, _scale_attr(scale, width // 3 // heads))
    inner = _attention_outputs(found)
    if _escapes(inner - {found.out}, inner, ops, readers, model, soft, *([found.mask] if found.mask else [])):
        return None                      # a piece of the pattern is read outside it
    return found


def _scale_attr(scale: float, head_dim: int) -> dict:
    """``attn_scores``' attributes for the scores' product of scalings: none for 1/sqrt(head_dim)
    (to float32 precision), else ``scale`` (T5's 1: its 1/sqrt(head_dim) is in the q weights)."""
    return {} if math.isclose(scale, 1.0 / math.sqrt(head_dim), rel_tol=1e-6) else {"scale": scale}


def _attention_outputs(a: _Attention) -> set[str]:
    q, k, v = a.moves
    return {op.output for op in (*q.ops, *k.ops, *v.ops, a.scores, a.context, *a.after, *a.dropped,
                                 *([a.scaled] if a.scaled else []))}


def _join(a: _Attention, model: Model, params: dict, origin: dict, shapes: dict) -> None:
    """The origins of ``attn_scores`` and ``attn_context``, and, for three projections, the one qkv
    linear's weights, origin and shape."""
    q, k, v = a.moves
    scaled = [a.scaled] if a.scaled else []
    masks = [op for op in a.dropped if op.kind == "binary"]
    guards = [op for op in a.dropped if op.kind != "binary"]
    origin[a.scores_out] = sum((model.origin.get(op.output, ()) for op in (*q.ops, *k.ops, a.scores, *scaled, *masks)),
                               ())
    origin[a.out] = sum((model.origin.get(op.output, ()) for op in (*guards, *v.ops, a.context, *a.after)), ())
    if a.merged is not None:            # one projection to (seq, 3·dim), as the zoo's qkv linear
        params[a.qkv + ".w"] = np.concatenate([params[p.params[0]] for p in a.merged], axis=1)
        params[a.qkv + ".b"] = np.concatenate([params[p.params[1]] for p in a.merged])
        origin[a.qkv] = sum((model.origin.get(p.output, ()) for p in a.merged), ())
        seq, dim = model.shapes[q.source]
        shapes[a.qkv] = (seq, 3 * dim)


def _rewrite_attention(model: Model, found: list[_Attention]) -> Model:
    """For each attention found: ``attn_scores`` where the scores were, ``attn_context`` where the
    moved-back context was, one qkv linear where the first of three projections was; a kept mask
    and guard stay between. One rebuild for all (they share no op)."""
    origin, params, shapes = dict(model.origin), dict(model.params), {}
    new: dict[str, Op | None] = {}               # by the output of the op it replaces; None: dropped
    for a in found:
        _join(a, model, params, origin, shapes)
        new.update(dict.fromkeys(_attention_outputs(a)))
        new[a.scores.output] = Op("attn_scores", (a.qkv,), a.scores_out, (), {"heads": a.heads, **a.scale})
        new[a.out] = Op("attn_context", (a.probs, a.qkv), a.out, (), {"heads": a.heads})
        first = next(op for op in model.ops if op in a.merged) if a.merged else None
        for p in a.merged or ():
            new[p.output] = Op("linear", p.inputs, a.qkv, (a.qkv + ".w", a.qkv + ".b")) if p is first else None
    rebuilt = [new.get(op.output, op) for op in model.ops]
    return _rebuild(model, [op for op in rebuilt if op is not None], params, origin, shapes)


def fuse_attention(model: Model) -> Model:
    """Multi-head self-attention as exporters decompose it (q, k and v cut out of one fused
    projection by reshapes, transposes and slices, or projected by three linears of one input;
    scores = q @ k^T scaled, perhaps plus a constant mask; softmax, perhaps NaN-guarded;
    context = probs @ v, moved back to (seq, dim)) becomes ``attn_scores``, ``softmax``,
    ``attn_context`` (three projections become one).

    Exact by construction: the moves are replayed on element indices and must give precisely
    the zoo's head layout (``ops.split_heads``, ``ops.head_columns``); the scalings' product
    becomes ``attn_scores``' ``scale`` unless it is 1/sqrt(head_dim) to float32 precision (T5's
    is 1). A mask (a folded causal or padding mask, or T5's position bias with its padding,
    added to the scaled scores) stays one ``binary`` add between ``attn_scores`` and the softmax;
    a mask of zeros goes. SDPA's guard Where(IsNaN(p), 0, p) goes where no row can be all -inf
    (it is then the identity on finite scores); else it stays before ``attn_context``.
    """
    softmaxes = [op for op in model.ops if op.kind == "softmax"]
    if not softmaxes:
        return model
    by_out, readers = {op.output: op for op in model.ops}, _readers(model.ops)
    found = [a for a in (_match_attention(soft, model.ops, model, by_out, readers) for soft in softmaxes) if a]
    return _rewrite_attention(model, found) if found else model


def drop_nan_guard(model: Model) -> Model:
    """SDPA's guard Where(IsNaN(p), 0, p) after the softmax of an attention ``fuse_attention`` did
    not take (a decoder's: rotary embeddings and repeated key/value heads lie between its
    projections and its scores): dropped where no row can be all -inf, by the same rule as there
    (``_mask_and_guard``: the scores a matmul, perhaps scaled, perhaps plus a constant mask
    leaving each row a finite entry); the context then reads the softmax."""
    ops, by_out, readers = model.ops, {op.output: op for op in model.ops}, _readers(model.ops)
    to_softmax, dropped = {}, set()                    # a guard's output -> the softmax it guards
    for soft in (op for op in ops if op.kind == "softmax"):
        around = _around_softmax(soft, ops, by_out, readers)
        if around is None or around.guard is None or around.guard[1].output == model.output:
            continue
        if _mask_and_guard(around, model, model.shapes[soft.output][-1])[1] is None:     # fuse_attention's rule
            isnan, where = around.guard
            to_softmax[where.output] = soft.output
            dropped |= {isnan.output, where.output}
    if not to_softmax:
        return model
    return _rebuild(model, [replace(op, inputs=tuple(to_softmax.get(t, t) for t in op.inputs))
                            for op in ops if op.output not in dropped])


# --- a decoder's attention: head-major q, k and v, key/value heads repeated for groups ----------

_REPEATS = ("reshape", "expand", "transpose")    # how exporters move and repeat key/value heads


class _Heads(NamedTuple):
    """Where an attention operand's heads come from: ``source``, moved to head-major by ``perm``
    (None: it is head-major), scaled by ``scale``, through ``ops``."""
    source: str
    perm: tuple[int, ...] | None
    scale: float
    ops: list[Op]


_PERMS = tuple(itertools.permutations(range(3)))


def _repeated(t: str, by_out, model: Model, transposed: bool = False) -> _Heads | None:
    """Where the heads of ``t`` (heads, seq, head_dim; ``transposed``: (heads, head_dim, seq), kᵀ)
    come from: the furthest tensor back through reshapes, expands, transposes and scalar
    scalings that holds them as (kv_heads, seq, head_dim), each head repeated heads / kv_heads
    times in a row (grouped-query attention; once: ``t`` itself or a view of it); else one that
    holds them in another axis order (a transpose then makes them head-major). Exact: the moves
    are replayed on element indices."""
    chain, walked = [], [t]
    while walked[-1] in by_out and (by_out[walked[-1]].kind in _REPEATS or _scale_of(by_out[walked[-1]]) is not None):
        chain.append(by_out[walked[-1]])
        walked.append(chain[-1].inputs[0])
    heads, *rows = model.shapes[t]
    if len(rows) != 2:
        return None
    rows = tuple(rows[::-1] if transposed else rows)
    for perm in _PERMS:                                  # the identity first
        for i in range(len(walked) - 1, -1, -1):
            shape, moves = model.shapes.get(walked[i], ()), chain[:i][::-1]
            if len(shape) != 3 or tuple(shape[p] for p in perm[1:]) != rows or heads % shape[perm[0]]:
                continue
            index = x = np.arange(math.prod(shape), dtype=np.float64).reshape(1, *shape)
            want = np.repeat(index.transpose(0, *(p + 1 for p in perm)), heads // shape[perm[0]], axis=1)
            try:
                for op in (op for op in moves if op.kind in _REPEATS):
                    x = OPS[op.kind].eager(x, **op.attrs)
                same = np.array_equal(x, want.swapaxes(-1, -2) if transposed else want)
            except (ValueError, IndexError):
                same = False
            if same:
                return _Heads(walked[i], None if perm == (0, 1, 2) else perm,
                              math.prod(_scale_of(op) or 1.0 for op in moves), moves)
    return None


def _transposed_shapes(ops, model: Model) -> dict:
    """The shapes of the transposes ``ops`` write."""
    return {op.output: tuple(model.shapes[op.inputs[0]][p] for p in op.attrs["perm"]) for op in ops}


def _grouped_attention(soft: Op, model: Model, by_out, readers) -> tuple[list[Op], list[Op]] | None:
    """The ops for the softmax ``soft``'s attention (transposes to head-major where a source is
    not, then ``attention``) and the ops they stand for, or None (see ``fuse_grouped_attention``)."""
    around = _around_softmax(soft, model.ops, by_out, readers)
    if around is None or around.guard is not None:
        return None
    (a, b), v_in = around.scores.inputs, around.context.inputs[1]
    found = (_repeated(a, by_out, model), _repeated(b, by_out, model, True), _repeated(v_in, by_out, model))
    if None in found:
        return None
    new = [Op("transpose", (h.source,), f"{h.source}.heads", (), {"perm": h.perm}) for h in found if h.perm]
    inputs = [h.source if h.perm is None else f"{h.source}.heads" for h in found]
    shapes = {**model.shapes, **_transposed_shapes(new, model)}
    (heads, seq, _), (kv_heads, kv_seq, _) = shapes[inputs[0]], shapes[inputs[1]]
    scale = found[0].scale * found[1].scale * (1.0 if around.scaled is None else _scale_of(around.scaled))
    same = (shapes[inputs[0]], shapes[inputs[2]], model.shapes[around.scores.output], found[2].scale) == \
        (model.shapes[a], shapes[inputs[1]], (heads, seq, kv_seq), 1.0)
    mask = around.mask if around.mask is not None and np.any(model.params[around.mask.params[0]]) else None
    attrs = {"scale": scale} if mask is None else {"scale": scale, "width": mask.attrs.get("width")}
    if not same or not math.isfinite(scale) or attrs.get("width", kv_seq) not in (kv_seq, seq * kv_seq,
                                                                                   heads * seq * kv_seq):
        return None                                   # (a mask of zeros goes)
    pattern = [*(op for h in found for op in h.ops), around.scores,
               *(op for op in (around.scaled, around.mask) if op), soft, around.context]
    attention = Op("attention", tuple(inputs), around.context.output, mask.params if mask else (), attrs)
    return [*new, attention], pattern


def fuse_grouped_attention(model: Model) -> Model:
    """The attention ``fuse_attention`` does not take (a decoder's: rotary embeddings between its
    projections and its scores, key/value heads repeated for grouped-query attention), as one
    ``attention`` op of head-major q, k and v: q (heads, seq, head_dim), perhaps scaled; kᵀ the
    heads of k (kv_heads, kv_seq, head_dim) transposed, repeated in groups (reshape, expand,
    reshape) or not, perhaps scaled; v likewise, unscaled; the scores perhaps scaled,
    perhaps plus a constant mask (the op's parameter; a mask of zeros goes); the softmax
    unguarded (``drop_nan_guard`` ran first). The scalings' product is its ``scale``. A source
    that holds the heads in another axis order (MobileBERT's k, moved from (seq, heads, head_dim)
    straight to kᵀ) is first transposed to head-major. Exact by construction: the moves are
    replayed on indices. The ops it stands for are left to
    ``live_ops``: one also read elsewhere stays."""
    by_out, readers = {op.output: op for op in model.ops}, _readers(model.ops)
    found = [f for f in (_grouped_attention(op, model, by_out, readers) for op in model.ops if op.kind == "softmax") if f]
    if not found:
        return model
    origin, new, shapes = dict(model.origin), {}, {}
    for ops, pattern in found:
        new[ops[-1].output] = ops
        for op in ops:
            origin[op.output] = sum((model.origin.get(p.output, ()) for p in pattern), ())
        shapes.update(_transposed_shapes(ops[:-1], model))
    ops = [new_op for op in model.ops for new_op in new.get(op.output, [op])]
    return _rebuild(model, live_ops(ops, model.output), origin=origin, shapes=shapes)


# --- convolutional networks -----------------------------------------------------------

def _absorb(model: Model, merge) -> Model:
    """Each op whose output only the next op of a chain reads, merged with that reader:
    ``merge(op, reader, params)`` gives the one op that replaces both (it writes the reader's
    output, and may add arrays to params) or None. Runs until nothing merges (BN, then Mul, then Add)."""
    ops, params, origin = list(model.ops), dict(model.params), dict(model.origin)
    changed, merges = True, 0
    while changed:
        changed, readers = False, _readers(ops)
        for i, op in enumerate(ops):
            if op is None or op.output == model.output or len(readers.get(op.output, ())) != 1:
                continue
            j = readers[op.output][0]
            if ops[j] is None or ops[j].inputs.count(op.output) != 1:
                continue
            merged = merge(op, ops[j], params)
            if merged is None:
                continue
            origin[ops[j].output] = origin.get(op.output, ()) + origin.get(ops[j].output, ())
            ops[i], ops[j] = None, merged
            changed, merges = True, merges + 1
        ops = [op for op in ops if op is not None]
    return _rebuild(model, ops, params, origin) if merges else model


def _new_param(params: dict, hint: str, value) -> str:
    name = hint
    while name in params:
        name += "+"
    with np.errstate(over="ignore"):        # two masks' lowest floats sum to -inf, as in float32
        params[name] = np.asarray(value, dtype=np.float32)
    return name


def fold_batchnorm(model: Model) -> Model:
    """``conv`` then ``batchnorm`` (read only there): one conv with the folded weights and bias
    (``engines.ir.conv.fold_batchnorm``, in float64)."""
    def merge(conv, bn, params):
        if conv.kind != "conv" or bn.kind != "batchnorm" or conv.attrs.get("activation", "none") != "none":
            return None
        w, b = (params[p] for p in conv.params)
        w, b = fold_conv_batchnorm(w, b, *(params[p] for p in bn.params), bn.attrs.get("epsilon", 1e-5))
        return Op("conv", conv.inputs, bn.output, (_new_param(params, conv.params[0] + ".bn", w),
                                                   _new_param(params, conv.params[1] + ".bn", b)), conv.attrs)
    return _absorb(model, merge)


def _per_channel(model: Model, op: Op, params, channel_axis: int) -> np.ndarray | None:
    """The constant operand of a ``binary`` mul/add as one value per channel of its output
    (``channel_axis`` of the per-sample shape), or None if it varies otherwise."""
    shape = model.shapes[op.output]
    channels = shape[channel_axis]
    if op.attrs.get("scalar") is not None:
        return np.full(channels, op.attrs["scalar"], np.float64)
    if len(op.params) != 1 or op.attrs.get("swap"):
        return None
    block = params[op.params[0]].astype(np.float64).reshape(-1)
    full = np.tile(block, math.prod(shape) // block.size)
    if full.size != math.prod(shape):
        return None
    full = np.moveaxis(full.reshape(shape), channel_axis, 0).reshape(channels, -1)
    return full[:, 0] if np.all(full == full[:, :1]) else None


def _within_rows(op: Op, params, width: int) -> np.ndarray | None:
    """The constant of a ``binary`` as one row of ``width`` elements, where it repeats within
    rows that long (a scalar, or a block whose length divides the width); else None."""
    block = _constant_block(op, params)
    return None if block is None or width % block.size else np.tile(block, width // block.size)


def binary_before_transpose(model: Model) -> Model:
    """A ``transpose`` of what ``fold_affine`` absorbs into (a conv's, a batchnorm's or a
    linear's output), read only by a ``binary`` with a constant operand: the binary first, on
    the constant permuted back, then the transpose. ConvNeXt's layer scale multiplies the
    output of its channels-last MLP after the transpose back to channels-first; before it, the
    product follows the MLP's last ``linear``, whose columns ``fold_affine`` then scales.
    Elsewhere the order stays: Swin's query scale after the transpose of a slice of its
    projection joins the quantize step after it, and the slice joins the transpose."""
    ops, readers = list(model.ops), _readers(model.ops)
    params, origin, shapes = dict(model.params), dict(model.origin), {}
    writers = {op.output: op.kind for op in ops}
    for i, t in enumerate(ops):
        if t.kind != "transpose" or t.output == model.output or len(readers.get(t.output, ())) != 1 \
                or writers.get(t.inputs[0]) not in ("conv", "batchnorm", "linear"):
            continue
        j = readers[t.output][0]
        b = ops[j]
        if b.kind != "binary" or b.inputs != (t.output,) or (b.attrs.get("scalar") is None and len(b.params) != 1):
            continue
        attrs, new_params = dict(b.attrs), ()
        if attrs.get("scalar") is None:
            out_shape, in_shape = model.shapes[b.output], model.shapes[t.inputs[0]]
            block = params[b.params[0]].reshape(-1)
            full = np.tile(block, math.prod(out_shape) // block.size).reshape(out_shape)
            back = np.argsort(t.attrs["perm"])                       # the transpose's inverse
            new_params = (_new_param(params, b.params[0] + ".pre", full.transpose(back).reshape(-1)),)
            attrs["width"] = math.prod(in_shape)
        moved = b.output + ".pre"
        shapes[moved] = model.shapes[t.inputs[0]]
        origin[moved] = origin.get(b.output, ())
        ops[i] = Op("binary", t.inputs, moved, new_params, attrs)
        ops[j] = Op("transpose", (moved,), b.output, (), t.attrs)
        readers = _readers(ops)
    if not shapes:
        return model
    return _rebuild(model, ops, params, origin, shapes)


def binary_before_reshape(model: Model) -> Model:
    """A ``reshape`` (a view: the sample's elements in the same order) read only by a ``binary``
    with a constant operand: the binary first, on the reshape's input, then the reshape. The
    constant repeats along the sample's elements either way, so it is unchanged. ``fold_affine``
    then reaches what the view hid: LeViT's BatchNorm1d after a linear over (N·L, C), GroupNorm's
    per-channel affine after the instance norm of one group."""
    ops, readers = list(model.ops), _readers(model.ops)
    origin, shapes = dict(model.origin), {}
    for i, r in enumerate(ops):
        if r.kind != "reshape" or r.output == model.output or len(readers.get(r.output, ())) != 1:
            continue
        j = readers[r.output][0]
        b = ops[j]
        if (b.kind != "binary" or b.inputs != (r.output,) or b.attrs.get("fn") not in ("mul", "add")
                or (b.attrs.get("scalar") is None and len(b.params) != 1)):
            continue
        moved = b.output + ".pre"
        shapes[moved] = shapes.get(r.inputs[0]) or model.shapes[r.inputs[0]]
        origin[moved] = origin.get(b.output, ())
        ops[i] = Op("binary", r.inputs, moved, b.params, b.attrs)
        ops[j] = Op("reshape", (moved,), b.output, (), r.attrs)
        readers = _readers(ops)
    if not shapes:
        return model
    return _rebuild(model, ops, model.params, origin, shapes)


def fold_affine(model: Model) -> Model:
    """A mul or add by a per-channel constant (or a scalar) after a ``conv``, a standalone
    ``batchnorm`` or a ``linear``, read only there, joins its weights and bias: mul scales both,
    add shifts the bias (a BatchNormalization exported as BN, Mul, Add is one conv). After a
    ``layernorm``, a constant that repeats within its rows joins its scale and shift (GroupNorm's
    per-channel affine, where the norm is over the whole sample)."""
    def merge(op, aff, params):
        fn = aff.attrs.get("fn")
        if aff.kind != "binary" or fn not in ("mul", "add") or aff.inputs != (op.output,):
            return None
        if op.kind == "conv" and op.attrs.get("activation", "none") == "none":
            c = _per_channel(model, aff, params, 0)
            scaled, shifted = (0, 1), (1,)             # params: w, b
        elif op.kind == "batchnorm":
            c = _per_channel(model, aff, params, 0)
            scaled, shifted = (0, 1), (1,)             # params: scale, bias, mean, var
        elif op.kind == "linear" and len(model.shapes[op.output]) >= 1:
            c = _per_channel(model, aff, params, len(model.shapes[op.output]) - 1)
            scaled, shifted = (0, 1), (1,)             # params: w (in, out), b
        elif op.kind == "layernorm":
            c = _within_rows(aff, params, params[op.params[0]].size)
            scaled, shifted = (0, 1), (1,)             # params: g, b (each row's width)
        else:
            return None
        if c is None:
            return None
        new = list(op.params)
        for k in (scaled if fn == "mul" else shifted):
            p = params[op.params[k]].astype(np.float64)
            if fn == "add":
                p = p + c
            elif op.kind == "conv" and k == 0:
                p = p * c.reshape(-1, 1, 1, 1)
            else:
                p = p * c                               # a bias, a bn scale, or w's output columns
            new[k] = _new_param(params, op.params[k] + "." + fn, p)
        return Op(op.kind, op.inputs, aff.output, tuple(new), op.attrs)
    return _absorb(model, merge)


def fuse_silu(model: Model) -> Model:
    """``sigmoid`` of x read only by a product with x: one ``silu`` (SiLU as exporters write it,
    EfficientNet's activation; oneDNN's conv takes it as a post-op)."""
    def merge(sig, mul, params):
        if (sig.kind != "sigmoid" or mul.kind != "binary" or mul.attrs.get("fn") != "mul" or mul.params
                or sorted(mul.inputs) != sorted((sig.inputs[0], sig.output))):
            return None
        return Op("silu", sig.inputs, mul.output, (), {})
    return _absorb(model, merge)


def fuse_conv_add(model: Model, fusable=residual_fusable) -> Model:
    """A 1x1 ``conv`` (no activation) then the ``add`` or two-input ``sum`` of it and another
    activation (ONNX's ``Add`` and ``Sum``; read only there): one ``conv_add`` whose output may take
    the other input's storage. ResNet's residual adds:
    the block's last conv then needs no buffer of its own beside the residual. ``fusable(channels,
    attrs)``: which convs an engine's ``conv_add`` runs (``engines.ir.conv``'s: 1x1, one group)."""
    def merge(conv, add, params):
        if conv.kind != "conv" or conv.attrs.get("activation", "none") != "none" or len(add.inputs) != 2:
            return None
        if add.kind not in ("add", "sum"):
            return None
        residual = add.inputs[1 - add.inputs.index(conv.output)]
        if (not fusable(model.shapes[conv.inputs[0]][0], conv.attrs)
                or model.shapes[residual] != model.shapes[conv.output]):
            return None
        return Op("conv_add", (conv.inputs[0], residual), add.output, conv.params, conv.attrs)
    return _absorb(model, merge)


def fuse_conv_activation(model: Model, activations: tuple[str, ...] = ("relu", "clip")) -> Model:
    """``conv`` or ``conv_add`` then one of ``activations`` (read only there): its ``activation``.
    The NumPy engines' convs fuse relu and clip; oneDNN's take hardswish, hardsigmoid and
    sigmoid too (``ir.conv.ACTIVATION_EAGER``); one a conv has no form of (a GELU: PoolFormer's
    1x1 convs) stays an op of its own."""
    def merge(conv, act, params):
        if (conv.kind not in ("conv", "conv_add") or conv.attrs.get("activation", "none") != "none"
                or act.kind not in activations or activation_of(act.kind, act.attrs) is None):
            return None
        return Op(conv.kind, conv.inputs, act.output, conv.params, {**conv.attrs, **activation_of(act.kind, act.attrs)})
    return _absorb(model, merge)


# Ops whose output lies on their input's quantization grid, whatever the grid: they move, copy,
# keep or drop values (a ReLU's 0 is on every grid: the zero point's level); and a concat of parts
# all on one grid (``grid_of``)
GRID_KEEPING = ("maxpool", "reshape", "transpose", "relu", "slice", "take", "expand")


def grid_of(by_out: dict, tensor: str) -> dict | None:
    """The static quantization step (``fake_quant``'s attributes: scale, zero point, levels) whose
    grid ``tensor`` lies on: the step that wrote it (a ``fake_quant``, or a conv that took one in),
    then only ``GRID_KEEPING`` ops and concats of parts on that one grid; None if none.
    ``by_out``: the model's ops by output."""
    op = by_out.get(tensor)
    while op is not None and op.kind in GRID_KEEPING:
        op = by_out.get(op.inputs[0])
    if op is not None and op.kind == "concat":
        grids = [grid_of(by_out, t) for t in op.inputs]
        return grids[0] if not op.params and all(g is not None and g == grids[0] for g in grids) else None
    attrs = None if op is None else op.attrs if op.kind == "fake_quant" else op.attrs.get("fake_quant")
    return attrs if attrs and attrs.get("scale") is not None else None


def drop_repeated_quantization(model: Model) -> Model:
    """A static ``fake_quant`` of a value already on its grid (the same scale, zero point and
    levels, then only ``GRID_KEEPING`` ops and same-grid concats: a quantized file's QDQ pairs
    around a max pool, a flatten, or Swin's window shifts and partitions) is the identity: its
    readers read its input. Exact."""
    by_out = {op.output: op for op in model.ops}
    same: dict[str, str] = {}
    for op in model.ops:
        if op.kind == "fake_quant" and op.attrs.get("scale") is not None and op.output != model.output \
                and grid_of(by_out, op.inputs[0]) == op.attrs:
            same[op.output] = same.get(op.inputs[0], op.inputs[0])
    if not same:
        return model
    ops = [replace(op, inputs=tuple(same.get(t, t) for t in op.inputs)) for op in model.ops if op.output not in same]
    return _rebuild(model, ops)


def fuse_conv_fake_quant(model: Model) -> Model:
    """``conv`` or ``conv_add`` (its activation taken in) then a static ``fake_quant`` read only
    there (a quantized file's QDQ pair on the conv's output): the conv, its ``fake_quant``
    attribute the step's scale, zero point and levels. For oneDNN's convs, which apply it as
    post-ops after the sum and the activation (``planned.onednn.fake_quant_chain``)."""
    def merge(conv, fq, params):
        if conv.kind not in ("conv", "conv_add") or "fake_quant" in conv.attrs or fq.kind != "fake_quant" \
                or fq.attrs.get("scale") is None:
            return None
        return Op(conv.kind, conv.inputs, fq.output, conv.params, {**conv.attrs, "fake_quant": dict(fq.attrs)})
    return _absorb(model, merge)


def fuse_conv_maxpool(model: Model) -> Model:
    """``conv`` on the im2col lowering then ``maxpool`` (read only there): one ``conv_maxpool``,
    which never holds the conv's whole output (a band of its rows per block of pooled rows).
    At the model's busiest step that output is the largest tensor: SqueezeNet's and Inception
    v2's first conv (3.2 MB, pooled to 0.8), VGG-19's second (12.8 MB, pooled to 3.2)."""
    def merge(conv, pool, params):
        if conv.kind != "conv" or pool.kind != "maxpool":
            return None
        if conv_lowering(model.shapes[conv.inputs[0]][0], conv.attrs) != "im2col":
            return None
        return Op("conv_maxpool", conv.inputs, pool.output, conv.params,
                  {**conv.attrs, "out_channels": model.shapes[conv.output][0],
                   **{POOL_PREFIX + k: v for k, v in pool.attrs.items()}})
    return _absorb(model, merge)


# In order: fusions first, then what they left unread.
PASSES = (drop_repeated_quantization, where_mask_as_add, fold_constant_adds, fold_bias, fuse_gelu_erf, fuse_gelu_tanh, fuse_layernorm,
          fuse_rmsnorm, fuse_rotary, fuse_attention, drop_nan_guard, fuse_grouped_attention, fold_batchnorm, binary_before_transpose, binary_before_reshape,
          fold_affine, fuse_silu,
          fuse_conv_add, fuse_conv_activation, fuse_conv_maxpool, remove_dead)

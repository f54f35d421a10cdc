"""Graph passes over an imported ``Model``: small pure functions, Model -> Model.

Each keeps the model's float64 output (``Model.reference``) unchanged; the
tests check exactly that on graphs where the pattern matches and where it
almost does. A pattern is rewritten only where it matches exactly (the same
constants to float32 precision, every intermediate read only inside the
pattern); anything else stays as the generic ops it was imported as.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .models import Model, Op


def live_ops(ops, output: str) -> list[Op]:
    """The ops that the output depends on, in order: dead-node removal."""
    needed, keep = {output}, []
    for op in reversed(ops):
        if op.output in needed:
            needed.update(op.inputs)
            keep.append(op)
    return keep[::-1]


def _rebuild(model: Model, ops, params=None, origin=None) -> Model:
    params = model.params if params is None else params
    used = {p for op in ops for p in op.params}
    names = {model.input, *(op.output for op in ops)}
    return replace(model, ops=tuple(ops), params={k: v for k, v in params.items() if k in used},
                   shapes={k: v for k, v in model.shapes.items() if k in names},
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
    return _rebuild(model, [op for op in ops if op is not None], params, origin)


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
    return _rebuild(model, [op for op in ops if op is not None], origin=origin)


def fuse_layernorm(model: Model) -> Model:
    """LayerNorm as exporters decompose it before opset 17, over the last axis:
    d = x - mean(x); y = d / sqrt(mean(d^2) + eps) * gamma + beta  (Pow 2 or d * d),
    becomes one ``layernorm``; gamma and beta are constant vectors of the row's width."""
    ops, readers = list(model.ops), _readers(model.ops)
    by_out = {op.output: op for op in ops}
    origin, params = dict(model.origin), dict(model.params)

    def producer(t, kind):
        op = by_out.get(t)
        return op if op is not None and op.kind == kind else None

    def binary(t, fn):
        op = by_out.get(t)
        return op if op is not None and op.kind == "binary" and op.attrs.get("fn") == fn else None

    def unexpanded(t):                  # a (rows, 1) statistic, broadcast by an expand
        e = producer(t, "expand")
        return e.inputs[0] if e is not None else None

    for shift in [op for op in ops if op.kind == "binary" and op.attrs.get("fn") == "add"
                  and op.attrs.get("width") is not None]:
        scale = binary(shift.inputs[0], "mul")
        div = scale and binary(scale.inputs[0], "div")
        if not (div and scale.attrs.get("width") and len(div.inputs) == 2):
            continue
        width = model.shapes[shift.output][-1]
        if scale.attrs["width"] != width or shift.attrs["width"] != width:
            continue
        d, root = div.inputs[0], producer(unexpanded(div.inputs[1]) or "", "sqrt")
        plus = root and binary(root.inputs[0], "add")
        var = plus and plus.attrs.get("scalar") is not None and producer(plus.inputs[0], "reduce_mean")
        sq = var and by_out.get(var.inputs[0])
        sub = binary(d, "sub")
        if not (sq and sub and len(sub.inputs) == 2):
            continue
        squares = (_scalar_is(sq, "pow", 2.0) and sq.inputs == (d,)) or \
            (sq.kind == "binary" and sq.attrs.get("fn") == "mul" and sq.inputs == (d, d))
        x, mean = sub.inputs[0], producer(unexpanded(sub.inputs[1]) or "", "reduce_mean")
        if not (squares and mean and mean.inputs == (x,)):
            continue
        chain = [mean, by_out[sub.inputs[1]], sub, sq, var, plus, root, by_out[div.inputs[1]], div, scale]
        inner = {op.output for op in chain}
        if any(r not in inner and ops[i] is not shift for t in inner for i in readers.get(t, ())
               for r in [ops[i].output]) or model.output in inner:
            continue                    # an intermediate is read outside the pattern
        ops = [op for op in ops if op.output not in inner]
        ops[ops.index(shift)] = Op("layernorm", (x,), shift.output, (scale.params[0], shift.params[0]),
                                   {"eps": plus.attrs["scalar"]})
        origin[shift.output] = sum((model.origin.get(op.output, ()) for op in (*chain, shift)), ())
        by_out = {op.output: op for op in ops}
        readers = _readers(ops)
    return _rebuild(model, ops, params, origin)


# In order: fusions first, then what they left unread.
PASSES = (fold_bias, fuse_gelu_erf, fuse_layernorm, remove_dead)

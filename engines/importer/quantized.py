"""Quantized ONNX files, as ``onnxruntime.quantization`` writes them, read as float graphs.

Before lowering, ``rewrite`` turns the integer parts of a graph into float ops of the same value,
so that every engine runs it and the int8 engine sees plain linears and convolutions:

- QDQ (``quantize_static``): a ``QuantizeLinear`` of an activation read only by
  ``DequantizeLinear`` nodes of the same scale and zero point becomes one ``FakeQuantize``
  (the IR's ``fake_quant``): the same rounding, the same levels, as floats. A
  ``DequantizeLinear`` of constants (weights, int32 biases) becomes its float value: the
  weights dequantized once, at import.
- Dynamic (``quantize_dynamic``): ``DynamicQuantizeLinear`` -> ``MatMulInteger``/``ConvInteger``
  -> ``Cast`` -> ``Mul`` by (input scale x weight scale) becomes a dynamic ``FakeQuantize`` of
  the input, then ``MatMul``/``Conv`` by the dequantized weights ((w - zero point) x scale).
  The integer sum times the two scales is the float product of the two dequantized operands.

- Operator form (``quantize_static`` with ``QuantFormat.QOperator``, and the int8 files of model
  zoos): 8-bit tensors between ``QLinearConv``, ``QLinearMatMul`` and ONNX Runtime's ``QGemm``,
  ``QLinearAdd``, ``QLinearMul``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``,
  ``QLinearSigmoid``, ``QLinearSoftmax``, ``QLinearConcat`` (``QOPS``), moved by ops that keep a
  value on its grid (``GRID_MOVES``). Each 8-bit tensor becomes its dequantized value, a float
  tensor of the same name: ``QuantizeLinear`` a ``FakeQuantize``, each QLinear op its float op on
  dequantized weights (an int32 bias times the input and weight scales) then a ``FakeQuantize``
  with its output's scale and zero point, ``DequantizeLinear`` of such a tensor an ``Identity``.
  Only where every reader of every 8-bit tensor is one of these, and no graph input or output
  is 8-bit: a float op reading the integers themselves would read other values.

What is not in one of these forms is left as it is, and refused by the importer like any
node it cannot lower. ``FakeQuantize`` lives in this module's domain; ``EVALUATOR_OPS`` runs it
in ONNX's reference evaluator during import.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..ir.ops import U8_LEVELS, fake_quant_eager

DOMAIN = "mlexec"
FAKE_QUANTIZE = "FakeQuantize"
# the levels of each integer element type (TensorProto: UINT8 2, INT8 3, UINT16 4, INT16 5)
LEVELS = {2: (0, U8_LEVELS), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767)}
INTEGER_PRODUCTS = {"MatMulInteger": "MatMul", "ConvInteger": "Conv"}
# What a refusal of a quantized op left by ``rewrite`` adds: the forms that are read
FORMS = {
    "QuantizeLinear": "a QuantizeLinear of a tensor, with one scale, read only by DequantizeLinear nodes "
                      "of the same scale and zero point",
    "DequantizeLinear": "a DequantizeLinear of constants, or of such a QuantizeLinear",
    "DynamicQuantizeLinear": "a DynamicQuantizeLinear read only by MatMulInteger or ConvInteger of constant "
                             "weights, each then Cast to float and multiplied by the two scales",
}
FORMS.update(MatMulInteger=FORMS["DynamicQuantizeLinear"], ConvInteger=FORMS["DynamicQuantizeLinear"])
# The operator form: op -> (float op, the 8-bit inputs as (tensor, scale, zero point) input indices,
# the output's (scale, zero point) indices or None (a float output), the int32 bias's index or None)
QOPS = {
    "QLinearConv": ("Conv", ((0, 1, 2), (3, 4, 5)), (6, 7), 8),
    "QLinearMatMul": ("MatMul", ((0, 1, 2), (3, 4, 5)), (6, 7), None),
    "QGemm": ("Gemm", ((0, 1, 2), (3, 4, 5)), (7, 8), 6),
    "QLinearAdd": ("Add", ((0, 1, 2), (3, 4, 5)), (6, 7), None),
    "QLinearMul": ("Mul", ((0, 1, 2), (3, 4, 5)), (6, 7), None),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", ((0, 1, 2),), (3, 4), None),
    "QLinearAveragePool": ("AveragePool", ((0, 1, 2),), (3, 4), None),
    "QLinearSigmoid": ("Sigmoid", ((0, 1, 2),), (3, 4), None),
    "QLinearSoftmax": ("Softmax", ((0, 1, 2),), (3, 4), None),
}
# Ops that keep their first input's values on its grid (they move, keep or drop values)
GRID_MOVES = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Gather", "Slice",
              "Split")
# attributes of the operator form's ops that their float op has not
QOP_ONLY_ATTRS = ("channels_last", "opset")
FORMS.update(dict.fromkeys((*QOPS, "QLinearConcat"),
                           "the operator form: 8-bit tensors read only by QLinear ops, DequantizeLinear and "
                           f"ops that move values ({', '.join(GRID_MOVES)}), none a graph input or output"))


def evaluator_op():
    """``FakeQuantize`` for ONNX's reference evaluator."""
    from onnx.reference.op_run import OpRun

    class FakeQuantize(OpRun):
        op_domain = DOMAIN

        def _run(self, x, scale=None, zero_point=None, lo=None, hi=None):
            attrs = {} if scale is None else dict(scale=scale, zero_point=zero_point, lo=lo, hi=hi)
            return (fake_quant_eager(x, **attrs).astype(x.dtype),)

    return FakeQuantize


class _Graph:
    """The nodes, constants and readers of a graph, and the edits made to it."""

    def __init__(self, proto):
        from onnx import numpy_helper
        self.proto = proto
        self.nodes = list(proto.graph.node)
        self.consts = {t.name: t for t in proto.graph.initializer}
        for n in self.nodes:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = n.attribute[0].t
        self.readers = defaultdict(list)
        self.producer = {o: n for n in self.nodes for o in n.output}
        for n in self.nodes:
            for i in n.input:
                self.readers[i].append(n)
        for o in proto.graph.output:
            self.readers[o.name].append(None)          # the graph's output: a reader that is no node
        self.array = lambda name: numpy_helper.to_array(self.consts[name])
        self.replaced: dict[int, list] = {}          # id(node) -> the nodes in its place
        self.added = {}                               # new initializers by name
        self.retyped: set[str] = set()                # 8-bit tensors now float: their value_info goes

    def const(self, node, i: int):
        """Input i of a node as an array when it is a constant, None when absent, else KeyError."""
        if i >= len(node.input) or not node.input[i]:
            return None
        return self.array(node.input[i])

    def only_reader(self, name: str, op_type: str):
        found = self.readers.get(name, [])
        return found[0] if len(found) == 1 and found[0] is not None and found[0].op_type == op_type else None

    def replace(self, node, *new) -> None:
        self.replaced[id(node)] = list(new)

    def result(self):
        from onnx import helper
        if not self.replaced:
            return self.proto
        nodes = [m for n in self.nodes for m in self.replaced.get(id(n), [n])]
        used = {i for n in nodes for i in n.input}
        inits = [t for t in self.proto.graph.initializer if t.name in used] + list(self.added.values())
        g = self.proto.graph
        value_info = [v for v in g.value_info if v.name not in self.retyped]
        graph = helper.make_graph(nodes, g.name, g.input, g.output, inits, value_info=value_info)
        opsets = [o for o in self.proto.opset_import if o.domain != DOMAIN] + [helper.make_opsetid(DOMAIN, 1)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=self.proto.ir_version,
                                  functions=self.proto.functions)
        return model


def _fake_quantize(x: str, out: str, **attrs):
    from onnx import helper
    return helper.make_node(FAKE_QUANTIZE, [x], [out], name=out, domain=DOMAIN, **attrs)


def _static_attrs(G: _Graph, q) -> dict | None:
    """A QuantizeLinear's scalar scale and zero point, and its levels; None if not of that form."""
    try:
        scale, zero = G.const(q, 1), G.const(q, 2)
    except KeyError:
        return None
    elem = G.consts[q.input[2]].data_type if zero is not None else 2          # default: uint8
    return _grid(scale, zero, elem)


def _grid(scale: np.ndarray | None, zero: np.ndarray | None, elem: int) -> dict | None:
    """One scale and zero point (of element type ``elem``) as ``FakeQuantize``'s attributes: scale,
    zero point and levels; None unless each is one value of an 8- or 16-bit type."""
    if scale is None or scale.size != 1 or (zero is not None and zero.size != 1) or elem not in LEVELS:
        return None
    lo, hi = LEVELS[elem]
    return dict(scale=float(scale.reshape(())), zero_point=int(0 if zero is None else zero.reshape(())), lo=lo, hi=hi)


def _dequantize(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, axis: int) -> np.ndarray:
    """(q - zero point) x scale as float32, per tensor or per channel along ``axis``."""
    shape = [1] * q.ndim
    if scale.size > 1 and q.ndim:
        shape[axis % q.ndim] = -1
    at = lambda a: a.astype(np.float64).reshape(shape if a.size > 1 else ())  # noqa: E731
    return ((q.astype(np.float64) - (0 if zero is None else at(zero))) * at(scale)).astype(np.float32)


def _qdq(G: _Graph, q) -> None:
    """QuantizeLinear -> DequantizeLinear of the same parameters: one static FakeQuantize."""
    if q.input[0] in G.consts:
        return
    attrs = _static_attrs(G, q)
    readers = G.readers.get(q.output[0], [])
    if attrs is None or not readers or any(d is None or d.op_type != "DequantizeLinear" or d.input[1:] != q.input[1:]
                                           for d in readers):
        return
    from onnx import helper
    fq = q.output[0] + ".fq"
    G.replace(q, _fake_quantize(q.input[0], fq, **attrs))
    for d in readers:
        G.replace(d, helper.make_node("Identity", [fq], [d.output[0]], name=d.name))


def _dequantized_weights(G: _Graph, product, w_scale: np.ndarray) -> np.ndarray:
    """(w - zero point) x scale, per tensor or per output channel (MatMul's last axis, Conv's first)."""
    w = G.const(product, 1)
    return _dequantize(w, w_scale, G.const(product, 3), 0 if product.op_type == "ConvInteger" else -1)


def _chain(G: _Graph, product, scale_name: str):
    """MatMulInteger/ConvInteger -> Cast(float) -> Mul by (scale_name x weight scale): the Cast,
    the Mul, the scale's Mul and the weight scale's name; None if the product is not in that form."""
    cast = G.only_reader(product.output[0], "Cast")
    mul = cast and G.only_reader(cast.output[0], "Mul")
    if not mul or next((a.i for a in cast.attribute if a.name == "to"), None) != 1:     # TensorProto.FLOAT
        return None
    by = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
    scales = G.producer.get(by)
    if scales is None or scales.op_type != "Mul" or scale_name not in scales.input:
        return None
    w_scale = scales.input[1] if scales.input[0] == scale_name else scales.input[0]
    if w_scale not in G.consts:
        return None
    return cast, mul, scales, w_scale


def _dynamic_plans(G: _Graph, dq) -> list | None:
    """The (product, chain) of each reader of a DynamicQuantizeLinear, when all are in
    quantize_dynamic's form and nothing else reads its scale and zero point; else None."""
    q, scale, zero = dq.output
    plans = []
    for p in G.readers.get(q, []):
        if p is None or p.op_type not in INTEGER_PRODUCTS or p.input[0] != q or p.input[2:3] != [zero] \
                or any(i and i not in G.consts for i in p.input[1:2] + p.input[3:4]):
            return None
        chain = _chain(G, p, scale)
        if chain is None:
            return None
        plans.append((p, chain))
    products, scale_muls = {id(p) for p, _ in plans}, {id(chain[2]) for _, chain in plans}
    if not plans or any(r is None or id(r) not in scale_muls for r in G.readers.get(scale, [])) \
            or any(r is None or id(r) not in products for r in G.readers.get(zero, [])):
        return None
    return plans


def _dynamic(G: _Graph, dq) -> None:
    """DynamicQuantizeLinear feeding integer products: a dynamic FakeQuantize, then float products."""
    plans = _dynamic_plans(G, dq)
    if plans is None:
        return
    from onnx import helper, numpy_helper
    fq = dq.output[0] + ".fq"
    G.replace(dq, _fake_quantize(dq.input[0], fq))
    for p, (cast, mul, scales, w_scale) in plans:
        name = "|".join([p.input[1], w_scale, *p.input[3:4]]) + ".dequantized"      # shared weights: once
        if name not in G.added:
            G.added[name] = numpy_helper.from_array(_dequantized_weights(G, p, G.array(w_scale)), name)
        attrs = {a.name: helper.get_attribute_value(a) for a in p.attribute}
        for n in (p, cast, scales):
            G.replace(n)
        G.replace(mul, helper.make_node(INTEGER_PRODUCTS[p.op_type], [fq, name], [mul.output[0]], name=p.name, **attrs))


def _fold(G: _Graph, node) -> None:
    """A DequantizeLinear of constants (weights, int32 biases): its float value, once, as an
    initializer (ONNX's evaluator has no DequantizeLinear before opset 19)."""
    try:
        q, scale, zero = G.const(node, 0), G.const(node, 1), G.const(node, 2)
    except KeyError:
        return
    block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
    if q is None or scale is None or block:
        return
    value = _dequantize(q, scale, zero, next((a.i for a in node.attribute if a.name == "axis"), 1))
    from onnx import numpy_helper
    G.added[node.output[0]] = numpy_helper.from_array(value, node.output[0])
    G.replace(node)


class _NotOperatorForm(Exception):
    """The graph's 8-bit tensors are not all in the operator form (``QOPS``): left as they are,
    and why (the message) goes with the importer's refusal."""


class _OperatorForm:
    """The rewrite of an operator-form graph (module docstring): each 8-bit tensor's grid, and the
    nodes in place of each op, kept until the whole graph is known to be in the form."""

    def __init__(self, G: _Graph):
        self.G, self.grids, self.new, self.added = G, {}, {}, {}
        self.integer: set[str] = set()              # the 8-bit tensors, float from here on

    def grid(self, scale_name: str, zero_name: str) -> dict:
        """An 8-bit tensor's grid from a node's scale and zero point inputs."""
        grid = _grid(self.G.array(scale_name), self.G.array(zero_name), self.G.consts[zero_name].data_type)
        if grid is None:
            raise _NotOperatorForm(f"{scale_name!r} and {zero_name!r} are not one scale and zero point")
        return grid

    def operand(self, node, i: int, s: int, z: int) -> str:
        """Input i of a QLinear op (scale at s, zero point at z) as a float tensor's name: an 8-bit
        tensor on that grid, or a constant dequantized (per channel: a weight's first axis for a
        conv and a transposed QGemm weight, its last for a product)."""
        name = node.input[i]
        if name in self.G.consts:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)      # QGemm's (n, k) weights
            axis = 0 if node.op_type == "QLinearConv" or trans_b else -1
            scale, zero = (self.G.array(node.input[k]) for k in (s, z))
            return self.constant(name + ".dequantized", _dequantize(self.G.array(name), scale, zero, axis))
        if name not in self.integer or self.grids[name] != self.grid(node.input[s], node.input[z]):
            raise _NotOperatorForm(f"node {node.name or node.output[0]!r} ({node.op_type}) reads {name!r} with "
                                   "another scale or zero point than it was written with, or not as 8-bit")
        return name

    def constant(self, name: str, value) -> str:
        from onnx import numpy_helper
        self.added[name] = numpy_helper.from_array(np.asarray(value, np.float32), name)
        return name

    def quantized(self, node, out_grid: dict | None, float_op):
        """``float_op`` writing the node's output, or its float value then the output's step."""
        out = node.output[0]
        if out_grid is None:
            return [float_op]
        float_op.output[0] = out + ".float"
        self.integer.add(out)
        self.grids[out] = out_grid
        return [float_op, _fake_quantize(out + ".float", out, **out_grid)]

    def qop(self, node) -> list:
        from onnx import helper
        op_type, triples, out, bias = QOPS[node.op_type]
        inputs = [self.operand(node, *t) for t in triples if t[0] < len(node.input) and node.input[t[0]]]
        if bias is not None and bias < len(node.input) and node.input[bias]:
            b = self.G.array(node.input[bias]).astype(np.float64)
            scales = [self.G.array(node.input[t[1]]).astype(np.float64).reshape(-1) for t in triples]
            inputs.append(self.constant(node.input[bias] + ".dequantized", b * scales[0] * scales[1]))
        given = out and out[0] < len(node.input) and node.input[out[0]]
        out_grid = self.grid(node.input[out[0]], node.input[out[1]]) if given else None
        if any(a.name == "channels_last" and a.i for a in node.attribute):
            raise _NotOperatorForm(f"node {node.name or node.output[0]!r} ({node.op_type}) is channels-last")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in QOP_ONLY_ATTRS}
        return self.quantized(node, out_grid, helper.make_node(op_type, inputs, [node.output[0]], name=node.name, **attrs))

    def concat(self, node) -> list:
        from onnx import helper
        ins = node.input
        inputs = [self.operand(node, i, i + 1, i + 2) for i in range(2, len(ins), 3)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return self.quantized(node, self.grid(ins[0], ins[1]), helper.make_node("Concat", inputs, [node.output[0]],
                                                                                 name=node.name, **attrs))

    def visit(self, node) -> None:
        """Plan the node's rewrite; raise ``_NotOperatorForm`` where it reads 8-bit values otherwise."""
        from onnx import helper
        reads = [i for i in node.input if i in self.integer]
        if node.op_type in QOPS:
            self.new[id(node)] = self.qop(node)
        elif node.op_type == "QLinearConcat":
            self.new[id(node)] = self.concat(node)
        elif node.op_type == "QuantizeLinear" and node.input[0] not in self.G.consts and not reads:
            attrs = _static_attrs(self.G, node)
            if attrs is None:
                raise _NotOperatorForm(f"node {node.name or node.output[0]!r} (QuantizeLinear) has no one scale "
                                       "and zero point")
            self.integer.add(node.output[0])
            self.grids[node.output[0]] = attrs
            self.new[id(node)] = [_fake_quantize(node.input[0], node.output[0], **attrs)]
        elif not reads:
            return
        elif node.op_type == "DequantizeLinear" and len(node.input) == 3 and \
                self.grids[node.input[0]] == self.grid(node.input[1], node.input[2]):
            self.new[id(node)] = [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)]
        elif node.op_type in GRID_MOVES and reads == [node.input[0]]:
            for o in node.output:
                self.integer.add(o)
                self.grids[o] = self.grids[node.input[0]]
        else:
            raise _NotOperatorForm(f"node {node.name or node.output[0]!r} ({node.op_type}) reads the 8-bit "
                                   f"integers of {reads[0]!r} themselves")

    def apply(self) -> None:
        G = self.G
        outputs = {o.name for o in G.proto.graph.output} | {i.name for i in G.proto.graph.input}
        if outputs & self.integer:
            raise _NotOperatorForm(f"the graph's input or output {sorted(outputs & self.integer)[0]!r} is 8-bit")
        for node in G.nodes:
            if id(node) in self.new:
                G.replace(node, *self.new[id(node)])
        G.added.update(self.added)
        G.retyped |= self.integer


def _operator_form(G: _Graph) -> list[str]:
    """The operator form's rewrite, where the whole graph is in it (``_OperatorForm``); else why not."""
    if not any(n.op_type in QOPS or n.op_type == "QLinearConcat" for n in G.nodes):
        return []
    form = _OperatorForm(G)
    try:
        for node in G.nodes:
            if id(node) not in G.replaced:
                try:
                    form.visit(node)
                except (KeyError, ValueError) as exc:    # an input not constant, scales of another shape
                    raise _NotOperatorForm(f"node {node.name or node.output[0]!r} ({node.op_type}): "
                                           f"{type(exc).__name__}: {exc}") from exc
        form.apply()
    except _NotOperatorForm as exc:
        return [f"the operator form is not read: {exc}"]
    return []


def rewrite(proto) -> tuple[object, list[str]]:
    """The graph with its QDQ pairs, dynamic integer products and operator form as float ops
    (module docstring), the proto itself when it has none; and why a form found was not read
    (for the importer's refusal of its ops)."""
    G = _Graph(proto)
    for node in G.nodes:
        if node.op_type == "QuantizeLinear":
            _qdq(G, node)
        elif node.op_type == "DynamicQuantizeLinear":
            _dynamic(G, node)
        elif node.op_type == "DequantizeLinear" and id(node) not in G.replaced:
            _fold(G, node)
    why = _operator_form(G)
    return G.result(), why

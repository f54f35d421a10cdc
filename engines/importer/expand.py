"""Ops with no lowering rule of their own, replaced by their ONNX function body before lowering.

Many ONNX ops are defined as a function of other ops (Elu, Selu, Softplus, Mish, Attention, ...:
``onnx.defs`` holds the body, or builds it from the node's input types). A node that reads the
input's data, whose op type has no ``LOWER`` rule but whose schema has such a body at the model's
opset, is replaced by the body: the onnx package's inliner instantiates it (attributes,
``ref_attr_name``, a context-dependent body), one node at a time, so that each inner node is
named ``<node>/<i>:<op>`` and traced back to the node it came from. Repeated while a body calls
another such op (Celu's calls Elu). A problem the import then finds with an inner node is
reported as the original node's, naming its op (``Expansion.refusal``); ``model.origin`` names
the original nodes too (``Expansion.trace``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass, field

MAX_DEPTH = 8            # bodies within bodies; ONNX's deepest is 2 (Celu -> Elu)


@dataclass(frozen=True)
class Root:
    """The file's node an inner node came from."""
    name: str
    op_type: str
    where: str           # "domain ai.onnx, opset 23"


@dataclass
class Expansion:
    """The graph with function bodies in place of the nodes that had no rule, and where each
    inner node came from (its name -> ``Root``)."""
    proto: object
    roots: dict[str, Root] = field(default_factory=dict)

    def refusal(self, problems: list[str]) -> list[str]:
        """The problems with every inner node named as the file's node it came from."""
        out = []
        for problem in problems:
            lead = re.match(r"node '([^']*)'(?: \(([^)]*)\))?: ", problem)
            root = self.roots.get(lead.group(1)) if lead else None
            if root is not None:
                rest = problem[lead.end():]
                rest = rest if lead.group(2) is None else f"{lead.group(2)}: {rest}"
                problem = (f"node {root.name!r}: {root.op_type} ({root.where}) is not supported: "
                           f"in its function body, {rest}")
            problem = re.sub(r"node '([^']*)'(?: \(([^)]*)\))?", self._named, problem)
            if problem not in out:
                out.append(problem)
        return out

    def _named(self, m: re.Match) -> str:
        root = self.roots.get(m.group(1))
        if root is None:
            return m.group(0)
        inner = f"{m.group(2)} in" if m.group(2) else "in"
        return f"node {root.name!r} ({inner} the function body of {root.op_type})"

    @contextlib.contextmanager
    def traced(self, error: type):
        """An ``error`` (``OnnxImportError``: its ``problems``) raised inside names the file's nodes
        (``refusal``)."""
        try:
            yield
        except error as exc:
            if not self.roots:
                raise
            raise error(self.refusal(exc.problems)) from exc

    def trace(self, model):
        """The model with its ops' origins named by the file's nodes."""
        for out, names in model.origin.items():
            model.origin[out] = tuple(dict.fromkeys(self.roots[n].name if n in self.roots else n for n in names))
        if model.fixed_batch is not None and self.roots:
            reason = re.sub(r"node '([^']*)'(?: \(([^)]*)\))?", self._named, model.fixed_batch.reason)
            model.fixed_batch = dataclasses.replace(model.fixed_batch, reason=reason)
        return model


def _types(proto) -> dict:
    """Every value's ``ValueInfoProto`` that shape inference finds (inputs and initializers too)."""
    import onnx
    from onnx import helper
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:       # noqa: BLE001 - no types: nothing is expanded, the node is refused as before
        inferred = proto
    graph = inferred.graph
    types = {vi.name: vi for vi in (*graph.input, *graph.value_info, *graph.output) if vi.type.HasField("tensor_type")}
    for t in graph.initializer:
        types.setdefault(t.name, helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return types


def _body(node, types: dict, proto) -> list | None:
    """The nodes of ``node``'s function body, its values as the inliner names them; None when the
    op has no body at this opset or the inliner cannot build it (an input of unknown type)."""
    import onnx
    from onnx import helper, inliner
    inputs = [i for i in dict.fromkeys(node.input) if i]
    if any(i not in types for i in inputs):
        return None
    outputs = [types.get(o) or onnx.ValueInfoProto(name=o) for o in node.output if o]
    graph = helper.make_graph([_with_defaults(node, proto)], "call", [types[i] for i in inputs], outputs)
    if "" in node.input:        # an absent optional input before a given one: the inliner asks its type
        graph.value_info.append(helper.make_tensor_value_info("", onnx.TensorProto.FLOAT, None))
    call = helper.make_model(graph, opset_imports=proto.opset_import, ir_version=proto.ir_version)
    try:
        done = inliner.inline_selected_functions(call, [(node.domain, node.op_type)], exclude=False,
                                                 inline_schema_functions=True)
    except Exception:       # noqa: BLE001 - no body, or one the inliner cannot instantiate here
        return None
    body = list(done.graph.node)
    if any(n.op_type == node.op_type and n.domain == node.domain for n in body):
        return None
    return body


def _with_defaults(node, proto):
    """A copy of the node with every attribute it leaves out that its schema gives a default for
    set to that default: the inliner drops a body's ``ref_attr_name`` to an absent attribute
    (MeanVarianceNormalization's axes would then reduce every axis)."""
    import onnx
    opsets = {o.domain or "": o.version for o in proto.opset_import}
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain or "", 1), node.domain or "")
    except onnx.defs.SchemaError:
        return node
    given = {a.name for a in node.attribute}
    call = onnx.NodeProto()
    call.CopyFrom(node)
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value.name:
            call.attribute.append(attr.default_value)
    return call


def _renamed(body, node, label: str, taken: set[str]) -> list:
    """The body's nodes named ``label/<i>:<op>``, its inner values ``label/<value>`` (the node's own
    inputs and outputs keep their names), inside subgraphs too."""
    outer = set(node.input) | set(node.output) | {""}
    inner = {v for n in body for v in (*n.input, *n.output) if v not in outer}
    rename = {}
    for v in sorted(inner):
        name = f"{label}/{v}"
        while name in taken:
            name += "_"
        rename[v] = name
        taken.add(name)
    for i, n in enumerate(body):
        n.name = f"{label}/{i}:{n.op_type}"
        _rename_values(n, rename)
    return body


def _rename_values(node, rename: dict) -> None:
    from onnx import AttributeProto
    node.input[:] = [rename.get(v, v) for v in node.input]
    node.output[:] = [rename.get(v, v) for v in node.output]
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                _rename_values(n, rename)


def expand_functions(proto, dynamic: set[str], rules, reads_data_of) -> Expansion:
    """``proto`` with every node that reads a value in ``dynamic`` and has no rule in ``rules``
    replaced by its function body, where its schema has one; the proto itself when none has.
    ``reads_data_of(node, dynamic)``: whether a node reads the data of a dynamic value."""
    import onnx
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    expansion = Expansion(proto)
    for _ in range(MAX_DEPTH):
        graph = expansion.proto.graph
        todo = [i for i, n in enumerate(graph.node) if n.op_type not in rules and reads_data_of(n, dynamic)]
        if not todo:
            break
        types = _types(expansion.proto)
        taken = {v for n in graph.node for v in (*n.input, *n.output, n.name)} | {t.name for t in graph.initializer}
        nodes, changed = [], False
        for i, node in enumerate(graph.node):
            body = _body(node, types, expansion.proto) if i in todo else None
            if body is None:
                nodes.append(node)
                continue
            label = node.name or node.output[0]
            domain = node.domain or "ai.onnx"
            root = expansion.roots.get(label) or Root(label, node.op_type, f"domain {domain}, opset {opsets.get(domain, '?')}")
            for inner in _renamed(body, node, label, taken):
                expansion.roots[inner.name] = root
                nodes.append(inner)
            changed = True
        if not changed:
            break
        expanded = onnx.ModelProto()
        expanded.CopyFrom(expansion.proto)         # the file's proto stays as it was
        del expanded.graph.node[:]
        expanded.graph.node.extend(nodes)
        expansion.proto = expanded
        dynamic = _dynamic_after(expansion.proto, dynamic, reads_data_of)
    return expansion


def _dynamic_after(proto, dynamic: set[str], reads_data_of) -> set[str]:
    """``dynamic`` grown by the values of inner nodes that read it."""
    dynamic = set(dynamic)
    for node in proto.graph.node:
        if reads_data_of(node, dynamic):
            dynamic.update(o for o in node.output if o)
    return dynamic

"""Bring your own model: an ONNX file as the same ``Model`` IR the zoo builds.

``load_onnx(source)`` reads a path or the file's bytes with the ``onnx``
package (``onnx.load``, ``onnx.checker``, ``onnx.shape_inference``,
``onnx.numpy_helper``) and returns a ``Model`` that every engine runs.

How the batch is kept out of the graph. The first axis of the single
float32 input is the batch. The graph is evaluated once with ONNX's
reference evaluator at batch 1 and once at batch 2: every value that does
not depend on the input's data (initializers, ``Constant``, and all shape
arithmetic: ``Shape``, ``Gather``, ``Slice``, ``Concat``, ``Reshape`` targets,
``ConstantOfShape``, ...) is folded to its batch-1 value, so nothing of it runs
per forward. Every other value (an activation) is lowered to IR ops acting
on one sample: its per-sample shape is its batch-1 shape without the axis
that grows with the batch (exporters move and merge that axis: PyTorch's
attention runs (seq, batch·heads, head_dim)). Because ops then treat each
sample independently, the import checks that the file does too: at batch 2,
the first sample's output must equal the batch-1 output.

A file that fixes its first axis at N is run the same way at batch 1 and 2 with
that axis made symbolic and its literal ``Reshape`` targets led by N made to lead
by -1 (``_batch_free``). If that passes the checks (and, for N > 1, the per-sample
model reproduces the file at N), the first axis is the batch: at N = 1 the model
runs at any batch, at N > 1 at N only. Otherwise no axis is the batch: the model
holds the file's whole shapes and runs them as one row, at N only (a rank-0 or
rank-1 input always does). ``Model.fixed_batch`` (``FixedBatch``) says which, and why.

Lowering is one table, ``onnx_lower.LOWER``: ONNX op type -> a function that
emits IR ops. A new op type is one entry. The passes that turn generic ops into the
project's fused kinds (``linear``, ``layernorm``, ``gelu_erf``) are pure
functions in ``onnx_passes``.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..ir.models import QUANTIZED_STEPS, FixedBatch, Model, Op
from .expand import expand_functions
from .lower import LOWER, Act, lower
from .passes import PASSES, live_ops
from .quantized import DOMAIN as QUANTIZED_DOMAIN, FAKE_QUANTIZE as QUANTIZE_STEP, FORMS as QUANTIZED_FORMS, evaluator_op
from .quantized import rewrite as dequantize

# Refused before anything is built: a graph this large is not what this project's engines
# are for, and the web page must not spend minutes on an upload.
MAX_NODES = 20_000
MAX_INITIALIZER_BYTES = 1 << 30
MAX_VALUE_BYTES = 1 << 30        # any one value of the graph, as shape inference sizes it
SEPARABLE_RTOL = 1e-4       # the batch-2 run's first sample against the batch-1 run


class OnnxImportError(ValueError):
    """The file cannot be imported; the message names every problem found."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(self.problems[0] if len(self.problems) == 1 else     # one line, for the CLI
                         f"{len(self.problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in enumerate(self.problems, 1)))


def _onnx():
    try:
        import onnx
    except ImportError as exc:
        raise OnnxImportError(f"importing ONNX files needs the onnx package ({exc}); "
                              f"pip install -e .[peers]") from exc
    return onnx


def workload_version(source: bytes | str | os.PathLike) -> str:
    """A stable version for a model file: its content hash. Results of another file are not compared."""
    data = source if isinstance(source, (bytes, bytearray)) else Path(source).read_bytes()
    return "onnx-" + hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True)
class FileWorkload:
    """What the benchmark suite needs to add a model file to its matrix at one batch."""
    model: Model
    batch: int
    version: str                 # the file's content hash (``workload_version``)

    @property
    def id(self) -> str:         # like the zoo's ids: test_forward[arena-mymodel-b8]
        return f"{self.model.name}-b{self.batch}"

    def input(self, seed: int = 0) -> np.ndarray:
        return self.model.random_input(self.batch, rng=seed)


def file_workload(path: str | os.PathLike, batch: int, **limits) -> FileWorkload:
    """The model in ``path`` (named by the file's stem) at ``batch``, with its version."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    model = load_onnx(path, **limits)
    model.rows(int(batch))            # BatchRefused (a ValueError) naming the file's fixed batch
    return FileWorkload(model, int(batch), workload_version(model.source))


# --- reading and checking -------------------------------------------------------

def read(source, *, allow_external_data: bool = True, max_nodes: int = MAX_NODES,
         max_initializer_bytes: int = MAX_INITIALIZER_BYTES):
    """The checked ``ModelProto`` of a path or of the file's bytes, and those bytes."""
    onnx = _onnx()
    from onnx import external_data_helper
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), None
    else:
        where = Path(source)
        try:
            data = where.read_bytes()
        except OSError as exc:
            raise OnnxImportError(f"cannot read {where}: {exc.strerror or exc}") from exc
    if not data:
        raise OnnxImportError("not an ONNX file: it is empty")
    try:
        proto = onnx.load_from_string(data)
    except Exception as exc:   # protobuf's DecodeError and friends
        raise OnnxImportError(f"not an ONNX file, or a truncated one: {type(exc).__name__}: {exc}") from exc
    if not proto.HasField("graph") or not proto.opset_import:
        raise OnnxImportError("not an ONNX file: no graph or no opset (a truncated file, or another format)")
    external = [t.name for t in external_data_helper._get_all_tensors(proto)
                if external_data_helper.uses_external_data(t)]
    if external:
        if not allow_external_data or where is None:
            raise OnnxImportError(f"{len(external)} tensors keep their data in external files "
                                  f"({', '.join(external[:5])}), which are not accepted here; "
                                  f"save the model as one file (onnx.save(model, path, save_as_external_data=False))")
        try:
            external_data_helper.load_external_data_for_model(proto, str(where.parent))
        except Exception as exc:
            raise OnnxImportError(f"external data missing for {where.name}: {exc}") from exc
        data = proto.SerializeToString()
    problems = []
    nodes = len(proto.graph.node)
    if nodes > max_nodes:
        problems.append(f"the graph has {nodes} nodes; the limit is {max_nodes}")
    init_bytes = sum(_tensor_bytes(t) for t in proto.graph.initializer)
    if init_bytes > max_initializer_bytes:
        problems.append(f"the initializers hold {init_bytes} bytes; the limit is {max_initializer_bytes}")
    if problems:
        raise OnnxImportError(problems)
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise OnnxImportError(f"the file fails onnx.checker: {str(exc).strip().splitlines()[0]}") from exc
    return proto, data


def _tensor_bytes(t) -> int:
    if t.raw_data:
        return len(t.raw_data)
    return 4 * math.prod(t.dims)


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


class Signature(NamedTuple):
    """The single float32 input: its name, its shape past the first axis, and the first axis'
    size where the file fixes it (None: symbolic, the batch). A rank-0 input has ``rest`` () and
    ``fixed`` 1: one shape, run as it is."""
    input: str
    rest: tuple[int, ...]
    fixed: int | None
    rank: int

    def shape(self, batch: int) -> tuple[int, ...]:
        """The input's shape at this size of its first axis."""
        return () if self.rank == 0 else (batch, *self.rest)


def _output_problems(proto) -> list[str]:
    from onnx import TensorProto
    if len(proto.graph.output) != 1:
        return [f"the graph has {len(proto.graph.output)} outputs; exactly one is supported"]
    out = proto.graph.output[0].type.tensor_type.elem_type
    if out != TensorProto.FLOAT:
        return [f"output {proto.graph.output[0].name!r} is {TensorProto.DataType.Name(out)}; "
                f"only float32 outputs are supported"]
    return []


def check_signature(proto) -> Signature:
    """The single float32 input and single float32 output, every problem at once."""
    from onnx import TensorProto
    inits = {t.name for t in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    problems = []
    if len(inputs) != 1:
        problems.append(f"the graph has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                        f"exactly one float32 input is supported")
    problems += _output_problems(proto)
    if problems or not inputs:
        raise OnnxImportError(problems)
    (x,) = inputs
    elem = x.type.tensor_type.elem_type
    if elem != TensorProto.FLOAT:
        problems.append(f"input {x.name!r} is {TensorProto.DataType.Name(elem)}; only float32 inputs are supported")
    if not x.type.tensor_type.HasField("shape"):
        problems.append(f"input {x.name!r} has an unknown rank; export it with its shape")
        raise OnnxImportError(problems)
    dims = _dims(x)
    first, rest = (dims[0], dims[1:]) if dims else (1, [])
    dynamic = [f"axis {i + 1} ({d!r})" for i, d in enumerate(rest) if not isinstance(d, int)]
    if dynamic:
        problems.append(f"input {x.name!r} has dynamic axes other than the batch: {', '.join(dynamic)}; "
                        f"export it with fixed sizes there")
    empty = [i for i, d in enumerate(dims) if isinstance(d, int) and d < 1]
    if empty:
        problems.append(f"input {x.name!r} has zero-sized axes ({', '.join(map(str, empty))}); "
                        f"an empty tensor is not supported")
    if problems:
        raise OnnxImportError(problems)
    return Signature(x.name, tuple(rest), first if isinstance(first, int) else None, len(dims))


# --- evaluation: fold what does not depend on the input, measure the rest -------------

# Inputs whose data a node does not read, only their shape or type (None: every input).
SHAPE_OR_TYPE_ONLY = {"Shape": None, "Size": None, "CastLike": (1,)}


def _subgraph_reads(node) -> set[str]:
    """Names the subgraphs of a node (If, Loop, Scan) read, their own values included."""
    from onnx import AttributeProto
    names = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for inner in g.node:
                names.update(i for i in inner.input if i)
                names |= _subgraph_reads(inner)
    return names


def reads_data_of(node, dynamic: set[str]) -> bool:
    """Whether the node reads the data of a value in ``dynamic`` (``SHAPE_OR_TYPE_ONLY`` aside),
    through its inputs or inside its subgraphs."""
    if node.op_type in SHAPE_OR_TYPE_ONLY and SHAPE_OR_TYPE_ONLY[node.op_type] is None:
        return False
    skip = SHAPE_OR_TYPE_ONLY.get(node.op_type, ())
    return any(i in dynamic for j, i in enumerate(node.input) if i and j not in skip) or \
        bool(_subgraph_reads(node) & dynamic)


def dynamic_values(proto, input_name: str) -> set[str]:
    """Values that depend on the input's data; ``Shape``, ``Size`` and the type operand of
    ``CastLike`` cut the dependency."""
    dynamic = {input_name}
    for node in proto.graph.node:
        if reads_data_of(node, dynamic):
            dynamic.update(o for o in node.output if o)
    return dynamic


def unsupported_nodes(proto, dynamic: set[str]) -> list[str]:
    """Every node the importer cannot lower, all at once."""
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    bad = []
    for node in proto.graph.node:
        domain = node.domain or "ai.onnx"
        runs = reads_data_of(node, dynamic)
        if domain not in ("ai.onnx", QUANTIZED_DOMAIN) or (runs and node.op_type not in LOWER):
            form = QUANTIZED_FORMS.get(node.op_type)
            bad.append(f"node {node.name or node.output[0]!r}: {node.op_type} (domain {domain}, "
                       f"opset {opsets.get(domain, '?')}) is not supported" + (f" (only as {form})" if form else ""))
    return bad


def _evaluator_ops() -> list:
    """Ops for ONNX's reference evaluator (onnx 1.x), through ``engines.ir.conv``'s eager forms,
    which tests/test_conv.py checks against ONNX Runtime:

    - 2-D MaxPool and AveragePool: the evaluator's own loop over every output in Python took
      40 of 50 s importing Inception v2. Anything else (auto_pad, other ranks, storage_order,
      the Indices output) goes to its own.
    - BatchNormalization before opset 14 in inference mode: the evaluator fills in the schema's
      default momentum and then normalises with the batch's own statistics (training mode),
      so a batch-2 run differed from batch 1 by 1e-3 at ResNet-50's first BN. Any rank from 2
      (BatchNorm1d: LeViT's linears, 1-D convolutional front ends), channels on axis 1."""
    from onnx.reference.ops.op_average_pool import AveragePool_19
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_max_pool import MaxPool as ReferenceMaxPool

    from ..ir.conv import avgpool_eager, batchnorm_eager, maxpool_eager

    def plain(node, x, auto_pad, kernel_shape, storage_order=None):
        return (np.ndim(x) == 4 and len(kernel_shape or ()) == 2 and auto_pad in (None, "NOTSET", b"NOTSET")
                and not storage_order and len([o for o in node.output if o]) == 1)

    def window(kernel_shape, strides, pads, dilations, ceil_mode):
        return dict(kernel_shape=tuple(kernel_shape), strides=tuple(strides or (1, 1)),
                    pads=tuple(pads or (0, 0, 0, 0)), dilations=tuple(dilations or (1, 1)), ceil_mode=ceil_mode or 0)

    class MaxPool(ReferenceMaxPool):
        op_domain = ""

        def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
                 storage_order=None, strides=None):
            if not plain(self.onnx_node, x, auto_pad, kernel_shape, storage_order):
                return super()._run(x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides)
            return (maxpool_eager(x, **window(kernel_shape, strides, pads, dilations, ceil_mode)).astype(x.dtype),)

    class AveragePool(AveragePool_19):
        op_domain = ""

        def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
                 strides=None, count_include_pad=None):
            if not plain(self.onnx_node, x, auto_pad, kernel_shape):
                return super()._run(x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides, count_include_pad)
            y = avgpool_eager(x, count_include_pad=count_include_pad or 0,
                              **window(kernel_shape, strides, pads, dilations, ceil_mode))
            return (y.astype(x.dtype),)

    class BatchNormalization(OpRun):
        op_domain = ""

        def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None,
                 is_test=None, spatial=None):
            if training_mode or np.ndim(x) < 2:
                raise NotImplementedError("BatchNormalization in training mode, or over fewer than 2 axes")
            eps = 1e-5 if epsilon is None else epsilon
            if np.ndim(x) == 4:
                return batchnorm_eager(x, scale, bias, mean, var, epsilon=eps).astype(x.dtype),
            per_channel = (-1,) + (1,) * (np.ndim(x) - 2)       # (N, C), (N, C, L), ...: channels on axis 1
            a = np.reshape(scale / np.sqrt(var + eps), per_channel)
            return ((x - np.reshape(mean, per_channel)) * a + np.reshape(bias, per_channel)).astype(x.dtype),

    class GatherElements(OpRun):
        op_domain = ""

        def _run(self, data, indices, axis=None):
            # The evaluator's own picks with np.choose, which takes at most 64 choices: along an
            # axis of 64 or more it fails (BERT's constant token-type buffer, expanded).
            axis = (axis or 0) % max(1, np.ndim(data))
            indices = np.where(indices < 0, indices + np.shape(data)[axis], indices)
            return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)

    return [MaxPool, AveragePool, BatchNormalization, GatherElements, evaluator_op()]


class NodeFailed(Exception):
    """A node of the graph raised while ONNX's reference evaluator ran it: the node and the error."""

    def __init__(self, node, error: BaseException):
        self.node, self.error = node, error
        super().__init__(f"node {node.name or node.output[0]!r} ({node.op_type}): {type(error).__name__}: "
                         f"{str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}")


def _guard(rt_node) -> None:
    """Make an evaluator node raise ``NodeFailed`` naming itself, whatever goes wrong inside it."""
    run = rt_node.run

    def guarded(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except NodeFailed:
            raise
        except Exception as exc:
            raise NodeFailed(rt_node.onnx_node, exc) from exc

    rt_node.run = guarded


def evaluate(proto, input_name: str, *xs: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Every value of the graph for each input, with ONNX's reference evaluator (and the fixed ops
    of ``_evaluator_ops``), one evaluator for all: the initializers' arrays are made once and
    shared by every run's values (a 47 MB ResNet-18 held them once, not once per run). A node that
    fails is an ``OnnxImportError`` naming it, its op type and the error."""
    from onnx.reference import ReferenceEvaluator
    evaluator, out = None, []
    for x in xs:
        at = f"batch {x.shape[0]}" if np.ndim(x) else "its input's shape ()"
        try:
            if evaluator is None:
                evaluator = ReferenceEvaluator(proto, new_ops=_evaluator_ops())
                for rt_node in evaluator.rt_nodes_:
                    _guard(rt_node)
            with np.errstate(all="ignore"):     # random inputs: overflow or log(0) in an activation is no error
                results = evaluator.run(None, {input_name: x}, intermediate=True)
        except NodeFailed as exc:
            raise OnnxImportError(f"the graph does not run at {at}: {exc}") from exc
        except Exception as exc:
            text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise OnnxImportError(f"the graph does not run at {at} ({type(exc).__name__}: {text})") from exc
        out.append({k: np.asarray(v) for k, v in results.items()})
    return out

def _measure(proto, dynamic, one: dict, two: dict) -> tuple[dict[str, Act], list[str]]:
    """Each activation's batch-1 shape and batch axis, from its shapes at batch 1 and 2."""
    acts, problems = {}, []
    owner = {o: n for n in proto.graph.node for o in n.output}
    for name in dynamic:
        if name not in one or name not in two:
            continue
        s1, s2 = np.shape(one[name]), np.shape(two[name])
        grew = [i for i, (a, b) in enumerate(zip(s1, s2)) if a != b]
        if len(s1) != len(s2) or len(grew) != 1 or s2[grew[0]] != 2 * s1[grew[0]]:
            node = owner.get(name)
            problems.append(f"node {node.name if node else name!r} ({node.op_type if node else 'input'}): "
                            f"its output {name!r} does not keep one batch axis ({s1} at batch 1, {s2} at batch 2)")
            continue
        i = grew[0]
        acts[name] = Act(name, tuple(s1), i if s1[i] == 1 else None)
    return acts, problems

def _close(got: np.ndarray, expected: np.ndarray, slack: float = 0.0) -> bool:
    """Equal within SEPARABLE_RTOL, relative to the larger of 1 and the expected values' size, or
    within ``slack``."""
    if np.shape(got) != np.shape(expected):
        return False
    if not np.size(expected):
        return True
    top = float(np.max(np.abs(np.nan_to_num(expected, nan=0.0, posinf=0.0, neginf=0.0))))
    atol = max(SEPARABLE_RTOL * max(1.0, top), slack)
    return bool(np.allclose(got, expected, rtol=SEPARABLE_RTOL, atol=atol, equal_nan=True))


def _step_slack(proto) -> float:
    """What a rounding tie may move a value by in a graph with quantization steps: QUANTIZED_STEPS
    of its coarsest step (``Model.tolerance``'s reason: the evaluator sums a conv in another order
    at batch 2, a value half a step off moves by a step, and the values after it with it); 0 in a
    float graph."""
    from onnx import helper
    steps = [helper.get_attribute_value(a) for n in proto.graph.node if n.op_type == QUANTIZE_STEP
             for a in n.attribute if a.name == "scale"]
    return QUANTIZED_STEPS * max(steps, default=0.0)


def _separable(proto, acts, one, two) -> list[str]:
    """The output keeps its batch axis first, and the batch-2 run's first sample is the batch-1 run
    (within a rounding tie's reach, ``_step_slack``)."""
    output = proto.graph.output[0].name
    out = acts.get(output)
    if out is None:
        return [f"the output {output!r} does not depend on the input"]
    if out.bpos != 0:
        return [f"the output {output!r} does not have the batch axis first (shape {out.shape} at batch 1)"]
    slack = _step_slack(proto)
    if not _close(two[output][:1], one[output], slack):
        return ["the graph mixes samples: at batch 2 the first sample's output differs from its "
                f"output at batch 1 (an op works across the batch axis{_first_mixing(proto, acts, one, two, slack)})"]
    return []


def _first_mixing(proto, acts, one, two, slack: float) -> str:
    """', first at node NAME (OpType)': the first node whose output's first sample at batch 2
    differs from batch 1; '' when none shows it (the output alone)."""
    for node in proto.graph.node:
        for name in node.output:
            act = acts.get(name)
            if act is None or act.bpos is None or name not in two:
                continue
            first = np.take(two[name], [0], axis=act.bpos)
            if not _close(first, one[name], slack):
                return f", first at node {node.name or name!r} ({node.op_type})"
    return ""


def _batch_free(proto, input_name: str, size: int, values: dict):
    """A copy of a file that fixes the batch at ``size``, with the batch axis made symbolic and
    every Reshape to a literal shape led by ``size`` ((1, 2048)) made to lead by -1 instead; and
    the names of those Reshape nodes. Whether the leading axis really was the batch the batch-1
    and batch-2 runs then show (each value keeps one batch axis, the first sample's output
    unchanged). ``values``: the file's values at its own batch (Reshape targets computed there)."""
    import onnx
    from onnx import numpy_helper
    proto2 = onnx.ModelProto()
    proto2.CopyFrom(proto)
    graph = proto2.graph
    graph.input[[i.name for i in graph.input].index(input_name)].type.tensor_type.shape.dim[0].dim_param = "batch"
    literal, inits = [], {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.data_type == 7}
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        target = values.get(node.input[1], inits.get(node.input[1]))
        if target is None or np.ndim(target) != 1 or len(target) < 1 or int(target[0]) != size:
            continue
        literal.append(f"node {node.name or node.output[0]!r}: Reshape to {tuple(int(d) for d in target)}")
        if -1 in target:                 # (1, -1): a second -1 is not allowed; stays fixed
            continue
        shape = np.array(target, dtype=np.int64)
        shape[0] = -1
        name = f"{node.input[1]}.batch_free"
        graph.initializer.append(numpy_helper.from_array(shape, name))
        node.input[1] = name
    return proto2, literal


def _batch_one(proto, dynamic, one: dict) -> tuple[dict[str, Act], list[str]]:
    """Each activation at batch 1 only: its leading axis (which must be 1) is the batch."""
    acts, problems = {}, []
    owner = {o: n for n in proto.graph.node for o in n.output}
    for name in dynamic:
        if name not in one:
            continue
        shape = tuple(np.shape(one[name]))
        if not shape or shape[0] != 1:
            node = owner.get(name)
            problems.append(f"node {node.name if node else name!r}: its output {name!r} has shape {shape} at "
                            f"batch 1, which does not lead with the batch axis")
            continue
        acts[name] = Act(name, shape, 0)
    return acts, problems


SHAPE_DATA_BYTES = 1 << 16       # initializers up to this size keep their values for shape inference


def _weightless(proto):
    """The graph with its large float initializers as typed graph inputs instead: what shape
    inference needs (their types and shapes; the values only of small ones, such as Reshape
    targets, which data propagation reads). Inference serializes the model into ONNX's C++ and
    back: on ResNet-18 (47 MB) the import's peak was 298 MB there, three copies of the weights."""
    from onnx import TensorProto, helper
    small, typed = [], []
    for t in proto.graph.initializer:
        if t.data_type == TensorProto.FLOAT and _tensor_bytes(t) > SHAPE_DATA_BYTES:
            typed.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            small.append(t)
    if not typed:
        return proto
    g = proto.graph
    graph = helper.make_graph(g.node, g.name, [*g.input, *typed], g.output, small, value_info=g.value_info)
    return helper.make_model(graph, opset_imports=proto.opset_import, ir_version=proto.ir_version,
                             functions=proto.functions)


def _oversized_values(inferred, max_value_bytes: int) -> list[str]:
    """Values whose inferred shape (known axes only) is larger than the limit, before anything runs."""
    graph = inferred.graph
    problems = []
    for vi in (*graph.value_info, *graph.output):
        dims = [d if isinstance(d, int) else 1 for d in _dims(vi)]
        if 4 * math.prod(dims) > max_value_bytes:
            problems.append(f"value {vi.name!r} would hold {4 * math.prod(dims):,} bytes at batch 1; "
                            f"the limit is {max_value_bytes:,}")
    return problems


class Batching(NamedTuple):
    """One way to read the batch of a graph: the graph to lower (the file, or its batch-free
    copy), each activation's shape and batch axis, the folded values, and the fixed batch."""
    proto: object
    acts: dict[str, Act]
    one: dict[str, np.ndarray]
    fixed: FixedBatch | None


def _symbolic(proto, sig: Signature, dynamic, x2: np.ndarray) -> Batching:
    """A symbolic batch axis: measured at batch 1 and 2; any batch."""
    one, two = evaluate(proto, sig.input, x2[:1], x2)
    acts, problems = _measure(proto, dynamic, one, two)
    problems += _separable(proto, acts, one, two)
    if problems:
        raise OnnxImportError(problems)
    return Batching(proto, acts, one, None)


def _fixed_ways(proto, sig: Signature, dynamic, rng):
    """The ways to read a file that fixes its first axis at N, most useful first, each a
    ``Batching`` or the problems that ruled it out:

    1. the first axis is the batch (the batch-free copy measured at batch 1 and 2, as a symbolic
       file): at N = 1 the model then runs at any batch, at N > 1 at N only;
    2. N = 1 only: every activation leads with the batch axis at batch 1 (it runs at batch 1);
    3. no axis is the batch: the file's whole shapes as one row, at N only."""
    n = sig.fixed
    x2 = rng.standard_normal((2, *sig.rest)).astype(np.float32)
    (at_n,) = evaluate(proto, sig.input, x2[:1] if n == 1 and sig.rank else
                       rng.standard_normal(sig.shape(n)).astype(np.float32))
    literal, why = [], "its input has rank 0 or 1"
    if sig.rank >= 2 or (sig.rank == 1 and n == 1):
        proto2, literal = _batch_free(proto, sig.input, n, at_n)
        try:
            one, two = evaluate(proto2, sig.input, x2[:1], x2)
            acts, problems = _measure(proto2, dynamic, one, two)
            problems += _separable(proto2, acts, one, two)
        except OnnxImportError as exc:
            problems = exc.problems
        where = f" ({', '.join(literal)})" if literal else ""
        fixed = None if n == 1 else FixedBatch(n, True, f"the file fixes the batch at {n}{where}: its input is "
                                                      f"{sig.shape(n)}; run it at batch {n}, or export it with a dynamic batch "
                                                      f"axis for others")
        yield problems or Batching(proto2, acts, one, fixed)
        why = f"at batch 2 {problems[0]}" if problems else "the per-sample model differs from the file at its batch"
    where = ", ".join(literal) if literal else "a shape computed in the graph"
    if n == 1 and sig.rank >= 1:
        acts, problems = _batch_one(proto, dynamic, at_n)
        yield problems or Batching(proto, acts, at_n, FixedBatch(1, True, (
            f"the file fixes the batch at 1 ({where}), and {why}; it runs at batch 1 only: export with a "
            f"dynamic batch axis (torch: dynamic_axes={{'x': {{0: 'batch'}}}} or dynamic_shapes)")))
    acts = {name: Act(name, tuple(np.shape(at_n[name])), None) for name in dynamic if name in at_n}
    yield Batching(proto, acts, at_n, FixedBatch(n, False, (
        f"the file fixes the batch at {n} and no axis could be shown to be the batch ({why}); "
        f"it runs at its one shape {sig.shape(n)}")))


def _reproduces(model: Model, proto, sig: Signature, rng) -> bool:
    """A per-sample model of a file fixed at N > 1 gives the file's output at N (ONNX's evaluator)."""
    x = rng.standard_normal(sig.shape(sig.fixed)).astype(np.float32)
    expected = evaluate(proto, sig.input, x)[0][proto.graph.output[0].name]
    with np.errstate(all="ignore"):
        return _close(model.reference(x), expected)


def _build(b: Batching, sig: Signature, name: str, data: bytes, passes: bool) -> Model:
    """The model of one reading of the batch: lowered, then the passes; OnnxImportError else."""
    proto = b.proto
    output = proto.graph.output[0].name
    L, problems = lower(proto, sig.input, b.one, b.acts)
    if problems:
        raise OnnxImportError(problems)
    result = L.values[output].name
    ops = live_ops(L.ops, result)
    if not ops or ops[-1].output != result:       # the output is the input itself: end on a copy
        shape = L.shapes[result]
        ops.append(Op("expand", (result,), L._fresh(output), (), {"aligned": shape, "shape": shape}))
        L.shapes[ops[-1].output] = shape
    L.ops = ops
    used = {p for op in ops for p in op.params}
    L.params = {k: v for k, v in L.params.items() if k in used}
    model = Model(name, tuple(L.ops), dict(L.shapes), dict(L.params),
                  input=sig.input, source=data, origin=dict(L.origin), fixed_batch=b.fixed)
    if passes:
        for p in PASSES:
            model = p(model)
    return model


def _build_fixed(proto, sig: Signature, dynamic, build) -> Model:
    """The first reading of a fixed batch (``_fixed_ways``) that lowers and, per sample at
    N > 1, reproduces the file at N. Else the problems of the first reading that got as far as
    lowering (the most specific), or of the last."""
    rng = np.random.default_rng(0)
    first, last = None, []
    for way in _fixed_ways(proto, sig, dynamic, rng):
        if isinstance(way, list):
            last = way
            continue
        try:
            model = build(way)
        except OnnxImportError as exc:
            first, last = first or exc.problems, exc.problems
            continue
        if way.fixed is None or not way.fixed.per_sample or way.fixed.size == 1 or _reproduces(model, proto, sig, rng):
            return model
    raise OnnxImportError(first or last)


def load_onnx(source, *, randomize_weights: int | None = None, name: str | None = None,
              passes: bool = True, max_value_bytes: int = MAX_VALUE_BYTES, **limits) -> Model:
    """A ``Model`` from an ONNX file (a path, or its bytes), ready for every engine.

    ``randomize_weights``: a seed; every float initializer and ``ConstantOfShape`` weight is
    replaced by seeded random values of its shape before import (the model's ``source`` then holds the file so
    changed), for graphs exported with untrained or absent weights.
    ``max_value_bytes``: the largest value shape inference may find (checked before the graph runs).
    ``limits``: ``allow_external_data``, ``max_nodes``, ``max_initializer_bytes`` (see ``read``).
    A file that fixes its input's first axis at N runs at batch N (``Model.fixed_batch``; at N = 1,
    at any batch when the importer shows the leading 1 is the batch).
    Raises ``OnnxImportError`` naming every problem found.
    """
    proto, data = read(source, **limits)
    if randomize_weights is not None:
        proto, data = _randomized(proto, randomize_weights)
    sig = check_signature(proto)
    try:
        import onnx
        inferred = onnx.shape_inference.infer_shapes(_weightless(proto), check_type=True, strict_mode=False,
                                                     data_prop=True)
    except Exception as exc:
        raise OnnxImportError(f"ONNX shape inference fails: {str(exc).strip().splitlines()[0][:300]}") from exc
    oversized = _oversized_values(inferred, max_value_bytes)
    if oversized:
        raise OnnxImportError(oversized)
    proto, why = dequantize(proto)      # a quantized file's integer steps as float ops of the same value
    dynamic = dynamic_values(proto, sig.input)
    bodies = expand_functions(proto, dynamic, LOWER, reads_data_of)     # ops defined by a function body
    with bodies.traced(OnnxImportError):
        proto, dynamic = bodies.proto, dynamic_values(bodies.proto, sig.input)
        bad = unsupported_nodes(proto, dynamic)
        if bad:
            raise OnnxImportError(why + bad)
        build = lambda b: _build(b, sig, name or _stem(source, proto), data, passes)  # noqa: E731
        if sig.fixed is not None:
            return bodies.trace(_build_fixed(proto, sig, dynamic, build))
        x2 = np.random.default_rng(0).standard_normal((2, *sig.rest)).astype(np.float32)
        return bodies.trace(build(_symbolic(proto, sig, dynamic, x2)))


def _stem(source, proto) -> str:
    if isinstance(source, (str, os.PathLike)):
        return Path(source).stem
    return proto.graph.name or "model"


def _randomized(proto, seed: int):
    """A copy with every float weight (an initializer, or a ``ConstantOfShape`` of a constant
    shape, as the onnx package's CNNs make theirs) replaced by seeded random values of its shape:
    matrices and kernels scaled by 1/sqrt(fan-in) (so a residual net's logits stay near 1 to 100,
    where a float32 rounding cannot swap the softmax's winner), vectors small, and
    BatchNormalization's scale and variance in [0.5, 1.5)."""
    import onnx
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    positive = {n.input[i] for n in graph.node if n.op_type == "BatchNormalization"
                for i in (1, 4) if i < len(n.input)}
    inits = {t.name: t for t in graph.initializer}

    def draw(shape, name):
        if name in positive:
            return rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if len(shape) >= 3:
            std = 1 / math.sqrt(max(1, math.prod(shape[1:])))
        else:
            std = 1 / math.sqrt(shape[0]) if len(shape) == 2 else 0.1
        return rng.standard_normal(shape).astype(np.float32) * np.float32(std)

    for t in graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size > 1:
            t.CopyFrom(numpy_helper.from_array(draw(a.shape, t.name), t.name))
    for i, node in enumerate(graph.node):
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            continue
        value = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "value"), None)
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        if value is None or value.data_type != onnx.TensorProto.FLOAT or math.prod(shape) <= 1:
            continue
        array = numpy_helper.from_array(draw(shape, node.output[0]))
        graph.node[i].CopyFrom(helper.make_node("Constant", [], [node.output[0]], name=node.name, value=array))
    return out, out.SerializeToString()

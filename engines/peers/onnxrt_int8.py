"""onnxruntime-int8: the model quantized by ONNX Runtime's own tools and run by ONNX Runtime, the
peer to compare the ``int8`` engine with.

Strategy: the file the ``onnxruntime`` peer runs (an imported model's own bytes, or the zoo
model's export), quantized once at construction by ``onnxruntime.quantization`` in a temporary
directory that is removed before the constructor returns, then run by the ``onnxruntime`` peer's
session (the same options and intra-op threads).

- A file that is already quantized (``QUANTIZED_OPS``: QDQ pairs, ``MatMulInteger``, ``QLinear*``)
  runs as it is.
- A graph without convolutions: ``quantize_dynamic``, weights s8 with one scale per tensor,
  activations u8 scaled per call (``DynamicQuantizeLinear``, which ONNX Runtime fuses with the
  product into ``DynamicQuantizeMatMul``). ``quantize_dynamic`` quantizes ``MatMul`` but not
  ``Gemm``, so each Gemm on constant weights is first rewritten as ``MatMul`` + ``Add``
  (``gemm_as_matmul``). Per tensor, not per channel: per channel had about 20 % lower error on the
  zoo but cost 7-15 % more time at batch 1-8 (docs/int8.md).
- A graph with a ``Conv``: ``quant_pre_process`` (shape inference, and ONNX Runtime's optimizer
  folding batchnorms into convs, so that no QDQ pair separates them), then ``quantize_static`` in
  QDQ form, weights s8 per output channel, activations u8 per tensor, their ranges calibrated
  (min/max) on ``CALIBRATION_SAMPLES`` inputs of ``Model.random_input`` drawn from one generator
  seeded ``CALIBRATION_SEED``: two builds give the same file, hence the same outputs.

Its error against the float64 reference is int8's, not float's: ``abs_tol``/``rel_tol`` below,
derived from measurement on the zoo (docs/int8.md, "The onnxruntime-int8 peer"). ``quantized``
keeps it out of the report's float targets.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import tempfile

import numpy as np

from ..base import EngineUnavailable
from ..ir.models import Model
from ..native.cpu import int8_dot_product
from .onnxrt import OnnxRuntimeEngine

# Op types whose presence shows a file is quantized already: it then runs as it is.
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "QLinearMatMul", "QLinearConv", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm", "QAttention"})
CALIBRATION_SEED = 34          # the static path's calibration inputs: one seeded generator
CALIBRATION_SAMPLES = 16       # inputs of the file's own batch (1 for the CNNs), min/max over all
PER_CHANNEL_DYNAMIC = False    # measured: per channel cost more time than it saved error (docs/int8.md)
QDQ_OPSET = 13                 # the least opset with per-axis DequantizeLinear
QDQ_IR_VERSION = 7             # opset 13's IR version


def reduce_range() -> bool:
    """Weights on 7 bits where this CPU has no int8 dot products (``native.cpu``): ONNX Runtime's
    own advice for such CPUs, whose u8 x s8 pairs summed in 16 bits saturate at full range. On an
    AVX2-only AMD EPYC its transformer without it ran 0.301 from the float64 reference, past the
    peer's 0.3."""
    return not int8_dot_product()


def _quantization():
    try:
        quantization = importlib.import_module("onnxruntime.quantization")
    except ImportError as exc:
        raise EngineUnavailable(f"the onnxruntime-int8 engine needs onnxruntime's quantization tools ({exc}); "
                                "pip install -e .[peers]") from exc
    return quantization


def gemm_as_matmul(proto, onnx) -> None:
    """Rewrite in place each ``Gemm`` whose B is an initializer (alpha 1, A not transposed, C absent
    or with beta 1) as ``MatMul`` (B transposed once if ``transB``) then ``Add`` of C: the form
    ``quantize_dynamic`` quantizes. Initializers no node reads any more are dropped."""
    from onnx import helper, numpy_helper

    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if (node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or (bias and attrs.get("beta", 1.0) != 1.0)):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        kn = f"{node.input[1]}.kn" if attrs.get("transB", 0) else node.input[1]
        if kn not in inits:
            inits[kn] = numpy_helper.from_array(np.ascontiguousarray(w.T), kn)
            graph.initializer.append(inits[kn])
        out = list(node.output)
        product = [f"{out[0]}.matmul"] if bias else out
        nodes.append(helper.make_node("MatMul", [node.input[0], kn], product, name=f"{node.name or out[0]}.matmul"))
        if bias:
            nodes.append(helper.make_node("Add", [product[0], bias], out, name=f"{node.name or out[0]}.bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _prepared(proto) -> None:
    """In place: no initializer listed among the graph's inputs (files of IR version 3 list them;
    the optimizer folds some away and would leave them as inputs no feed gives), and a name for
    every node (``nodes_to_exclude`` names them)."""
    proto.ir_version = max(proto.ir_version, QDQ_IR_VERSION)    # IR 3 requires them listed
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    taken = {n.name for n in proto.graph.node}
    for i, node in enumerate(proto.graph.node):
        if not node.name:
            node.name = next(name for k in range(i, i + len(taken) + 1)
                             if (name := f"{node.op_type}_{k}") not in taken)
            taken.add(node.name)


def _preprocess(q, src: str, pre: str) -> None:
    """``quant_pre_process`` of file ``src`` into ``pre``; where its symbolic shape inference gives
    up ("Incomplete symbolic shape inference": an ``Expand`` whose shape is an ``Identity`` of an
    initializer, as in torchvision's Swin V2 export), again without it, as ONNX Runtime's tool
    offers: ONNX's own shape inference and the optimizer still run. It runs in ``src``'s folder:
    the failing inference saves the model there (``sym_shape_infer_temp.onnx`` and its weights)."""
    here = os.getcwd()
    os.chdir(os.path.dirname(src))
    try:
        q.quant_pre_process(src, pre)
    except Exception as exc:
        if "symbolic shape inference" not in str(exc):
            raise
        q.quant_pre_process(src, pre, skip_symbolic_shape=True)
    finally:
        os.chdir(here)


def _softmax_tail(proto) -> list[str]:
    """The last Softmax and the nodes after it (a classifier's probabilities and their reshapes):
    left float. ONNX Runtime quantizes a softmax's output on a fixed [0, 1] range, a step of 1/255,
    and 1,000 class probabilities near 0.001 would all round to 0."""
    nodes = list(proto.graph.node)
    soft = [i for i, n in enumerate(nodes) if n.op_type == "Softmax"]
    return [n.name for n in nodes[soft[-1]:]] if soft else []


@contextlib.contextmanager
def _no_preprocess_advice():
    """Without the root logger's "Please consider to run pre-processing" from quantize_dynamic:
    measured on the zoo, ``quant_pre_process`` changed no output of the dynamic path (docs/int8.md)."""
    def advice(record):
        return not record.getMessage().startswith("Please consider to run pre-processing")
    root = logging.getLogger()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


def _opset(proto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)


class _Calibration:
    """``CALIBRATION_SAMPLES`` seeded random inputs of the file's own batch, one per call
    (ONNX Runtime's ``CalibrationDataReader`` protocol)."""

    def __init__(self, model: Model, input_name: str):
        rng = np.random.default_rng(CALIBRATION_SEED)
        batch = model.fixed_batch.size if model.fixed_batch is not None else 1
        self._feeds = iter([{input_name: model.random_input(batch, rng)} for _ in range(CALIBRATION_SAMPLES)])

    def get_next(self):
        return next(self._feeds, None)


class OnnxRuntimeInt8Engine(OnnxRuntimeEngine):
    name = "onnxruntime-int8"
    quantized = True
    # Measured on the zoo (docs/int8.md): worst max abs error 0.136 (mlp-deep d1024), worst
    # relative L2 4.3 % (mlp-deep d48 at batch 1: six layers, per-tensor scales); twice those.
    abs_tol = 0.3
    rel_tol = 0.09

    def program(self, model: Model, onnx) -> bytes:
        """The float program quantized (or a quantized file as it is), its weights counted."""
        proto, self.scheme = quantized(model, onnx.load_from_string(super().program(model, onnx)), onnx)
        self.op_types = frozenset(n.op_type for n in proto.graph.node)     # of the file the session runs
        from onnx import numpy_helper
        self.weight_bytes = sum(numpy_helper.to_array(i).nbytes for i in proto.graph.initializer)
        return proto.SerializeToString()


def quantized(model: Model, proto, onnx, static: bool | None = None) -> tuple:
    """(``proto`` quantized as this peer runs it, the scheme: "as given", "dynamic" or "static QDQ");
    ``static``: QDQ or dynamic whatever the graph (default: QDQ where it has a conv)."""
    ops = {n.op_type for n in proto.graph.node}
    if ops & QUANTIZED_OPS:
        return proto, "as given"
    scheme = "static QDQ" if ("Conv" in ops if static is None else static) else "dynamic"
    import onnx.version_converter  # noqa: F401  (onnx.version_converter below)
    q = _quantization()
    with tempfile.TemporaryDirectory(prefix="mlexec-int8-") as tmp:
        src, out = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "int8.onnx")
        if scheme == "dynamic":
            gemm_as_matmul(proto, onnx)
            onnx.save(proto, src)
            with _no_preprocess_advice():
                q.quantize_dynamic(src, out, weight_type=q.QuantType.QInt8, per_channel=PER_CHANNEL_DYNAMIC,
                                   reduce_range=reduce_range())
        else:
            # per-channel QDQ needs DequantizeLinear's axis (opset 13); older files are converted
            if _opset(proto) < QDQ_OPSET:
                proto = onnx.version_converter.convert_version(proto, QDQ_OPSET)
            _prepared(proto)
            onnx.save(proto, src)
            pre = os.path.join(tmp, "pre.onnx")
            _preprocess(q, src, pre)
            q.quantize_static(pre, out, _Calibration(model, model.input),
                              quant_format=q.QuantFormat.QDQ, per_channel=True,
                              activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                              calibrate_method=q.CalibrationMethod.MinMax, reduce_range=reduce_range(),
                              nodes_to_exclude=_softmax_tail(onnx.load(pre)))
        return onnx.load(out), scheme

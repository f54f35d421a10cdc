"""onnxruntime: the model exported to an ONNX graph and run by ONNX Runtime, a peer to compare with.

Strategy: an imported model (``engines.importer``) runs its original file.
For the zoo, at construction, write the op list as an ONNX graph with the onnx
helper API (Gemm or MatMul+Add, Relu, Gelu (tanh), LayerNormalization,
Softmax, attention as Reshape/Transpose/MatMul), weights as initializers and
a symbolic batch axis, then open an ``InferenceSession`` on the
CPUExecutionProvider with every graph optimization on and as many intra-op
threads as the BLAS pool NumPy uses. forward is one ``session.run``; the
result is a fresh array, the caller's own.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..base import Engine, EngineUnavailable
from ..ir.models import Model
from ..native.threads import blas_threads

OPSET = 20   # LayerNormalization (17) and Gelu with approximate="tanh" (20)
# ONNX Runtime's refusal of a file newer than it reads: its installed version, not the file, is at fault
_TOO_NEW = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")


def _import(engine: str = "onnxruntime"):
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise EngineUnavailable(
            f"the {engine} engine needs onnx and onnxruntime ({exc}); pip install -e .[peers]") from exc
    return onnx, onnxruntime


def export(model: Model, onnx):
    """The model as an ``onnx.ModelProto`` with a dynamic batch axis named ``batch``."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    for name, value in model.params.items():
        const(name, value.astype(np.float32))
    heads_of: dict[str, tuple[str, str, str]] = {}   # qkv tensor -> (q, k, v) names

    def split_heads(qkv, heads):
        # (B, S, 3·D) -> (B, S, 3, H, hd) -> (3, B, H, S, hd) -> q, k, v each (B, H, S, hd)
        if qkv not in heads_of:
            seq, width = model.shapes[qkv]
            hd = width // (3 * heads)
            shape = const(f"{qkv}.split_shape", np.array([0, 0, 3, heads, hd], dtype=np.int64))
            nodes.append(helper.make_node("Reshape", [qkv, shape], [f"{qkv}.5d"]))
            nodes.append(helper.make_node("Transpose", [f"{qkv}.5d"], [f"{qkv}.t"], perm=[2, 0, 3, 1, 4]))
            names = []
            for i, part in enumerate("qkv"):
                idx = const(f"{qkv}.idx{i}", np.array(i, dtype=np.int64))
                nodes.append(helper.make_node("Gather", [f"{qkv}.t", idx], [f"{qkv}.{part}"], axis=0))
                names.append(f"{qkv}.{part}")
            heads_of[qkv] = tuple(names)
        return heads_of[qkv]

    for op in model.ops:
        out, ins, ps = op.output, list(op.inputs), list(op.params)
        if op.kind == "linear":
            if len(model.shapes[ins[0]]) == 1:        # (B, in): one Gemm
                nodes.append(helper.make_node("Gemm", [ins[0], *ps], [out]))
            else:                                     # (B, S, in): MatMul + Add
                nodes.append(helper.make_node("MatMul", [ins[0], ps[0]], [f"{out}.mm"]))
                nodes.append(helper.make_node("Add", [f"{out}.mm", ps[1]], [out]))
        elif op.kind == "relu":
            nodes.append(helper.make_node("Relu", ins, [out]))
        elif op.kind == "gelu":
            nodes.append(helper.make_node("Gelu", ins, [out], approximate="tanh"))
        elif op.kind == "add":
            nodes.append(helper.make_node("Add", ins, [out]))
        elif op.kind == "layernorm":
            nodes.append(helper.make_node("LayerNormalization", ins + ps, [out], axis=-1,
                                          epsilon=float(op.attrs["eps"])))
        elif op.kind == "softmax":
            nodes.append(helper.make_node("Softmax", ins, [out], axis=-1))
        elif op.kind == "attn_scores":
            q, k, _ = split_heads(ins[0], op.attrs["heads"])
            hd = model.shapes[ins[0]][-1] // (3 * op.attrs["heads"])
            nodes.append(helper.make_node("Transpose", [k], [f"{out}.kT"], perm=[0, 1, 3, 2]))
            nodes.append(helper.make_node("MatMul", [q, f"{out}.kT"], [f"{out}.raw"]))
            scale = const(f"{out}.scale", np.array(1.0 / math.sqrt(hd), dtype=np.float32))
            nodes.append(helper.make_node("Mul", [f"{out}.raw", scale], [out]))
        elif op.kind == "attn_context":
            _, _, v = split_heads(ins[1], op.attrs["heads"])
            nodes.append(helper.make_node("MatMul", [ins[0], v], [f"{out}.bhsd"]))
            nodes.append(helper.make_node("Transpose", [f"{out}.bhsd"], [f"{out}.bshd"], perm=[0, 2, 1, 3]))
            shape = const(f"{out}.shape", np.array([0, 0, model.shapes[out][-1]], dtype=np.int64))
            nodes.append(helper.make_node("Reshape", [f"{out}.bshd", shape], [out]))
        else:
            raise NotImplementedError(f"no ONNX lowering for op kind {op.kind!r}")

    def value_info(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", *model.shapes[name]])

    graph = helper.make_graph(nodes, model.name, [value_info(model.input)], [value_info(model.output)], inits)
    # The least IR version the opset needs, not the onnx package's newest: an older onnxruntime
    # refuses a newer IR version ("Unsupported model IR version: 14, max supported IR version: 13").
    proto = helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(proto)
    return proto


def _session(ort, source: bytes, options, engine: str):
    """ONNX Runtime's session on ``source``; ``EngineUnavailable`` where the installed onnxruntime
    is older than the file's IR version (a file from a newer onnx package), any other refusal as
    it is raised."""
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:          # onnxruntime's Fail has no public import path
        too_new = _TOO_NEW.search(str(exc))
        if too_new is None:
            raise
        raise EngineUnavailable(
            f"onnxruntime {ort.__version__} reads ONNX IR versions up to {too_new[2]} and this file is "
            f"IR {too_new[1]}, so {engine} cannot run it here; pip install -U onnxruntime") from exc


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    peer = True
    own_threads = True            # its intra-op pool: the memory pass counts every thread

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        onnx, ort = _import(self.name)
        self.weight_bytes = sum(v.nbytes for v in model.params.values())
        source = self.program(model, onnx)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.threads = blas_threads()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self.session = _session(ort, source, options, self.name)
        self._input = self.session.get_inputs()[0].name
        self._outputs = [self.session.get_outputs()[0].name]
        # A file whose batch axis is fixed at 1 runs one sample at a time.
        shape = self.session.get_inputs()[0].shape
        self._per_sample = not model.whole and bool(shape) and shape[0] == 1

    def program(self, model: Model, onnx) -> bytes:
        """The ONNX file the session runs: an imported model's own (not a re-export of its IR), or
        the zoo model's export. A subclass may transform it (``onnxrt_int8`` quantizes it)."""
        return model.source if model.source is not None else export(model, onnx).SerializeToString()

    def _forward(self, x: np.ndarray) -> np.ndarray:
        if self.model.whole:        # one row of the file's whole shape: the file's input is that row
            return self.session.run(self._outputs, {self._input: x.reshape(x.shape[1:])})[0][None]
        if self._per_sample and x.shape[0] > 1:
            return np.concatenate([self.session.run(self._outputs, {self._input: x[i:i + 1]})[0]
                                   for i in range(x.shape[0])])
        return self.session.run(self._outputs, {self._input: x})[0]

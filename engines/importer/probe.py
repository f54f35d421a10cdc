"""The matrix of an op that is linear in its first input once its other inputs are constants.

GridSample with a constant grid maps each channel's image to the output by fixed weights (every
mode and padding mode: the weights and the indices they fall on depend on the grid only). Its
matrix is ONNX's reference evaluator run on the identity: one probe channel per input element,
each a one-hot image, so the weights are the evaluator's own. Ops that only move elements by
constant indices (ReverseSequence, GatherND, MaxUnpool) are the evaluator run on the elements'
positions (``selection``).
"""
from __future__ import annotations

import math

import numpy as np

MAX_ELEMENTS = 1 << 24          # a probe or map beyond this (64 MiB in float32) is refused


def run_alone(node, opset_import, x: np.ndarray, constants: list) -> np.ndarray:
    """``node`` run by ONNX's reference evaluator on its own, in float64: x as its first input,
    ``constants`` as the others (None: absent)."""
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    names = ["" if c is None else f"c{i}" for i, c in enumerate(constants)]
    call = onnx.NodeProto()
    call.CopyFrom(node)
    call.input[:] = ["x", *names]
    del call.output[1:]
    call.output[0] = "y"
    graph = helper.make_graph(
        [call], "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, list(x.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(np.asarray(c), n) for c, n in zip(constants, names) if c is not None])
    model = helper.make_model(graph, opset_imports=list(opset_import))
    (y,) = ReferenceEvaluator(model).run(None, {"x": x})
    return np.asarray(y, dtype=np.float64)


def channel_map(node, opset_import, spatial: tuple[int, ...], constants: list) -> np.ndarray:
    """(out, in) weights of ``node`` over one channel of ``spatial`` elements: each output
    element's weight on each input element. ``constants``: the node's other inputs, in order."""
    size = math.prod(spatial)
    y = run_alone(node, opset_import, np.eye(size).reshape(1, size, *spatial), constants)
    return y.reshape(size, -1).T


def selection(node, opset_import, shape: tuple[int, ...], constants: list) -> np.ndarray | None:
    """For an op that only moves its first input's elements (or writes zeros): each output
    element's flat input position, -1 for a zero; None when the op is not such a selection. The op
    runs on the positions (1-based) and on a shuffle of them, which must agree."""
    size = math.prod(shape)
    first = np.arange(1, size + 1, dtype=np.float64)
    shuffled = np.random.default_rng(0).permutation(size).astype(np.float64) + size + 1
    a = run_alone(node, opset_import, first.reshape(shape), constants).reshape(-1)
    b = run_alone(node, opset_import, shuffled.reshape(shape), constants).reshape(-1)
    picked = np.rint(a).astype(np.int64)
    if np.any(a != picked) or np.any((picked < 0) | (picked > size)):
        return None
    lookup = np.concatenate([[0.0], shuffled])
    if np.any(b != lookup[picked]):
        return None
    return picked - 1

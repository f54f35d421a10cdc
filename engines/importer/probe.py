"""The matrix of an op that is linear in its first input once its other inputs are constants.

GridSample with a constant grid maps each channel's image to the output by fixed weights (every
mode and padding mode: the weights and the indices they fall on depend on the grid only). Its
matrix is ONNX's reference evaluator run on the identity: one probe channel per input element,
each a one-hot image, so the weights are the evaluator's own.
"""
from __future__ import annotations

import math

import numpy as np

MAX_ELEMENTS = 1 << 24          # a probe or map beyond this (64 MiB in float32) is refused


def channel_map(node, opset_import, spatial: tuple[int, ...], constants: list) -> np.ndarray:
    """(out, in) weights of ``node`` over one channel of ``spatial`` elements: each output
    element's weight on each input element. ``constants``: the node's other inputs, in order."""
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    size = math.prod(spatial)
    probe = np.eye(size).reshape(1, size, *spatial)
    names = [f"c{i}" for i in range(len(constants))]
    call = onnx.NodeProto()
    call.CopyFrom(node)
    call.input[:] = ["x", *names]
    call.output[:] = ["y"]
    graph = helper.make_graph(
        [call], "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, list(probe.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(np.asarray(c), n) for c, n in zip(constants, names)])
    model = helper.make_model(graph, opset_imports=list(opset_import))
    (y,) = ReferenceEvaluator(model).run(None, {"x": probe})
    return np.asarray(y, dtype=np.float64).reshape(size, -1).T

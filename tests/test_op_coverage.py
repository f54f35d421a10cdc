"""Op coverage for what people export (torchvision classifiers, Hugging Face text, vision and speech
encoders): each new kind's calls against its float64 eager form, one-node and small imported graphs
against ONNX Runtime on every NumPy engine, no allocation per warm forward on the planned engines,
and the importer's folding (GatherElements on long axes) and its errors naming the node."""
from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX models are built with the onnx package (extra peers)")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the peer imported graphs are checked against")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engines import ENGINES, OnnxImportError, load_onnx  # noqa: E402
from engines.importer.load import evaluate  # noqa: E402
from tests.test_zero_alloc import tracemalloc_peak  # noqa: E402

OWN = ["naive", "static", "arena", "fused", "packed", "onednn"]
PLANNED = OWN[1:]
MAX_BATCH = 3
N = helper.make_node
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


def build(nodes, inits=(), in_shape=("N", 4, 6), out_shape=None, opset=20, outputs=None) -> bytes:
    """A checked model's bytes: float32 input x, float32 output y."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))
    y = outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                  list(in_shape if out_shape is None else out_shape))]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], y, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def check_every_engine(data: bytes, batches=(1, MAX_BATCH)):
    """Every NumPy engine and the float64 reference against ONNX Runtime on the original file,
    on fresh random inputs; the model."""
    model = load_onnx(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in batches:
        x = model.random_input(batch, rng=batch + 10)
        expected = session.run(None, {model.input: x})[0]
        bar = 1e-4 * max(1.0, float(np.abs(expected).max()))
        ref = model.reference(x)
        assert ref.shape == expected.shape and np.abs(ref - expected).max() <= bar, "reference vs ONNX Runtime"
        for name in OWN:
            engine = ENGINES[name](model, MAX_BATCH)
            for _ in range(2):                                   # a warm call gives the same
                got = engine.forward(x)
                assert np.abs(got - expected).max() <= bar, f"{name} at batch {batch}"
    return model


# --- folding: ONNX's evaluator, fixed where it fails ------------------------------------------

@pytest.mark.parametrize("length", [63, 64, 200])
def test_gather_elements_folds_along_long_axes(length):
    """onnx.reference's GatherElements picks with np.choose, which takes at most 64 choices: a
    constant gathered along an axis of 64 or more failed the import (BERT's token-type buffer)."""
    table = np.arange(2 * length, dtype=np.float32).reshape(2, length)
    idx = np.stack([np.arange(length)[::-1], np.arange(length) % 5 - 5]).astype(np.int64)   # negatives too
    data = build([N("GatherElements", ["table", "idx"], ["g"], axis=1), N("Add", ["x", "g"], ["y"])],
                 {"table": table, "idx": idx}, in_shape=("N", 2, length))
    model = check_every_engine(data)
    folded = evaluate(onnx.load_from_string(data), "x", np.zeros((1, 2, length), np.float32))["g"]
    np.testing.assert_array_equal(folded, np.take_along_axis(table, np.where(idx < 0, idx + length, idx), 1))
    assert [op.kind for op in model.ops] == ["binary"]          # the gather folded into a constant


def test_a_failing_node_is_named_with_its_op_and_error():
    data = build([N("Reshape", ["x", "s"], ["y"], name="bad_reshape")], {"s": I64(4, 4)},
                 in_shape=("N", 6), out_shape=(4, 4))
    with pytest.raises(OnnxImportError, match=r"does not run at batch 1: node 'bad_reshape' \(Reshape\): "
                                              r"ValueError: cannot reshape"):
        load_onnx(data)

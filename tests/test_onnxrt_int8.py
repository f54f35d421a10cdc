"""The onnxruntime-int8 peer: the model quantized by onnxruntime.quantization, held to its own bar."""
import functools
import os
import sys
import tempfile

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnxruntime-int8 peer needs the peers extra")
pytest.importorskip("onnxruntime", reason="the onnxruntime-int8 peer needs the peers extra")

from engines import ENGINES, MODELS, EngineUnavailable  # noqa: E402
from engines.ir.models import ABS_TOL  # noqa: E402
from engines.peers import onnxrt_int8  # noqa: E402

PEER = ENGINES["onnxruntime-int8"]
# the zoo at sizes the tolerance table (docs/int8.md) measured, on seeds it did not use
ZOO = {"mlp-d1024": ("mlp", dict(dim=1024)), "mlp-deep-d256": ("mlp-deep", dict(dim=256)),
       "transformer-d256-s64": ("transformer", dict(dim=256, seq=64, heads=8)),
       "mlp-d64": ("mlp", dict(dim=64)), "transformer-d32-s8": ("transformer", dict(dim=32, seq=8, heads=4))}
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
DYNAMIC_OPS = {"DynamicQuantizeLinear", "MatMulInteger"}


@functools.lru_cache(maxsize=2)
def squeezenet():
    from engines.importer.load import load_onnx
    return load_onnx(os.path.join(LIGHT, "light_squeezenet.onnx"), randomize_weights=17)


def errors(engine, model, x):
    y, ref = np.asarray(engine.forward(x), np.float64), model.reference(x)
    assert y.shape == ref.shape and engine.forward(x).dtype == np.float32
    return float(np.max(np.abs(y - ref))), float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("point", list(ZOO))
def test_zoo_within_its_bar_at_batch_1_and_8(point):
    name, kw = ZOO[point]
    model = MODELS[name](**kw, seed=7)
    engine = PEER(model, 8)
    assert engine.scheme == "dynamic" and engine.quantized and engine.peer
    for batch in (1, 8):
        abs_err, rel_err = errors(engine, model, model.random_input(batch, rng=4000 + batch))
        assert abs_err < PEER.abs_tol and rel_err < PEER.rel_tol, (batch, abs_err, rel_err)
        assert abs_err > 10 * ABS_TOL        # quantization's error, not a float path left in


def test_every_linear_runs_on_integer_products():
    """quantize_dynamic quantizes MatMul, not Gemm: the mlp's Gemms are rewritten first, so none is left."""
    model = MODELS["mlp-deep"](dim=48, seed=1)
    engine = PEER(model, 2)
    assert DYNAMIC_OPS <= engine.op_types and not {"Gemm", "MatMul"} & engine.op_types
    transformer = PEER(MODELS["transformer"](dim=32, seq=8, heads=4, seed=1), 2)
    assert DYNAMIC_OPS <= transformer.op_types and "MatMulInteger" in transformer.op_types
    # its weights held as int8: about a quarter of the float ones
    assert engine.weight_bytes < 0.3 * model.weight_bytes


def test_gemm_rewrite_keeps_the_float_result():
    from engines.peers.onnxrt import export
    import onnxruntime as ort
    model = MODELS["mlp"](dim=32, seed=3)
    proto = export(model, onnx)
    x = model.random_input(3, rng=0)
    before = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    onnxrt_int8.gemm_as_matmul(proto, onnx)
    assert {n.op_type for n in proto.graph.node} == {"MatMul", "Add", "Relu"}
    assert len(proto.graph.initializer) == len(model.params)       # the Gemm's weights dropped
    after = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_cnn_static_qdq_calibrated_seeded_and_correct():
    """A CNN: quantize_static in QDQ form, per-channel weights; two builds give identical outputs."""
    model = squeezenet()
    first, second = PEER(model, 1), PEER(model, 1)
    assert first.scheme == "static QDQ"
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= first.op_types
    for seed in range(2):
        x = model.random_input(1, rng=300 + seed)
        np.testing.assert_array_equal(first.forward(x), second.forward(x))
        y, ref = first.forward(x), model.reference(x)
        assert np.argmax(y) == np.argmax(ref)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < PEER.rel_tol


def test_a_cnn_whose_shapes_defeat_symbolic_inference_is_still_quantized(tmp_path, monkeypatch):
    """ONNX Runtime's symbolic shape inference gives up on an ``Expand`` whose shape is an
    ``Identity`` of an initializer (torchvision's Swin V2 TorchScript export has 8); the peer quantizes the
    file without it, runs it within its bar, and leaves nothing in the working directory (the
    failed inference saves the model into it)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from engines.importer.load import load_onnx
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Identity", ["shape0"], ["shape"]), helper.make_node("Expand", ["c", "shape"], ["e"]),
             helper.make_node("Add", ["x", "e"], ["h"]), helper.make_node("Conv", ["h", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.array([6], np.int64), "shape0"),
             numpy_helper.from_array(rng.standard_normal(1).astype(np.float32), "c"),
             numpy_helper.from_array(rng.standard_normal((3, 2, 1, 1)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 6, 6])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    probe, work = tmp_path / "probe", tmp_path / "work"
    probe.mkdir(), work.mkdir()
    monkeypatch.chdir(probe)
    with pytest.raises(Exception, match="symbolic shape inference"):
        SymbolicShapeInference.infer_shapes(proto)
    assert "sym_shape_infer_temp.onnx" in os.listdir(probe)
    model = load_onnx(proto.SerializeToString())
    monkeypatch.chdir(work)
    engine = PEER(model, 2)
    assert os.listdir(work) == []
    assert engine.scheme == "static QDQ" and "QuantizeLinear" in engine.op_types
    x = model.random_input(2, rng=3)
    y, ref = engine.forward(x), model.reference(x)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < PEER.rel_tol


@pytest.mark.parametrize("static, scheme", [(None, "dynamic"), (True, "static QDQ")])
def test_a_graph_without_a_conv_is_quantized_dynamically_unless_asked_for_qdq(static, scheme):
    """``quantized`` (the peer's, and ``scripts/quantize_files.py --static``'s): a transformer gets
    quantize_dynamic by default, and QDQ pairs with per-channel weights when asked."""
    from engines.peers.onnxrt import export
    model = MODELS["transformer"](dim=32, seq=8, heads=4, seed=2)
    proto, got = onnxrt_int8.quantized(model, export(model, onnx), onnx, static)
    ops = {n.op_type for n in proto.graph.node}
    assert got == scheme
    assert (DYNAMIC_OPS <= ops) == (scheme == "dynamic")
    assert ({"QuantizeLinear", "DequantizeLinear"} <= ops) == (scheme == "static QDQ")


def test_a_quantized_file_runs_as_it_is(tmp_path):
    """An imported file that is quantized already (here by quantize_dynamic) is not quantized again."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from engines.importer.load import load_onnx
    from engines.peers.onnxrt import export
    import onnxruntime as ort
    proto = export(MODELS["mlp"](dim=64, seed=5), onnx)
    onnxrt_int8.gemm_as_matmul(proto, onnx)
    onnx.save(proto, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "int8.onnx", weight_type=QuantType.QInt8)
    data = (tmp_path / "int8.onnx").read_bytes()
    try:
        model = load_onnx(data)
    except Exception as exc:                  # the importer's support for quantized files
        pytest.skip(f"this quantized file does not import: {exc}")
    engine = PEER(model, 4)
    assert engine.scheme == "as given"
    x = model.random_input(4, rng=1)
    direct = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {model.input: x})[0]
    np.testing.assert_allclose(engine.forward(x), direct, rtol=1e-6, atol=1e-6)


def test_nothing_left_behind_in_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    PEER(MODELS["mlp"](dim=32, seed=0), 1)
    PEER(squeezenet(), 1)
    assert os.listdir(tmp_path) == []


def test_same_threads_as_the_onnxruntime_peer():
    model = MODELS["mlp"](dim=32, seed=0)
    assert PEER(model, 1).threads == ENGINES["onnxruntime"](model, 1).threads


@pytest.mark.parametrize("module", ["onnxruntime", "onnxruntime.quantization"])
def test_unavailable_without_the_package_names_the_extra(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)       # import raises ImportError
    with pytest.raises(EngineUnavailable, match=r"onnxruntime-int8.*pip install -e \.\[peers\]"):
        PEER(MODELS["mlp"](dim=32, seed=0), 1)

"""Quantized ONNX files (``onnxruntime.quantization``: ``quantize_dynamic``, and ``quantize_static``
in QDQ form with per-channel weights) import as float graphs with quantize steps, run on every
engine, and match ONNX Runtime on the same file (engines/importer/quantized.py, docs/int8.md)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="importing ONNX files needs the peers extra")
ort = pytest.importorskip("onnxruntime", reason="quantizing and running the files needs onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,  # noqa: E402
                                      quantize_static)

from engines import ENGINES, EngineUnavailable, OnnxImportError, load_onnx  # noqa: E402
from engines.ir.models import MODELS, QUANTIZED_ABS_TOL  # noqa: E402
from engines.native.onednn import BINARY_MAX, BINARY_MUL, BinaryPostOp  # noqa: E402
from engines.native.onednn_int8 import quantize_columns  # noqa: E402
from engines.peers.onnxrt import export  # noqa: E402
from engines.peers.onnxrt_int8 import reduce_range  # noqa: E402
from engines.planned.int8 import saturating  # noqa: E402
from engines.planned.onednn import SOURCE  # noqa: E402
from tests.conformance import float_engines  # noqa: E402
from tests.test_zero_alloc import tracemalloc_peak  # noqa: E402

INTEGER_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
               "QLinearConv", "QLinearMatMul", "QGemm"}
CALIBRATION = 16       # seeded samples for quantize_static


def _cnn():
    """A small CNN: conv-relu, max pool, a residual block (conv, the sum, relu), two conv-relus,
    global average pool, flatten, gemm (its weight (out, in), as PyTorch exports a Linear). A 3 x 13 x 13 input: a sample of 507 values, which no
    8-bit copy of it padded to whole floats may hide."""
    rng = np.random.default_rng(3)
    w = lambda *s: numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32))  # noqa: E731
    inits = [w(16, 3, 3, 3), w(16), w(16, 16, 3, 3), w(16), w(32, 16, 3, 3), w(32), w(32, 32, 1, 1), w(32), w(10, 32),
             w(10)]
    for t, name in zip(inits, ("w1", "b1", "wr", "br", "w2", "b2", "w3", "b3", "fc", "fb")):
        t.name = name
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"]),
             node("MaxPool", ["r1"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["m", "wr", "br"], ["cr"], pads=[1, 1, 1, 1]), node("Add", ["cr", "m"], ["s"]),
             node("Relu", ["s"], ["rs"]),
             node("Conv", ["rs", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]), node("Relu", ["c2"], ["r2"]),
             node("Conv", ["r2", "w3", "b3"], ["c3"]), node("Relu", ["c3"], ["r3"]),
             node("GlobalAveragePool", ["r3"], ["p"]), node("Flatten", ["p"], ["f"]), node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 13, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _float_files():
    return {"mlp": export(MODELS["mlp"](dim=64), onnx), "transformer": export(MODELS["transformer"](dim=32, seq=8), onnx),
            "cnn": _cnn()}


class _Calibration(CalibrationDataReader):
    def __init__(self, proto):
        name = proto.graph.input[0].name
        shape = [d.dim_value or 1 for d in proto.graph.input[0].type.tensor_type.shape.dim]
        rng = np.random.default_rng(0)
        self.samples = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(CALIBRATION)])

    def get_next(self):
        return next(self.samples, None)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    """name-dynamic / name-qdq -> the quantized file's bytes."""
    d = tmp_path_factory.mktemp("quantized")
    out = {}
    for name, proto in _float_files().items():
        src = d / f"{name}.onnx"
        onnx.save(proto, src)
        # 7-bit weights where the CPU has no int8 dot products, as the peer quantizes: there ONNX
        # Runtime's own u8 x s8 kernels saturate at full range (0.49 from the float engines)
        narrow = reduce_range()
        quantize_dynamic(src, d / f"{name}-dynamic.onnx", weight_type=QuantType.QInt8, reduce_range=narrow)
        quantize_static(src, d / f"{name}-qdq.onnx", _Calibration(proto), quant_format=QuantFormat.QDQ,
                        per_channel=True, reduce_range=narrow)
        quantize_static(src, d / f"{name}-qop.onnx", _Calibration(proto), quant_format=QuantFormat.QOperator,
                        per_channel=True, reduce_range=narrow)
        for kind in ("dynamic", "qdq", "qop"):
            out[f"{name}-{kind}"] = (d / f"{name}-{kind}.onnx").read_bytes()
    return out


FILES = [f"{m}-{k}" for m in ("mlp", "transformer", "cnn") for k in ("dynamic", "qdq", "qop")]


def _file_semantics(data: bytes):
    """ONNX Runtime with its graph optimizations off: the file's own arithmetic, op by op, on the
    dequantized values (its optimized int8 kernels requantize in between; docs/int8.md)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", FILES)
def test_integer_steps_become_float_ops_with_quantize_steps(name, files):
    proto = onnx.load_from_string(files[name])
    assert INTEGER_OPS & {n.op_type for n in proto.graph.node}, "the file is quantized"
    model = load_onnx(files[name])
    kinds = [op.kind for op in model.ops]
    assert "fake_quant" in kinds and model.quantized
    steps = [op.attrs["scale"] for op in model.ops if op.kind == "fake_quant" and "scale" in op.attrs]
    assert model.tolerance[0] == max(QUANTIZED_ABS_TOL, 2 * max(steps, default=0))
    dynamic = [op for op in model.ops if op.kind == "fake_quant" and "scale" not in op.attrs]
    assert bool(dynamic) == name.endswith("dynamic")
    assert not load_onnx(export(MODELS["mlp"](dim=64), onnx).SerializeToString()).quantized, "a float file"


@pytest.mark.parametrize("name", FILES)
def test_every_engine_matches_the_file(name, files):
    """Every float engine and int8, at batch 1 and 8: within its bar of the float64 reference; the
    float engines within one output step of the file's arithmetic (static files), or within the
    quantized bar where the step is the input's own (dynamic files, one sample at a time: the file
    quantizes per tensor, over the batch; the engines per sample)."""
    model = load_onnx(files[name])
    session = _file_semantics(files[name])
    last = model.ops[-1]
    step = last.attrs["scale"] if last.kind == "fake_quant" and "scale" in last.attrs else None
    engines = [e for e in float_engines() + ["int8"] if e in ENGINES]
    for batch in (1, 8):
        x = model.random_input(batch, rng=batch)
        ref = model.reference(x)
        theirs = np.concatenate([session.run(None, {model.input: x[i:i + 1]})[0] for i in range(batch)])
        for engine_name in engines:
            try:
                engine = ENGINES[engine_name](model, batch)
            except EngineUnavailable:
                continue
            got = engine.forward(x)
            abs_tol, rel_tol = engine.tolerance
            err = np.abs(got - ref)
            assert err.max() < abs_tol and np.linalg.norm(got - ref) < rel_tol * np.linalg.norm(ref), \
                f"{engine_name} at batch {batch}: max abs {err.max():.3g}"
            if engine_name != "int8":
                bar = 1.001 * step if step is not None else QUANTIZED_ABS_TOL
                assert np.abs(got - theirs).max() <= bar, f"{engine_name} vs the file at batch {batch}"


def test_static_files_match_onnx_runtime_exactly_on_most_outputs(files):
    """Where nothing lands on a half step, the float engines compute what the file does: on the
    MLP's QDQ file at batch 8, at least 99 % of outputs are equal to ONNX Runtime's."""
    model = load_onnx(files["mlp-qdq"])
    x = model.random_input(8, rng=8)
    got = ENGINES["arena"](model, 8).forward(x)
    theirs = _file_semantics(files["mlp-qdq"]).run(None, {model.input: x})[0]
    assert np.mean(got == theirs) >= 0.99


def test_fake_quant_is_onnx_quantize_then_dequantize():
    """The IR's fake_quant against ONNX's own evaluator of the file's nodes, static and dynamic."""
    from onnx.reference import ReferenceEvaluator
    from engines.ir.ops import OPS
    x = np.random.default_rng(0).standard_normal((1, 5, 7)).astype(np.float32) * 3
    for zp_type, zp in ((TensorProto.UINT8, 128), (TensorProto.INT8, -3)):
        inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.037]), helper.make_tensor("z", zp_type, [], [zp])]
        g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                               helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "qdq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        want = ReferenceEvaluator(helper.make_model(g)).run(None, {"x": x})[0]
        lo, hi = (0, 255) if zp_type == TensorProto.UINT8 else (-128, 127)
        got = OPS["fake_quant"].eager(x, scale=float(np.float32(0.037)), zero_point=zp, lo=lo, hi=hi)
        np.testing.assert_array_equal(got, want)
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "dyn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    want = ReferenceEvaluator(helper.make_model(g)).run(None, {"x": x})[0]
    np.testing.assert_allclose(OPS["fake_quant"].eager(x), want, rtol=0, atol=1e-6)


def test_int8_keeps_the_files_integers():
    """Weights dequantized with one scale for the whole tensor come back as the file's integers and
    scale, not rounded a second time; float weights get one scale per column as before."""
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(64, 32)).astype(np.int8)
    q[0, 0] = -127
    step = np.float32(0.0123)
    got, scales = quantize_columns(q.astype(np.float32) * step, 127)
    np.testing.assert_array_equal(got, q)
    np.testing.assert_allclose(scales, step, rtol=1e-6)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    got, scales = quantize_columns(w, 127)
    np.testing.assert_allclose(scales, np.abs(w).max(axis=0) / 127, rtol=1e-6)


def test_a_quantized_tensor_read_by_another_op_is_refused_by_name():
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]), helper.make_tensor("z", TensorProto.UINT8, [], [128])]
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
                           helper.make_node("Cast", ["q"], ["y"], name="cast", to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    with pytest.raises(OnnxImportError, match="'quant': QuantizeLinear"):
        load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString())


@pytest.mark.parametrize("name", ["mlp-dynamic", "transformer-qdq", "cnn-qdq"])
def test_planned_engines_allocate_nothing_on_quantized_files(name, files):
    model = load_onnx(files[name])
    for engine_name in ("arena", "fused", "onednn", "int8"):
        try:
            engine = ENGINES[engine_name](model, 4)
        except EngineUnavailable:
            continue
        assert tracemalloc_peak(engine, model.random_input(4, rng=0)) <= 4096, engine_name


@pytest.mark.parametrize("name", ["mlp-qdq", "cnn-qdq", "mlp-qop", "cnn-qop"])
def test_int8_runs_a_qdq_file_on_its_own_scales_and_zero_points(name, files):
    """Each int8 linear and conv of a QDQ file quantizes its input with the file's scale and zero
    point, on the file's weight integers: its products are the file's integer products, so at
    least 99 % of its outputs equal the file's arithmetic exactly. The zero point is oneDNN's
    source zero point, or, for a product and an unpadded conv, taken into the bias."""
    int8 = ENGINES["int8"]
    model = load_onnx(files[name])
    try:
        engine = int8(model, 8)
    except EngineUnavailable as exc:
        pytest.skip(f"int8 needs oneDNN: {exc}")
    grids = [s.attrs["grid"] for s in engine.steps if s.kind in ("int8_linear", "int8_conv")]
    assert grids and all(g is not None for g in grids)
    linears = [s for s in engine.steps if s.kind == "int8_linear"]
    assert [s.attrs["zero_point_folded"] for s in linears] == [s.attrs["grid"][1] != 0 for s in linears]
    if name.startswith("cnn"):      # a conv, or the residual sum, read only by the next conv writes its integers
        convs = [s for s in engine.steps if s.kind == "int8_conv"]
        assert [bool(s.attrs.get("dst_grid")) for s in convs] == [False, False, True, False]
        assert [s.attrs["integer_input"] for s in convs] == [False, False, True, True]
        # the 1x1 one, where its grid has a zero point (s8 grids are u8 ones where pairs saturate)
        assert [s.attrs["zero_point_folded"] for s in convs] == [i == 3 and s.attrs["grid"][1] != 0
                                                                  for i, s in enumerate(convs)]
        assert [bool(s.attrs.get("dst_grid")) for s in engine.steps if s.kind == "dnnl_binary"] == [True, False]
    step = model.ops[-1].attrs["scale"]
    # Where pairs saturate, ONNX Runtime's QLinearConv (the QOperator file) rounds its requantized
    # outputs its own way there: 5 of 80 outputs one step apart at batch 8, AMD EPYC 7003 (AVX2)
    exact = 0.9 if name == "cnn-qop" and saturating() else 0.99
    for batch in (1, 8):
        x = model.random_input(batch, rng=batch)
        theirs = _file_semantics(files[name]).run(None, {model.input: x})[0]
        got = engine.forward(x)
        assert np.mean(got == theirs) >= exact and np.abs(got - theirs).max() <= 1.001 * step, f"batch {batch}"


@pytest.mark.parametrize("batch", [1, 8])
def test_a_qdq_files_linears_give_the_same_result_on_the_inner_product(files, batch):
    """On a file's grid one scale quantizes every row, so int8 offers oneDNN's inner product beside
    its matmul at any batch (``InnerProductForm``): the same integer sums, scales and bias."""
    from engines.planned.int8 import Int8Engine, Variant
    if saturating():
        pytest.skip("no int8 dot products on this CPU: its linears are 1x1 convolutions")
    model = load_onnx(files["mlp-qdq"])
    name = "brgemm:avx512_core_vnni"
    forced = type("Forced", (Int8Engine,), {"forced_variant": Variant(name, False)})(model, batch)
    x = model.random_input(batch, rng=batch)
    np.testing.assert_allclose(forced.forward(x), ENGINES["int8"](model, batch).forward(x), rtol=1e-5, atol=1e-6)
    assert {p["implementation"] for p in forced.report()["primitives"] if p["kind"] == "int8_linear"} == {name}


def _initializers(seed: int, shapes: dict) -> list:
    """Named weights (name -> shape), each N(0, 1 / fan-in), drawn in order from one seed."""
    rng = np.random.default_rng(seed)
    return [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), name)
            for name, s in shapes.items()]


def _classifier(name: str, nodes: list, inits: list, last: str):
    """A graph of ``nodes`` on an (N, 3, 13, 13) input, then the global pool of ``last``, a flatten
    and a Gemm to 10 classes (``fc``, ``fb`` in ``inits``)."""
    node = helper.make_node
    nodes = nodes + [node("GlobalAveragePool", [last], ["g"]), node("Flatten", ["g"], ["f"]),
                     node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 13, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _on_int8(tmp_path, proto, **quantize_options):
    """``proto`` quantized by quantize_static (QDQ, per-channel, seeded calibration): the file's
    bytes, its model, and the int8 engine built from it at batch 8."""
    onnx.save(proto, tmp_path / "f.onnx")
    quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", _Calibration(proto), quant_format=QuantFormat.QDQ,
                    per_channel=True, **{"reduce_range": reduce_range(), **quantize_options})
    data = (tmp_path / "q.onnx").read_bytes()
    model = load_onnx(data)
    try:
        return data, model, ENGINES["int8"](model, 8)
    except EngineUnavailable as exc:
        pytest.skip(f"int8 needs oneDNN: {exc}")


def _matches_the_files_arithmetic_on_jit_code(data, model, engine):
    """At least 99 % of the outputs equal the file's arithmetic at batch 1 and 8, and no primitive
    runs oneDNN's reference code."""
    for batch in (1, 8):
        x = model.random_input(batch, rng=batch)
        theirs = _file_semantics(data).run(None, {model.input: x})[0]
        assert np.mean(engine.forward(x) == theirs) >= 0.99, f"batch {batch}"
    impls = {p["implementation"] for p in engine.report()["primitives"]}
    assert not [i for i in impls if i.startswith("ref")], impls


def _inverted_residual():
    """MobileNetV2's block as a QDQ file: a conv's output read by the block's first conv and by
    the residual sum at its end (1x1 expansion, ReLU, 1x1 projection, Add), then a conv, the
    global pool and a Gemm."""
    inits = _initializers(5, {"w1": (16, 3, 3, 3), "b1": (16,), "we": (48, 16, 1, 1), "be": (48,), "wp": (16, 48, 1, 1),
                              "bp": (16,), "w2": (32, 16, 3, 3), "b2": (32,), "fc": (10, 32), "fb": (10,)})
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["block"], pads=[1, 1, 1, 1]),
             node("Conv", ["block", "we", "be"], ["e"]), node("Relu", ["e"], ["re"]),
             node("Conv", ["re", "wp", "bp"], ["p"]), node("Add", ["p", "block"], ["s"]),
             node("Conv", ["s", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]), node("Relu", ["c2"], ["r2"])]
    return _classifier("block", nodes, inits, "r2")


def test_int8_reads_a_blocks_input_as_integers_in_its_residual_sum(tmp_path):
    """The block's input, read by its first conv and by its residual sum: the conv before writes
    its integers, the first conv reads them unquantized, and the sum (oneDNN's binary add) reads
    them as its second source with the grid's scale, less scale x zero point; at least 99 % of the
    outputs equal the file's arithmetic, on oneDNN's jit code."""
    data, model, engine = _on_int8(tmp_path, _inverted_residual())
    convs = [s for s in engine.steps if s.kind == "int8_conv"]
    (add,) = [s for s in engine.steps if s.kind == "dnnl_binary" and s.attrs.get("src_grids")]
    assert [bool(s.attrs.get("dst_grid")) for s in convs][0] and convs[1].attrs["integer_input"]
    assert add.attrs["src_grids"][0] is None and add.attrs["src_grids"][1] == convs[1].attrs["grid"]
    _matches_the_files_arithmetic_on_jit_code(data, model, engine)


def _silu_block():
    """EfficientNet's SiLU as a QDQ file quantizes it: a conv, its Sigmoid and their product (the
    sigmoid quantized on a grid of zero point 0 before the product), then a conv, the global pool
    and a Gemm."""
    inits = _initializers(6, {"w1": (16, 3, 3, 3), "b1": (16,), "w2": (32, 16, 1, 1), "b2": (32,), "fc": (10, 32),
                              "fb": (10,)})
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]), node("Sigmoid", ["c"], ["sg"]),
             node("Mul", ["c", "sg"], ["silu"]), node("Conv", ["silu", "w2", "b2"], ["c2"])]
    return _classifier("silu", nodes, inits, "c2")


@pytest.mark.parametrize("name", ["int8", "onednn"])
def test_a_quantized_silu_is_one_call(tmp_path, name):
    """SiLU's sigmoid, its quantize step, the product by the sigmoid's input and the product's
    quantize step: one oneDNN binary call, max(x, x) taking them as post-ops, the product one on
    x itself (two calls before: the sigmoid's, then the product reading its integers); at least
    99 % of the outputs equal the file's arithmetic, on oneDNN's jit code."""
    data, model, engine = _on_int8(tmp_path, _silu_block(), activation_type=QuantType.QUInt8)   # as the peer
    if name != "int8":
        engine = ENGINES[name](model, 8)
    binaries = [s for s in engine.steps if s.kind == "dnnl_binary"]
    (silu,) = [s for s in binaries if BinaryPostOp(BINARY_MUL, SOURCE) in s.attrs["eltwises"]]
    assert silu.attrs["alg"] == BINARY_MAX and silu.reads[0] == silu.reads[1]
    assert not [s for s in binaries if s.attrs["alg"] == BINARY_MUL]
    _matches_the_files_arithmetic_on_jit_code(data, model, engine)


def _fire(pool_branch: bool):
    """SqueezeNet's fire module as a QDQ file: a squeeze conv, two expand convs (1x1, 3x3) with
    their ReLUs joined by a channel concat, read by the next conv alone or (``pool_branch``) by a
    conv and a 3x3 max pool before another (GoogLeNet's inception), joined again; then the global
    pool and a Gemm."""
    inits = _initializers(7, {"w0": (16, 3, 3, 3), "b0": (16,), "ws": (8, 16, 1, 1), "bs": (8,), "w1": (16, 8, 1, 1),
                              "b1": (16,), "w3": (16, 8, 3, 3), "b3": (16,), "wn": (24, 32, 1, 1), "bn": (24,),
                              "fc": (10, 24), "fb": (10,), "wq": (8, 32, 1, 1), "bq": (8,), "wm": (24, 32, 1, 1),
                              "bm": (24,)})
    node = helper.make_node
    nodes = [node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), node("Relu", ["c0"], ["r0"]),
             node("Conv", ["r0", "ws", "bs"], ["s"]), node("Relu", ["s"], ["rs"]),
             node("Conv", ["rs", "w1", "b1"], ["e1"]), node("Relu", ["e1"], ["r1"]),
             node("Conv", ["rs", "w3", "b3"], ["e3"], pads=[1, 1, 1, 1]), node("Relu", ["e3"], ["r3"]),
             node("Concat", ["r1", "r3"], ["cat"], axis=1),
             node("Conv", ["cat", "wn", "bn"], ["cn"]), node("Relu", ["cn"], ["rn"])]
    if not pool_branch:
        return _classifier("fire", nodes, inits[:12], "rn")
    nodes += [node("MaxPool", ["cat"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
              node("Conv", ["p", "wq", "bq"], ["cq"]), node("Relu", ["cq"], ["rq"]),
              node("Concat", ["rn", "rq"], ["cat2"], axis=1),
              node("Conv", ["cat2", "wm", "bm"], ["cm"]), node("Relu", ["cm"], ["rm"])]
    return _classifier("fire", nodes, inits, "rm")


@pytest.mark.parametrize("pool_branch", [False, True], ids=["conv", "conv-and-pool"])
def test_int8_joins_a_concats_parts_as_integers_on_its_grid(tmp_path, pool_branch):
    """The expand convs write their parts' integers on the concat's grid (each after its own
    quantize step: the grids differ), the concat joins 8-bit parts, and the next conv (and a max
    pool before another, which pools the integers) reads them unquantized; at least 99 % of the
    outputs equal the file's arithmetic, on oneDNN's jit code."""
    data, model, engine = _on_int8(tmp_path, _fire(pool_branch), activation_type=QuantType.QUInt8)
    concat, *more = [s for s in engine.steps if s.kind == "dnnl_concat"]
    parts = [s for s in engine.steps if s.out in concat.reads]
    readers = [s for s in engine.steps if concat.out in s.reads]
    assert concat.attrs["dst_grid"] and [s.attrs["dst_grid"] for s in parts] == [concat.attrs["dst_grid"]] * 2
    assert {s.attrs["conv"]["fake_quant"]["scale"] for s in parts} != {concat.attrs["dst_grid"][0]}, "grids differ"
    by_kind = {s.kind: s for s in readers}
    assert sorted(by_kind) == ["dnnl_pool", "int8_conv"][1 - pool_branch:] and len(readers) == 1 + pool_branch
    assert by_kind["int8_conv"].attrs["integer_input"]
    if pool_branch:
        assert by_kind["dnnl_pool"].attrs["dst_grid"] == concat.attrs["dst_grid"] and more[0].attrs["dst_grid"]
    _matches_the_files_arithmetic_on_jit_code(data, model, engine)


def test_a_quantize_step_on_its_own_grid_is_dropped(files):
    """The file's QDQ pairs after the max pool and the flatten repeat their input's grid: dropped at
    import; every other step stays (the model still matches the file: ``test_every_engine_matches_the_file``)."""
    from engines.importer.passes import GRID_KEEPING
    model = load_onnx(files["cnn-qdq"])
    by_out = {op.output: op for op in model.ops}
    quantized = [op for op in model.ops if op.kind == "fake_quant"]
    assert not [op for op in quantized if by_out.get(op.inputs[0]) and by_out[op.inputs[0]].kind in GRID_KEEPING]
    proto = onnx.load_from_string(files["cnn-qdq"])
    assert len(quantized) == sum(n.op_type == "QuantizeLinear" and n.input[0] not in {i.name for i in proto.graph.initializer}
                                 for n in proto.graph.node) - 2      # after the pool, after the flatten


def test_the_bar_is_the_files_whatever_pass_folds_its_quantize_steps(files):
    """A file's bar comes from all its quantize steps, those a pass folds into the conv before
    them included (``fuse_conv_fake_quant``, which ``onednn`` and ``int8`` run): here the
    coarsest step, made 1.0, is a conv's, and every engine is held to the same bar."""
    from dataclasses import replace
    from engines.importer.passes import fuse_conv_fake_quant
    model = load_onnx(files["cnn-qdq"])
    by_out = {op.output: op for op in model.ops}
    after_conv = next(op for op in model.ops if op.kind == "fake_quant" and by_out.get(op.inputs[0])
                      and by_out[op.inputs[0]].kind in ("conv", "conv_add"))
    model = replace(model, ops=tuple(replace(op, attrs={**op.attrs, "scale": 1.0}) if op is after_conv else op
                                     for op in model.ops))
    assert model.tolerance[0] == 2.0
    folded = fuse_conv_fake_quant(model)
    assert after_conv.output not in {op.output for op in folded.ops if op.kind == "fake_quant"}
    assert folded.quantized and folded.tolerance == model.tolerance
    for name in ("onednn", "int8", "fused"):
        try:
            assert ENGINES[name](model, 1).tolerance == model.tolerance, name
        except EngineUnavailable:
            continue


def _window_roll():
    """Swin's shifted windows in small: a conv's output rolled along its channels (two slices,
    then a concat of them in the other order) before the next conv."""
    inits = _initializers(6, {"w1": (16, 3, 3, 3), "b1": (16,), "w2": (16, 16, 3, 3), "b2": (16,), "fc": (10, 16),
                              "fb": (10,)})
    inits += [numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in {"s0": [0], "e0": [5], "s1": [5], "e1": [16], "axes": [1]}.items()]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"]),
             node("Slice", ["r1", "s0", "e0", "axes"], ["head"]), node("Slice", ["r1", "s1", "e1", "axes"], ["tail"]),
             node("Concat", ["tail", "head"], ["rolled"], axis=1),
             node("Conv", ["rolled", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), node("Relu", ["c2"], ["r2"])]
    return _classifier("roll", nodes, inits, "r2")


def test_a_quantize_step_after_slices_and_their_concat_is_dropped(tmp_path):
    """Slices of a quantized tensor, and a concat of parts all on its grid, lie on that grid: the
    QDQ pairs ONNX Runtime's quantizer writes after them (Swin's window shifts: 139 of its 390
    steps) are dropped at import, and the model still computes the file's arithmetic."""
    data, model, engine = _on_int8(tmp_path, _window_roll())
    quantized = {n.input[0] for n in onnx.load_from_string(data).graph.node if n.op_type == "QuantizeLinear"}
    assert {"head", "tail", "rolled"} <= quantized, "the file quantizes the slices and the concat"
    by_out = {op.output: op for op in model.ops}
    steps = [op for op in model.ops if op.kind == "fake_quant"]
    assert not [op for op in steps if by_out.get(op.inputs[0]) and by_out[op.inputs[0]].kind in ("slice", "concat")]
    assert any(by_out[op.inputs[0]].kind == "slice" for op in model.ops if op.kind == "concat")
    _matches_the_files_arithmetic_on_jit_code(data, model, engine)
    theirs = _file_semantics(data).run(None, {model.input: (x := model.random_input(4, rng=2))})[0]
    for name in ("fused", "onednn"):
        if name in ENGINES:
            assert np.mean(ENGINES[name](model, 4).forward(x) == theirs) >= 0.99, name


def test_onednn_runs_a_qdq_cnns_quantize_steps_in_its_primitives(files):
    """Each quantize step after a conv, the residual sum and the pools runs as eltwise post-ops of
    that oneDNN primitive, in its layout: nothing else runs from the first conv to the global pool
    (the input's step is one primitive on the plain input on ``onednn``; ``int8``'s first conv
    quantizes the input on its grid itself), on oneDNN's jit kernels, never its reference code."""
    model = load_onnx(files["cnn-qdq"])
    for name in ("onednn", "int8"):
        try:
            engine = ENGINES[name](model, 4)
        except EngineUnavailable as exc:
            pytest.skip(f"needs oneDNN: {exc}")
        kinds = [s.kind for s in engine.steps]
        first = next(i for i, k in enumerate(kinds) if k.endswith("_conv"))
        last = max(i for i, s in enumerate(engine.steps) if s.kind == "dnnl_pool")
        assert set(kinds[first:last + 1]) <= {"dnnl_conv", "int8_conv", "dnnl_pool", "dnnl_binary"}, (name, kinds)
        # the input's step: one primitive on the plain input (onednn); left out (int8)
        assert [k for k in kinds[:first] if k != "dnnl_reorder"] == (["dnnl_binary"] if name == "onednn" else []), kinds
        convs = [s.attrs["conv"] for s in engine.steps if s.kind in ("dnnl_conv", "int8_conv")]
        assert len(convs) == 4 and all("fake_quant" in c for c in convs), name
        chains = [len(s.attrs["eltwises"]) for s in engine.steps[first:last + 1] if s.kind in ("dnnl_binary", "dnnl_pool")]
        assert chains == [0, 4, 4], name     # the max pool's step dropped; the sum's and the mean's steps
        engine.forward(model.random_input(4, rng=0))
        impls = {p["implementation"] for p in engine.report()["primitives"]}
        assert not [i for i in impls if i.startswith("ref")], impls


def test_the_batch_probe_takes_a_rounding_tie_for_no_mixing_but_still_finds_mixing():
    """ONNX's evaluator sums a conv in another order at batch 2 than at batch 1, and a quantize step
    half a level off can then round the other way: the first sample's output moves by about a
    step (DenseNet-121's QDQ file was refused for it). Within QUANTIZED_STEPS of the coarsest step
    that is no mixing; an op across the batch axis between QDQ pairs still is, named."""
    from engines.importer import load
    from engines.importer.quantized import rewrite
    from engines.ir.models import QUANTIZED_STEPS
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]), helper.make_tensor("z", TensorProto.UINT8, [], [128])]
    qdq = lambda x, y: [helper.make_node("QuantizeLinear", [x, "s", "z"], [y + "q"]),  # noqa: E731
                        helper.make_node("DequantizeLinear", [y + "q", "s", "z"], [y])]
    g = helper.make_graph(qdq("x", "a") + [helper.make_node("Softmax", ["a"], ["m"], axis=0, name="over_batch")]
                          + qdq("m", "y"), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match=r"mixes samples.*first at node 'over_batch' \(Softmax\)"):
        load_onnx(proto.SerializeToString())
    rewritten, _ = rewrite(proto)
    assert load._step_slack(rewritten) == pytest.approx(QUANTIZED_STEPS * 0.05)
    out = rewritten.graph.output[0].name
    acts = {out: load.Act(out, (1, 4), 0)}
    one = {out: np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)}
    for moved, refused in ((0.05, False), (0.5, True)):        # a tie's step; a value of another sample
        two = {out: np.concatenate([one[out] + np.float32([[0, moved, 0, 0]]), one[out]])}
        assert bool(load._separable(rewritten, acts, one, two)) == refused, moved


def test_the_operator_form_is_read_as_its_dequantized_values(files):
    """A QOperator file (QLinearConv, QGemm, ONNX Runtime's QLinearAdd and QLinearGlobalAveragePool,
    8-bit tensors through a max pool and a flatten) imports as the QDQ file of the same model does:
    the same op kinds, each 8-bit tensor its dequantized value on its grid."""
    proto = onnx.load_from_string(files["cnn-qop"])
    assert {"QLinearConv", "QGemm", "QLinearAdd", "QLinearGlobalAveragePool"} <= {n.op_type for n in proto.graph.node}
    assert [op.kind for op in load_onnx(files["cnn-qop"]).ops] == [op.kind for op in load_onnx(files["cnn-qdq"]).ops]


def test_an_8_bit_tensor_read_as_integers_is_refused_by_name(files):
    """A float op that reads an 8-bit tensor's integers themselves (here a Cast) would read other
    values than the dequantized ones: the graph stays in its form and is refused, naming the node."""
    proto = onnx.load_from_string(files["cnn-qop"])
    conv = next(n for n in proto.graph.node if n.op_type == "QLinearConv")
    proto.graph.node.append(helper.make_node("Cast", [conv.output[0]], ["as_float"], to=TensorProto.FLOAT, name="cast"))
    with pytest.raises(OnnxImportError, match=r"node 'cast' \(Cast\) reads the 8-bit integers of .*QLinearConv"):
        load_onnx(proto.SerializeToString())


def _branching_cnn():
    """GoogLeNet's stage and EfficientNet's squeeze-excite, small: conv-relu and a max pool, whose
    output three branches read (a 1x1 conv, a 3x3 conv, a 3x3 max pool then a 1x1 conv), their
    concat, then the concat times the sigmoid of a conv of its global mean, and a last conv."""
    rng = np.random.default_rng(5)
    inits = []

    def w(name, *s):
        inits.append(numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), name))
        return name
    node = helper.make_node
    nodes = [node("Conv", ["x", w("w1", 16, 3, 3, 3), w("b1", 16)], ["c1"], pads=[1, 1, 1, 1]),
             node("Relu", ["c1"], ["r1"]), node("MaxPool", ["r1"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["m", w("wa", 16, 16, 1, 1), w("ba", 16)], ["a"]),
             node("Conv", ["m", w("wb", 16, 16, 3, 3), w("bb", 16)], ["b"], pads=[1, 1, 1, 1]),
             node("MaxPool", ["m"], ["mp"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             node("Conv", ["mp", w("wc", 16, 16, 1, 1), w("bc", 16)], ["c"]),
             node("Concat", ["a", "b", "c"], ["cat"], axis=1),
             node("GlobalAveragePool", ["cat"], ["g"]),
             node("Conv", ["g", w("wg", 48, 48, 1, 1), w("bg", 48)], ["gc"]), node("Sigmoid", ["gc"], ["s"]),
             node("Mul", ["cat", "s"], ["e"]),
             node("Conv", ["e", w("we", 16, 48, 1, 1), w("be", 16)], ["ce"]),
             node("GlobalAveragePool", ["ce"], ["p"]), node("Flatten", ["p"], ["f"]),
             node("Gemm", ["f", w("fc", 10, 16), w("fb", 10)], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "branching", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_int8_quantizes_a_tensor_once_for_all_its_convs_and_a_product_writes_integers(tmp_path):
    """On a QDQ file: the stage pool's output, which three convs and a max pool read on one grid,
    is quantized once into its own 8-bit buffer (the pool then pools those integers for its conv);
    the squeeze-excite product, whose quantize step only the last conv reads, writes that step's
    integers itself. The outputs stay the file's."""
    proto = _branching_cnn()
    src, out = tmp_path / "branching.onnx", tmp_path / "branching-qdq.onnx"
    onnx.save(proto, src)
    quantize_static(src, out, _Calibration(proto), quant_format=QuantFormat.QDQ, per_channel=True,
                    reduce_range=reduce_range())
    model = load_onnx(out.read_bytes())
    try:
        engine = ENGINES["int8"](model, 8)
    except EngineUnavailable as exc:
        pytest.skip(f"int8 needs oneDNN: {exc}")
    if engine.dnnl.block > 16:
        pytest.skip(f"16 channels are fewer than oneDNN's channel block here ({engine.dnnl.block})")
    steps = engine.steps
    (copy,) = [s for s in steps if s.kind == "int8_quantize"]
    readers = [s for s in steps if copy.out in s.reads]
    assert sorted(s.kind for s in readers) == ["dnnl_pool", "int8_conv", "int8_conv"]
    assert all(s.attrs.get("dst_grid") for s in readers if s.kind == "dnnl_pool")
    convs = [s for s in steps if s.kind == "int8_conv"]
    # quantizing their input themselves: the first (the model's input) and the squeeze (after the
    # global mean: oneDNN's pooling writes no 8-bit output from floats)
    assert [s.attrs["integer_input"] for s in convs] == [False, True, True, True, False, True]
    product = next(s for s in steps if s.kind == "dnnl_binary" and s.attrs["alg"] == BINARY_MUL)
    assert product.attrs.get("dst_grid") and not product.attrs.get("eltwises")
    for batch in (1, 8):
        x = model.random_input(batch, rng=batch)
        theirs = _file_semantics(out.read_bytes()).run(None, {model.input: x})[0]
        assert np.mean(engine.forward(x) == theirs) >= 0.99, f"batch {batch}"


def _attention():
    """Single-head attention as an exporter writes it when it is not the fused kind: the q, k and
    v projections (MatMul, then the bias Add), k transposed, the scores' product scaled, a
    softmax, its product with v, and an output projection; (N, 8, 32) in and out."""
    inits = _initializers(7, {f"w{n}": (32, 32) for n in "qkvo"} | {f"b{n}": (32,) for n in "qkvo"})
    inits.append(numpy_helper.from_array(np.array(32 ** -0.5, np.float32), "scale"))
    node = helper.make_node
    nodes = [n for p in "qkv" for n in (node("MatMul", ["x", f"w{p}"], [f"m{p}"]), node("Add", [f"m{p}", f"b{p}"], [p]))]
    nodes += [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s"]),
              node("Mul", ["s", "scale"], ["ss"]), node("Softmax", ["ss"], ["a"], axis=-1),
              node("MatMul", ["a", "v"], ["c"]), node("MatMul", ["c", "wo"], ["mo"]), node("Add", ["mo", "bo"], ["y"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_products_and_their_quantize_steps_and_bias_are_one_onednn_primitive_each(tmp_path):
    """A QDQ file's projection (its MatMul's quantize step, the bias Add, that one's step): one
    int8 matmul with the rest as its post-ops. A product of two activations (the scores, the
    context) and the steps after it: oneDNN's batched matmul with them as post-ops, not NumPy's
    one GEMM per matrix. Both still compute the file's arithmetic, on jit code, and allocate
    nothing per warm forward."""
    from engines.native.onednn import BinaryPostOp
    data, model, engine = _on_int8(tmp_path, _attention())
    linears = [s for s in engine.steps if s.kind == "int8_linear"]
    assert len(linears) == 4 and all(any(isinstance(p, BinaryPostOp) for p in s.attrs["epilogue"]) for s in linears)
    for eng in (engine, ENGINES["onednn"](model, 8)):
        products = [s for s in eng.steps if s.kind == "dnnl_matmul"]
        assert len(products) == 2 and all(s.attrs["eltwises"] for s in products), [s.kind for s in eng.steps]
        _matches_the_files_arithmetic_on_jit_code(data, model, eng)
        assert tracemalloc_peak(eng, model.random_input(8, rng=0)) < 4096


def test_a_projection_no_int8_kernel_takes_runs_in_float_then_its_post_ops(tmp_path, monkeypatch):
    """Where oneDNN offers no brgemm kernel for an int8 projection, its dequantized weights run in
    float32: on the input's grid (the file's quantize step, which the int8 product would have
    applied), with the bias before the zero point went into it, then the quantize steps and bias
    it took in as one chain step. The file's arithmetic still, named in report(), nothing
    allocated per warm forward."""
    import engines.planned.int8 as int8
    data, model, _ = _on_int8(tmp_path, _attention())
    monkeypatch.setattr(int8, "implementations", lambda dnnl, make_pd: [])
    engine = ENGINES["int8"](model, 8)
    for batch in (1, 8):
        x = model.random_input(batch, rng=batch)
        theirs = _file_semantics(data).run(None, {model.input: x})[0]
        assert np.mean(engine.forward(x) == theirs) >= 0.99, f"batch {batch}"
    assert engine.report()["float_products"] == ["64x32x32", "8x32x32"]
    assert tracemalloc_peak(engine, model.random_input(8, rng=0)) < 4096

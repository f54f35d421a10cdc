"""The nine CNNs that ship with the onnx package, imported and run on every NumPy engine.

``onnx/backend/test/data/light/*.onnx``: real topologies at 1 x 3 x 224 x 224 whose weights
are ``ConstantOfShape`` fills. Constant weights hide layout bugs (a transposed kernel gives
the same numbers), so every model also runs with ``load_onnx(randomize_weights=seed)``.

What is compared, per model, weights (the file's, random) and batch (1, and 4 where the
import shows the file's leading 1 is the batch axis): each engine's output against the
float64 reference (``Model.reference``), and against ONNX Runtime on the file itself.

- The output (after the softmax): max abs error <= 1e-4 x max(1, max|ref|), with random
  weights. With the file's weights eight of the nine reach logits of 1e9 to 1e21 that are
  equal in exact arithmetic (every channel the same), so float32 rounding decides the
  softmax and the softmax is no test there (squeezenet's differed by 0.25 between two
  correct engines); those are checked on the logits only.
- The logits (the softmax's input): max abs error <= 1e-3 x max|ref|, both weights.

BLAS is pinned to one thread (on this machine kind threaded OpenBLAS under load made
ResNet-50's convs 6x slower, and zero-allocation needs it). The big three's full
cross-product is marked ``slow`` (``-m slow``): by default AlexNet and ZFNet-512 run ``naive``
and ``arena`` at batch 1 with random weights, and VGG-19 (550 MB of weights: its import and
float64 reference alone took 40 s) only under ``-m slow``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import replace

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="importing ONNX files needs the peers extra")
ort = pytest.importorskip("onnxruntime", reason="the comparison runs ONNX Runtime on the file")
from threadpoolctl import threadpool_limits  # noqa: E402

from engines import ENGINES  # noqa: E402
from engines.importer.load import load_onnx  # noqa: E402
from engines.importer.passes import _rebuild, live_ops  # noqa: E402
from tests.test_zero_alloc import BOOKKEEPING_BYTES, memray_peak, tracemalloc_peak  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512")
BIG = {"vgg19", "bvlc_alexnet", "zfnet512"}
NUMPY_ENGINES = ("naive", "static", "arena", "fused", "packed", "onednn")
PLANNED = ("static", "arena", "fused", "packed", "onednn")
WEIGHTS = {"file": None, "random": 17}
SOFTMAX_TOL = 1e-4          # x max(1, max|ref|), on the output
LOGITS_TOL = 1e-3           # x max|ref|, on the softmax's input
SLOW = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    with threadpool_limits(1):
        yield


def path(name: str) -> str:
    return os.path.join(LIGHT, f"light_{name}.onnx")


@functools.lru_cache(maxsize=4)
def imported(name: str, weights: str):
    return load_onnx(path(name), randomize_weights=WEIGHTS[weights])


def logits_of(model):
    """The model cut at its last softmax's input (the views before it skipped), or None."""
    soft = [op for op in model.ops if op.kind == "softmax"]
    if not soft:
        return None
    writer = {op.output: op for op in model.ops}
    t = soft[-1].inputs[0]
    while t in writer and writer[t].kind == "reshape":
        t = writer[t].inputs[0]
    return replace(_rebuild(model, live_ops(model.ops, t)), name=model.name + "-logits")


def onnx_logits_name(model) -> str | None:
    """The file's value that the last Softmax reads."""
    graph = onnx.load_from_string(model.source).graph
    soft = [n for n in graph.node if n.op_type == "Softmax"]
    return soft[-1].input[0] if soft else None


@functools.lru_cache(maxsize=2)
def expected(name: str, weights: str, batch: int):
    """(input, reference output, reference logits, ONNX Runtime output, ONNX Runtime logits)."""
    model = imported(name, weights)
    x = model.random_input(batch, rng=batch)
    logits = logits_of(model)
    proto = onnx.load_from_string(model.source)
    extra = onnx_logits_name(model)
    if extra:
        proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(extra))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    runs = [session.run(None, {model.input: x[i:i + 1]}) for i in range(batch)]     # the file fixes batch 1
    ort_out = np.concatenate([r[0] for r in runs])
    ort_logits = np.concatenate([r[1] for r in runs]) if extra else None
    return (x, model.reference(x), None if logits is None else logits.reference(x), ort_out, ort_logits)


def error(got, ref, scale) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64).reshape(ref.shape) - ref))) / scale


def cases():
    for name in MODELS:
        for weights in WEIGHTS:
            for batch in (1, 4):
                for engine in NUMPY_ENGINES:
                    big = name in BIG and (batch > 1 or engine not in ("naive", "arena") or weights == "file"
                                           or name == "vgg19")
                    yield pytest.param(name, weights, batch, engine, id=f"{engine}-{name}-{weights}-b{batch}",
                                       marks=[SLOW] if big else [])


@pytest.mark.parametrize("name, weights, batch, engine", cases())
def test_engine_matches_reference_and_onnxruntime(name, weights, batch, engine):
    model = imported(name, weights)
    if model.fixed_batch and batch > 1:
        pytest.fail(f"{name}: batch {batch} refused though every light model shows its batch axis: "
                    f"{model.fixed_batch}")
    x, ref, ref_logits, ort_out, ort_logits = expected(name, weights, batch)
    scale = max(1.0, float(np.max(np.abs(ref))))
    assert error(ort_out, ref, scale) <= SOFTMAX_TOL or ref_logits is not None   # the peer agrees on the file
    got = ENGINES[engine](model, batch).forward(x)
    assert got.shape == ref.shape
    if ref_logits is None or weights == "random":
        assert error(got, ref, scale) <= SOFTMAX_TOL
        assert error(got, ort_out, scale) <= SOFTMAX_TOL
    if ref_logits is not None:
        logits = ENGINES[engine](logits_of(model), batch).forward(x)
        top = float(np.max(np.abs(ref_logits)))
        assert error(logits, ref_logits, top) <= LOGITS_TOL
        assert error(ort_logits, ref_logits, top) <= LOGITS_TOL
        assert error(logits, ort_logits, top) <= 2 * LOGITS_TOL


@pytest.mark.parametrize("name", [pytest.param(n, marks=[SLOW] if n in BIG else []) for n in MODELS])
def test_import_folds_and_fuses(name):
    model = imported(name, "file")
    assert model.fixed_batch is None        # each file's literal leading 1 was shown to be the batch
    writer = {op.output: op for op in model.ops}
    readers = {}
    for op in model.ops:
        for t in op.inputs:
            readers.setdefault(t, []).append(op)
    for op in model.ops:
        src = writer.get(op.inputs[0]) if op.inputs else None
        alone = src is not None and len(readers[src.output]) == 1
        if alone and src.kind == "conv" and src.attrs.get("activation", "none") == "none":
            assert op.kind not in ("batchnorm", "relu", "clip"), f"{op.kind} after a conv left unfused"
    kinds = {op.kind for op in model.ops}
    assert "conv" in kinds and not kinds & {"binary"}      # every Mul/Add by a constant folded


def test_random_weights_change_every_weight_and_keep_the_graph():
    file, rand = imported("squeezenet", "file"), imported("squeezenet", "random")
    assert [op.kind for op in file.ops] == [op.kind for op in rand.ops]
    assert file.params.keys() == rand.params.keys()
    for p in file.params:
        assert file.params[p].shape == rand.params[p].shape
        assert not np.array_equal(file.params[p], rand.params[p]) and np.unique(rand.params[p]).size > 2, p


ALLOC_CASES = [(e, n) for n in ("squeezenet", "resnet50") for e in PLANNED]


@pytest.mark.parametrize("engine, name", ALLOC_CASES, ids=[f"{e}-{n}" for e, n in ALLOC_CASES])
def test_no_array_allocation_per_warm_forward(engine, name):
    model = imported(name, "file")
    runner = ENGINES[engine](model, 1)
    x = model.random_input(1, rng=0)
    peaks = {"tracemalloc": tracemalloc_peak(runner, x, calls=1), "memray": memray_peak(runner, x, calls=1)}
    assert max(peaks.values()) <= BOOKKEEPING_BYTES, peaks


def test_refusals_are_listed_at_once_with_node_names():
    from onnx import TensorProto, helper

    from engines.importer.load import OnnxImportError
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    dw = onnx.numpy_helper.from_array(rng.standard_normal((16, 1, 3, 3)).astype(np.float32), "dw")
    pads = onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="reflect", mode="reflect"),
             helper.make_node("Conv", ["p", "w"], ["a"], name="same", auto_pad="SAME_UPPER", kernel_shape=[3, 3]),
             helper.make_node("MaxPool", ["a"], ["b"], name="order", kernel_shape=[2, 2], strides=[2, 2],
                              storage_order=1),
             helper.make_node("Conv", ["b", "dw"], ["y"], name="multiplier", group=8, kernel_shape=[3, 3])]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 3, 3])], [w, dw, pads])
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxImportError) as info:
        load_onnx(bad.SerializeToString())
    message = str(info.value)
    assert message.startswith("3 problems")
    assert "'reflect'" in message and "mode=reflect" in message          # (auto_pad is supported)
    assert "'order'" in message and "storage_order=1" in message
    assert "'multiplier'" in message and "channel multiplier" in message


def test_what_pytorch_exports_for_standard_layers():
    """Pad, Conv + Clip (ReLU6), AveragePool with count_include_pad, MaxPool with ceil_mode,
    Sigmoid, ReduceMean over the spatial axes, Flatten, Gemm: every engine against ONNX Runtime."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.standard_normal((8, 3, 3, 3)) / 5), ("b", rng.standard_normal(8)), ("lo", np.array(0.0)),
        ("hi", np.array(6.0)), ("fc", rng.standard_normal((5, 8)) / 3), ("fcb", rng.standard_normal(5)))]
    inits.append(numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "pads"))   # asymmetric
    N = helper.make_node
    nodes = [N("Pad", ["x", "pads"], ["p"], name="pad"),
             N("Conv", ["p", "w", "b"], ["c"], kernel_shape=[3, 3], strides=[2, 1]),
             N("Clip", ["c", "lo", "hi"], ["r6"]),
             N("AveragePool", ["r6"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
             N("MaxPool", ["a"], ["m"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             N("Sigmoid", ["m"], ["s"]),
             N("ReduceMean", ["s"], ["g"], axes=[2, 3], keepdims=1),
             N("Flatten", ["g"], ["f"]),
             N("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "torchlike",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 11, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    model = load_onnx(data)
    assert {"pad", "conv", "averagepool", "maxpool"} <= {op.kind for op in model.ops}
    assert any(op.kind == "conv" and op.attrs.get("activation") == "clip" for op in model.ops)
    x = model.random_input(4, rng=1)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ref = model.reference(x)
    assert error(want, ref, max(1.0, float(np.max(np.abs(ref))))) <= SOFTMAX_TOL
    for engine in NUMPY_ENGINES:
        got = ENGINES[engine](model, 4).forward(x)
        assert error(got, ref, max(1.0, float(np.max(np.abs(ref))))) <= SOFTMAX_TOL, engine

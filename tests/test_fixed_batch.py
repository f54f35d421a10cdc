"""Files that fix their input's first axis at N run at exactly batch N, everywhere a model file goes.

Two readings (``engines.FixedBatch``): the importer shows the first axis is the batch (the IR is
per sample, run at N rows), or no axis can be shown to be the batch (the IR is the file's whole
shapes, run as one row). Either way every engine matches the float64 reference and ONNX Runtime on
the original file, another batch is refused naming N, and a symbolic batch is untouched.
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="importing ONNX files needs the peers extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engines import ENGINES, BatchRefused, EngineUnavailable, load_onnx  # noqa: E402
from engines.importer.load import file_workload  # noqa: E402
from tests.test_zero_alloc import tracemalloc_peak  # noqa: E402

OWN = ["naive", "static", "arena", "fused", "packed", "onednn"]
RNG = np.random.default_rng(7)
N = helper.make_node


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def build(nodes, inits, in_shape, out_shape) -> bytes:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


# The first axis is the batch: a linear, a ReLU and a softmax per sample, fixed at 4.
PER_SAMPLE = build([N("MatMul", ["x", "w"], ["h"]), N("Relu", ["h"], ["r"]), N("Softmax", ["r"], ["y"], axis=-1)],
                   {"w": _w(5, 6)}, (4, 3, 5), (4, 3, 6))
# No axis is the batch: the first axis moves (Transpose) and is multiplied away (MatMul).
WHOLE = build([N("Transpose", ["x"], ["t"], perm=[1, 0]), N("MatMul", ["t", "w"], ["m"]), N("Relu", ["m"], ["y"])],
              {"w": _w(3, 5)}, (3, 4), (4, 5))
RANK0 = build([N("Mul", ["x", "c"], ["m"]), N("Relu", ["m"], ["y"])], {"c": np.float32(-2.0)}, (), ())
RANK1 = build([N("Mul", ["x", "c"], ["m"]), N("Sigmoid", ["m"], ["y"])], {"c": _w(6)}, (6,), (6,))
SYMBOLIC = build([N("MatMul", ["x", "w"], ["y"])], {"w": _w(5, 6)}, ("batch", 3, 5), ("batch", 3, 6))


def _ort(data: bytes, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _engine(name, model, batch):
    try:
        return ENGINES[name](model, batch)
    except EngineUnavailable as exc:
        pytest.skip(f"engine {name!r} unavailable: {exc}")


@pytest.mark.parametrize("data, size, per_sample, shape", [
    pytest.param(PER_SAMPLE, 4, True, (4, 3, 5), id="per-sample"),
    pytest.param(WHOLE, 3, False, (3, 4), id="whole"),
    pytest.param(RANK0, 1, False, (), id="rank-0"),
    pytest.param(RANK1, 6, False, (6,), id="rank-1"),
])
@pytest.mark.parametrize("engine", OWN + ["onnxruntime", "torch"])
def test_a_fixed_batch_runs_at_it_on_every_engine_and_matches_onnxruntime(data, size, per_sample, shape, engine):
    model = load_onnx(data)
    assert (model.fixed_batch.size, model.fixed_batch.per_sample) == (size, per_sample)
    assert model.input_shape(size) == shape
    x = model.random_input(size, rng=1)
    assert x.shape == shape
    expected = _ort(data, x)
    ref = model.reference(x)
    assert ref.shape == expected.shape and np.abs(ref - expected).max() <= 1e-5
    eng = _engine(engine, model, size)
    for _ in range(2):                        # a warm call gives the same
        got = eng.forward(x)
        assert isinstance(got, np.ndarray) and got.shape == expected.shape, engine
        assert np.abs(got - ref).max() <= 1e-5, engine
    if eng.zero_alloc:                        # the views around the one row allocate no array
        assert tracemalloc_peak(eng, x) <= 4096


@pytest.mark.parametrize("data, size", [(PER_SAMPLE, 4), (WHOLE, 3)])
def test_another_batch_is_refused_naming_the_fixed_one(data, size, tmp_path):
    model = load_onnx(data)
    other = size + 4
    message = f"batch {other} refused: the file fixes the batch at {size}"
    for refuse in (lambda: model.input_shape(other), lambda: model.random_input(other),
                   lambda: ENGINES["arena"](model, other), lambda: model.flops(other) and model.rows(other)):
        with pytest.raises(BatchRefused, match=message) as refused:
            refuse()
        said = str(refused.value)            # the fixed batch and how to run it, each said once
        assert said.count("fixes the batch") == 1 and said.count(f"at {size}") == 1, said
    path = tmp_path / "fixed.onnx"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message):
        file_workload(path, other)
    assert file_workload(path, size).input(0).shape == model.input_shape(size)
    engine = ENGINES["static"](model, size)
    short = np.zeros((1, *model.shapes[model.input]) if model.fixed_batch.per_sample else (1, 2), np.float32)
    with pytest.raises(ValueError, match=str(size)):
        engine.forward(short)


def test_the_leading_axis_of_a_fixed_batch_is_taken_as_the_batch_only_where_shown():
    # Softmax over axis 0 mixes the rows of the first axis: no batch axis, one row of the whole shape.
    mixing = build([N("Softmax", ["x"], ["y"], axis=0)], {}, (4, 6), (4, 6))
    model = load_onnx(mixing)
    assert not model.fixed_batch.per_sample and "no axis could be shown to be the batch" in str(model.fixed_batch)
    x = model.random_input(4, rng=0)
    np.testing.assert_allclose(ENGINES["arena"](model, 4).forward(x), _ort(mixing, x), atol=1e-6)
    # a literal Reshape led by the fixed size is read per sample (as a leading 1 is)
    literal = build([N("Reshape", ["x", "rows"], ["y"])], {"rows": np.array([4, 24], np.int64)}, (4, 4, 6), (4, 24))
    model = load_onnx(literal)
    assert model.fixed_batch.per_sample and model.shapes[model.output] == (24,)
    x = model.random_input(4, rng=0)
    np.testing.assert_array_equal(ENGINES["static"](model, 4).forward(x), x.reshape(4, 24))


def test_a_symbolic_batch_is_unchanged():
    model = load_onnx(SYMBOLIC)
    assert model.fixed_batch is None and model.shapes[model.input] == (3, 5)
    for batch in (1, 5):
        x = model.random_input(batch, rng=batch)
        assert model.input_shape(batch) == (batch, 3, 5)
        np.testing.assert_allclose(ENGINES["arena"](model, 5).forward(x), _ort(SYMBOLIC, x), atol=1e-5)


def test_mlexec_runs_a_fixed_batch_file_at_its_batch_only(tmp_path, capsys):
    from mlexec.analysis import AnalysisError, prepare_analysis, run_analysis
    from mlexec.cli import main
    from mlexec.suite.grid import file_cases
    fixed, free = tmp_path / "fixed.onnx", tmp_path / "free.onnx"
    fixed.write_bytes(WHOLE)
    free.write_bytes(SYMBOLIC)
    # the suite: the fixed file at 3 only, and a note saying so; the symbolic file at every batch
    found = file_cases([str(fixed), str(free)], (1, 8))
    assert [c.id for c in found.cases] == ["fixed-b3", "free-b1", "free-b8"]
    assert len(found.notes) == 1 and "fixed.onnx: measured at batch 3 only, not at 1,8" in found.notes[0]
    # mlexec report: another batch is one line naming the fixed one
    assert main(["report", "--model", str(fixed), "--batches", "1,8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batch 1 refused: the file fixes the batch at 3" in err
    # mlexec analyze and the web page (prepare_analysis answers its 400): the fixed batch by default
    model = load_onnx(fixed)
    with pytest.raises(AnalysisError, match="batch 2 refused: the file fixes the batch at 3"):
        prepare_analysis(None, batch=2, engines="naive", model_file=model)
    result = run_analysis(None, engines="naive,arena", repeat=1, model_file=model)
    assert result["model"]["batch"] == 3 and result["model"]["input_shape"] == [3, 4]
    assert result["model"]["output_shape"] == [4, 5]
    assert all(e["passed"] for e in result["engines"])

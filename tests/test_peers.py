"""Peer engines (onnxruntime, torch, torch-compile) against the float64 reference."""
import numpy as np
import pytest

from engines import ENGINES, MODELS, EngineUnavailable
from engines.ir.models import ABS_TOL, REL_TOL

MAX_BATCH = 4
SMALL = {"mlp": dict(dim=64), "mlp-deep": dict(dim=64), "transformer": dict(dim=64, seq=16)}


def build(engine, model):
    try:
        return ENGINES[engine](model, MAX_BATCH)
    except EngineUnavailable as exc:
        pytest.skip(f"{engine} unavailable: {exc}")


def check(engine, model, batches=(1, 3, MAX_BATCH)):
    for seed, batch in enumerate(batches):
        x = model.random_input(batch, rng=100 + seed)
        y = engine.forward(x)
        ref = model.reference(x)
        assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == ref.shape
        assert np.abs(y - ref).max() < ABS_TOL
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < REL_TOL


@pytest.mark.parametrize("model_name", list(SMALL))
@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_peer_matches_reference(engine, model_name):
    model = MODELS[model_name](**SMALL[model_name], seed=1)
    check(build(engine, model), model)


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_peer_returns_fresh_arrays_and_checks_input(engine):
    model = MODELS["mlp"](dim=32)
    eng = build(engine, model)
    assert eng.returns_view is False and eng.zero_alloc is False
    x = model.random_input(2, rng=0)
    a = eng.forward(x)
    b = eng.forward(x)
    assert not np.shares_memory(a, b) and not np.shares_memory(a, x)
    a[...] = 0                                   # the caller's own: writable, and the engine unharmed
    np.testing.assert_array_equal(eng.forward(x), b)
    with pytest.raises(TypeError):
        eng.forward(x.astype(np.float64))
    with pytest.raises(ValueError):
        eng.forward(model.random_input(MAX_BATCH + 1))


def test_weight_bytes_reported():
    model = MODELS["transformer"](**SMALL["transformer"])
    for engine in ("onnxruntime", "torch"):
        assert build(engine, model).weight_bytes == model.weight_bytes


def test_torch_compile_small_mlp():
    """One small model only: compiling takes seconds to tens of seconds on a 2-core CPU."""
    model = MODELS["mlp"](dim=32, seed=2)
    eng = build("torch-compile", model)
    assert eng.compile_seconds > 0
    check(eng, model, batches=(1, 3, MAX_BATCH, 2))


def test_torch_compile_stays_compiled_past_dynamos_recompile_limit(monkeypatch, caplog):
    """Every engine compiles the same ``run``; Dynamo runs eagerly past ``recompile_limit`` graphs
    of one code object. With the limit at 1, this engine's two graphs (dynamic, batch 1) would
    pass it: construction must raise it, not fall back to eager."""
    torch = pytest.importorskip("torch", reason="torch-compile needs torch (peers extra)")
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    model = MODELS["transformer"](dim=32, seq=8, seed=3)
    with caplog.at_level("WARNING", logger="torch._dynamo"):
        eng = build("torch-compile", model)
        check(eng, model, batches=(1, MAX_BATCH))
    assert torch._dynamo.config.recompile_limit >= 1024
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]


def test_missing_package_raises_engine_unavailable(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_peers(name, *args, **kwargs):
        if name.split(".")[0] in {"onnx", "onnxruntime", "torch", "scipy"}:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peers)
    model = MODELS["mlp"](dim=8)
    for engine in ("onnxruntime", "torch", "torch-compile", "fused"):
        with pytest.raises(EngineUnavailable, match=r"pip install -e \.\[(peers|fast)\]"):
            ENGINES[engine](model, 2)


@pytest.mark.parametrize("model_name", list(SMALL))
def test_the_onnx_export_carries_the_least_ir_version_its_opset_needs(model_name):
    """Not the onnx package's newest: onnxruntime 1.30 refuses IR 14, which onnx 1.23 writes by
    default, so the peers failed to start beside an older onnxruntime."""
    onnx = pytest.importorskip("onnx")
    from engines.peers.onnxrt import OPSET, export
    proto = export(MODELS[model_name](**SMALL[model_name]), onnx)
    least = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", OPSET)])
    assert proto.ir_version == least < onnx.IR_VERSION


def test_an_onnxruntime_older_than_the_file_makes_the_peer_unavailable_naming_both_versions(monkeypatch):
    """onnxruntime 1.30 refused an IR 14 file ("Unsupported model IR version: 14, max supported IR
    version: 13"): the peer is unavailable for that file, and says why, where the report crashed."""
    ort = pytest.importorskip("onnxruntime")

    def refusing(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : model.cc:202 onnxruntime::Model::Model "
                           "Unsupported model IR version: 14, max supported IR version: 13")
    monkeypatch.setattr(ort, "InferenceSession", refusing)
    for engine in ("onnxruntime", "onnxruntime-int8"):
        with pytest.raises(EngineUnavailable, match=r"reads ONNX IR versions up to 13 and this file is IR 14"):
            ENGINES[engine](MODELS["mlp"](dim=32), 2)

    def failing(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : a broken graph")
    monkeypatch.setattr(ort, "InferenceSession", failing)
    with pytest.raises(RuntimeError, match="INVALID_GRAPH"):      # any other refusal is not hidden
        ENGINES["onnxruntime"](MODELS["mlp"](dim=32), 2)

"""The compute budget: an analysis's time estimated from flops, bytes, repeat and engines, checked before it runs."""
import pytest

from engines import MODELS
from mlexec.analysis import (COMPUTE_RATES, LIMITS, AnalysisError, _model_cost, check_compute, estimate_seconds,
                             run_analysis)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_flops_estimate_matches_the_built_model(model):
    built = MODELS[model](dim=64, seed=0)
    assert _model_cost(model, 64)[2] == built.flops(1)


def test_estimate_grows_with_each_input():
    base = dict(flops=10**9, bytes_moved=10**7, ops=3, repeat=10, engines=["naive"])
    total = sum(estimate_seconds(**base).values())
    for key, bigger in (("flops", 10**10), ("bytes_moved", 10**9), ("ops", 300), ("repeat", 100),
                        ("engines", ["naive", "static"])):
        assert sum(estimate_seconds(**dict(base, **{key: bigger})).values()) > total, key
    compiled = estimate_seconds(**dict(base, engines=["torch-compile"]))
    assert compiled["torch-compile"] >= COMPUTE_RATES["compile_seconds"]


def test_the_issue_request_is_refused_before_anything_runs(monkeypatch):
    """mlp d2048 b256 repeat 500 on all eight engines took 155 s of both cores: refused, saying what to lower."""
    built = []
    original = MODELS["mlp"]
    monkeypatch.setitem(MODELS, "mlp", lambda dim, seed=0: built.append(dim) or original(dim=dim, seed=seed))
    # the request's engines (every engine then; with int8 as well, the memory estimate refuses it first)
    engines = ["naive", "static", "arena", "fused", "packed", "onednn", "onnxruntime", "torch", "torch-compile"]
    with pytest.raises(AnalysisError) as info:
        run_analysis("1", model="mlp", dim=2048, batch=256, repeat=500, engines=engines)
    message = str(info.value)
    assert f"estimated at {LIMITS['max_estimated_seconds']:.0f} s of compute or less" in message
    assert "lower repeat to" in message and "lower dim or batch" in message and "torch-compile alone" in message
    assert 2048 not in built


def test_within_budget_passes_and_names_no_advice_it_cannot_give():
    assert check_compute({"reference": 0.1, "naive": 1.0}, 10, "x") == pytest.approx(1.1)
    with pytest.raises(AnalysisError) as info:
        check_compute({"reference": 1.0, "naive": 100.0}, 1, "x")
    assert "lower repeat" not in str(info.value) and "fewer engines" not in str(info.value)

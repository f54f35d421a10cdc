"""run_analysis: real measurements, real errors, and every bad input refused with a clear message."""
import numpy as np
import pytest

from engines import ENGINES, MODELS, Engine, EngineUnavailable
from engines.ir.models import ABS_TOL
from mlexec.analysis import LIMITS, AnalysisError, _model_size, estimate_bytes, parse_values, run_analysis, tile_values


def test_result_is_measured_and_consistent(small):
    result = run_analysis("1.0, 0.5", **small)
    by_name = {e["name"]: e for e in result["engines"]}
    assert list(by_name) == ["naive", "static", "arena"]
    naive = by_name["naive"]
    for e in by_name.values():
        assert e["available"] and e["rounds"] == 3
        assert e["median_s"] > 0 and e["min_s"] <= e["median_s"]
        assert e["speedup_vs_naive"] == pytest.approx(naive["median_s"] / e["median_s"])
        assert e["footprint_bytes"] == e["activation_bytes"] + e["peak_bytes"]
        assert e["memory_saved_pct"] == pytest.approx(100 * (1 - e["footprint_bytes"] / naive["footprint_bytes"]))
    assert naive["speedup_vs_naive"] == pytest.approx(1.0)
    # naive plans nothing and allocates every intermediate during forward; the others plan ahead
    assert naive["activation_bytes"] == 0 and naive["peak_bytes"] >= 64 * 4
    assert by_name["arena"]["activation_bytes"] <= by_name["static"]["activation_bytes"]
    assert result["model"]["input_shape"] == [1, 64]
    assert result["model"]["case"] == "mlp-b1-d64"      # the suite's and the report's id (mlexec.case)


def test_a_peers_memory_is_not_claimed(small):
    """ONNX Runtime allocates through its own allocator, which tracemalloc does not see: no memory
    saved is claimed for it, and the table says why."""
    result = run_analysis("1.0, 0.5", engines="naive,arena,onnxruntime", **small)
    by_name = {e["name"]: e for e in result["engines"]}
    if not by_name["onnxruntime"]["available"]:
        pytest.skip(f"onnxruntime unavailable: {by_name['onnxruntime']['reason']}")
    peer, arena = by_name["onnxruntime"], by_name["arena"]
    assert not peer["memory_seen"] and peer["memory_saved_pct"] is None
    assert arena["memory_seen"] and arena["memory_saved_pct"] is not None
    from mlexec.cli import format_result
    table = format_result(result)
    row = next(line for line in table.splitlines() if line.startswith("onnxruntime"))
    assert "%" not in row and "not measured for onnxruntime" in table


def test_a_sequence_model_is_named_with_its_seq(small):
    result = run_analysis("1.0", model="transformer", engines="naive", **{**small, "dim": 32, "repeat": 1})
    assert result["model"]["case"] == "transformer-b1-d32-s64"


def test_error_is_against_the_reference(small):
    result = run_analysis("1.0, 0.5", engines="naive,arena", batch=2, **small)
    model = MODELS["mlp"](dim=64, seed=0)
    x = tile_values(np.array([1.0, 0.5]), model.input_shape(2))
    expected = float(np.max(np.abs(ENGINES["arena"](model, 2).forward(x) - model.reference(x))))
    arena = result["engines"][1]
    assert arena["max_abs_error"] == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert arena["passed"] is (expected <= ABS_TOL)


def test_large_values_fail_the_absolute_check(small):
    # float32 keeps ~7 digits, so activations ~1e6 cannot be within ABS_TOL absolute
    result = run_analysis([1e6, -1e6, 5e5], engines=["naive"], **small)
    assert result["engines"][0]["max_abs_error"] > ABS_TOL
    assert result["engines"][0]["passed"] is False and result["all_passed"] is False


def test_values_are_tiled_cyclically():
    x = tile_values(parse_values("1,2,3"), (2, 4))
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert x.tolist() == [[1, 2, 3, 1], [2, 3, 1, 2]]
    assert parse_values("1, 2\n3, 4\n").tolist() == [1, 2, 3, 4]
    assert parse_values([[1, 2], [3, 4]]).tolist() == [1, 2, 3, 4]
    assert parse_values("1\n\n2\n").tolist() == [1, 2]


def test_per_op_breakdown_flags_the_slowest(small):
    result = run_analysis("0.1", model="transformer", dim=16, repeat=3)
    ops = result["ops"]
    assert [o["name"] for o in ops] == [op.output for op in MODELS["transformer"](dim=16).ops]
    assert sum(o["share_pct"] for o in ops) == pytest.approx(100)
    slowest = [o for o in ops if o["slowest"]]
    assert slowest and min(o["median_s"] for o in slowest) >= max(o["median_s"] for o in ops if not o["slowest"])
    assert result["slowest_ops"] == [o["name"] for o in sorted(slowest, key=lambda o: o["rank"])]
    assert all(o["bytes"] > 0 for o in ops)


def test_progress_reports_every_step(small):
    calls = []
    run_analysis("1", progress=lambda done, total: calls.append((done, total)), **small)
    assert calls[-1][0] == calls[-1][1]
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_unavailable_engine_is_reported_not_raised(monkeypatch, small):
    class Missing(Engine):
        def __init__(self, model, max_batch):
            raise EngineUnavailable("pip install nothing-here")

    monkeypatch.setitem(ENGINES, "missing", Missing)
    result = run_analysis("1", engines="naive,missing", **small)
    missing = result["engines"][1]
    assert missing == {"name": "missing", "available": False, "reason": "pip install nothing-here"}
    assert result["engines"][0]["available"]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_memory_estimate_matches_the_built_model(model):
    built = MODELS[model](dim=64, seed=0)
    assert _model_size(model, 64) == (built.weight_bytes, sum(built.tensor_bytes(t) for t in built.shapes))


@pytest.mark.parametrize("values, options, expected", [
    ("1, abc", {}, r"expected a number at position 2, got text 'abc'"),
    ("", {}, r"expected at least one number, got empty input"),
    ("  \n ", {}, r"got empty input"),
    ([], {}, r"got empty input"),
    ("1,,2", {}, r"expected a number at position 2, got an empty value"),
    ("1,2,", {}, r"position 3, got an empty value"),
    ("1, nan", {}, r"expected a finite number at position 2, got nan"),
    ("inf", {}, r"expected a finite number .* got inf"),
    ([1.0, float("-inf")], {}, r"finite number .* -inf"),
    ("1e300", {}, r"\|value\| <= 1e\+06 .* got 1e\+300"),
    ("1," * 600_000, {}, r"expected at most 1,000,000 bytes of input text, got 1,200,000 bytes"),
    ("0," * 100_000 + "0", {}, r"expected at most 100,000 input values, got 100,001"),
    ("1", {"batch": 10**9}, r"expected batch to be an integer in 1..1024, got 1000000000"),
    ("1", {"batch": 0}, r"batch .* 1..1024, got 0"),
    ("1", {"dim": 10**6}, r"expected dim to be an integer in 1..4096"),
    ("1", {"dim": "big"}, r"expected dim to be an integer .* got 'big'"),
    ("1", {"dim": 4096, "batch": 1024}, r"expected an analysis that fits in 512 MiB .* estimated \d+ MiB"),
    ("1", {"model": "resnet"}, r"unknown model 'resnet'; expected one of \['mlp', 'mlp-deep', 'transformer'\]"),
    ("1", {"engines": "naive,turbo"}, r"unknown engine 'turbo'; expected one of \[.*'arena'.*'naive'.*\]"),
    ("1", {"engines": ""}, r"expected at least one engine"),
    ("1", {"model": "transformer", "dim": 12}, r"invalid options for model 'transformer': dim must be divisible"),
    ("1", {"repeat": 0}, r"repeat .* 1..500"),
    ('1,"2\n', {}, r"malformed CSV"),
    ("1,2\n3\n", {}, r"expected every row to have 2 value\(s\) like row 1 \(malformed CSV\), got 1 in row 2"),
    ([[1, 2], 3], {}, r"a mix of both"),
    ([True], {}, r"expected a number at position 1, got True"),
    ({"a": 1}, {}, r"expected text, a list of numbers or a list of rows, got dict"),
    (b"\xff\xfe1", {}, r"UTF-8"),
])
def test_bad_input_is_refused_with_a_clear_message(values, options, expected):
    with pytest.raises(AnalysisError, match=expected):
        run_analysis(values, **{"dim": 64, "repeat": 1, **options})


def test_huge_request_is_refused_before_allocation(monkeypatch):
    built = []
    original = MODELS["mlp"]
    monkeypatch.setitem(MODELS, "mlp", lambda dim, seed=0: built.append(dim) or original(dim=dim, seed=seed))
    with pytest.raises(AnalysisError, match="MiB"):
        run_analysis("1", dim=4096, batch=1024)
    assert 4096 not in built   # only the tiny builds of the estimate ran
    assert estimate_bytes("mlp", 4096, 1024, 3) > LIMITS["max_estimated_bytes"]


def test_a_quantized_engine_is_labelled_and_held_to_its_own_bar(small, monkeypatch):
    """int8's and onnxruntime-int8's error is quantization's: shown as such, against their own bar;
    over that bar the analysis fails, never passes silently."""
    from mlexec.cli import format_result
    quantized = "onnxruntime-int8"
    try:
        ENGINES[quantized](MODELS["mlp"](dim=8), 1)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    result = run_analysis("1.0, 0.5", engines=["naive", quantized], **small)
    naive, peer = result["engines"]
    assert naive["quantized"] is False and naive["tolerance"] == ABS_TOL
    assert peer["quantized"] is True and peer["tolerance"] == ENGINES[quantized].abs_tol
    assert ABS_TOL < peer["max_abs_error"] < peer["tolerance"] and peer["passed"] and result["all_passed"]
    text = format_result(result)
    assert f"quantized (bar {ENGINES[quantized].abs_tol:g})" in text and "FAIL" not in text
    monkeypatch.setattr(ENGINES[quantized], "abs_tol", 1e-3)      # a bar its error exceeds
    result = run_analysis("1.0, 0.5", engines=["naive", quantized], **small)
    peer = result["engines"][1]
    assert peer["passed"] is False and result["all_passed"] is False
    assert "quantized (bar 0.001)" in format_result(result) and "FAIL (> 0.001)" in format_result(result)

"""The suite's pytest plugin, run by pytester in a fresh process (in-process runs inherit the
enclosing session's modules and memray state) on a one-case matrix with a fake engine:
its options, its registration, sharded collection, and the gate's verdicts against a reference
folder with planted regressions. No git here: the pytester folder is not a checkout."""
from __future__ import annotations

import json

import pytest

from conftest import ROOT
from engines import ENGINES
from mlexec.suite import plugin
from mlexec.suite.grid import FULL, assign_shards, pair_costs, parse_shard

pytest_plugins = ["pytester"]

# A fake engine: static, made slower (FAKE_PLANT=slow, +50 %) or given an 8 KiB temporary
# (FAKE_PLANT=temp) when built; removed again when the inner session ends.
FAKE = '''
import os, time
import numpy as np
from engines import ENGINES
from engines.planned.static import StaticEngine


class FakeEngine(StaticEngine):
    name = "fake"

    def __init__(self, model, max_batch):
        super().__init__(model, max_batch)
        self.plant = os.environ.get("FAKE_PLANT", "none")

    def _forward(self, x):
        t0 = time.perf_counter()
        out = super()._forward(x)
        if self.plant == "slow":
            until = time.perf_counter() + 0.5 * (time.perf_counter() - t0)
            while time.perf_counter() < until:
                pass
        elif self.plant == "temp":
            np.ones(2048, dtype=np.float32)          # an 8 KiB temporary
        return out


ENGINES["fake"] = FakeEngine
collect_ignore = ["reference"]         # the reference code's own conftest.py is code, not this run's


def pytest_unconfigure(config):
    ENGINES.pop("fake", None)
'''

# The reference code: a folder laid out as the repository, whose conftest.py (the gated code: the fake
# engine lives there) holds a "fake" that is plain static.
REFERENCE = '''
from engines.planned.static import StaticEngine


class FakeEngine(StaticEngine):
    name = "fake"
'''

ONE_CASE = ["-p", "no:cacheprovider", "--mlexec-engines=fake", "-k", "mlp-b1-d256 and not deep",
            "--benchmark-max-time=0.02", "--mlexec-compare=off"]


@pytest.fixture
def suite(pytester, monkeypatch):
    """A folder with the suite's test file, the root conftest.py and the fake engine."""
    monkeypatch.delenv("FAKE_PLANT", raising=False)
    pytester.makeconftest((ROOT / "conftest.py").read_text() + FAKE)
    pytester.makepyfile(test_mlexec_suite=(ROOT / "benchmarks" / "test_engines.py").read_text())
    reference = pytester.mkdir("reference")
    (reference / "conftest.py").write_text(REFERENCE)
    return pytester


def gate_section(result) -> str:
    text = result.stdout.str()
    return text[text.rindex("regression gate"):]


def test_options_are_one_documented_group(suite):
    result = suite.runpytest_subprocess("--help")
    text = result.stdout.str()
    for option in ("--mlexec-base=auto|off|REF|DIR", "--mlexec-shard=K/N", "--mlexec-require-gate",
                   "--mlexec-compare=auto|off|FILE"):
        assert option in text


@pytest.mark.parametrize("shard", ["3/2", "0/2", "1-2", "x/y"])
def test_bad_shard_is_a_usage_error(suite, shard):
    result = suite.runpytest_subprocess(f"--mlexec-shard={shard}", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mlexec-shard: expected*"])


def test_nothing_compared_is_said_last_and_require_gate_fails(suite):
    result = suite.runpytest_subprocess(*ONE_CASE, "--mlexec-pass=memory")
    assert result.ret == 0
    section = gate_section(result)
    assert "is not a git checkout, and no saved run in baselines names a commit" in section
    assert "memory A/B (1): no reference code:" in section and "fake-mlp-b1-d256" in section
    assert "NOTHING COMPARED: this run is not gated" in section
    result = suite.runpytest_subprocess(*ONE_CASE, "--mlexec-pass=memory", "--mlexec-require-gate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--mlexec-require-gate: nothing was compared" in gate_section(result)


def test_planted_allocation_against_a_reference_folder_is_caught(suite, monkeypatch):
    verdict = suite.path / "verdict.json"
    args = [*ONE_CASE, "--mlexec-pass=memory", "--mlexec-base=reference", f"--mlexec-verdict={verdict}"]
    result = suite.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str()
    assert json.loads(verdict.read_text())["compared"]["memory"] == ["fake-mlp-b1-d256"]
    monkeypatch.setenv("FAKE_PLANT", "temp")
    result = suite.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (finding,) = json.loads(verdict.read_text())["regressions"]
    assert (finding["name"], finding["kind"]) == ("fake-mlp-b1-d256", "memory")
    assert finding["current"] >= 8192 > finding["baseline"]             # the planted temporary
    assert "fake-mlp-b1-d256  memory" in gate_section(result)


def test_planted_slowdown_is_caught_and_the_section_follows_the_benchmark_table(suite, monkeypatch):
    monkeypatch.setenv("FAKE_PLANT", "slow")
    result = suite.runpytest_subprocess(*ONE_CASE, "--mlexec-pass=time", "--mlexec-base=reference")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = result.stdout.str()
    assert text.index("benchmark: 1 tests") < text.index("engines compared") < text.rindex("regression gate")
    assert "fake-mlp-b1-d256  latency" in gate_section(result)


def test_a_saved_run_from_another_cpu_says_what_is_comparable(suite):
    from mlexec.suite.memory import allocation_environment
    stats = dict.fromkeys(("min", "max", "mean", "stddev", "median", "iqr", "rounds"), 1)
    run = {"machine_info": {"cpu": {"brand_raw": "Some Other CPU"}, "mlexec_allocation": allocation_environment()},
           "commit_info": {"id": "abc"}, "datetime": "2026-01-01T00:00:00", "version": "5.2.3",
           "benchmarks": [{"name": "test_forward[fake-mlp-b1-d256]", "fullname": "x", "stats": stats,
                           "extra_info": {"case": "mlp-b1-d256", "engine": "fake", "version": "old",
                                          "peak_bytes": 72}}]}
    (suite.path / "saved.json").write_text(json.dumps(run))
    result = suite.runpytest_subprocess(*ONE_CASE[:-1], "--mlexec-pass=memory", "--mlexec-base=off",
                             "--mlexec-compare=saved.json")
    section = gate_section(result)
    assert "and saved run: saved.json (recorded on Some Other CPU, not this" in section
    assert "memory comparable: same Python" in section and "its times are never compared" in section
    assert "memory vs saved run (1): another workload version in the saved run: fake-mlp-b1-d256" in section


# --- registration: once, whichever way the plugin comes in ----------------------------

def test_registered_once_by_conftest_and_by_dash_p(suite):
    for args in ([], ["-p", "mlexec.suite.plugin"]):
        result = suite.runpytest_subprocess(*args, *ONE_CASE, "--collect-only", "-q")
        assert result.ret == 0, result.stdout.str() + result.stderr.str()
        result.stdout.fnmatch_lines(["test_mlexec_suite.py::test_forward[fake-mlp-b1-d256]"])


def test_registered_once_with_the_entry_point_installed(suite, monkeypatch, tmp_path):
    """A stand-in for ``pip install``: a distribution whose pytest11 entry point names the plugin."""
    dist = tmp_path / "site" / "mlexec_probe-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlexec-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{plugin.NAME} = mlexec.suite.plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    result = suite.runpytest(*ONE_CASE, "--collect-only")         # the entry point, then conftest.py
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["plugins:*mlexec-probe-0.0*", "*<Function test_forward[[]fake-mlp-b1-d256[]]>"])
    result = suite.runpytest(f"-p no:{plugin.NAME}", "--collect-only", "-q")    # blocked: not registered
    assert result.stdout.lines[:2] == ["test_mlexec_suite.py::test_forward", "test_mlexec_suite.py::test_peak_memory"]


# --- shards ----------------------------------------------------------------------------

def test_shards_cover_the_matrix_exactly_once_and_balance_cost():
    costs = {f"{e}-{c.id}": float(c.batch * (c.dim or 1)) for c in FULL for e in ENGINES}
    for n in (1, 2, 3, 4):
        shard = assign_shards(costs, n)
        assert set(shard) == set(costs) and set(shard.values()) == set(range(1, n + 1))
        loads = [sum(costs[u] for u in shard if shard[u] == k) for k in range(1, n + 1)]
        assert max(loads) - min(loads) <= max(costs.values())          # greedy: within one unit
        assert assign_shards(dict(reversed(costs.items())), n) == shard   # order-independent
    assert parse_shard("2/4") == (2, 4)


def test_measured_costs_stand_and_the_rest_are_estimated_on_their_scale():
    estimates = {("a", "x"): 1.0, ("b", "x"): 2.0, ("c", "x"): 4.0, ("new", "x"): 3.0}
    measured = {("a", "x"): 10.0, ("b", "x"): 30.0, ("c", "x"): 40.0, ("gone", "x"): 99.0}
    # measured/estimated: 10, 15, 10 -> median 10; a pair no longer in the matrix is ignored
    assert pair_costs(list(estimates), measured, estimates.get) == {("a", "x"): 10.0, ("b", "x"): 30.0,
                                                                   ("c", "x"): 40.0, ("new", "x"): 30.0}
    assert pair_costs(list(estimates), {}, estimates.get) == estimates
    # every pair measured: nothing is estimated (an estimate builds the model)
    assert pair_costs([("a", "x")], measured, lambda p: pytest.fail("estimated")) == {("a", "x"): 10.0}


def test_costs_file_has_every_pair_the_run_measured(suite):
    """--mlexec-costs: seconds per engine x case, tests and gate together (what shards balance on)."""
    costs = suite.path / "costs.json"
    result = suite.runpytest_subprocess(*ONE_CASE, "--mlexec-engines=fake,static", "--mlexec-pass=memory",
                                        "--mlexec-base=reference", f"--mlexec-costs={costs}")
    assert result.ret == 0, result.stdout.str()
    data = json.loads(costs.read_text())
    assert data["matrix"] == "quick" and data["cpu"]
    assert set(data["seconds"]) == {"fake mlp-b1-d256", "static mlp-b1-d256"}
    assert all(s > 0 for s in data["seconds"].values())


def test_sharded_collection_is_a_partition(suite):
    def collected(*args):
        result = suite.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", "--mlexec-engines=naive,static",
                                 "--mlexec-matrix=quick", *args)
        return {line for line in result.stdout.lines if line.startswith("test_mlexec_suite.py::")}
    whole = collected()
    parts = [collected(f"--mlexec-shard={k}/3") for k in (1, 2, 3)]
    assert all(parts) and set().union(*parts) == whole
    assert sum(map(len, parts)) == len(whole)
    for part in parts:          # both passes of an engine x case stay together
        assert {t.replace("test_forward", "test_peak_memory") for t in part if "test_forward" in t} <= part


def _mlp_file(path):
    """A two-layer MLP (Gemm, Relu, MatMul + Add) written with the onnx package, batch axis symbolic."""
    onnx = pytest.importorskip("onnx", reason="the model file is written with the onnx package (peers extra)")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) / 4).astype(np.float32), name)
               for name, shape in (("W1", (16, 32)), ("b1", (32,)), ("W2", (32, 16)), ("b2", (16,)))]
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["m"]), helper.make_node("Add", ["m", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_quick_matrix_leaves_out_slow_builds_with_their_reason():
    compiled = ENGINES["torch-compile"]                   # skip reasons, not timings
    assert compiled.slow_build and plugin.quick_skip(compiled).startswith(compiled.quick_skip)
    assert all(plugin.quick_skip(ENGINES[e]) is None for e in ("naive", "packed", "onednn"))


def test_case_can_name_a_model_file(tmp_path):
    import engines
    from mlexec.suite.grid import file_case
    from mlexec.suite.session import _reference_model

    case = file_case(str(_mlp_file(tmp_path / "tiny.onnx")), 4)
    assert case.id == "tiny-b4" and case.build().flops(4) >= 2 * 4 * 2 * 16 * 32   # at least the two products
    assert _reference_model(engines, case).ops == case.build().ops     # the reference code builds it too


def test_merged_shard_verdicts_equal_the_unsharded_verdict(suite, monkeypatch):
    from mlexec.suite import ci
    monkeypatch.setenv("FAKE_PLANT", "temp")
    args = [*ONE_CASE, "--mlexec-engines=fake,static,naive", "--mlexec-pass=memory", "--mlexec-base=reference"]
    whole = suite.path / "whole.json"
    assert suite.runpytest_subprocess(*args, f"--mlexec-verdict={whole}").ret == pytest.ExitCode.TESTS_FAILED
    for k in (1, 2):
        suite.runpytest_subprocess(*args, f"--mlexec-shard={k}/2", f"--mlexec-verdict=shard-{k}/verdict.json")
    merged, _ = ci.merge_shards([suite.path / "shard-1", suite.path / "shard-2"], 2)
    expected = json.loads(whole.read_text())
    got = merged.as_dict()
    assert {k: sorted(v) for k, v in got["compared"].items()} == {k: sorted(v) for k, v in expected["compared"].items()}
    assert got["regressions"] == expected["regressions"] and len(expected["regressions"]) == 1
    shards = [json.loads((suite.path / f"shard-{k}/verdict.json").read_text()) for k in (1, 2)]
    assert all(s["compared"]["memory"] or s["skipped"]["memory"] for s in shards)     # each shard reported


def test_a_model_file_joins_the_matrix_and_the_gate(suite, monkeypatch):
    """--mlexec-model: ids from the file's stem at every --mlexec-batches size, memray limits from
    its plan, and the same gate (a planted temporary caught against the reference code)."""
    _mlp_file(suite.path / "mymodel.onnx")
    args = ["-p", "no:cacheprovider", "--mlexec-engines=fake", "--mlexec-model=mymodel.onnx",
            "--mlexec-batches=1,3", "-k", "mymodel", "--mlexec-compare=off", "--mlexec-base=reference"]
    collected = suite.runpytest_subprocess(*args, "--collect-only", "-q")
    collected.stdout.fnmatch_lines(["test_mlexec_suite.py::test_forward[fake-mymodel-b1]",
                                    "test_mlexec_suite.py::test_forward[fake-mymodel-b3]"])
    verdict = suite.path / "verdict.json"
    result = suite.runpytest_subprocess(*args, "--mlexec-pass=memory", f"--mlexec-verdict={verdict}")
    assert result.ret == 0, result.stdout.str()
    assert sorted(json.loads(verdict.read_text())["compared"]["memory"]) == ["fake-mymodel-b1", "fake-mymodel-b3"]
    monkeypatch.setenv("FAKE_PLANT", "temp")
    result = suite.runpytest_subprocess(*args, "--mlexec-pass=memory", f"--mlexec-verdict={verdict}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert {f["name"] for f in json.loads(verdict.read_text())["regressions"]} == {"fake-mymodel-b1",
                                                                                "fake-mymodel-b3"}


def test_a_bad_model_file_is_one_usage_error(suite):
    (suite.path / "broken.onnx").write_bytes(b"not a model")
    result = suite.runpytest_subprocess("--mlexec-model=broken.onnx", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mlexec-model broken.onnx at batch 1: *"])
    result = suite.runpytest_subprocess("--mlexec-batches=0,x", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR

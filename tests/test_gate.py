"""The regression gate: its rules on hand-made figures, its verdict text, then end to end with
planted regressions (marked e2e: each runs pytest benchmarks/ in a subprocess)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, subprocess_env
from mlexec import baselines
from mlexec.suite import gate
from mlexec.timing import Interleaved


def run_with(peak, version="v1", case="mlp-b1-d256", engine="static"):
    return {"benchmarks": [{"name": f"test_forward[{engine}-{case}]", "fullname": "x",
                            "extra_info": {"case": case, "engine": engine, "version": version,
                                           "peak_bytes": peak}}]}


@pytest.mark.parametrize("before, after, regressed", [
    (72, 72, False), (72, 72 + 511, False), (72, 72 + 512, True), (72, 1024, True), (4096, 2048, False),
])
def test_memory_growth_of_half_a_kib_fails(before, after, regressed):
    assert (gate.memory_finding("static-mlp-b1-d256", before, after) is not None) is regressed
    verdict = gate.Verdict()
    gate.memory_findings(run_with(before), {("mlp-b1-d256", "static"): {"peak": after, "version": "v1"}}, verdict)
    assert verdict.failed is regressed and verdict.compared["memory-saved"] == ["static-mlp-b1-d256"]
    if regressed:
        (finding,) = verdict.regressions
        assert (finding.name, finding.baseline, finding.current) == ("static-mlp-b1-d256", before, after)


def test_other_workload_version_is_skipped_not_misread():
    verdict = gate.Verdict()
    gate.memory_findings(run_with(72, version="old"), {("mlp-b1-d256", "static"): {"peak": 10**6, "version": "new"}},
                         verdict)
    assert not verdict.failed and verdict.memory_compared == 0
    assert verdict.skipped["memory-saved"] == {"another workload version in the saved run": ["static-mlp-b1-d256"]}


def test_mann_whitney_matches_scipy():
    stats = pytest.importorskip("scipy.stats", reason="the reference implementation is SciPy's")
    rng = np.random.default_rng(7)
    for shift in (0.0, 0.02, 0.1):
        a = np.round(rng.normal(1 + shift, 0.05, 60), 3)     # rounded: ties, as timer ticks make
        b = np.round(rng.normal(1, 0.05, 45), 3)
        expected = stats.mannwhitneyu(a, b, alternative="greater", method="asymptotic").pvalue
        assert gate.mann_whitney_greater(a, b) == pytest.approx(expected, rel=1e-9)


def test_gate_imports_no_scipy():
    code = "import sys; import mlexec.suite.gate, mlexec.suite.plugin; print('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"


def measurements(*ratios, base=1e-3, rounds=15):
    """Fake A/B measurements: each with the given current/reference ratio and a little spread."""
    it = iter(ratios)

    def measure():
        r = next(it)
        b = tuple(base * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(rounds))
        return Interleaved(tuple(t * r for t in b), b)
    return measure


def test_persistent_slowdown_is_a_latency_regression():
    finding = gate.latency_finding("static-mlp-b1-d256", measurements(1.25, 1.25, 1.25))
    assert finding and finding.kind == "latency" and finding.ratio == pytest.approx(1.25, rel=0.01)
    assert finding.p_value < gate.ALPHA


@pytest.mark.parametrize("ratios", [(1.0,), (1.09,), (1.3, 1.0), (1.3, 1.3, 1.02)])
def test_noise_bursts_and_small_drifts_pass(ratios):
    assert gate.latency_finding("static-mlp-b1-d256", measurements(*ratios)) is None


def test_verdict_that_compared_nothing_says_so_and_why():
    verdict = gate.Verdict(reference="no reference code: /x is not a git checkout")
    for name in ("naive-mlp-b1-d256", "static-mlp-b1-d256"):
        verdict.skip("latency", name, verdict.reference)
    verdict.skip("memory", "torch-mlp-b1-d256", "engine 'torch' unavailable")
    text = gate.format_verdict(verdict)
    assert verdict.nothing_compared and not verdict.failed
    assert text.splitlines()[-1] == "NOTHING COMPARED: this run is not gated"
    assert ("latency A/B (2): no reference code: /x is not a git checkout: naive-mlp-b1-d256, static-mlp-b1-d256"
            in text)                                   # one line per reason, not one per benchmark
    assert "memory A/B (1): engine 'torch' unavailable: torch-mlp-b1-d256" in text


def test_verdict_round_trips_and_shards_merge():
    one, two = gate.Verdict(reference="code at abc", shard="1/2"), gate.Verdict(reference="code at abc", shard="2/2")
    one.done("memory", "static-mlp-b1-d256")
    two.done("latency", "planted-mlp-b1-d256", gate.Finding("planted-mlp-b1-d256", "latency", 1e-5, 1.3e-5, 1.3, 1e-9))
    two.skip("memory", "torch-mlp-b1-d256", "unavailable")
    again = [gate.Verdict.from_dict(json.loads(json.dumps(v.as_dict()))) for v in (two, one)]
    merged = gate.merge(again)
    assert merged.reference == "code at abc" and merged.failed
    assert (merged.memory_compared, merged.latency_compared) == (1, 1)
    assert merged.skipped["memory"] == {"unavailable": ["torch-mlp-b1-d256"]}
    assert "planted-mlp-b1-d256  latency" in gate.format_verdict(merged)
    assert "| `planted-mlp-b1-d256` | latency | 10.0 µs | 13.0 µs | 1.30x |" in gate.format_markdown(merged)


# --- end to end: pytest benchmarks/ in a subprocess ---------------------------

def bench(tmp_path, plant, *args):
    env = dict(subprocess_env(), MLEXEC_PLANT=plant)
    verdict = tmp_path / f"verdict-{plant}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider", "-p", "mlexec.suite.plants",
         "--mlexec-engines=static,planted", "-k", "mlp-b32-d256", "--benchmark-max-time=0.05",
         f"--mlexec-verdict={verdict}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    found = json.loads(verdict.read_text()) if verdict.exists() else None
    return proc, found


@pytest.mark.e2e
def test_planted_slowdown_fails_the_gate_and_unchanged_code_passes(tmp_path):
    proc, verdict = bench(tmp_path, "none", "--mlexec-pass=time", "--mlexec-compare=off", "--mlexec-base=.")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert verdict["latency_compared"] == 2 and not verdict["failed"]

    proc, verdict = bench(tmp_path, "slow", "--mlexec-pass=time", "--mlexec-compare=off", "--mlexec-base=.")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert [f["name"] for f in verdict["regressions"]] == ["planted-mlp-b32-d256"]
    assert verdict["regressions"][0]["kind"] == "latency" and verdict["regressions"][0]["ratio"] > 1.1
    section = proc.stdout[proc.stdout.index("regression gate"):]
    assert "planted-mlp-b32-d256  latency" in section and "benchmark:" not in section   # last, after the table


@pytest.mark.e2e
def test_planted_temporary_fails_the_gate_against_code_and_saved_run(tmp_path):
    store = tmp_path / "baselines"
    proc, _ = bench(tmp_path, "none", f"--mlexec-baselines={store}", "--mlexec-save", "--mlexec-base=off")
    assert proc.returncode == 0, proc.stdout[-2000:]
    [(path, saved)] = baselines.iter_runs(store)
    peaks = {b["extra_info"]["engine"]: b["extra_info"]["peak_bytes"] for b in saved["benchmarks"]}
    assert peaks["planted"] == peaks["static"] < 1024

    proc, verdict = bench(tmp_path, "temp", f"--mlexec-baselines={store}", "--mlexec-pass=memory",
                          "--mlexec-base=.")
    assert proc.returncode == 1
    found = {f["kind"]: f for f in verdict["regressions"]}
    assert set(found) == {"memory", "memory-saved"}          # against the code and the saved run
    for finding in found.values():
        assert finding["name"] == "planted-mlp-b32-d256"
        assert finding["current"] >= 32 * 256 * 4 > finding["baseline"]    # one (batch, dim) float32 copy
    assert "test_peak_memory[planted-mlp-b32-d256]" in proc.stdout     # the memray limit failed too
    assert baselines.iter_runs(store) == [(path, saved)]                # nothing overwritten


@pytest.mark.e2e
def test_corrupt_baseline_is_a_clear_error(tmp_path):
    bad = tmp_path / "baselines" / baselines.machine_id() / "0001_deadbeef.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"machine_info": {}, "benchmarks": [')
    proc, _ = bench(tmp_path, "none", f"--mlexec-baselines={tmp_path / 'baselines'}", "--mlexec-pass=time")
    assert proc.returncode == 4
    assert f"cannot gate: {bad}: invalid JSON (truncated?)" in proc.stdout
    assert bad.read_text() == '{"machine_info": {}, "benchmarks": ['

"""``mlexec report``: the engine x shape table, its ratios, its files, and the command line.

In-process on a tiny grid (mlp dim 64, batches 1 and 8, two rounds, a
millisecond block), plus two subprocess runs. Nothing here asserts a duration
or a speed: only that the ratios are the ones the measured medians give.
"""
import json
import platform
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import ROOT, subprocess_env
from engines import MODELS, EngineUnavailable
from engines.kernels import cpu_model
from mlexec import report, timing
from mlexec.case import Case
from mlexec.report import ReportError

ENGINES = ["naive", "static", "fused", "onnxruntime", "torch", "ghost"]
GRID = {"mlp": [Case("mlp", 1, 64), Case("mlp", 8, 64)]}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class GhostEngine:
    """Stands for a peer whose package is missing."""

    def __init__(self, model, max_batch):
        raise EngineUnavailable("ghost needs the 'ghost' package")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(report.ENGINES, "ghost", GhostEngine)
        built = report.run_report(["mlp"], ENGINES, grid=GRID, rounds=2, recheck_rounds=0, block_seconds=0.001,
                                   settle_seconds=0)
    out = tmp_path_factory.mktemp("report")
    paths, note = report.save(built, out)
    return built, paths, note


def measured(built):
    return [r for r in built["rows"] if not r.get("error")]


def test_every_available_engine_has_a_row_per_shape(result):
    built, _, _ = result
    missing = {u["engine"] for u in built["unavailable"]}
    assert "ghost" in missing
    ghosts = [u for u in built["unavailable"] if u["engine"] == "ghost"]
    assert len(ghosts) == 1 and ghosts[0]["reason"] == "ghost needs the 'ghost' package"   # once, not per shape
    expected = [(s.id, e) for s in GRID["mlp"] for e in ENGINES if e not in missing]
    assert [(r["case"], r["engine"]) for r in built["rows"]] == expected
    assert all(not r.get("error") for r in built["rows"]), built["rows"]
    table = report.format_table(built)
    assert table.count("unavailable: ghost: ghost needs") == 1
    for case_id, engine in expected:
        assert any(line.split()[:2] == [case_id, engine] for line in table.splitlines())


def test_ratios_pair_the_rounds(result):
    built, _, _ = result
    for case in GRID["mlp"]:
        rows = {r["engine"]: r for r in measured(built) if r["case"] == case.id}
        for r in rows.values():
            rounds = np.array(r["rounds_s"])
            assert len(rounds) == 2
            assert r["median_s"] == pytest.approx(float(np.median(rounds)), rel=1e-12)
            for ref in ("naive", "onnxruntime"):
                if ref not in rows:
                    assert r[f"vs_{ref}"] is None
                    continue
                per_round = np.array(rows[ref]["rounds_s"]) / rounds     # the same round's times
                assert r[f"vs_{ref}"] == pytest.approx(float(np.median(per_round)), rel=1e-12)
                assert r[f"vs_{ref}_iqr"] == pytest.approx(np.percentile(per_round, [25, 75]).tolist(), rel=1e-12)
            assert r["iqr_pct"] >= 0
        assert rows["naive"]["vs_naive"] == 1.0 and rows["naive"]["vs_naive_iqr"] == [1.0, 1.0]
        if "onnxruntime" in rows:
            assert rows["onnxruntime"]["vs_onnxruntime"] == 1.0


def test_roofline_fraction(result):
    built, _, _ = result
    roofs = report.Roofs(**built["roofs"])
    for r in measured(built):
        model = MODELS["mlp"](dim=r["dim"])
        roof_s = max(model.flops(r["batch"]) / (roofs.gflops * 1e9), model.weight_bytes / (roofs.gbytes_per_s * 1e9))
        assert r["roofline_s"] == pytest.approx(roof_s, rel=1e-12)
        assert r["roofline_fraction"] == pytest.approx(roof_s / r["median_s"], rel=1e-12)
        assert 0 < r["roofline_fraction"] <= 1.5, r


def test_files_png_markdown_json(result):
    built, paths, note = result
    names = {p.name for p in paths}
    assert {"report.md", "report.json"} <= names
    if note is None:                 # matplotlib installed (the "charts" extra)
        assert {"mlp.png", "mlp-grid.png"} <= names
        assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths if p.suffix == ".png")
    md = next(p for p in paths if p.name == "report.md").read_text()
    assert md.count("| mlp-b1-d64 |") == md.count("| mlp-b8-d64 |") == len(measured(built)) // 2
    assert "`ghost`: ghost needs" in md
    saved = json.loads(next(p for p in paths if p.name == "report.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(built["rows"]))


def test_parse_shapes_and_names():
    grid = report.parse_shapes("1x64, 8x64,2x32x8,1x64", ["mlp", "transformer"])     # a repeat is measured once
    assert grid == {"mlp": [Case("mlp", 1, 64), Case("mlp", 8, 64)], "transformer": [Case("transformer", 2, 32, 8)]}
    for text, models in [("1x64x8", ["mlp"]), ("1x", ["mlp"]), ("8x64", ["mlp", "transformer"])]:
        with pytest.raises(ReportError):
            report.parse_shapes(text, models)
    with pytest.raises(ReportError, match="unknown engine 'nope'"):
        report.parse_names("naive,nope", report.ENGINES, "engine")
    with pytest.raises(ReportError, match="expected --rounds"):
        report.run_report(["mlp"], ["naive"], grid=GRID, rounds=0)


def mlexec(*args):
    return subprocess.run([sys.executable, "-m", "mlexec", "report", *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)


def test_cli_quick_report(tmp_path):
    proc = mlexec("--quick", "--engines", "naive,fused", "--shapes", "1x64,8x64",     # mlp, from the shapes
                  "--rounds", "1", "--recheck-rounds", "0", "--block-seconds", "0.001", "--settle-seconds", "0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"CPU: {cpu_model()}; kernel tuning ")
    assert lines[1].startswith("roofs: matmul ")
    if platform.libc_ver()[0] == "glibc":      # the process measured with its heap pinned (mlexec.heap)
        assert lines[1].endswith("heap: glibc malloc pinned: no trimming, mmap from 32 MiB")
    # stderr is a pipe here: a line per point, not a redrawn one
    assert proc.stderr.splitlines() == ["report: 0/2 mlp-b1-d64", "report: 1/2 mlp-b8-d64"]
    assert json.loads((tmp_path / "report.json").read_text())["cpu"] == cpu_model()
    assert (tmp_path / "report.md").read_text().startswith(f"# Engine report: {cpu_model()}\n")
    rows = [line.split() for line in lines if line.startswith("mlp-")]
    expected = [(s, e) for s in ("mlp-b1-d64", "mlp-b8-d64") for e in ("naive", "fused")]
    assert [(r[0], r[1]) for r in rows] == expected
    assert lines[-1].startswith("saved: ") and str(tmp_path / "report.md") in lines[-1]
    verdicts = lines[lines.index("targets (mlexec/targets.py):") + 1:-2]
    assert [v.split("] ")[1].split(":")[0] for v in verdicts] == [
        "fused >= naive at every point", "fused >= 1.3x naive at batch <= 8, dim <= 256"]
    assert all(v.startswith(("  [met] ", "  [MISSED] ")) for v in verdicts)
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--engines", "nope"], "unknown engine 'nope'"),
    (["--models", "mlp,resnet"], "unknown model 'resnet'"),
    (["--models", "mlp", "--shapes", "1x64x8"], "transformer shape"),
    (["--models", "mlp", "--settle-seconds", "nan"], "expected --settle-seconds in 0.0..10.0, got nan"),
    (["--models", "mlp", "--settle-seconds", "-1"], "expected --settle-seconds"),
    (["--models", "mlp", "--recheck-rounds", "-1"], "expected --recheck-rounds in 0..200, got -1"),
])
def test_cli_bad_input_is_one_line(args, message):
    proc = mlexec("--quick", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("mlexec: error: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_close_calls_get_more_rounds_and_are_judged_on_all(monkeypatch):
    seen = []

    def close_calls(rows):
        seen.append({(r["case"], r["engine"]): len(r["rounds_s"]) for r in rows})
        return ["mlp-b8-d64"]

    monkeypatch.setattr(report.targets, "close_calls", close_calls)
    kwargs = dict(grid=GRID, rounds=2, block_seconds=0.001, settle_seconds=0,
                  roofs=report.Roofs(gflops=100.0, gbytes_per_s=10.0))
    built = report.run_report(["mlp"], ["naive", "static"], recheck_rounds=3, **kwargs)
    first = {(s.id, e): 2 for s in GRID["mlp"] for e in ("naive", "static")}
    assert seen == [first]                               # judged once, on the first pass
    assert {(r["case"], r["engine"]): len(r["rounds_s"]) for r in built["rows"]} == {**first, ("mlp-b8-d64", "naive"): 5,
                                                                                       ("mlp-b8-d64", "static"): 5}
    b8 = {r["engine"]: r for r in built["rows"] if r["case"] == "mlp-b8-d64"}
    per_round = np.array(b8["naive"]["rounds_s"]) / np.array(b8["static"]["rounds_s"])
    assert b8["static"]["vs_naive"] == pytest.approx(float(np.median(per_round)), rel=1e-12)
    assert built["rechecked"] == ["mlp-b8-d64"]
    assert "2 interleaved round(s) per shape, 5 at the close call(s) mlp-b8-d64;" in report.format_table(built)

    built = report.run_report(["mlp"], ["naive", "static"], recheck_rounds=0, **kwargs)
    assert len(seen) == 1 and built["rechecked"] == []
    assert {len(r["rounds_s"]) for r in built["rows"]} == {2}


def test_an_engine_wrong_when_measured_again_is_reported_not_timed(monkeypatch):
    built_engines = []

    class WrongTheSecondTime:
        def __init__(self, model, max_batch):
            self.right = report.ENGINES["naive"](model, max_batch)
            built_engines.append(self)

        def forward(self, x):
            return self.right.forward(x) + (len(built_engines) > 1)

    monkeypatch.setitem(report.ENGINES, "flaky", WrongTheSecondTime)
    monkeypatch.setattr(report.targets, "close_calls", lambda rows: ["mlp-b1-d16"])
    built = report.run_report(["mlp"], ["naive", "flaky"], grid={"mlp": [Case("mlp", 1, 16)]}, rounds=2,
                              recheck_rounds=2, block_seconds=0.001, settle_seconds=0,
                              roofs=report.Roofs(gflops=100.0, gbytes_per_s=10.0))
    rows = {r["engine"]: r for r in built["rows"]}
    assert len(built_engines) == 2 and list(rows) == ["naive", "flaky"]
    assert "max abs error" in rows["flaky"]["error"] and "median_s" not in rows["flaky"]
    assert len(rows["naive"]["rounds_s"]) == 4 and built["rechecked"] == ["mlp-b1-d16"]


def test_wrong_result_is_reported_not_timed(monkeypatch):
    class Broken:
        def __init__(self, model, max_batch):
            self.shape = model.output_shape(max_batch)

        def forward(self, x):
            return np.zeros(self.shape, dtype=np.float32)

    monkeypatch.setitem(report.ENGINES, "broken", Broken)
    built = report.run_report(["mlp"], ["naive", "broken"], grid={"mlp": [Case("mlp", 1, 16)]}, rounds=1,
                              block_seconds=0.001, settle_seconds=0,
                              roofs=report.Roofs(gflops=100.0, gbytes_per_s=10.0))
    rows = {r["engine"]: r for r in built["rows"]}
    assert rows["naive"]["vs_naive"] == 1.0 and rows["naive"]["vs_onnxruntime"] is None
    assert "max abs error" in rows["broken"]["error"] and "median_s" not in rows["broken"]
    assert "max abs error" in report.format_table(built) and "max abs error" in report.format_markdown(built)


@pytest.mark.parametrize("n", range(1, 9))
def test_round_order_balances_first_places_and_predecessors(n):
    # A rotation keeps every engine behind the same predecessor; a Williams design varies it.
    cycle = n if n % 2 == 0 else 2 * n
    rows = [timing.round_order(n, r) for r in range(cycle)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    assert Counter(row[0] for row in rows) == {i: cycle // n for i in range(n)}
    pairs = Counter(pair for row in rows for pair in zip(row, row[1:]))
    if n > 1:
        assert set(pairs) == {(a, b) for a in range(n) for b in range(n) if a != b}
        assert set(pairs.values()) == {cycle // n}


def test_quick_means_few_rounds_unless_told_otherwise(monkeypatch, tmp_path):
    """--quick: the models' quick points with QUICK_TIMING; an explicit option still wins."""
    from mlexec.cli import build_parser
    seen = {}

    def fake(models, names, **kwargs):
        seen.update(kwargs, models=models)
        raise SystemExit(0)

    monkeypatch.setattr(report, "run_report", fake)
    for argv, expected in [(["--quick"], report.QUICK_TIMING), ([], report.TIMING),
                           (["--quick", "--rounds", "5"], {**report.QUICK_TIMING, "rounds": 5})]:
        seen.clear()
        with pytest.raises(SystemExit):
            report.main(build_parser().parse_args(["report", *argv, "--out", str(tmp_path)]))
        assert {k: seen[k] for k in expected} == expected
        assert seen["models"] == list(report.DEFAULT_MODELS)


def test_shapes_alone_pick_their_models():
    assert report.parse_shapes("1x256,8x256", None) == {"mlp": [Case("mlp", 1, 256), Case("mlp", 8, 256)]}
    assert list(report.parse_shapes("1x256x64,1x256", None)) == ["transformer", "mlp"]
    with pytest.raises(ReportError, match="expected at least one shape"):
        report.parse_shapes(" , ", None)


def test_openblas_line_without_threadpoolctl(monkeypatch):
    """The last thing a report asks is which OpenBLAS kernels ran: with only NumPy installed
    (threadpoolctl comes with the bench extra) it says so instead of failing minutes of timing."""
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)     # import raises ImportError
    assert report._openblas_kernels() == "not known (threadpoolctl is not installed)"


def test_threads_limits_every_pool_the_engines_use_and_says_so():
    """``--threads 1``: MKL's pool (loaded by packed after the limit began) and OpenMP's (oneDNN's)
    run one thread too, and the report says 1, not the pools' size outside the limit."""
    from threadpoolctl import threadpool_info
    seen = []
    real = report.measuring._build

    def build(name, *args):
        engine = real(name, *args)
        seen.append({p["internal_api"]: p["num_threads"] for p in threadpool_info()})
        return engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report.measuring, "_build", build)
        built = report.run_report(["mlp"], ["naive", "packed", "onednn"], grid={"mlp": [Case("mlp", 1, 16)]}, rounds=1,
                                   recheck_rounds=0, block_seconds=0.001, settle_seconds=0, threads=1)
    assert built["threads"] == 1 and seen and all(set(pools.values()) == {1} for pools in seen), seen


SPEEDUP = {(1, 256): 1.5, (8, 256): 2.5, (1, 1024): 0.5}


def test_the_heat_map_has_a_cell_for_every_point_and_reference():
    """Each engine's panel against each reference holds its median ratio at the point's batch
    (column) and dim (row); an engine has no panel against itself; an unmeasured point is blank."""
    pytest.importorskip("matplotlib", reason="charts are the 'charts' extra")
    from mlexec.report.output import _heatmap
    rows = [{"model": "mlp", "case": f"mlp-b{b}-d{d}", "batch": b, "dim": d, "seq": None, "engine": e,
             "vs_naive": 1.0 if e == "naive" else SPEEDUP[(b, d)], "vs_onnxruntime": 2.0, "error": None}
            for e in ("naive", "fused") for b, d in ((1, 256), (8, 256), (1, 1024))]
    fig = _heatmap({"engines": ["naive", "fused"], "rows": rows}, "mlp")
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(panels) == {"naive vs onnxruntime", "fused vs naive", "fused vs onnxruntime"}
    grid = panels["fused vs naive"].get_images()[0].get_array()
    assert grid.shape == (2, 2)                                        # d256, d1024 x b1, b8
    assert (grid[0, 0], grid[0, 1], grid[1, 0]) == (1.5, 2.5, 0.5)
    assert np.ma.is_masked(grid[1, 1]) or np.isnan(grid[1, 1])          # b8 d1024: not measured
    labels = sorted(t.get_text() for t in panels["fused vs onnxruntime"].texts)
    assert labels == ["2.00"] * 3


def test_no_heat_map_without_naive_or_onnx_runtime():
    """A run of engines none of which is compared with naive or ONNX Runtime (``--engines
    int8,onnxruntime-int8``) has no heat map, and saving its report does not fail."""
    pytest.importorskip("matplotlib", reason="charts are the 'charts' extra")
    from mlexec.report.output import _heatmap
    rows = [{"model": "mlp", "case": "mlp-b1-d256", "batch": 1, "dim": 256, "seq": None, "engine": e,
             "vs_naive": None, "vs_onnxruntime": None, "error": None} for e in ("int8", "onednn")]
    assert _heatmap({"engines": ["int8", "onednn"], "rows": rows}, "mlp") is None

"""History: series per benchmark, step changes, version segments, table and charts."""
from conftest import FIXTURES
import shutil

from conftest import ROOT
from mlexec.history import (MEMORY_FLOOR_BYTES, Point, collect, find_steps, format_text, page_context,
                            render_charts, write_site)


def points(values, versions=None):
    versions = versions or [1] * len(values)
    return [Point(f"c{i}", f"{i:04d}_r.json", v, None, ver) for i, (v, ver) in enumerate(zip(values, versions))]


def steps(pts, metric="median"):
    return {i: p.step[metric] for i, p in enumerate(pts) if metric in p.step}


def test_persistent_step_is_flagged_once():
    pts = points([1.0, 1.02, 0.98, 1.5, 1.52, 1.49, 1.5])
    find_steps(pts)
    assert steps(pts) == {3: "up"}


def test_single_outlier_is_not_a_step():
    pts = points([1.0, 1.01, 2.0, 1.0, 0.99, 1.0])
    find_steps(pts)
    assert steps(pts) == {}


def test_newest_point_jump_is_unconfirmed():
    pts = points([1.0, 1.0, 1.0, 0.5])
    find_steps(pts)
    assert steps(pts) == {3: "new-down"}


def test_version_change_is_not_compared():
    pts = points([1.0, 1.0, 1.0, 3.0, 3.0, 3.0], versions=[1, 1, 1, 2, 2, 2])
    find_steps(pts)
    assert steps(pts) == {}


def test_threshold_is_respected():
    pts = points([1.0, 1.0, 1.15, 1.15, 1.15])
    find_steps(pts, threshold=0.2)
    assert steps(pts) == {}
    find_steps(pts, threshold=0.1)
    assert steps(pts) == {2: "up"}


def test_memory_step_needs_the_gates_floor():
    from mlexec.suite.gate import MEMORY_GROWTH_BYTES

    assert MEMORY_FLOOR_BYTES == MEMORY_GROWTH_BYTES
    small = [Point(f"c{i}", "f", 1.0, b, 1) for i, b in enumerate([72, 72, 72, 96, 96, 96])]
    assert find_steps(small) == []
    large = [Point(f"c{i}", "f", 1.0, b, 1) for i, b in enumerate([4096, 4096, 4096, 8192, 8192, 8192])]
    [step] = find_steps(large)
    assert (step.metric, step.index, step.before, step.after, step.confirmed) == ("peak_bytes", 3, 4096, 8192, True)


def test_collect_fixtures_text_and_charts(tmp_path):
    history = collect(FIXTURES / "baselines", "Linux-CPython-3.11-64bit")
    [machine] = history.machines
    assert machine.commits == ["a1b2c3d4", "b2c3d4e5", "c3d4e5f6", "d4e5f6a7", "e5f6a7b8"]
    by_engine = {s.name.split("[")[-1].rstrip("]"): s for s in machine.series}
    assert steps(by_engine["arena"].points) == {2: "down"}
    assert steps(by_engine["naive"].points) == {}   # its last point has a new workload version
    assert [p.peak_bytes for p in by_engine["naive"].points] == [4096] * 5
    text = format_text(history)
    assert "500.0 µs → 290.0 µs" in text and "new version" in text
    assert "test_fwd[arena]  latency  b2c3d4e5   c3d4e5f6  505.0 µs → 300.0 µs" in text
    assert max(len(line) for line in text.splitlines()) <= 120
    paths = render_charts(history, tmp_path, fmt="svg")
    assert len(paths) == 1 and "<svg" in paths[0].read_text()


def test_short_names_grouping_and_width_on_the_saved_runs():
    history = collect(ROOT / "baselines")
    machine = history.machine(None)
    shorts = [s.short for s in machine.series]
    assert "arena · mlp · b1 · d1024" in shorts and "torch · transformer · b8 · d256 · s64" in shorts
    models = [s.model for s in machine.series]
    assert models == sorted(models, key=["mlp", "mlp-deep", "transformer"].index)   # grouped by model
    assert all(machine.commits[p.x] == p.commit for s in machine.series for p in s.points)   # one commit axis
    assert max(len(line) for line in format_text(history).splitlines()) <= 120


def test_a_truncated_file_is_skipped_and_named(tmp_path):
    shutil.copytree(FIXTURES / "baselines", tmp_path / "b")
    (tmp_path / "b" / "Linux-CPython-3.11-64bit" / "0006_bad.json").write_text(
        (FIXTURES / "invalid" / "truncated.json").read_text())
    history = collect(tmp_path / "b")
    assert len(history.machines) == 2 and len(history.machines[0].commits) == 5
    [skipped] = history.skipped
    assert "0006_bad.json: invalid JSON (truncated?)" in skipped
    assert format_text(history).startswith("skipped ")
    assert page_context(history, "Linux-CPython-3.11-64bit")["skipped"] == [skipped]


def test_static_site_has_a_page_per_machine(tmp_path):
    written = write_site(collect(FIXTURES / "baselines"), tmp_path)
    assert sorted(p.name for p in written) == sorted(["history.css", "history.js", "index.html",
                                                      "machine-Linux-CPython-3.11-64bit.html",
                                                      "machine-other-machine.html"])
    index = (tmp_path / "index.html").read_text()
    assert index.count('<figure class="chart"') == 2 and "<script>" not in index and "style=" not in index
    assert 'href="machine-' in index and 'src="history.js"' in index

"""History: series per benchmark, step changes, version segments, table and charts."""
from conftest import FIXTURES
from mlexec.history import Point, collect, find_steps, format_table, render_charts


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


def test_collect_fixtures_table_and_charts(tmp_path):
    commits, series = collect(FIXTURES / "baselines", "Linux-CPython-3.11-64bit")
    assert commits == ["a1b2c3d4", "b2c3d4e5", "c3d4e5f6", "d4e5f6a7", "e5f6a7b8"]
    by_engine = {s.name.split("[")[-1].rstrip("]"): s for s in series}
    assert steps(by_engine["arena"].points) == {2: "down"}
    assert steps(by_engine["naive"].points) == {}   # its last point has a new workload version
    assert [p.peak_bytes for p in by_engine["naive"].points] == [4096] * 5
    table = format_table(commits, series)
    assert "300.0 us" in table and "v / 64 B" in table and "[v2]" in table
    paths = render_charts(series, tmp_path, fmt="svg")
    assert len(paths) == 1 and "<svg" in paths[0].read_text()

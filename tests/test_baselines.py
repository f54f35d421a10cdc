"""Saved pytest-benchmark runs: loading, validation, listing and never-overwriting saves."""
import json
import threading

import pytest

from conftest import FIXTURES
from mlexec.baselines import BaselineError, iter_runs, load_run, save_run

MACHINE = "Linux-CPython-3.11-64bit"


def test_load_real_pytest_benchmark_file():
    run = load_run(FIXTURES / "template_run.json")
    assert {b["params"]["engine"] for b in run["benchmarks"]} == {"naive", "arena"}
    assert all("median" in b["stats"] for b in run["benchmarks"])


@pytest.mark.parametrize("name, message", [
    ("corrupt.json", "invalid JSON"),
    ("truncated.json", "invalid JSON (truncated?)"),
    ("missing_median.json", "stats.median should be a number"),
    ("missing_commit_info.json", "missing key 'commit_info'"),
])
def test_invalid_files_name_the_file(name, message):
    path = FIXTURES / "invalid" / name
    with pytest.raises(BaselineError) as info:
        load_run(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(BaselineError, match="nothere.json: cannot read"):
        load_run(tmp_path / "nothere.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(BaselineError, match="empty.json: empty file"):
        load_run(tmp_path / "empty.json")


def test_iter_runs_sorted_and_filtered():
    runs = iter_runs(FIXTURES / "baselines")
    assert [(p.parent.name, p.name) for p, _ in runs][:5] == [(MACHINE, f"000{i}_run.json") for i in range(1, 6)]
    assert len(runs) == 6
    only = iter_runs(FIXTURES / "baselines", "other-machine")
    assert [p.parent.name for p, _ in only] == ["other-machine"]
    assert iter_runs(FIXTURES / "does-not-exist") == []


def test_save_numbers_files_and_never_overwrites(tmp_path):
    run = load_run(FIXTURES / "template_run.json")
    first = save_run(run, tmp_path, "m1", "bench")
    second = save_run(run, tmp_path, "m1", "bench")
    assert (first.name, second.name) == ("0001_bench.json", "0002_bench.json")
    assert load_run(first) == run
    (tmp_path / "m1" / "0007_other.json").write_text(json.dumps(run))
    assert save_run(run, tmp_path, "m1", "bench").name == "0008_bench.json"
    assert not [p for p in (tmp_path / "m1").iterdir() if p.name.startswith(".tmp")]


def test_concurrent_saves_get_distinct_files(tmp_path):
    run = load_run(FIXTURES / "template_run.json")
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(save_run(run, tmp_path, "m", "r"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 8 and len(list((tmp_path / "m").glob("*.json"))) == 8


def test_save_refuses_bad_runs_and_names(tmp_path):
    run = load_run(FIXTURES / "template_run.json")
    with pytest.raises(BaselineError, match="missing key 'benchmarks'"):
        save_run({k: v for k, v in run.items() if k != "benchmarks"}, tmp_path, "m", "x")
    with pytest.raises(BaselineError, match="machine_id must match"):
        save_run(run, tmp_path, "../escape", "x")
    with pytest.raises(BaselineError, match="name must match"):
        save_run(run, tmp_path, "m", "a/b")
    assert not (tmp_path / "m").exists() or not list((tmp_path / "m").iterdir())

"""Saved pytest-benchmark runs: loading, validation, listing and never-overwriting saves."""
import json
import multiprocessing
import os
import signal
import threading
import time

import pytest

from conftest import FIXTURES
from mlexec.baselines import BaselineError, iter_runs, load_run, remove_stale_temps, save_run

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


def _save_five(root, start, index):
    run = load_run(FIXTURES / "template_run.json")
    start.wait()
    for i in range(5):
        save_run(run, root, "m", f"p{index}-{i}")


def test_concurrent_processes_get_distinct_numbers(tmp_path):
    """20 processes x 5 saves into one folder: 100 files, 100 distinct run numbers."""
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_save_five, args=(tmp_path, start, i)) for i in range(20)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 20
    files = sorted((tmp_path / "m").glob("*.json"))
    assert len(files) == 100
    assert sorted(int(f.name[:4]) for f in files) == list(range(1, 101))
    assert len(iter_runs(tmp_path)) == 100
    assert not list((tmp_path / "m").glob(".tmp-*"))


def test_stale_temp_files_are_removed_live_ones_kept(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    dead = multiprocessing.get_context("fork").Process(target=lambda: None)
    dead.start()
    dead.join()
    killed = folder / f".tmp-{dead.pid}-abc.json.part"          # a save SIGKILLed mid-write
    live = folder / f".tmp-{os.getpid()}-def.json.part"         # a save in progress
    old = folder / f".tmp-{os.getpid()}-old.json.part"          # a live pid's, but a day old
    for path in (killed, live, old):
        path.write_text("{")
    os.utime(old, (time.time() - 86400,) * 2)
    save_run(load_run(FIXTURES / "template_run.json"), tmp_path, "m", "r")
    assert sorted(p.name for p in folder.glob(".tmp-*")) == [live.name]
    assert remove_stale_temps(folder, max_age=-1) == [live]


def test_sigkill_mid_save_leaves_a_temp_the_next_save_removes(tmp_path):
    ctx = multiprocessing.get_context("fork")
    run = load_run(FIXTURES / "template_run.json")
    run["benchmarks"] = run["benchmarks"] * 20000              # a few tens of MB: slow to write
    proc = ctx.Process(target=save_run, args=(run, tmp_path, "m", "big"))
    proc.start()
    folder = tmp_path / "m"
    deadline = time.monotonic() + 30
    while not list(folder.glob(".tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    left = list(folder.glob(".tmp-*"))
    assert left and not list(folder.glob("*.json"))
    save_run(load_run(FIXTURES / "template_run.json"), tmp_path, "m", "small")
    assert not list(folder.glob(".tmp-*")) and [p.name for p in folder.glob("*.json")] == ["0001_small.json"]


def test_iter_runs_skips_and_names_bad_files_when_asked(tmp_path):
    run = load_run(FIXTURES / "template_run.json")
    for name in ("a", "b"):
        save_run(run, tmp_path, "m", name)
    bad = tmp_path / "m" / "0003_cut.json"
    bad.write_text(json.dumps(run)[:200])
    with pytest.raises(BaselineError, match="0003_cut.json"):          # the gate's way: refuse
        iter_runs(tmp_path)
    errors = []
    assert [p.name for p, _ in iter_runs(tmp_path, errors=errors)] == ["0001_a.json", "0002_b.json"]
    assert len(errors) == 1 and str(bad) in str(errors[0]) and "invalid JSON" in str(errors[0])

"""What happens around the benchmarks: results per case, memory peaks, the run's JSON,
the gate against a reference run, saving, and the terminal report."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlexec import baselines
from . import gate, summary

RESULTS = pytest.StashKey[dict]()    # (case id, engine) -> {"median", "peak", "err"}
VERDICT = pytest.StashKey[tuple]()   # (label, gate.Verdict) or (label, error message)
SAVED = pytest.StashKey[Path]()


def record(config, case_id: str, engine: str, **fields) -> None:
    config.stash.setdefault(RESULTS, {}).setdefault((case_id, engine), {}).update(fields)


def record_peak(item) -> None:
    """Copy pytest-memray's measured peak of a memory test into the results."""
    manager = item.config.pluginmanager.get_plugin("memray_manager")
    result = manager.results.get(item.nodeid) if manager else None
    if result is not None:
        params = item.callspec.params
        record(item.config, params["case"].id, params["engine_name"], peak=result.peak_memory)


def attach_peaks(config, output_json: dict) -> None:
    """Each benchmark's measured peak bytes go beside its timings, in one JSON file."""
    results = config.stash.get(RESULTS, {})
    for bench in output_json["benchmarks"]:
        info = bench.setdefault("extra_info", {})
        peak = results.get((info.get("case"), info.get("engine")), {}).get("peak")
        if peak is not None:
            info["peak_bytes"] = peak


def current_run(config) -> dict | None:
    bs = getattr(config, "_benchmarksession", None)
    if bs is None or bs.disabled or not bs.benchmarks:
        return None
    commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
    config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
    run = config.hook.pytest_benchmark_generate_json(
        config=config, benchmarks=bs.benchmarks, include_data=False,
        machine_info=bs.get_machine_info(), commit_info=commit_info)
    config.hook.pytest_benchmark_update_json(config=config, benchmarks=bs.benchmarks, output_json=run)
    return run


def _reference(config, machine: str):
    choice = config.getoption("mlexec_compare")
    if choice == "off":
        return None
    if choice != "auto":
        return choice, baselines.load_run(choice)
    runs = baselines.iter_runs(config.getoption("mlexec_baselines"), machine_id=machine)
    if not runs:
        return None
    path, run = runs[-1]
    return str(path), run


def finish(session, machine: str) -> None:
    config = session.config
    run = current_run(config)
    if run is None:
        return
    try:
        reference = _reference(config, machine)
    except baselines.BaselineError as exc:
        config.stash[VERDICT] = ("baseline", f"cannot gate: {exc}")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    if reference is not None:
        label, ref_run = reference
        verdict = gate.compare(ref_run, run)
        config.stash[VERDICT] = (label, verdict)
        if verdict.failed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if config.getoption("mlexec_save") and session.exitstatus == 0:
        name = (run["commit_info"].get("id") or "nocommit")[:12]
        if run["commit_info"].get("dirty"):
            name += "-dirty"
        config.stash[SAVED] = baselines.save_run(run, config.getoption("mlexec_baselines"), machine, name)


def report(tr, config) -> None:
    results = config.stash.get(RESULTS, {})
    if results:
        tr.write_sep("=", "engines compared")
        tr.write_line("alloc/fwd: memray peak of warm forwards, BLAS pinned to 1 thread; held: planned "
                      "activation buffers; median: pytest-benchmark; speedup and mem saved: vs naive")
        tr.write_line(summary.format_table(results))
    if VERDICT in config.stash:
        label, verdict = config.stash[VERDICT]
        tr.write_sep("=", "regression gate")
        tr.write_line(verdict if isinstance(verdict, str) else gate.format_verdict(verdict, label))
    if SAVED in config.stash:
        tr.write_line(f"saved this run as {config.stash[SAVED]}")

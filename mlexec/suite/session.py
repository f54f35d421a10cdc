"""What happens around the benchmarks: results per case, memory peaks, the run's JSON,
the gate, saving, and the terminal report."""
from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
from memray import FileReader
from threadpoolctl import threadpool_limits

from engines import ENGINES
from mlexec import baselines
from . import basecode, gate, summary
from .grid import MATRICES, workload_version
from .ratio import interleave

RESULTS = pytest.StashKey[dict]()      # (case id, engine) -> {"median", "peak", "held", "err", ...}
VERDICT = pytest.StashKey[tuple]()     # (label, gate.Verdict | error message)
SAVED = pytest.StashKey[Path]()
# Engine name -> reference engine name, for throw-away engines that exist only in this run.
BASE_ALIASES = pytest.StashKey[dict]()
REPO = Path(__file__).resolve().parents[2]


def record(config, case_id: str, engine: str, **fields) -> None:
    config.stash.setdefault(RESULTS, {}).setdefault((case_id, engine), {}).update(fields)


def record_peak(item) -> None:
    """The memory test's peak, counted as its limit_memory marker counts it (same threads)."""
    manager = item.config.pluginmanager.get_plugin("memray_manager")
    result = manager.results.get(item.nodeid) if manager else None
    marker = item.get_closest_marker("limit_memory")
    if result is None or marker is None:
        return
    main_only = marker.kwargs.get("current_thread_only", False)
    reader = FileReader(result.result_file)
    peak = sum(r.size for r in reader.get_high_watermark_allocation_records(merge_threads=not main_only)
               if not main_only or r.tid == reader.metadata.main_thread_id)
    params = item.callspec.params
    record(item.config, params["case_id"], params["engine_name"], peak=peak)


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


def _reference_run(config, machine: str):
    choice = config.getoption("mlexec_compare")
    if choice == "off":
        return None
    if choice != "auto":
        return choice, baselines.load_run(choice)
    runs = baselines.iter_runs(config.getoption("mlexec_baselines"), machine_id=machine)
    return (str(runs[-1][0]), runs[-1][1]) if runs else None


def _head_commit() -> tuple[str | None, bool]:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "engines"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head, bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        return None, True


def _measurement(make_current, make_reference, x, rounds):
    """Each measurement builds both engines afresh, in alternating order: where buffers land
    (cache sets, page offsets) can make identical code differ by 10-15 % for the life of
    an instance, and that must not persist into the confirmations the way a regression does."""
    count = itertools.count()

    def measure():
        if next(count) % 2:
            reference, current = make_reference(), make_current()
        else:
            current, reference = make_current(), make_reference()
        return interleave(lambda: current.forward(x), lambda: reference.forward(x), min_rounds=rounds)
    return measure


def _latency_ab(config, source: str, verdict: gate.Verdict) -> None:
    """Every timed benchmark of this run, current engine against the reference code's."""
    head, dirty = _head_commit()
    if head and not dirty and head.startswith(source):
        verdict.notes.append(f"latency: the reference code is this commit ({source}); nothing to compare")
        return
    try:
        label, directory = basecode.resolve(source, REPO)
        base = basecode.load(directory)
    except basecode.BaseCodeError as exc:
        verdict.notes.append(f"latency not gated: {exc}")
        return
    aliases = config.stash.get(BASE_ALIASES, {})
    timed = {key for key, r in config.stash.get(RESULTS, {}).items() if r.get("median") is not None}
    cases = {c.id: c for c in MATRICES[config.getoption("mlexec_matrix")]}
    rounds = config.getoption("mlexec_rounds")
    for case_id in dict.fromkeys(case for case, _ in timed):
        case = cases[case_id]
        model = case.build()
        try:
            base_model = base.MODELS[case.model](**case.model_kwargs, seed=0)
        except (KeyError, TypeError, ValueError):
            base_model = None
        x = model.random_input(case.batch, rng=12345)
        for engine in [e for c, e in timed if c == case_id]:
            name = f"{engine}-{case_id}"
            base_cls = base.ENGINES.get(aliases.get(engine, engine))
            if base_model is None or base_cls is None:
                verdict.notes.append(f"latency: {name} has no counterpart in {label}")
                continue
            if workload_version(case_id, base_model) != case.version:
                verdict.stale.append(name)
                continue
            with threadpool_limits(1):
                finding = gate.latency_finding(name, _measurement(
                    lambda: ENGINES[engine](model, case.batch), lambda: base_cls(base_model, case.batch), x, rounds))
            verdict.latency_compared += 1
            if finding:
                verdict.regressions.append(finding)
    verdict.notes.insert(0, f"latency reference code: {label}")


def finish(session, machine: str) -> None:
    config = session.config
    results = config.stash.get(RESULTS, {})
    if not results:
        return
    run = current_run(config)
    try:
        reference = _reference_run(config, machine)
    except baselines.BaselineError as exc:
        config.stash[VERDICT] = ("baseline", f"cannot gate: {exc}")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    source = config.getoption("mlexec_base") or (reference and reference[1]["commit_info"].get("id"))
    if reference or source:
        verdict = gate.Verdict()
        label = reference[0] if reference else f"code at {source}"
        if reference:
            cases = {c.id: c for c in MATRICES[config.getoption("mlexec_matrix")]}
            current = {key: {"peak": r.get("peak"), "version": cases[key[0]].version}
                       for key, r in results.items() if key[0] in cases}
            gate.memory_findings(reference[1], current, verdict)
        if source:
            _latency_ab(config, source, verdict)
        config.stash[VERDICT] = (label, verdict)
        path = config.getoption("mlexec_verdict")
        if path:
            Path(path).write_text(json.dumps({"reference": label, **verdict.as_dict()}, indent=1))
        if verdict.failed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if config.getoption("mlexec_save") and session.exitstatus == 0 and run is not None:
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

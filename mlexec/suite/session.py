"""What happens around the benchmarks: results per case, memory peaks, the run's JSON,
the gate, saving, and the terminal report. Called from ``mlexec.suite.plugin``."""
from __future__ import annotations

import itertools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from threadpoolctl import threadpool_limits

from engines import ENGINES
from mlexec import baselines
from ..case import workload_version
from ..timing import interleave
from . import basecode, gate, summary
from .memory import allocation_environment, high_watermark, measure_peak

RESULTS = pytest.StashKey[dict]()      # (case id, engine) -> {"median", "peak", "held", "err", ...}
PLANNED = pytest.StashKey[dict]()      # (pass, case id, engine) -> True: what this run set out to measure
CASES = pytest.StashKey[dict]()        # case id -> Case, every case of the chosen matrix
VERDICT = pytest.StashKey[object]()    # gate.Verdict, or an error message
SAVED = pytest.StashKey[Path]()
# Engine name -> reference engine name, for throw-away engines that exist only in this run.
BASE_ALIASES = pytest.StashKey[dict]()
COSTS = pytest.StashKey[dict]()        # (engine, case id) -> seconds this run spent on the pair
PASSES = {"test_forward": "time", "test_peak_memory": "memory"}
ALLOCATION_KEY = "mlexec_allocation"   # machine_info key of a run's allocation environment


def record(config, case_id: str, engine: str, **fields) -> None:
    config.stash.setdefault(RESULTS, {}).setdefault((case_id, engine), {}).update(fields)


def record_cost(config, engine: str, case_id: str, seconds: float) -> None:
    """Add ``seconds`` to what one engine x case pair cost this run: its tests' set-up, call and
    teardown, and its A/B measurements in the gate (what ``grid.measured_costs`` balances)."""
    costs = config.stash.setdefault(COSTS, {})
    costs[engine, case_id] = costs.get((engine, case_id), 0.0) + seconds


def write_costs(config, path: Path) -> None:
    """This run's cost per pair as JSON: {"cpu", "matrix", "seconds": {"ENGINE CASE": s}}."""
    costs = config.stash.get(COSTS, {})
    write_json(path, {"cpu": this_cpu(), "matrix": config.getoption("mlexec_matrix"),
                      "seconds": {f"{e} {c}": round(s, 3) for (e, c), s in sorted(costs.items())}})


def record_outcome(item, report) -> None:
    """Why a benchmark has no figure: it was skipped (with pytest's reason) or failed."""
    params = item.callspec.params
    which = PASSES[item.originalname]
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        record(item.config, params["case_id"], params["engine_name"],
               **{f"{which}_status": reason.removeprefix("Skipped: ")})
    elif report.failed:
        record(item.config, params["case_id"], params["engine_name"],
               **{f"{which}_status": f"its test failed ({report.when})"})


def record_peak(item) -> None:
    """The memory test's peak, counted as its limit_memory marker counts it (same threads)."""
    manager = item.config.pluginmanager.get_plugin("memray_manager")
    result = manager.results.get(item.nodeid) if manager else None
    marker = item.get_closest_marker("limit_memory")
    if result is None or marker is None:
        return
    peak = high_watermark(result.result_file, marker.kwargs.get("current_thread_only", False))
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


# --- the saved run: a second source for memory ---------------------------------------

def _describe(env: dict) -> str:
    return f"Python {env.get('python')}, NumPy {env.get('numpy')}, {env.get('blas')}, " \
           f"BLAS threads {env.get('blas_threads')}"


def _cpu(run: dict) -> str | None:
    return (run.get("machine_info", {}).get("cpu") or {}).get("brand_raw")


def this_cpu() -> str:
    """This machine's CPU model, as /proc/cpuinfo (or the platform) names it."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or "unknown CPU")
    except OSError:
        return platform.processor() or "unknown CPU"


def saved_run(config, here_cpu: str | None) -> tuple[str, dict, str | None] | None:
    """(label, run, why memory is not comparable or None), or None when no saved run is compared.

    ``auto``: the latest saved run, on any machine, whose allocation environment is this one's.
    A named file is always taken, and the label says which of its parts are comparable here.
    """
    choice = config.getoption("mlexec_compare")
    env = allocation_environment()
    if choice == "off":
        return None
    if choice == "auto":
        root = config.getoption("mlexec_baselines")
        runs = [(p, r) for p, r in baselines.iter_runs(root) if r["machine_info"].get(ALLOCATION_KEY) == env]
        if not runs:
            return None
        path, run = max(runs, key=lambda pr: (pr[1]["datetime"], str(pr[0])))
        return f"{path} (the latest in {root} with this allocation environment)", run, None
    run = baselines.load_run(choice)
    there = run["machine_info"].get(ALLOCATION_KEY)
    cpu = _cpu(run)
    where = f"recorded on {cpu or 'an unnamed CPU'}" + (f", not this {here_cpu}" if cpu != here_cpu else "")
    if there is None:
        return (f"{choice} ({where}; it does not record its allocation environment: memory compared "
                f"unverified; its times are never compared)"), run, None
    differs = [f"{k} {there.get(k)} there, {v} here" for k, v in env.items() if there.get(k) != v]
    if differs:
        return (f"{choice} ({where}; times never compared)", run,
                "another allocation environment in the saved run: " + "; ".join(differs))
    return (f"{choice} ({where}; memory comparable: same {_describe(env)}; "
            f"its times are never compared)"), run, None


# --- the reference code: latency and memory A/B ----------------------------------------

def _repository(config) -> Path:
    """The git checkout the run is in (its rootdir when it is in none)."""
    root = Path(config.rootpath).resolve()
    return basecode.toplevel(root) or root


def _model_files(config, repo: Path) -> list[str]:
    """The run's model files that lie inside the repository, relative to it."""
    inside = []
    for case in config.stash[CASES].values():
        if case.path:
            try:
                inside.append(Path(case.path).resolve().relative_to(repo).as_posix())
            except ValueError:
                pass
    return list(dict.fromkeys(inside))


def _latest_saved_commit(config, why: str) -> tuple[str | None, str]:
    root = config.getoption("mlexec_baselines")
    try:
        runs = baselines.iter_runs(root)
    except baselines.BaselineError:
        runs = []
    commits = [r["commit_info"].get("id") for _, r in sorted(runs, key=lambda pr: pr[1]["datetime"])]
    if not commits or not commits[-1]:
        return None, f"{why}, and no saved run in {root} names a commit"
    return commits[-1], f"the latest saved run's commit ({why})"


def reference_code(config) -> tuple[str, basecode.Reference | None]:
    """(label, the reference code), or (why there is none, None)."""
    choice = config.getoption("mlexec_base")
    if choice == "off":
        return "no reference code (--mlexec-base off)", None
    repo = _repository(config)
    aliases = config.stash.get(BASE_ALIASES, {})
    classes = list(dict.fromkeys(ENGINES[e] for _, _, e in config.stash.get(PLANNED, {}) if e not in aliases))
    modules = list(dict.fromkeys(cls.__module__ for cls in classes))
    try:
        sources = basecode.gated_sources(Path(config.rootpath), repo, classes)
    except basecode.BaseCodeError as exc:
        return f"no reference code: {exc}", None
    files = _model_files(config, repo)
    if not sources and not files:
        return (f"no reference code: no engine that runs and no model file lives in {repo} "
                f"(name the packages in pyproject.toml's [tool.mlexec] packages)"), None
    paths = [s.path for s in sources] + files
    if choice == "auto":
        source, why = basecode.default_base(repo, paths)
        if source is None:
            source, why = _latest_saved_commit(config, why)
            if source is None:
                return f"no reference code: {why}", None
    else:
        source, why = choice, "named by --mlexec-base"
    try:
        reference = basecode.load(source, repo, sources, files, modules)
    except basecode.BaseCodeError as exc:
        return f"no reference code: {exc}", None
    return f"code at {reference.label} ({why}): {', '.join(paths)}", reference


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


def _reference_model(engines, case, path: str | None = None):
    """The case's model as the reference side builds it (``path``: the reference's own copy of a
    model file), or False when it can't."""
    try:
        if case.path:
            return engines.load_onnx(path or case.path)
        return engines.MODELS[case.model](**case.model_kwargs, seed=0)
    except Exception:   # the reference code may predate this model, its importer or its options
        return False


class _Sides(NamedTuple):
    """One case as this run and the reference build it; ``change`` when its model file differs."""
    model: object
    x: object
    base_model: object           # False when the reference cannot build it
    change: gate.ModelChange | None


def _graph_nodes(path) -> int:
    import onnx
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def _sides(case, reference: basecode.Reference, repo: Path, verdict: gate.Verdict) -> _Sides:
    model = case.build()
    x = model.random_input(case.batch, rng=12345)
    engines = reference.modules.get("engines") or sys.modules["engines"]
    if not case.path:
        return _Sides(model, x, _reference_model(engines, case), None)
    try:
        relative = Path(case.path).resolve().relative_to(repo).as_posix()
    except ValueError:
        relative = None
    before = reference.file(relative) if relative and reference.commit else None
    if before is None or before.read_bytes() == Path(case.path).read_bytes():
        if relative and reference.commit and before is None:
            note = f"{relative} is not in the reference commit: its engines compared on this file"
            verdict.notes += [note] if note not in verdict.notes else []
        return _Sides(model, x, _reference_model(engines, case), None)
    base_model = _reference_model(engines, case, str(before))
    change = next((m for m in verdict.models if m.file == relative), None)
    if change is None and base_model is not False:
        change = gate.ModelChange(relative, (_graph_nodes(before), _graph_nodes(case.path)),
                                  (base_model.flops(1), model.flops(1)))
        verdict.models.append(change)
    return _Sides(model, x, base_model, change)


def _counterpart(reference: basecode.Reference, engine: str, aliases: dict, sides: _Sides) -> tuple[type | None, str]:
    """(the reference's engine class, "") or (None, why this engine is not compared)."""
    if sides.base_model is False:
        return None, "no counterpart in the reference code (it cannot build this model)"
    cls = ENGINES[engine]
    if engine in aliases or reference.gates(cls):
        found = reference.engine_class(cls, aliases.get(engine, engine))
        return found, "" if found else "no counterpart in the reference code"
    if sides.change is not None:
        return cls, ""                    # the engine's code is the same; the model is not
    return None, (f"the same code on both sides: {cls.__module__} is not in the gated code "
                  f"(pyproject.toml's [tool.mlexec] packages)")


def _compare_pair(config, engine: str, base_cls: type, case, sides: _Sides, verdict: gate.Verdict,
                  kinds: list[str]) -> None:
    """The latency and memory A/B of one engine on one case, current against reference."""
    name = f"{engine}-{case.id}"
    figures = sides.change.benchmarks.setdefault(name, {}) if sides.change else {}
    make_now, make_before = (lambda: ENGINES[engine](sides.model, case.batch),
                             lambda: base_cls(sides.base_model, case.batch))
    if "latency" in kinds:
        with threadpool_limits(1):
            ratio, finding = gate.latency_comparison(name, _measurement(
                make_now, make_before, sides.x, config.getoption("mlexec_rounds")))
        figures["ratio"] = verdict.ratios[name] = round(ratio, 4)
        verdict.done("latency", name, finding)
    if "memory" in kinds:
        now, before = make_now(), make_before()
        peaks = [measure_peak(before, sides.x), measure_peak(now, sides.x)]
        figures.update(peak=peaks, arena=[before.activation_bytes, now.activation_bytes],
                       weights=[before.weight_bytes, now.weight_bytes])
        verdict.done("memory", name, gate.memory_finding(name, *peaks))


def _compare_code(config, reference: basecode.Reference | None, verdict: gate.Verdict) -> None:
    """Every benchmark this run measured, current engine against the reference code's:
    latency interleaved, memory peak once each."""
    planned = config.stash.get(PLANNED, {})
    results = config.stash.get(RESULTS, {})
    aliases = config.stash.get(BASE_ALIASES, {})
    cases = config.stash[CASES]
    repo = _repository(config)
    for case_id in dict.fromkeys(c for _, c, _ in planned):
        case, sides = cases[case_id], None
        for engine in dict.fromkeys(e for _, c, e in planned if c == case_id):
            started = time.perf_counter()
            name, r = f"{engine}-{case_id}", results.get((case_id, engine), {})
            kinds = []
            for kind, which, figure in (("latency", "time", "median"), ("memory", "memory", "peak")):
                if (which, case_id, engine) not in planned:
                    continue
                if r.get(figure) is None:
                    verdict.skip(kind, name, r.get(f"{which}_status") or "not measured in this run")
                elif reference is None:
                    verdict.skip(kind, name, verdict.reference)
                else:
                    kinds.append(kind)
            if kinds:
                sides = sides or _sides(case, reference, repo, verdict)
                base_cls, why = _counterpart(reference, engine, aliases, sides)
                if base_cls is None:
                    for kind in kinds:
                        verdict.skip(kind, name, why)
                elif not case.path and workload_version(case_id, sides.base_model) != case.version:
                    for kind in kinds:
                        verdict.skip(kind, name, "another workload version in the reference code")
                else:
                    _compare_pair(config, engine, base_cls, case, sides, verdict, kinds)
            record_cost(config, engine, case_id, time.perf_counter() - started)


def _memory_against_saved(config, saved, verdict: gate.Verdict) -> None:
    """The memory findings against a saved run of this machine's kind (``saved_run``), or why none."""
    if not saved:
        if config.getoption("mlexec_compare") == "auto":
            verdict.notes.append(f"no saved run in {config.getoption('mlexec_baselines')} with this allocation "
                                 f"environment ({_describe(allocation_environment())})")
        return
    verdict.saved, saved_figures, not_comparable = saved
    results = config.stash.get(RESULTS, {})
    current = {key: {"peak": r.get("peak"), "version": config.stash[CASES][key[0]].version}
               for key, r in results.items() if r.get("peak") is not None}
    if not_comparable:
        for engine_case in (f"{e}-{c}" for c, e in current):
            verdict.skip("memory-saved", engine_case, not_comparable)
    else:
        gate.memory_findings(saved_figures, current, verdict)


def _write_outputs(config, verdict: gate.Verdict) -> None:
    path = config.getoption("mlexec_verdict")
    if path:
        write_json(Path(path), verdict.as_dict())
    if config.getoption("mlexec_costs"):
        write_costs(config, Path(config.getoption("mlexec_costs")))


def _exit_status(session, verdict: gate.Verdict) -> None:
    if verdict.failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif verdict.nothing_compared and session.config.getoption("mlexec_require_gate"):
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def _save_run(config, run: dict) -> None:
    """This run among the saved runs of this machine, named by its commit."""
    name = (run["commit_info"].get("id") or "nocommit")[:12]
    if run["commit_info"].get("dirty"):
        name += "-dirty"
    from mlexec.baselines import machine_id
    config.stash[SAVED] = baselines.save_run(run, config.getoption("mlexec_baselines"), machine_id(), name)


def finish(session) -> None:
    """The gate, at the end of a run that measured benchmarks: sets the exit status."""
    config = session.config
    if not config.stash.get(PLANNED, None) or config.option.collectonly:
        return
    run = current_run(config)
    here_cpu = (_cpu(run) if run else None) or this_cpu()
    verdict = gate.Verdict(shard=config.getoption("mlexec_shard"))
    try:
        saved = saved_run(config, here_cpu)
    except baselines.BaselineError as exc:
        config.stash[VERDICT] = f"cannot gate: {exc}"
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    _memory_against_saved(config, saved, verdict)
    verdict.reference, reference = reference_code(config)
    try:
        _compare_code(config, reference, verdict)
    finally:
        if reference is not None:
            reference.close()
    config.stash[VERDICT] = verdict
    _write_outputs(config, verdict)
    _exit_status(session, verdict)
    if config.getoption("mlexec_save") and session.exitstatus == 0 and run is not None:
        _save_run(config, run)


def write_json(path: Path, data) -> None:
    """Atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1)
    os.replace(tmp, path)


# --- the terminal report -----------------------------------------------------------------

def report_table(tr, config) -> None:
    results = {k: r for k, r in config.stash.get(RESULTS, {}).items()
               if r.get("median") is not None or r.get("peak") is not None}
    if results:
        tr.write_sep("=", "engines compared")
        tr.write_line("alloc/fwd: memray peak of warm forwards, BLAS pinned to 1 thread; held: planned "
                      "activation buffers; median: pytest-benchmark; speedup and mem saved: vs naive")
        tr.write_line(summary.format_table(results))


def report_gate(tr, config) -> None:
    """The gate's section, the last thing a run prints before pytest's closing line."""
    if not config.stash.get(PLANNED, None) or config.option.collectonly:
        return
    verdict = config.stash.get(VERDICT, "not run (the session ended before the gate)")
    shard = config.getoption("mlexec_shard")
    tr.write_sep("=", "regression gate" + (f" (shard {shard})" if shard else ""))
    if isinstance(verdict, str):
        tr.write_line(verdict, red=True)
    else:
        tr.write_line(gate.format_verdict(verdict))
        if verdict.nothing_compared and config.getoption("mlexec_require_gate"):
            tr.write_line("--mlexec-require-gate: nothing was compared, so the run fails (exit 4)", red=True)
    if SAVED in config.stash:
        tr.write_line(f"saved this run as {config.stash[SAVED]}")

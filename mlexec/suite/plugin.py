"""The benchmark suite as a pytest plugin: options, parametrization, shared fixtures, the
summary and the gate.

Installed with the package (entry point ``pytest11``: ``mlexec.suite.plugin``), so any
repository can run the suite; this repository's root ``conftest.py``
registers it under the same name when the entry point is not installed.
``pytest benchmarks/`` then runs two passes over every engine x case:
``test_forward`` (latency, pytest-benchmark) and ``test_peak_memory``
(memray limit), and ends with the gate's section. The logic lives in the
pure modules of ``mlexec.suite``; this module wires it into pytest.
"""
from __future__ import annotations

import argparse
import time

import pytest

from engines import ENGINES, EngineUnavailable
from mlexec import heap
from ..case import Case
from . import session as suite_session
from .grid import MATRICES, assign_shards, estimated_seconds, file_cases, measured_costs, pair_costs, parse_shard

NAME = "mlexec.suite.plugin"   # the entry point's name, the module's own: `-p` finds it registered either way


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(dict.fromkeys(_positive_int(b.strip()) for b in str(text).split(",") if b.strip()))
    except (ValueError, argparse.ArgumentTypeError):
        batches = ()
    if not batches:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1 like 1,8; got {text!r}")
    return batches


def _shard(text: str) -> str:
    try:
        parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def pytest_addoption(parser):
    group = parser.getgroup("mlexec", "ML execution benchmarks (pytest benchmarks/)")
    group.addoption("--mlexec-matrix", choices=sorted(MATRICES), default="quick", metavar="NAME",
                    help="which grid of the zoo's models to run: quick (<3 min on 2 cores), full, or none (only "
                         "--mlexec-model files). Default: %(default)r")
    group.addoption("--mlexec-model", action="append", default=[], metavar="FILE.onnx",
                    help="also benchmark this ONNX model file (repeatable), named by its stem: "
                         "test_forward[arena-mymodel-b8]. See docs/importing.md")
    group.addoption("--mlexec-batches", type=_batches, default="1,8", metavar="LIST",
                    help="batch sizes for --mlexec-model files. Default: %(default)r")
    group.addoption("--mlexec-engine-module", action="append", default=[], metavar="MODULE",
                    help="import MODULE and register every engines.base.Engine subclass it defines under its "
                         "name (repeatable); installed packages' engines join through the entry point group "
                         "mlexec.engines. See docs/gate.md")
    group.addoption("--mlexec-engines", default="all", metavar="LIST",
                    help="comma-separated engines to run, or all: every engine in engines.ENGINES "
                         "when tests are collected. Default: %(default)r")
    group.addoption("--mlexec-pass", choices=["both", "time", "memory"], default="both", metavar="PASS",
                    help="time (pytest-benchmark), memory (memray limits) or both. Default: %(default)r")
    group.addoption("--mlexec-shard", type=_shard, default=None, metavar="K/N",
                    help="run only shard K of N: every engine x case lands in exactly one shard, shards "
                         "balanced by measured cost (mlexec/suite/costs.json), estimated where not measured. "
                         "Default: all")
    group.addoption("--mlexec-rounds", type=_positive_int, default=15, metavar="N",
                    help="fewest interleaved current/reference call pairs per latency A/B measurement "
                         "(more are run while they fit in 0.25 s). Default: %(default)r")
    group.addoption("--mlexec-base", default="auto", metavar="auto|off|REF|DIR",
                    help="the reference code (the gated packages, pyproject.toml's [tool.mlexec] packages or "
                         "those the engines live in, and the model files), measured beside this code for "
                         "latency and memory: a git ref, a folder laid out as the repository, off, or auto = "
                         "the merge-base of HEAD with the default branch (origin/HEAD, else main), HEAD itself "
                         "when the gated paths have uncommitted changes, the latest saved run's commit when "
                         "git gives nothing. Default: %(default)r")
    group.addoption("--mlexec-compare", default="auto", metavar="auto|off|FILE",
                    help="also gate memory against a saved run: auto = the latest one with this allocation "
                         "environment (Python, NumPy, BLAS, threads), off, or a run's JSON file. "
                         "Default: %(default)r")
    group.addoption("--mlexec-baselines", default="baselines", metavar="DIR",
                    help="where saved runs live, one folder per machine. Default: %(default)r")
    group.addoption("--mlexec-require-gate", action="store_true",
                    help="fail (exit 4) when the gate compared nothing at all")
    group.addoption("--mlexec-verdict", default=None, metavar="FILE",
                    help="write the gate's verdict as JSON to FILE")
    group.addoption("--mlexec-costs", default=None, metavar="FILE",
                    help="write the seconds each engine x case pair took (tests and gate) as JSON to FILE: "
                         "what --mlexec-shard balances on, once saved as mlexec/suite/costs.json")
    group.addoption("--mlexec-save", action="store_true",
                    help="save this run into --mlexec-baselines, named by commit")


FILE_CASES = pytest.StashKey[list]()
FILE_NOTES = pytest.StashKey[list]()     # model files measured at their fixed batch only


def pytest_configure(config):
    """Engines of installed packages (entry points) and of the named modules join the registry."""
    from engines.registry import discover, register_module
    try:
        discover()
        for module in config.getoption("mlexec_engine_module"):
            register_module(module)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _matrix(config) -> list[Case]:
    """The chosen grid, then every --mlexec-model file at every --mlexec-batches size."""
    if FILE_CASES not in config.stash:
        try:
            found = file_cases(config.getoption("mlexec_model"), config.getoption("mlexec_batches"))
            config.stash[FILE_CASES], config.stash[FILE_NOTES] = found.cases, found.notes
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return MATRICES[config.getoption("mlexec_matrix")]() + config.stash[FILE_CASES]


def _engines(config) -> list[str]:
    chosen = config.getoption("mlexec_engines")
    engines = list(ENGINES) if chosen == "all" else [e.strip() for e in chosen.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise pytest.UsageError(f"--mlexec-engines: unknown {unknown}; expected some of {sorted(ENGINES)}")
    return engines


# --- parametrization: every engine x every case, readable ids -----------------

def pytest_generate_tests(metafunc):
    if "case_id" not in metafunc.fixturenames:
        return
    config = metafunc.config
    engines = _engines(config)
    quick = config.getoption("mlexec_engines") == "all" and config.getoption("mlexec_matrix") == "quick"

    def marks(engine: str) -> list:
        reason = quick_skip(ENGINES[engine]) if quick else None
        return [pytest.mark.skip(reason=reason)] if reason else []

    # Plain strings as parameters: they land in the saved JSON's "params".
    params = [pytest.param(e, c.id, id=f"{e}-{c.id}", marks=marks(e)) for c in _matrix(config) for e in engines]
    metafunc.parametrize("engine_name, case_id", params)


def quick_skip(engine: type) -> str | None:
    """Why the quick matrix (every engine, unnamed) leaves this engine out, or None: an engine that
    compiles for many seconds per model would blow its 3-minute budget (``Engine.quick_skip``).
    It runs in the full matrix and when named."""
    if engine.quick_skip:
        return f"{engine.quick_skip}: runs in --mlexec-matrix full, or name it in --mlexec-engines"
    return None


def shard_of(config) -> dict[tuple[str, str], int] | None:
    """(engine, case id) -> shard, over the whole chosen matrix (not what -k leaves), by each pair's
    measured cost (``grid.COSTS_FILE``), estimated where none was measured."""
    option = config.getoption("mlexec_shard")
    if option is None:
        return None
    _, n = parse_shard(option)
    cases = {c.id: c for c in _matrix(config)}
    per_row = {}      # (model, dim, seq, path) -> flops of one row: builds each model once

    def estimate(pair):
        engine, case = pair[0], cases[pair[1]]
        key = (case.model, case.dim, case.seq, case.path)
        if key not in per_row:
            per_row[key] = case.build().flops(1)
        return estimated_seconds(per_row[key] * case.batch, ENGINES[engine].slow_build)

    pairs = [(e, c) for c in cases for e in _engines(config)]
    return assign_shards(pair_costs(pairs, measured_costs(), estimate), n)


def pytest_collection_modifyitems(config, items):
    wanted = {"both": ("test_forward", "test_peak_memory"), "time": ("test_forward",),
              "memory": ("test_peak_memory",)}[config.getoption("mlexec_pass")]
    shards = shard_of(config)
    k = parse_shard(config.getoption("mlexec_shard"))[0] if shards else None
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        params = getattr(item, "callspec", None) and item.callspec.params
        if name in suite_session.PASSES and params and "case_id" in params:
            mine = name in wanted and (shards is None or shards[(params["engine_name"], params["case_id"])] == k)
        else:
            mine = shards is None or k == 1          # anything else runs in the first shard only
        (keep if mine else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # One case at a time, latency then memory, so each model is built once and dropped after.
    order = {c.id: i for i, c in enumerate(_matrix(config))}

    def key(item):
        callspec = getattr(item, "callspec", None)
        if callspec is None or "case_id" not in callspec.params:
            return (-1, 0)
        return (order[callspec.params["case_id"]], getattr(item, "originalname", "") == "test_peak_memory")
    items[:] = sorted(keep, key=key)


def pytest_report_collectionfinish(config):
    """A model file that fixes its batch: measured at that batch only, said once after collection."""
    return config.stash.get(FILE_NOTES, [])


def pytest_collection_finish(session):
    """What this run sets out to measure, after every deselection (-k, passes, shards)."""
    planned = {}
    for item in session.items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if getattr(item, "originalname", "") in suite_session.PASSES and params and "case_id" in params:
            planned[(suite_session.PASSES[item.originalname], params["case_id"], params["engine_name"])] = True
    session.config.stash[suite_session.PLANNED] = planned
    session.config.stash[suite_session.CASES] = {c.id: c for c in _matrix(session.config)}


# --- shared fixtures -----------------------------------------------------------

class _Workbench:
    """The model, input, reference and engines of one case; replaced when the case changes."""

    def __init__(self, case: Case):
        self.case = case
        self.model = case.build()
        self.x = self.model.random_input(case.batch, rng=12345)   # fresh random, never zeros
        self.reference = self.model.reference(self.x)
        self.engines: dict = {}
        self.build_seconds: dict[str, float] = {}

    def engine(self, name):
        if name not in self.engines:
            start = time.perf_counter()
            try:
                self.engines[name] = ENGINES[name](self.model, self.case.batch)
            except EngineUnavailable as exc:
                self.engines[name] = exc
            self.build_seconds[name] = time.perf_counter() - start   # torch-compile: its compile time
        found = self.engines[name]
        if isinstance(found, EngineUnavailable):
            pytest.skip(f"engine {name!r} unavailable: {found}")
        return found


@pytest.fixture(scope="session")
def _workbenches():
    heap.pin()    # naive's latency must not depend on which cases ran before it (mlexec/heap.py)
    return {}


@pytest.fixture
def case(case_id, request) -> Case:
    return request.config.stash[suite_session.CASES][case_id]


@pytest.fixture
def bench(_workbenches, case):
    if case not in _workbenches:
        _workbenches.clear()          # free the previous case's weights and engines
        _workbenches[case] = _Workbench(case)
    return _workbenches[case]


@pytest.fixture(scope="session")
def roofs():
    from .roofs import calibrate
    return calibrate()


# --- results, the gate, the report ------------------------------------------------

def pytest_benchmark_update_machine_info(config, machine_info):
    from .memory import allocation_environment
    machine_info[suite_session.ALLOCATION_KEY] = allocation_environment()


def pytest_benchmark_update_json(config, benchmarks, output_json):
    suite_session.attach_peaks(config, output_json)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if getattr(item, "originalname", "") in suite_session.PASSES and hasattr(item, "callspec") \
            and "case_id" in item.callspec.params:
        params = item.callspec.params
        suite_session.record_cost(item.config, params["engine_name"], params["case_id"], report.duration)
        if report.when == "call" and item.originalname == "test_peak_memory":
            suite_session.record_peak(item)
        if report.skipped or report.failed:
            suite_session.record_outcome(item, report)
    return report


def pytest_sessionfinish(session, exitstatus):
    suite_session.finish(session)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, config):
    """After everything else in the summary (pytest-benchmark's table, pytest's short summary):
    the engines table, then the gate's section, where a reader finds it without scrolling."""
    try:
        return (yield)
    finally:
        suite_session.report_table(terminalreporter, config)
        suite_session.report_gate(terminalreporter, config)

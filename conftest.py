"""Root configuration of the benchmark suite: options, shared fixtures, the summary and the gate.

``pytest benchmarks/`` runs two passes over every engine x case: ``test_forward``
(latency, pytest-benchmark) and ``test_peak_memory`` (memray limit). The
logic lives in ``mlexec.suite``; this file wires it into pytest.
"""
from __future__ import annotations

import argparse
import time

import pytest

from engines import ENGINES, EngineUnavailable
from mlexec.suite import session as suite_session
from mlexec import heap
from mlexec.baselines import machine_id
from mlexec.suite.grid import MATRICES, Case


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def pytest_addoption(parser):
    group = parser.getgroup("mlexec", "ML execution benchmarks (pytest benchmarks/)")
    group.addoption("--mlexec-matrix", choices=sorted(MATRICES), default="quick", metavar="NAME",
                    help="which grid to run: quick (<3 min on 2 cores) or full. Default: %(default)r")
    group.addoption("--mlexec-engines", default="all", metavar="LIST",
                    help="comma-separated engines to run, or all: every engine in engines.ENGINES "
                         "when tests are collected. Default: %(default)r")
    group.addoption("--mlexec-pass", choices=["both", "time", "memory"], default="both", metavar="PASS",
                    help="time (pytest-benchmark), memory (memray limits) or both. Default: %(default)r")
    group.addoption("--mlexec-rounds", type=_positive_int, default=15, metavar="N",
                    help="fewest interleaved current/reference call pairs per latency A/B measurement "
                         "(more are run while they fit in 0.25 s). Default: %(default)r")
    group.addoption("--mlexec-baselines", default="baselines", metavar="DIR",
                    help="where saved runs live, one folder per machine. Default: %(default)r")
    group.addoption("--mlexec-compare", default="auto", metavar="auto|off|FILE",
                    help="gate against: auto = the latest saved run for this machine, if any; "
                         "off; or a run's JSON file. Default: %(default)r")
    group.addoption("--mlexec-base", default=None, metavar="REF|DIR",
                    help="latency reference code: a git ref or a folder holding engines/. "
                         "Default: the commit of the saved run compared against")
    group.addoption("--mlexec-verdict", default=None, metavar="FILE",
                    help="write the gate's verdict as JSON to FILE")
    group.addoption("--mlexec-save", action="store_true",
                    help="save this run into --mlexec-baselines, named by commit")


# --- parametrization: every engine x every case, readable ids -----------------

def pytest_generate_tests(metafunc):
    if "case_id" not in metafunc.fixturenames:
        return
    config = metafunc.config
    chosen = config.getoption("mlexec_engines")
    engines = list(ENGINES) if chosen == "all" else [e.strip() for e in chosen.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise pytest.UsageError(f"--mlexec-engines: unknown {unknown}; expected some of {sorted(ENGINES)}")
    cases = MATRICES[config.getoption("mlexec_matrix")]
    # Engines that compile for many seconds per model would blow the quick matrix's
    # 3-minute budget; they run in the full matrix or when named.
    skip_slow = chosen == "all" and config.getoption("mlexec_matrix") == "quick"
    slow = pytest.mark.skip(reason="compiles for many seconds per model: runs in --mlexec-matrix full, "
                                   "or name it in --mlexec-engines")
    # Plain strings as parameters: they land in the saved JSON's "params".
    params = [pytest.param(e, c.id, id=f"{e}-{c.id}",
                           marks=[slow] if skip_slow and ENGINES[e].slow_build else [])
              for c in cases for e in engines]
    metafunc.parametrize("engine_name, case_id", params)


def pytest_collection_modifyitems(config, items):
    wanted = {"both": ("test_forward", "test_peak_memory"), "time": ("test_forward",),
              "memory": ("test_peak_memory",)}[config.getoption("mlexec_pass")]
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        (drop if name in ("test_forward", "test_peak_memory") and name not in wanted else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # One case at a time, latency then memory, so each model is built once and dropped after.
    order = {c.id: i for i, c in enumerate(MATRICES[config.getoption("mlexec_matrix")])}

    def key(item):
        callspec = getattr(item, "callspec", None)
        if callspec is None or "case_id" not in callspec.params:
            return (-1, 0)
        return (order[callspec.params["case_id"]], getattr(item, "originalname", "") == "test_peak_memory")
    items[:] = sorted(keep, key=key)


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
    return next(c for c in MATRICES[request.config.getoption("mlexec_matrix")] if c.id == case_id)


@pytest.fixture
def bench(_workbenches, case):
    if case not in _workbenches:
        _workbenches.clear()          # free the previous case's weights and engines
        _workbenches[case] = _Workbench(case)
    return _workbenches[case]


@pytest.fixture(scope="session")
def roofs():
    from mlexec.suite.roofs import calibrate
    return calibrate()


# --- end of session: attach memory peaks, summary table, the gate, saving ------

def pytest_benchmark_update_json(config, benchmarks, output_json):
    suite_session.attach_peaks(config, output_json)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if call.when == "call" and getattr(item, "originalname", "") == "test_peak_memory":
        suite_session.record_peak(item)


def pytest_sessionfinish(session, exitstatus):
    suite_session.finish(session, machine_id())


def pytest_terminal_summary(terminalreporter, config):
    suite_session.report(terminalreporter, config)

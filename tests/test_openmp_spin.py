"""engines.native.openmp: GNU OpenMP's idle spin bounded before MKL or oneDNN load it, never over the environment."""
import subprocess
import sys

import pytest

from engines import kernels
from engines.native import openmp
from tests.conftest import ROOT, subprocess_env


def _run(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh process whose environment says nothing of OpenMP's wait but ``env``."""
    full = {k: v for k, v in subprocess_env().items() if k not in (openmp.ENV, openmp.POLICY_ENV)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**full, **env}, capture_output=True,
                          text=True, check=True)


def _spin(**env) -> tuple[str, str]:
    """(CHOICE, GOMP_SPINCOUNT) once ``engines`` is imported."""
    out = _run("import os, engines; from engines.native import openmp; "
               "print(openmp.CHOICE); print(os.environ.get('GOMP_SPINCOUNT'))", **env)
    said, spin = out.stdout.splitlines()
    return said, spin


def test_the_spin_is_bounded_unless_the_environment_says_how_to_wait():
    said, spin = _spin()
    assert spin == openmp.SPINCOUNT and said.startswith(f"GOMP_SPINCOUNT={openmp.SPINCOUNT}")
    said, spin = _spin(OMP_WAIT_POLICY="active")
    assert said == "OMP_WAIT_POLICY=active (set in the environment)" and spin == "None"
    said, spin = _spin(GOMP_SPINCOUNT="50000")
    assert said == "GOMP_SPINCOUNT=50000 (set in the environment)" and spin == "50000"


@pytest.mark.parametrize("env", [{}, {"GOMP_SPINCOUNT": "300000"}], ids=["project", "gnu_default"])
def test_gnu_openmp_reads_the_setting(env):
    """The setting reaches the runtime: GNU OpenMP reads it when oneDNN's library loads it, after
    ``engines`` set it (``OMP_DISPLAY_ENV=VERBOSE`` prints what the runtime took)."""
    if kernels.unavailable().get("onednn"):
        pytest.skip("needs oneDNN's library (the onednn extra), which loads GNU OpenMP")
    out = _run("import engines; from engines.native import onednn; onednn.load()", OMP_DISPLAY_ENV="VERBOSE", **env)
    assert f"GOMP_SPINCOUNT = '{env.get('GOMP_SPINCOUNT', openmp.SPINCOUNT)}'" in out.stderr


# --- the pool's workers bound, the caller not --------------------------------------------------

def test_worker_cpus_binds_each_worker_and_never_the_caller():
    assert openmp.worker_cpus({}, {0, 1}, 2) == {1: 1}
    assert openmp.worker_cpus({}, {4, 2, 6}, 3) == {1: 4, 2: 6}           # the allowed CPUs after the first
    assert openmp.worker_cpus({}, {0, 1}, 4) == {1: 1, 2: 0, 3: 1}        # more threads than CPUs: round the CPUs
    assert openmp.worker_cpus({openmp.PIN_ENV: "0"}, {0, 1}, 2) == {}      # switched off
    assert openmp.worker_cpus({"OMP_PROC_BIND": "close"}, {0, 1}, 2) == {}  # the environment binds threads itself
    assert openmp.worker_cpus({}, {0, 1}, 1) == {} and openmp.worker_cpus({}, {3}, 2) == {}


def _two_cpus() -> set[int]:
    import os
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2 or openmp.current_cpu() is None:
        pytest.skip("needs two CPUs and sched_getcpu: nothing to step aside to")
    return allowed


def test_step_aside_moves_the_caller_off_the_workers_cpus_and_keeps_its_affinity(monkeypatch):
    """Timed while it shares a worker's core, OpenMP's pool measured 430-570 us a call where it
    takes 13 (docs/kernels.md): before a timing the caller leaves the workers' CPUs."""
    import os
    allowed = _two_cpus()
    for _ in range(5):                                  # the scheduler may move it between the two calls
        here = openmp.current_cpu()
        monkeypatch.setattr(openmp, "_worker_cpus", {here})
        if openmp.step_aside():
            break
    else:
        pytest.fail("the caller never stepped aside")
    assert openmp.current_cpu() != here and os.sched_getaffinity(0) == allowed
    assert openmp.step_aside() is False                 # already elsewhere: nothing to do


def test_step_aside_leaves_a_caller_with_nowhere_else_to_go(monkeypatch):
    import os
    allowed = _two_cpus()
    monkeypatch.setattr(openmp, "_worker_cpus", set(allowed))
    assert openmp.step_aside() is False and os.sched_getaffinity(0) == allowed


def test_every_timing_steps_the_caller_aside_first(monkeypatch):
    """The GEMM timings and the forward timings both start from the caller off the workers' CPUs."""
    import numpy as np
    from engines.kernels import timing
    steps = []
    monkeypatch.setattr(openmp, "step_aside", lambda: steps.append(1) or False)
    a = np.ones(4)
    timing.measure_forwards({"one": [(np.negative, (a, a))], "two": [(np.abs, (a, a))]}, budget_s=1e-3)
    assert steps
    steps.clear()
    monkeypatch.setattr(timing, "PARK_S", 0.0)
    timing.measure(kernels.Gemm(1, 8, 8), ["numpy"], budget_s=1e-3)
    assert len(steps) >= 2                              # sizing the blocks, and after the pause
    checks = []                                         # and each timed block checks again
    monkeypatch.setattr(openmp, "keep_aside", lambda: checks.append(1))
    timing._interleaved({"one": [(np.negative, (a, a))], "two": [(np.abs, (a, a))]}, reps=2, rounds=3)
    assert len(checks) == 6                             # 2 candidates x 3 rounds


def test_a_forward_on_the_pool_first_keeps_the_caller_off_the_workers_cpus(monkeypatch):
    """Stepped aside once, the caller came back: a worker waking it from a barrier may have it
    placed on that worker's CPU, where it stays (beside a busy core: int8 mlp b8 d1024 a forward
    in 400 us against 175; docs/kernels.md). So each forward on OpenMP's pool checks first."""
    from engines import ENGINES, MODELS
    moves = []
    monkeypatch.setattr(openmp, "step_aside", lambda: moves.append(1) or True)
    monkeypatch.setattr(openmp, "_worker_cpus", {7})
    monkeypatch.setattr(openmp, "_sched_getcpu", lambda: 3)
    openmp.keep_aside()
    assert moves == []                                  # not on a worker's CPU: nothing done
    monkeypatch.setattr(openmp, "_sched_getcpu", lambda: 7)
    openmp.keep_aside()
    assert moves == [1]
    from engines import EngineUnavailable
    monkeypatch.setenv(kernels.TUNE_ENV, "0")          # the forward on the pool, where there are two threads
    model = MODELS["mlp"](dim=16, seed=1)
    for name, first in (("onednn", True), ("packed", True), ("fused", False)):
        try:
            engine = ENGINES[name](model, 2)
        except EngineUnavailable as exc:                # its extra is not installed here
            pytest.skip(f"{name}: {exc}")
        engine.forward(model.random_input(2, 0))
        calls = engine._bound[2].calls
        one_thread = getattr(engine, "forward_threads", {}).get(2, {}).get("threads") == 1
        assert (calls[0][0] is openmp.keep_aside) == (first and not one_thread), name
        assert sum(fn is openmp.keep_aside for fn, _ in calls) <= 1


_AFFINITIES = """
import ctypes, json, os, engines
from engines.native import onednn, openmp
before = sorted(os.sched_getaffinity(0))
lib = onednn.library().lib
seen = {}
def record(_):
    seen[lib.omp_get_thread_num()] = sorted(os.sched_getaffinity(0))
lib.GOMP_parallel(ctypes.CFUNCTYPE(None, ctypes.c_void_p)(record), None, lib.omp_get_max_threads(), 0)
print(json.dumps({"before": before, "after": sorted(os.sched_getaffinity(0)), "threads": seen, "said": openmp.PINNED}))
"""


@pytest.mark.parametrize("env", [{}, {"MLEXEC_PIN_WORKERS": "0"}], ids=["pinned", "switched-off"])
def test_loading_onednn_binds_the_pools_workers_and_leaves_the_caller_free(env):
    """After an idle pause, an unbound worker woken onto the caller's core cost the next forward
    5-10 ms (docs/kernels.md): each worker is bound to one CPU when GNU OpenMP loads, the calling
    thread keeps every CPU it had; switched off, nothing is bound."""
    import json
    import os
    if kernels.unavailable().get("onednn"):
        pytest.skip("needs oneDNN's library (the onednn extra), which loads GNU OpenMP")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU here: no worker to bind")
    out = json.loads(_run(_AFFINITIES, OMP_NUM_THREADS="2", **env).stdout.splitlines()[-1])
    assert out["after"] == out["before"] and out["threads"]["0"] == out["before"]
    if env:
        assert out["threads"]["1"] == out["before"] and out["said"].startswith("workers not pinned")
    else:
        assert out["threads"]["1"] == [out["before"][1]] and out["said"].startswith("workers pinned to CPU")


def test_a_library_on_another_runtime_is_left_unbound_and_still_loads():
    """Binding is a refinement: a library without GNU OpenMP's entry points (another runtime, or
    none) binds nothing, raises nothing, and a later GNU OpenMP may still be bound."""
    out = _run("import ctypes; from engines.native import openmp; "
               "print(openmp.pin_workers(ctypes.CDLL(None))); print(openmp._pin_done)")
    said, done = out.stdout.splitlines()[-2:]
    assert said == "workers not pinned (GNU OpenMP not loaded)" and done == "False"

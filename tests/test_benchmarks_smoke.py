"""Smoke mode: every benchmark of the quick matrix runs once, so a broken benchmark fails CI."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env
from engines import ENGINES
from mlexec.suite.grid import HEADLINE, QUICK


@pytest.mark.e2e
def test_every_benchmark_runs_once_and_the_summary_prints():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks/", "--benchmark-disable", "--mlexec-compare=off", "--mlexec-base=off",
         "-p", "mlexec.suite.plants", "-p", "no:cacheprovider", "-v", "-rs"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    outcomes = dict(re.findall(r"::(test_\w+\[[^\]]+\]) (PASSED|SKIPPED|FAILED|ERROR)", proc.stdout))
    # every registered engine, a plugin's included, on every case, in both passes, with readable ids
    for engine in [*ENGINES, "planted"]:
        for case in QUICK:
            for test in ("test_forward", "test_peak_memory"):
                assert f"{test}[{engine}-{case.id}]" in outcomes, f"{test}[{engine}-{case.id}] not run"
    skipped = [name for name, outcome in outcomes.items() if outcome == "SKIPPED"]
    for line in re.findall(r"SKIPPED \[\d+\] .*", proc.stdout):
        # only engines whose optional package is missing, or that the quick matrix leaves out
        assert "unavailable:" in line or any(cls.quick_skip and cls.quick_skip in line for cls in ENGINES.values()), line
    assert len(skipped) < len(outcomes)
    assert "engines compared" in proc.stdout
    assert f"headline ({HEADLINE.id}): allocated per forward, naive" in proc.stdout
    # the gate's section comes last, and says that this run compared nothing
    section = proc.stdout[proc.stdout.rindex("regression gate"):]
    assert "NOTHING COMPARED: this run is not gated" in section and "engines compared" not in section

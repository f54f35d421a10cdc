#!/usr/bin/env python
"""Measure the latency gate's false-alarm and detection rates over N runs.

Each run is a fresh ``pytest benchmarks/`` process on the quick matrix with
the ``planted`` engine from ``mlexec.suite.plants`` and the latency gate
against this checkout's own code (``--mlexec-base .``):

- N runs with ``MLEXEC_PLANT=none``: nothing changed, so any regression the
  gate reports is a false alarm;
- N runs with ``MLEXEC_PLANT=slow``: the planted engine is 25 % slower, so
  the gate must report it (other engines must still pass).

The two kinds alternate, so both see the same machine weather.
Usage: python scripts/gate_rates.py [-n 20] [--engines naive,static,arena,planted]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gate_run(verdict: Path, plant: str, engines: str, extra: list[str]) -> dict:
    env = dict(os.environ, MLEXEC_PLANT=plant, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
           "-p", "mlexec.suite.plants", "--mlexec-pass=time", "--mlexec-compare=off", "--mlexec-base=.",
           f"--mlexec-engines={engines}", "--benchmark-max-time=0.05", f"--mlexec-verdict={verdict}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not verdict.exists():
        raise SystemExit(f"benchmark run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(verdict.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20, help="runs of each kind (default: %(default)s)")
    parser.add_argument("--engines", default="naive,static,arena,planted",
                        help="engines to run (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="keep the verdict files here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gate-rates-"))
    out.mkdir(parents=True, exist_ok=True)

    started = time.time()
    passed = caught = planted_flagged = planted_total = innocent_flagged = compared = 0
    for i in range(args.n):
        clean = gate_run(out / f"clean-{i:02d}.json", "none", args.engines, args.pytest_args)
        slow = gate_run(out / f"slow-{i:02d}.json", "slow", args.engines, args.pytest_args)
        passed += not clean["failed"]
        for f in clean["regressions"]:
            print(f"false alarm, run {i}: {f['name']} {f['ratio']:.3f}x p={f['p_value']}", file=sys.stderr)
        flagged = {f["name"] for f in slow["regressions"] if f["kind"] == "latency"}
        planted = {n for n in flagged if n.startswith("planted-")}
        caught += bool(planted)
        planted_flagged += len(planted)
        planted_total += slow["latency_compared"] // len(args.engines.split(","))   # one per case
        innocent_flagged += len(flagged - planted)
        compared += clean["latency_compared"] + slow["latency_compared"]
        print(f"run {i + 1}/{args.n}: unchanged {'passed' if not clean['failed'] else 'FAILED'}, "
              f"slowed: {len(planted)} planted flagged ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)

    n = args.n
    print(f"latency gate: > 1.15x in 3 interleaved A/B measurements and Mann-Whitney p < 0.002; "
          f"quick matrix, engines {args.engines}, {compared} A/B comparisons")
    print(f"unchanged code passed:  {passed}/{n} runs")
    print(f"25% slowdown caught:    {caught}/{n} runs "
          f"({planted_flagged}/{planted_total} planted benchmarks flagged; "
          f"{innocent_flagged} unplanted benchmarks flagged in those runs)")
    print(f"wall time {time.time() - started:.0f} s; verdicts in {out}")
    return 0 if (passed == n and caught >= n - 1) else 1


if __name__ == "__main__":
    sys.exit(main())

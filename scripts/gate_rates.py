#!/usr/bin/env python
"""Measure the latency gate's false-alarm and detection rates over N runs.

Runs the quick matrix N+1 times unchanged and N times with the ``planted``
engine slowed by 25 % (``mlexec.suite.plants``), each run a fresh pytest
process, then gates:

- false alarms: unchanged run i+1 against unchanged run i (N pairs);
- detection: planted run i against unchanged run i (N pairs).

Runs alternate unchanged/planted so both see the same machine weather.
Usage: python scripts/gate_rates.py [-n 20] [--engines static,planted] [--out DIR]
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
sys.path.insert(0, str(ROOT))

from mlexec.suite import gate  # noqa: E402


def run_suite(out: Path, plant: str, engines: str, extra: list[str]) -> dict:
    env = dict(os.environ, MLEXEC_PLANT=plant, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
           "-p", "mlexec.suite.plants", "--mlexec-pass", "time", "--mlexec-compare", "off",
           f"--mlexec-engines={engines}", "--benchmark-max-time=0.2", f"--benchmark-json={out}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20, help="pairs per rate (default: %(default)s)")
    parser.add_argument("--engines", default="static,planted", help="engines to run (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run JSON files here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gate-rates-"))
    out.mkdir(parents=True, exist_ok=True)

    started = time.time()
    clean, slow = [], []
    for i in range(args.n + 1):
        clean.append(run_suite(out / f"clean-{i:02d}.json", "none", args.engines, args.pytest_args))
        if i < args.n:
            slow.append(run_suite(out / f"slow-{i:02d}.json", "slow", args.engines, args.pytest_args))
        print(f"run {i + 1}/{args.n + 1} done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)

    false_alarms, detected, planted_hits, planted_total = 0, 0, 0, 0
    worst_clean = 0.0
    for i in range(args.n):
        v = gate.compare(clean[i], clean[i + 1])
        false_alarms += v.failed
        for f in v.regressions:
            print(f"false alarm, pair {i}: {f.name} {f.ratio:.3f}x p={f.p_value}", file=sys.stderr)
        ref = {b["fullname"]: b["extra_info"] for b in clean[i]["benchmarks"]}
        for b in clean[i + 1]["benchmarks"]:
            old = ref.get(b["fullname"])
            if old and "ratio" in old:
                worst_clean = max(worst_clean, b["extra_info"]["ratio"] / old["ratio"])
        v = gate.compare(clean[i], slow[i])
        flagged = {f.name for f in v.regressions if f.kind == "latency"}
        planted = [b["name"] for b in slow[i]["benchmarks"] if b["extra_info"]["engine"] == "planted"]
        planted_hits += len(flagged & set(planted))
        planted_total += len(planted)
        detected += bool(flagged & set(planted))
        others = flagged - set(planted)
        false_alarms_in_slow = len(others)
        if false_alarms_in_slow:
            print(f"pair {i}: unplanted benchmarks flagged too: {sorted(others)}", file=sys.stderr)

    n = args.n
    print(f"gate: latency factor > {gate.LATENCY_FACTOR}, Mann-Whitney p < {gate.ALPHA}, "
          f"engines {args.engines}, quick matrix")
    print(f"unchanged code passed: {n - false_alarms}/{n} runs "
          f"(worst unchanged median-ratio drift {worst_clean:.3f}x)")
    print(f"25% slowdown caught:   {detected}/{n} runs "
          f"({planted_hits}/{planted_total} planted benchmarks flagged)")
    print(f"wall time {time.time() - started:.0f} s; runs kept in {out}")
    return 0 if (false_alarms == 0 and detected >= n - 1) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Measure the gate's false-alarm and detection rates over N trials, with no saved run.

Each run is a fresh ``pytest benchmarks/`` process on the quick matrix with
the ``planted`` engine from ``mlexec.suite.plants``, gated against this
checkout's own code measured beside it (``--mlexec-base .``; in the
reference code ``planted`` is plain ``static``) and against no saved run
(``--mlexec-baselines`` an empty folder), so it works on any machine:

- ``MLEXEC_PLANT=none``, both passes: nothing changed, so any regression the
  gate reports is a false alarm;
- ``MLEXEC_PLANT=slow``, latency pass: ``planted`` is 25 % slower, so the
  gate must report it (other engines must still pass);
- ``MLEXEC_PLANT=temp``, memory pass: ``planted`` makes one extra (batch, dim)
  temporary per forward, so the memory A/B must report it at every case.

The kinds alternate within a trial, so all see the same machine weather.

``--outside``: the same in a user's repository (``mlexec.suite.example``, its own git repository in
a temporary folder, no saved run), each kind a pull request branch off ``main`` gated as the action
gates it (``python -m mlexec.suite.ci gate --base auto``): ``docs`` (nothing measured changes),
``slow`` (their engine 25 % slower), ``temp`` (a 16 KiB temporary alive through each forward),
``model`` (the model file widened to 30 % more flops: must be reported, with its ratio).

Usage: python scripts/gate_rates.py [-n 20] [--engines naive,static,arena,planted] [--outside]
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
PASS = {"none": "both", "slow": "time", "temp": "memory"}


def gate_run(verdict: Path, plant: str, engines: str, store: Path, extra: list[str]) -> dict:
    env = dict(os.environ, MLEXEC_PLANT=plant, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
           "-p", "mlexec.suite.plants", f"--mlexec-pass={PASS[plant]}", f"--mlexec-baselines={store}",
           "--mlexec-base=.", "--mlexec-require-gate", f"--mlexec-engines={engines}",
           "--benchmark-max-time=0.05", f"--mlexec-verdict={verdict}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not verdict.exists():
        raise SystemExit(f"benchmark run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(verdict.read_text())


def planted_caught(verdict: dict, kind: str) -> tuple[int, int, int]:
    """(planted benchmarks flagged, planted benchmarks compared, unplanted flagged) for one kind."""
    flagged = {f["name"] for f in verdict["regressions"] if f["kind"] == kind}
    planted = {n for n in verdict["compared"][kind] if n.startswith("planted-")}
    return len(flagged & planted), len(planted), len(flagged - planted)


# --- in a user's repository -------------------------------------------------------------------

OUTSIDE_PASS = {"docs": "both", "slow": "time", "temp": "memory", "model": "both"}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=dev@example.com", "-c", "user.name=dev", *args], cwd=root,
                   check=True, capture_output=True)


def outside_repository(root: Path) -> None:
    """The example repository with main and one branch per kind, each planting its change."""
    from mlexec.suite import example
    example.write(root)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "our inference service")
    for kind in OUTSIDE_PASS:
        _git(root, "checkout", "-q", "-b", kind, "main")
        example.plant(root, kind)
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", kind)


def outside_run(root: Path, kind: str, out: Path) -> dict:
    _git(root, "checkout", "-q", kind)
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "mlexec.suite.ci", "gate", "--base", "auto", "--out", str(out), "--",
           "-q", "-p", "no:cacheprovider", f"--mlexec-pass={OUTSIDE_PASS[kind]}", "--mlexec-compare=off",
           "--benchmark-max-time=0.05"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not (out / "verdict.json").exists():
        raise SystemExit(f"gate run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((out / "verdict.json").read_text())


def outside(n: int, out: Path) -> int:
    root = out / "repository"
    outside_repository(root)
    started = time.time()
    passed = slow = temp = reported = failed_model = 0
    ratios = []
    for i in range(n):
        runs = {kind: outside_run(root, kind, out / f"{kind}-{i:02d}") for kind in OUTSIDE_PASS}
        passed += not runs["docs"]["failed"]
        mine = lambda v, kind: {f["name"] for f in v["regressions"] if f["kind"] == kind and f["name"].startswith("mine-")}  # noqa: E731
        slow += bool(mine(runs["slow"], "latency"))
        temp += mine(runs["temp"], "memory") == {n for n in runs["temp"]["compared"]["memory"] if n.startswith("mine-")}
        changes = runs["model"]["models"]
        got = [b.get("ratio") for c in changes for b in c["benchmarks"].values()]
        reported += bool(changes) and all(r is not None for r in got)
        failed_model += runs["model"]["failed"]
        ratios += got
        print(f"trial {i + 1}/{n}: unchanged {'passed' if not runs['docs']['failed'] else 'FAILED'}, slow caught "
              f"{slow}, temporary caught {temp}, model reported {reported} ({time.time() - started:.0f} s)",
              file=sys.stderr, flush=True)
    print(f"in a user's repository (mlexec.suite.example), gated against main's copy of it, no saved run; {n} trials")
    print(f"unchanged code passed:            {passed}/{n} trials")
    print(f"25% slowdown of their engine:     {slow}/{n} trials caught")
    print(f"16 KiB temporary per forward:     {temp}/{n} trials caught at every batch")
    print(f"model change, 30% more flops:     {reported}/{n} trials reported with its ratio, {failed_model}/{n} failed; "
          f"ratios {min(ratios):.2f}-{max(ratios):.2f}x (median {sorted(ratios)[len(ratios) // 2]:.2f}x)")
    print(f"wall time {time.time() - started:.0f} s; verdicts in {out}")
    return 0 if (passed == slow == temp == reported == n) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20, help="trials, each one run of every kind (default: %(default)s)")
    parser.add_argument("--outside", action="store_true", help="in a user's repository (see above)")
    parser.add_argument("--engines", default="naive,static,arena,planted",
                        help="engines to run (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="keep the verdict files here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gate-rates-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.outside:
        return outside(args.n, out)
    store = out / "no-saved-runs"
    store.mkdir(exist_ok=True)

    started = time.time()
    passed = slow_caught = temp_caught = 0
    slow_flags = slow_total = temp_flags = temp_total = innocent = compared = 0
    for i in range(args.n):
        runs = {plant: gate_run(out / f"{plant}-{i:02d}.json", plant, args.engines, store, args.pytest_args)
                for plant in ("none", "slow", "temp")}
        clean = runs["none"]
        passed += not clean["failed"]
        for f in clean["regressions"]:
            print(f"false alarm, trial {i}: {f['name']} {f['kind']} {f['ratio']:.3f}x", file=sys.stderr)
        flagged, total, others = planted_caught(runs["slow"], "latency")
        slow_caught += flagged > 0
        slow_flags, slow_total, innocent = slow_flags + flagged, slow_total + total, innocent + others
        flagged, total, others = planted_caught(runs["temp"], "memory")
        temp_caught += flagged == total > 0
        temp_flags, temp_total, innocent = temp_flags + flagged, temp_total + total, innocent + others
        compared += sum(r["memory_compared"] + r["latency_compared"] for r in runs.values())
        print(f"trial {i + 1}/{args.n}: unchanged {'passed' if not clean['failed'] else 'FAILED'}, "
              f"slowed: {slow_flags} flagged so far, temporary: {temp_flags} flagged so far "
              f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)

    n = args.n
    print(f"gate against this checkout's code measured beside it, no saved run; quick matrix, engines "
          f"{args.engines}; {compared} A/B comparisons")
    print(f"unchanged code passed:     {passed}/{n} trials")
    print(f"25% slowdown caught:       {slow_caught}/{n} trials ({slow_flags}/{slow_total} planted benchmarks "
          f"flagged)")
    print(f"planted temporary caught:  {temp_caught}/{n} trials (every case; {temp_flags}/{temp_total} planted "
          f"benchmarks flagged)")
    print(f"unplanted benchmarks flagged in the planted runs: {innocent}")
    print(f"wall time {time.time() - started:.0f} s; verdicts in {out}")
    return 0 if (passed == n and slow_caught >= n - 1 and temp_caught == n) else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the CI workflows run, as one tested module (the YAML only calls it).

- ``gate``: the benchmark suite with the gate (memory against baselines/,
  latency A/B against a reference commit), leaving in ``--out`` the run's JSON,
  the verdict, a Markdown summary for the job page and, when a memory test
  failed, memray flame graphs of the failing tests.
- ``record``: the suite, saved into baselines/ as a new run named by commit,
  then the history table and charts rendered into ``--out``.
- ``summary``: a verdict JSON file as Markdown.

Usage: python -m mlexec.suite.ci gate --base origin/main --out bench-out [-- PYTEST ARGS]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from . import gate

ROOT = Path(__file__).resolve().parents[2]


def _pytest(args: list[str]) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # pytest-memray hands its result folder to workers through this variable; a stale one
    # (from an enclosing pytest) would override --memray-bin-path and its readable file names.
    env.pop("MEMRAY_RESULT_PATH", None)
    return subprocess.run([sys.executable, "-m", "pytest", "benchmarks/", *args], cwd=ROOT, env=env).returncode


def failed_memory_tests(junit: Path) -> list[str]:
    """Names like test_peak_memory[static-mlp-b1-d256] that failed, from a JUnit XML report."""
    if not junit.exists():
        return []
    return [case.get("name") for case in ET.parse(junit).iter("testcase")
            if case.get("name", "").startswith("test_peak_memory[")
            and (case.find("failure") is not None or case.find("error") is not None)]


def memray_reports(bins: Path, names: list[str], out: Path) -> list[Path]:
    """Flame graphs of the failing memory tests' captures (pytest-memray names files by node id)."""
    reports = []
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        for capture in sorted(bins.glob(f"*{glob.escape(name)}*.bin")):
            target = out / f"{capture.stem}.html"
            subprocess.run([sys.executable, "-m", "memray", "flamegraph", "-f", "-o", str(target), str(capture)],
                           check=True, capture_output=True)
            reports.append(target)
    return reports


def cmd_gate(args) -> int:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    status = _pytest([f"--mlexec-base={args.base}", f"--mlexec-verdict={out / 'verdict.json'}",
                      f"--benchmark-json={out / 'run.json'}", f"--junitxml={out / 'junit.xml'}",
                      f"--memray-bin-path={out / 'memray'}", "--memray-bin-prefix=gate", *args.pytest_args])
    verdict = out / "verdict.json"
    summary = (gate.format_markdown(json.loads(verdict.read_text()), json.loads(verdict.read_text())["reference"])
               if verdict.exists() else f"### Benchmark gate: no verdict (pytest exit {status})\n")
    (out / "summary.md").write_text(summary)
    failing = failed_memory_tests(out / "junit.xml")
    if failing:
        memray_reports(out / "memray", failing, out / "memray-reports")
    return status


def cmd_record(args) -> int:
    status = _pytest(["--mlexec-save", f"--mlexec-baselines={args.baselines}", *args.pytest_args])
    if status == 0:
        status = subprocess.run([sys.executable, "-m", "mlexec", "history", "--root", str(args.baselines),
                                 "--out", str(args.out)], cwd=ROOT).returncode
    return status


def cmd_summary(args) -> int:
    verdict = json.loads(args.verdict.read_text())
    sys.stdout.write(gate.format_markdown(verdict, verdict.get("reference", "?")))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlexec.suite.ci", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gate", help="run the suite and gate it")
    p.add_argument("--base", required=True, help="latency reference: a git ref or a folder holding engines/")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="where results go (default: %(default)s)")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    p.set_defaults(run=cmd_gate)
    p = sub.add_parser("record", help="run the suite, save it as a baseline, render the history")
    p.add_argument("--baselines", type=Path, default=Path("baselines"), help="default: %(default)s")
    p.add_argument("--out", type=Path, default=Path("reports/history"), help="default: %(default)s")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    p.set_defaults(run=cmd_record)
    p = sub.add_parser("summary", help="print a verdict JSON file as Markdown")
    p.add_argument("verdict", type=Path)
    p.set_defaults(run=cmd_summary)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

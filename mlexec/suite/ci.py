"""What the CI workflows run, as one tested module (the YAML only calls it).

- ``gate``: the benchmark suite (one shard of it with ``--shard K/N``) gated
  against reference code measured beside it, leaving in ``--out`` the run's
  JSON, the verdict, a Markdown summary for the job page and, when a memory
  test failed, memray flame graphs of the failing tests. Nothing compared fails.
- ``record``: the suite (or one shard) measured for the history, ungated.
- ``merge``: the shards' verdicts, runs and costs as one verdict, one run, one
  costs.json and one summary; a missing shard fails it. ``--save DIR`` adds the merged run to
  saved runs, named by commit.
- ``fetch-history``: the history branch's saved runs into a folder (empty if
  the branch does not exist yet), for ``--mlexec-compare auto``.
- ``trends``: the history branch's saved runs as the history table and charts, and as the
  static history site in ``OUT/site`` (the page ``/history`` serves) for GitHub Pages.
- ``comment``: the summary as the pull request's comment (one, updated), with the gh CLI.
- ``summary``: a verdict JSON file as Markdown.

Each runs in the current folder, the repository being gated (this project's, or a user's).

Usage: python -m mlexec.suite.ci gate --base origin/main --shard 1/4 --out bench-out/1 [-- PYTEST ARGS]
       python -m mlexec.suite.ci merge --shards 4 --out bench-out bench-out/*
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

from . import gate
from .grid import parse_shard

def _tests(given: list[str] | None) -> list[str]:
    """What pytest runs: the given paths, else ``benchmarks/`` where there is one (this project),
    else pytest's own choice (``testpaths``, or the folder)."""
    if given:
        return given
    return ["benchmarks/"] if Path("benchmarks").is_dir() else []


def _pytest(tests: list[str] | None, args: list[str]) -> int:
    """pytest in this folder (the repository being gated), importable from it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    # pytest-memray hands its result folder to workers through this variable; a stale one
    # (from an enclosing pytest) would override --memray-bin-path and its readable file names.
    env.pop("MEMRAY_RESULT_PATH", None)
    return subprocess.run([sys.executable, "-m", "pytest", *_tests(tests), *args], env=env).returncode


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


def _shard_args(shard: str | None) -> list[str]:
    return [f"--mlexec-shard={shard}"] if shard else []


def cmd_gate(args) -> int:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    status = _pytest(args.tests, [f"--mlexec-base={args.base}", "--mlexec-require-gate", *_shard_args(args.shard),
                      f"--mlexec-verdict={out / 'verdict.json'}", f"--mlexec-costs={out / 'costs.json'}",
                      f"--benchmark-json={out / 'run.json'}", f"--junitxml={out / 'junit.xml'}",
                      f"--memray-bin-path={out / 'memray'}", "--memray-bin-prefix=gate", *args.pytest_args])
    verdict = out / "verdict.json"
    summary = (gate.format_markdown(gate.Verdict.from_dict(json.loads(verdict.read_text())))
               if verdict.exists() else f"### Benchmark gate: no verdict (pytest exit {status})\n")
    (out / "summary.md").write_text(summary)
    failing = failed_memory_tests(out / "junit.xml")
    if failing:
        memray_reports(out / "memray", failing, out / "memray-reports")
    return status


def cmd_record(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    return _pytest(args.tests, ["--mlexec-base=off", "--mlexec-compare=off", *_shard_args(args.shard),
                    f"--mlexec-verdict={args.out / 'verdict.json'}", f"--mlexec-costs={args.out / 'costs.json'}",
                    f"--benchmark-json={args.out / 'run.json'}",
                    *args.pytest_args])


class MergeError(ValueError):
    """The shards don't make one whole run; the message says why."""


class Shard(NamedTuple):
    """One shard's verdict, and its timed run (None when it timed nothing)."""
    verdict: gate.Verdict
    run: dict | None


def _read_shards(folders: list[Path], shards: int) -> dict[int, Shard]:
    """Shard number -> its verdict and run, from the folders that hold a verdict.json; MergeError
    when one is of another split, doubled, or missing."""
    found: dict[int, Shard] = {}
    for folder in folders:
        path = folder / "verdict.json"
        if not path.is_file():
            continue
        verdict = gate.Verdict.from_dict(json.loads(path.read_text()))
        k, n = parse_shard(verdict.shard or "1/1")
        if n != shards:
            raise MergeError(f"{path}: shard {verdict.shard}, expected one of {shards}")
        if k in found:
            raise MergeError(f"{path}: shard {k}/{n} given twice")
        run = folder / "run.json"
        found[k] = Shard(verdict, json.loads(run.read_text()) if run.is_file() else None)
    missing = [k for k in range(1, shards + 1) if k not in found]
    if missing:
        raise MergeError(f"no verdict from shard {', '.join(f'{k}/{shards}' for k in missing)}: "
                         f"{'it' if len(missing) == 1 else 'they'} failed to report")
    return found


def _merged_run(runs: list[dict]) -> dict | None:
    """The shards' runs as one (benchmarks by name, each shard's machine kept); they must have
    measured one commit."""
    if not runs:
        return None
    commits = {r["commit_info"].get("id") for r in runs}
    if len(commits) > 1:
        raise MergeError(f"shards measured different commits: {sorted(map(str, commits))}")
    run = dict(runs[0], benchmarks=sorted((b for r in runs for b in r["benchmarks"]), key=lambda b: b["name"]))
    run["machine_info"] = dict(runs[0]["machine_info"], shards=[r["machine_info"] for r in runs])
    return run


def merge_shards(folders: list[Path], shards: int) -> tuple[gate.Verdict, dict | None]:
    """One verdict and one run from the folders of shards 1..``shards`` (each a verdict.json and,
    when benchmarks were timed, a run.json). Raises MergeError when a shard is missing or doubled."""
    found = _read_shards(folders, shards)
    ordered = [found[k] for k in sorted(found)]
    return (gate.merge([s.verdict for s in ordered]),
            _merged_run([s.run for s in ordered if s.run is not None]))


def merge_costs(folders: list[Path]) -> dict | None:
    """The shards' costs.json as one (every pair is in one shard), or None when none wrote one."""
    found = [json.loads(p.read_text()) for p in (f / "costs.json" for f in folders) if p.is_file()]
    if not found:
        return None
    return {"cpu": found[0]["cpu"], "matrix": found[0]["matrix"],
            "seconds": dict(sorted(kv for c in found for kv in c["seconds"].items()))}


def cmd_merge(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        verdict, run = merge_shards(args.folders, args.shards)
    except MergeError as exc:
        (args.out / "summary.md").write_text(f"### Benchmark gate: **incomplete**\n\n{exc}\n")
        print(f"merge: {exc}", file=sys.stderr)
        return 1
    from .session import write_json
    write_json(args.out / "verdict.json", verdict.as_dict())
    if run is not None:
        write_json(args.out / "run.json", run)
    costs = merge_costs(args.folders)
    if costs is not None:
        write_json(args.out / "costs.json", costs)
    (args.out / "summary.md").write_text(gate.format_markdown(verdict))
    print(gate.format_verdict(verdict))
    if args.save:
        if run is None:
            print("merge: no timed run to save", file=sys.stderr)
            return 1
        from mlexec import baselines
        name = (run["commit_info"].get("id") or "nocommit")[:12]
        saved = baselines.save_run(run, args.save, machine_folder(run["machine_info"]), name)
        print(f"saved the merged run as {saved}")
    if verdict.failed:
        return 1
    return 4 if args.require_gate and verdict.nothing_compared else 0


def machine_folder(machine_info: dict) -> str:
    """``mlexec.baselines.machine_id``'s form, from a run's machine_info (its first shard's machine)."""
    cpu = machine_info.get("cpu") or {}
    slug = re.sub(r"[^A-Za-z0-9]+", "-", cpu.get("brand_raw") or "unknown-cpu").strip("-")
    version = ".".join(str(machine_info.get("python_version", "0.0")).split(".")[:2])
    return (f"{machine_info.get('system', 'unknown')}-{machine_info.get('python_implementation', 'unknown')}-"
            f"{version}-{cpu.get('bits', 64)}bit-{slug}-{cpu.get('count', 0)}cpu")


def cmd_fetch_history(args) -> int:
    """``git fetch`` the history branch and check out its baselines/ into ``--into``."""
    args.into.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(["git", "fetch", "-q", "origin", args.branch], capture_output=True)
    if fetched.returncode != 0:
        print(f"fetch-history: no branch {args.branch!r} on origin yet: no history", file=sys.stderr)
        return 0
    archive = subprocess.run(["git", "archive", "--format=tar", "FETCH_HEAD", "baselines"], capture_output=True)
    if archive.returncode != 0:
        print(f"fetch-history: {args.branch!r} holds no baselines/", file=sys.stderr)
        return 0
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(args.into, filter="data")
    return 0


def cmd_trends(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cmd_fetch_history(argparse.Namespace(branch=args.branch, into=Path(tmp)))
        root = Path(tmp) / "baselines"
        if not root.is_dir():
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "README.md").write_text(f"No saved runs on {args.branch} yet.\n")
            return 0
        return subprocess.run([sys.executable, "-m", "mlexec", "history", "--root", str(root),
                               "--out", str(args.out), "--html", str(args.out / "site")]).returncode


def cmd_summary(args) -> int:
    sys.stdout.write(gate.format_markdown(gate.Verdict.from_dict(json.loads(args.verdict.read_text()))))
    return 0


MARKER = "<!-- mlexec benchmark gate -->"   # finds the gate's own comment on a pull request


def _gh(*args: str) -> str:
    return subprocess.run(["gh", *args], capture_output=True, text=True, check=True).stdout


def pull_request_number(event_path: str | None) -> int | None:
    """The pull request's number from the workflow's event payload, or None for another event."""
    if not event_path or not Path(event_path).is_file():
        return None
    number = (json.loads(Path(event_path).read_text()).get("pull_request") or {}).get("number")
    return int(number) if number else None


def cmd_comment(args) -> int:
    """The summary as the pull request's gate comment (with the gh CLI): the gate's earlier comment
    is updated, so a pull request carries one, always the latest verdict."""
    number = args.pr or pull_request_number(os.environ.get("GITHUB_EVENT_PATH"))
    if number is None or not args.repo:
        print("comment: not a pull request (no number or repository): no comment", file=sys.stderr)
        return 0
    body = Path(tempfile.mkdtemp(prefix="mlexec-comment-")) / "body.md"
    try:
        body.write_text(f"{MARKER}\n{args.summary.read_text()}")
        found = _gh("api", "--paginate", f"repos/{args.repo}/issues/{number}/comments",
                    "--jq", f'.[] | select(.body | startswith("{MARKER}")) | .id').split()
        if found:
            _gh("api", "-X", "PATCH", f"repos/{args.repo}/issues/comments/{found[-1]}", "-F", f"body=@{body}")
        else:
            _gh("api", f"repos/{args.repo}/issues/{number}/comments", "-F", f"body=@{body}")
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"comment: {getattr(exc, 'stderr', '') or exc}".strip(), file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(body.parent, ignore_errors=True)
    print(f"comment: {'updated' if found else 'posted'} the gate's comment on {args.repo}#{number}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlexec.suite.ci", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gate", help="run the suite (or one shard) and gate it")
    p.add_argument("--base", required=True, help="reference code: a git ref, a folder laid out as the repository, "
                                                 "or auto")
    p.add_argument("--tests", action="append", default=None, metavar="PATH",
                   help="what pytest runs (repeatable); default: benchmarks/ where there is one, else pytest's "
                        "testpaths")
    p.add_argument("--shard", default=None, metavar="K/N", help="run shard K of N (default: all)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="where results go (default: %(default)s)")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    p.set_defaults(run=cmd_gate)
    p = sub.add_parser("record", help="run the suite (or one shard) for the history, ungated")
    p.add_argument("--tests", action="append", default=None, metavar="PATH",
                   help="what pytest runs (repeatable); default as for gate")
    p.add_argument("--shard", default=None, metavar="K/N", help="run shard K of N (default: all)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="default: %(default)s")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    p.set_defaults(run=cmd_record)
    p = sub.add_parser("merge", help="merge the shards' verdicts and runs; fails if a shard is missing")
    p.add_argument("--shards", type=int, required=True, help="how many shards the run was split into")
    p.add_argument("--out", type=Path, required=True, help="where the merged files go")
    p.add_argument("--save", type=Path, default=None, metavar="DIR", help="save the merged run into DIR")
    p.add_argument("--require-gate", action="store_true", help="exit 4 when nothing at all was compared")
    p.add_argument("folders", type=Path, nargs="+", help="one folder per shard")
    p.set_defaults(run=cmd_merge)
    p = sub.add_parser("fetch-history", help="the history branch's saved runs into a folder")
    p.add_argument("--branch", default="bench-history", help="default: %(default)s")
    p.add_argument("--into", type=Path, default=Path("history"), help="default: %(default)s")
    p.set_defaults(run=cmd_fetch_history)
    p = sub.add_parser("trends", help="the history branch's saved runs as the history table and charts")
    p.add_argument("--branch", default="bench-history", help="default: %(default)s")
    p.add_argument("--out", type=Path, default=Path("reports/history"), help="default: %(default)s")
    p.set_defaults(run=cmd_trends)
    p = sub.add_parser("comment", help="post (or update) the summary as the pull request's gate comment")
    p.add_argument("--summary", type=Path, required=True, help="the Markdown to post (merge's summary.md)")
    p.add_argument("--repo", default=os.environ.get("GITHUB_REPOSITORY"), help="OWNER/NAME (default: $GITHUB_REPOSITORY)")
    p.add_argument("--pr", type=int, default=None, help="the pull request (default: from $GITHUB_EVENT_PATH)")
    p.set_defaults(run=cmd_comment)
    p = sub.add_parser("summary", help="print a verdict JSON file as Markdown")
    p.add_argument("verdict", type=Path)
    p.set_defaults(run=cmd_summary)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

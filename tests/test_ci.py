"""The CI side: workflow files are valid, call only tested entry points, and the gate command
leaves a summary, the run and memray reports of failing tests."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env
from mlexec.suite import ci

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def test_workflows_match_the_github_schema():
    exe = shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is part of the dev extra"
    proc = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {w.name for w in WORKFLOWS} == {"tests.yml", "bench-gate.yml", "bench-history.yml"}


def test_workflow_steps_call_only_entry_points_that_exist():
    for workflow in WORKFLOWS:
        for command in re.findall(r"^\s+(?:- )?run: (.+)$", workflow.read_text(), flags=re.M):
            first = command.split()[0]
            if first in ("bash", "./scripts/setup") or first.startswith("./scripts/"):
                script = command.split()[1] if first == "bash" else first
                assert (ROOT / script).is_file(), f"{workflow.name}: {script} missing"
            elif first == "python":
                module = command.split()[2]
                assert module.startswith("mlexec.") and (ROOT / (module.replace(".", "/") + ".py")).is_file()
            else:
                assert first == "cat", f"{workflow.name}: unexpected step {command!r}"


def test_ci_run_installs_then_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    commands = [line for line in readme[:8] if line.startswith("./scripts/setup")]
    assert len(commands) == 2 and "pytest benchmarks/" in commands[0]
    test_command = commands[1].split("#")[0].split("&&")[1].strip()
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(f"python -m {test_command}")


def test_failed_memory_tests_are_read_from_junit(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase name="test_peak_memory[static-mlp-b1-d256]"><failure message="x"/></testcase>'
                     '<testcase name="test_peak_memory[arena-mlp-b1-d256]"/>'
                     '<testcase name="test_forward[naive-mlp-b1-d256]"><failure message="y"/></testcase>'
                     '</testsuite></testsuites>')
    assert ci.failed_memory_tests(junit) == ["test_peak_memory[static-mlp-b1-d256]"]
    assert ci.failed_memory_tests(tmp_path / "absent.xml") == []


@pytest.mark.e2e
def test_gate_command_leaves_summary_run_and_memray_report(tmp_path):
    out = tmp_path / "out"
    env = dict(subprocess_env(), MLEXEC_PLANT="temp")
    proc = subprocess.run([sys.executable, "-m", "mlexec.suite.ci", "gate", "--base", ".", "--out", str(out), "--",
                           "-q", "-p", "mlexec.suite.plants", "-p", "no:cacheprovider", "--mlexec-engines=planted",
                           "-k", "mlp-b8-d256 or mlp-b32-d256", "--benchmark-max-time=0.05",
                           f"--mlexec-baselines={tmp_path / 'none'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert {b["extra_info"]["case"] for b in run["benchmarks"]} == {"mlp-b32-d256"}
    assert all(b["extra_info"]["peak_bytes"] >= 32 * 256 * 4 for b in run["benchmarks"])
    summary = (out / "summary.md").read_text()
    assert summary.startswith("### Benchmark gate: **regression**")     # the temporary, against static at "."
    assert "| `planted-mlp-b32-d256` | memory |" in summary
    reports = list((out / "memray-reports").glob("*.html"))
    assert len(reports) == 1 and "planted-mlp-b32-d256" in reports[0].name


def test_push_history_commits_new_runs_to_the_history_branch(tmp_path):
    git = lambda *args, cwd: subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,  # noqa: E731
                                            text=True).stdout
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    git("clone", "-q", str(origin), str(work), cwd=tmp_path)
    (work / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "push-history", work / "scripts" / "push-history")
    (work / "baselines" / "m").mkdir(parents=True)
    (work / "baselines" / "m" / "0001_old.json").write_text("{}")
    git("add", ".", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    for new in ("0002_abc.json", "0003_def.json"):          # two pushes to main, one run each
        (work / "baselines" / "m" / new).write_text('{"run": "%s"}' % new)
        subprocess.run(["bash", "scripts/push-history", "bench-history"], cwd=work, check=True)
        (work / "baselines" / "m" / new).unlink()
    listed = git("ls-tree", "-r", "--name-only", "bench-history", cwd=origin).split()
    assert {"baselines/m/0002_abc.json", "baselines/m/0003_def.json"} <= set(listed)
    assert git("show", "bench-history:baselines/m/0002_abc.json", cwd=origin) == '{"run": "0002_abc.json"}'
    assert git("log", "--format=%s", "main", cwd=origin).split("\n")[0] == "init"   # main untouched

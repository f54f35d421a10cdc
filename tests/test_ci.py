"""The CI side: workflow files are valid, call only tested entry points, and the gate command
leaves a summary, the run and memray reports of failing tests."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env
from mlexec import baselines
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


def git(*args, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _repo_with_push_history(tmp_path, first_file: str, text: str):
    """A bare origin and a clone whose main holds scripts/push-history and one file: (origin, clone)."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    git("clone", "-q", str(origin), str(work), cwd=tmp_path)
    (work / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "push-history", work / "scripts" / "push-history")
    (work / "baselines" / "m").mkdir(parents=True)
    (work / first_file).write_text(text)
    git("add", ".", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    return origin, work


def test_push_history_commits_new_runs_to_the_history_branch(tmp_path):
    origin, work = _repo_with_push_history(tmp_path, "baselines/m/0001_old.json", "{}")
    for new in ("0002_abc.json", "0003_def.json"):          # two pushes to main, one run each
        (work / "baselines" / "m" / new).write_text('{"run": "%s"}' % new)
        subprocess.run(["bash", "scripts/push-history", "bench-history"], cwd=work, check=True)
        (work / "baselines" / "m" / new).unlink()
    listed = git("ls-tree", "-r", "--name-only", "bench-history", cwd=origin).split()
    assert {"baselines/m/0002_abc.json", "baselines/m/0003_def.json"} <= set(listed)
    assert git("show", "bench-history:baselines/m/0002_abc.json", cwd=origin) == '{"run": "0002_abc.json"}'
    assert git("log", "--format=%s", "main", cwd=origin).split("\n")[0] == "init"   # main untouched


def test_push_history_renumbers_a_taken_name_and_retries_a_rejected_push(tmp_path):
    origin, work = _repo_with_push_history(tmp_path, "README", "x")
    (work / "baselines" / "m" / "0001_other.json").write_text('{"run": "other"}')
    subprocess.run(["bash", "scripts/push-history"], cwd=work, check=True, capture_output=True)
    (work / "baselines" / "m" / "0001_other.json").unlink()
    # The next push is rejected once, as when another writer got in first.
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\n[ -e {tmp_path}/rejected ] && exit 0\ntouch {tmp_path}/rejected\nexit 1\n")
    hook.chmod(0o755)
    (work / "baselines" / "m" / "0001_mine.json").write_text('{"run": "mine"}')     # the same number
    proc = subprocess.run(["bash", "scripts/push-history"], cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "rejected (attempt 1)" in proc.stderr
    listed = git("ls-tree", "-r", "--name-only", "bench-history", cwd=origin).split()
    assert sorted(listed) == ["README", "baselines/m/0001_other.json", "baselines/m/0002_mine.json",
                              "scripts/push-history"]


# --- merging shards -----------------------------------------------------------------------

def shard_folder(tmp_path, k, n, commit="abc", compared=("static-mlp-b1-d256",), regressions=()):
    from mlexec.suite import gate
    verdict = gate.Verdict(reference="code at def (merge-base of HEAD with main)", shard=f"{k}/{n}")
    for name in compared:
        verdict.done("memory", name)
    for name in regressions:
        verdict.done("memory", name, gate.Finding(name, "memory", 72, 8264, 114.8))
    folder = tmp_path / f"shard-{k}"
    folder.mkdir()
    (folder / "verdict.json").write_text(json.dumps(verdict.as_dict()))
    stats = dict.fromkeys(("min", "max", "mean", "stddev", "median", "iqr", "rounds"), 1)
    run = {"machine_info": {"system": "Linux", "python_implementation": "CPython", "python_version": "3.11.7",
                            "cpu": {"brand_raw": f"CPU {k}", "bits": 64, "count": 2}},
           "commit_info": {"id": commit}, "datetime": "2026-01-01T00:00:00", "version": "5.2.3",
           "benchmarks": [{"name": f"test_forward[{n}]", "fullname": "x", "stats": stats, "extra_info": {}}
                          for n in compared]}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def test_merge_makes_one_verdict_run_and_summary(tmp_path):
    folders = [shard_folder(tmp_path, 1, 2, compared=["naive-mlp-b1-d256"]),
               shard_folder(tmp_path, 2, 2, compared=["static-mlp-b1-d256", "planted-mlp-b1-d256"],
                            regressions=["planted-mlp-b1-d256"])]
    out = tmp_path / "out"
    status = ci.main(["merge", "--shards", "2", "--out", str(out), "--save", str(tmp_path / "saved"),
                      *map(str, folders)])
    assert status == 1                                             # the planted regression
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["memory_compared"] == 3 and [f["name"] for f in verdict["regressions"]] == ["planted-mlp-b1-d256"]
    run = json.loads((out / "run.json").read_text())
    assert [b["name"] for b in run["benchmarks"]] == ["test_forward[naive-mlp-b1-d256]",
                                                      "test_forward[planted-mlp-b1-d256]",
                                                      "test_forward[static-mlp-b1-d256]"]
    assert [m["cpu"]["brand_raw"] for m in run["machine_info"]["shards"]] == ["CPU 1", "CPU 2"]
    assert (out / "summary.md").read_text().startswith("### Benchmark gate: **regression**")
    [(path, saved)] = baselines.iter_runs(tmp_path / "saved")
    assert path.parent.name == "Linux-CPython-3.11-64bit-CPU-1-2cpu" and path.name == "0001_abc.json"


def test_merge_joins_the_shards_costs(tmp_path):
    folders = [shard_folder(tmp_path, k, 2) for k in (1, 2)]
    for k, folder in enumerate(folders, 1):
        (folder / "costs.json").write_text(json.dumps({"cpu": "CPU", "matrix": "full",
                                                       "seconds": {f"e{k} mlp-b1-d256": float(k)}}))
    out = tmp_path / "out"
    ci.main(["merge", "--shards", "2", "--out", str(out), *map(str, folders)])
    assert json.loads((out / "costs.json").read_text()) == {
        "cpu": "CPU", "matrix": "full", "seconds": {"e1 mlp-b1-d256": 1.0, "e2 mlp-b1-d256": 2.0}}


def test_merge_fails_when_a_shard_did_not_report(tmp_path):
    folders = [shard_folder(tmp_path, 1, 3), shard_folder(tmp_path, 3, 3), tmp_path / "empty"]
    out = tmp_path / "out"
    assert ci.main(["merge", "--shards", "3", "--out", str(out), *map(str, folders)]) == 1
    assert "no verdict from shard 2/3: it failed to report" in (out / "summary.md").read_text()
    assert not (out / "verdict.json").exists()


def test_merge_rejects_doubled_shards_and_mixed_commits(tmp_path):
    one = shard_folder(tmp_path, 1, 2)
    with pytest.raises(ci.MergeError, match="given twice"):
        ci.merge_shards([one, one], 2)
    with pytest.raises(ci.MergeError, match="different commits"):
        ci.merge_shards([one, shard_folder(tmp_path, 2, 2, commit="xyz")], 2)


def test_merge_of_shards_that_compared_nothing_fails_when_the_gate_is_required(tmp_path):
    folders = [shard_folder(tmp_path, k, 2, compared=()) for k in (1, 2)]
    assert ci.main(["merge", "--shards", "2", "--require-gate", "--out", str(tmp_path / "o"), *map(str, folders)]) == 4
    assert ci.main(["merge", "--shards", "2", "--out", str(tmp_path / "p"), *map(str, folders)]) == 0


def test_trends_write_the_history_table_charts_and_the_static_site(tmp_path, monkeypatch):
    """What bench-history.yml publishes: trends of the history branch's runs, and the /history page
    as a static site for GitHub Pages (the git fetch itself stood in for by a copy)."""
    import argparse

    from conftest import FIXTURES

    monkeypatch.setattr(ci, "cmd_fetch_history",
                        lambda a: shutil.copytree(FIXTURES / "baselines", a.into / "baselines") and 0)
    out = tmp_path / "history"
    assert ci.cmd_trends(argparse.Namespace(branch="bench-history", out=out)) == 0
    page = (out / "site" / "index.html").read_text()
    assert '<figure class="chart' in page and "history.js" in page
    assert (out / "site" / "history.js").is_file() and list(out.glob("*.png"))


# --- the composite action a user's workflow runs ---------------------------------------------

ACTION = ROOT / "action.yml"


def _docs_workflow() -> str:
    """The workflow docs/gate.md tells a user to copy."""
    text = (ROOT / "docs" / "gate.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    (workflow,) = [b for b in blocks if "pull_request" in b]
    return workflow


def test_the_action_and_the_documented_workflow_match_the_github_schemas(tmp_path):
    exe = shutil.which("check-jsonschema")
    workflow = tmp_path / "bench-gate.yml"
    workflow.write_text(_docs_workflow())
    for schema, path in (("vendor.github-actions", ACTION), ("vendor.github-workflows", workflow)):
        proc = subprocess.run([exe, "--builtin-schema", schema, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_workflows_use_only_inputs_the_action_declares():
    import yaml
    inputs = set(yaml.safe_load(ACTION.read_text())["inputs"])
    uses = [step for text in [_docs_workflow(), (ROOT / ".github/workflows/bench-gate.yml").read_text()]
            for job in yaml.safe_load(text)["jobs"].values() for step in job["steps"]
            if step.get("uses") in ("./", "OWNER/mlexec@main")]
    assert len(uses) == 4 and all(set(step.get("with", {})) <= inputs for step in uses)


def test_the_action_runs_only_ci_commands_that_exist():
    """Thin YAML: every `python -m mlexec...` line of the action is a subcommand ci's parser knows."""
    import yaml
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    commands = [line.strip() for s in steps for line in s.get("run", "").splitlines()
                if line.strip().startswith("python -m mlexec")]
    known = {"gate", "record", "merge", "fetch-history", "trends", "comment", "summary"}
    assert {c.split()[3] for c in commands if c.split()[2] == "mlexec.suite.ci"} == {"gate", "merge", "fetch-history",
                                                                                   "trends", "comment"}
    for command in commands:
        sub = command.split()[3]
        assert sub in known
        proc = subprocess.run([sys.executable, "-m", "mlexec.suite.ci", sub, "--help"], capture_output=True,
                              text=True, env=subprocess_env())
        assert proc.returncode == 0, proc.stderr
        for flag in re.findall(r"(--[a-z-]+)", command.split(" -- ")[0]):
            assert flag in proc.stdout, f"{sub} has no {flag}"


def test_the_comment_is_posted_once_then_updated(tmp_path, monkeypatch):
    """ci comment with a stand-in gh on PATH: no earlier comment -> POST; one -> PATCH that one."""
    log, existing = tmp_path / "gh.log", tmp_path / "existing"
    gh = tmp_path / "bin" / "gh"
    gh.parent.mkdir()
    gh.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                  f'case "$*" in *--jq*) cat {existing} 2>/dev/null || true;; esac\n')
    gh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{gh.parent}:{os.environ['PATH']}")
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 7}}))
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    summary = tmp_path / "summary.md"
    summary.write_text("### Benchmark gate: no regression\n")
    assert ci.main(["comment", "--summary", str(summary), "--repo", "me/svc"]) == 0
    assert log.read_text().splitlines()[-1].startswith("api repos/me/svc/issues/7/comments -F body=@")
    existing.write_text("1234\n")
    assert ci.main(["comment", "--summary", str(summary), "--repo", "me/svc"]) == 0
    assert log.read_text().splitlines()[-1].startswith("api -X PATCH repos/me/svc/issues/comments/1234 -F body=@")
    monkeypatch.delenv("GITHUB_EVENT_PATH")
    assert ci.main(["comment", "--summary", str(summary), "--repo", "me/svc"]) == 0      # not a pull request
    assert len(log.read_text().splitlines()) == 4

"""The gate in a user's own repository (mlexec.suite.example: their package, their engine, their
model file), built by pytester as a git repository of its own, flat and src layouts: a base
commit on main, then a pull request branch that plants a slowdown, an allocation or a model
change. Each must fail the run with its verdict, unchanged code must pass, and the run must
leave nothing in the temporary folder. Each run is a fresh process, as CI runs it."""
from __future__ import annotations

import json
import subprocess
import sys

import onnx  # noqa: F401  (imported before pytester snapshots sys.modules: its extension loads once)
import pytest

from mlexec.suite import example

pytest_plugins = ["pytester"]


def _git(root, *args):
    subprocess.run(["git", "-c", "user.email=dev@example.com", "-c", "user.name=dev", *args], cwd=root,
                   check=True, capture_output=True)


@pytest.fixture
def user_repo(pytester, tmp_path_factory, monkeypatch):
    """A factory: the example repository in ``layout`` with one commit on main and a branch ``pr``
    checked out; TMPDIR is a fresh empty folder that the runs must leave empty."""
    temp = tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)

    def make(layout: str):
        root = pytester.path
        example.write(root, layout)
        _git(root, "init", "-q", "-b", "main")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", "our inference service")
        _git(root, "checkout", "-q", "-b", "pr")
        return root, temp
    return make


def _pull_request(root, what: str, layout: str, commit: bool = True, **kw):
    example.plant(root, what, layout, **kw)
    if commit:
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", what)


def _gate(pytester, *args):
    """The suite as the action runs it (python -m mlexec.suite.ci gate), quick on a busy machine."""
    result = pytester.run(sys.executable, "-m", "mlexec.suite.ci", "gate", "--base", "auto", "--out", "out",
                          "--", "-p", "no:cacheprovider", "--benchmark-max-time=0.05", "--mlexec-compare=off", *args)
    verdict = json.loads((pytester.path / "out" / "verdict.json").read_text())
    return result, verdict


def _flagged(verdict, kind):
    return sorted(f["name"] for f in verdict["regressions"] if f["kind"] == kind)


MINE = ["mine-mlp-b1", "mine-mlp-b8"]


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["flat", "src"])
def test_unchanged_code_passes_and_leaves_nothing_behind(pytester, user_repo, layout):
    root, temp = user_repo(layout)
    _pull_request(root, "docs", layout)
    result, verdict = _gate(pytester)
    assert result.ret == 0, result.stdout.str()
    assert sorted(verdict["compared"]["latency"]) == sorted(verdict["compared"]["memory"]) == MINE
    src = "src/mypkg" if layout == "src" else "mypkg"
    assert f"(merge-base of HEAD with main): {src}, models/mlp.onnx" in verdict["reference"]
    # naive comes from the installed package: the same code on both sides, said, not compared
    (reason,) = verdict["skipped"]["latency"]
    assert "the same code on both sides" in reason
    assert list(temp.iterdir()) == []
    assert (root / "out" / "summary.md").read_text().startswith("### Benchmark gate: no regression")


@pytest.mark.e2e
def test_a_slowdown_in_their_engine_fails_the_run(pytester, user_repo):
    root, temp = user_repo("flat")
    _pull_request(root, "slow", "flat", slowdown=1.0)
    result, verdict = _gate(pytester, "--mlexec-pass=time")
    assert result.ret == 1
    assert _flagged(verdict, "latency") == MINE
    assert all(f["ratio"] > 1.5 for f in verdict["regressions"])
    assert list(temp.iterdir()) == []


@pytest.mark.e2e
def test_an_uncommitted_allocation_is_measured_against_head(pytester, user_repo):
    root, _ = user_repo("src")
    _pull_request(root, "temp", "src", commit=False)
    result, verdict = _gate(pytester, "--mlexec-pass=memory")
    assert result.ret == 1
    assert "HEAD: src/mypkg, models/mlp.onnx has uncommitted changes" in verdict["reference"]
    assert _flagged(verdict, "memory") == MINE            # 16 KiB more at every batch
    assert all(f["current"] - f["baseline"] >= 16384 for f in verdict["regressions"])


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["flat", "src"])
def test_a_changed_model_file_is_measured_at_the_reference_beside_the_new_one(pytester, user_repo, layout):
    root, temp = user_repo(layout)
    _pull_request(root, "model", layout, extra_flops=1.0)
    result, verdict = _gate(pytester)
    assert result.ret == 1
    (change,) = verdict["models"]
    assert change["file"] == "models/mlp.onnx" and change["nodes"] == [3, 3]
    assert change["flops"][1] / change["flops"][0] == pytest.approx(2.0, rel=0.01)
    # every engine on the model, the installed ones too: the model is what changed
    assert sorted(change["benchmarks"]) == ["mine-mlp-b1", "mine-mlp-b8", "naive-mlp-b1", "naive-mlp-b8"]
    assert all(b["ratio"] > 1.3 and b["weights"][1] > b["weights"][0] for b in change["benchmarks"].values())
    assert "mine-mlp-b8" in _flagged(verdict, "latency")
    text = result.stdout.str()
    assert "model changed: models/mlp.onnx: 3 -> 3 nodes, 2.00x the flops" in text
    assert list(temp.iterdir()) == []


@pytest.mark.e2e
def test_an_engine_registered_in_conftest_is_gated_too(pytester, user_repo):
    """Registered by hand (ENGINES[name] = cls) rather than by --mlexec-engine-module."""
    root, _ = user_repo("flat")
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(" --mlexec-engine-module=mypkg.engine", ""))
    (root / "conftest.py").write_text("from engines import ENGINES\nfrom mypkg.engine import MyEngine\n\n"
                                      "ENGINES['mine'] = MyEngine\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "register in conftest")
    _git(root, "branch", "-f", "main", "HEAD")
    _pull_request(root, "slow", "flat", slowdown=1.0)
    result, verdict = _gate(pytester, "--mlexec-pass=time")
    assert result.ret == 1, result.stdout.str()
    assert _flagged(verdict, "latency") == MINE
    assert verdict["reference"].endswith("(merge-base of HEAD with main): mypkg, models/mlp.onnx")


# --- the pieces, in this process ----------------------------------------------------------------

def test_the_copy_imports_its_own_modules_under_private_names(tmp_path):
    """Absolute and relative imports inside the copy resolve to the copy; the current modules and the
    registry come back untouched; close() forgets the copy and removes a temporary folder."""
    from engines import ENGINES
    from mlexec.suite import basecode

    def package(root, value):
        (root / "gatedpkg").mkdir(parents=True)
        (root / "gatedpkg" / "__init__.py").write_text("")
        (root / "gatedpkg" / "values.py").write_text(f"VALUE = {value}\n")
        (root / "gatedpkg" / "engine.py").write_text(
            "from engines.planned.static import StaticEngine\nfrom engines import ENGINES\n"
            "from gatedpkg.values import VALUE\nfrom . import values\n\n"
            "class E(StaticEngine):\n    name = 'gated'\n    value = VALUE\n\n"
            "    def relative(self):\n        from .values import VALUE\n        return VALUE\n\n"
            "ENGINES['gated'] = E\n")
    package(tmp_path / "now", 2)
    package(tmp_path / "then", 1)
    sys.path.insert(0, str(tmp_path / "now"))
    try:
        from gatedpkg.engine import E
        source = basecode.source_of(E, tmp_path / "now")
        assert source == basecode.Source("gatedpkg", "gatedpkg")
        before = dict(ENGINES)
        prefix, copy, registered = basecode.import_copy(tmp_path / "then", [source], ["gatedpkg.engine"])
        old = copy["gatedpkg.engine"].E
        assert (old.value, E.value) == (1, 2) and old.relative(None) == 1
        assert registered == {"gated": old} and ENGINES == before
        assert sys.modules["gatedpkg.engine"].E is E and sys.modules[prefix + "gatedpkg.engine"].E is old
    finally:
        sys.path.remove(str(tmp_path / "now"))
        for name in [n for n in sys.modules if "gatedpkg" in n]:
            del sys.modules[name]
        ENGINES.pop("gated", None)


def test_engines_join_from_a_module_and_from_entry_points(monkeypatch):
    from engines import registry
    monkeypatch.setattr(registry, "ENGINES", dict(registry.ENGINES))
    assert registry.register_module("mlexec.suite.plants") == ["planted"]
    with pytest.raises(ValueError, match="defines no engines.base.Engine subclass"):
        registry.register_module("mlexec.suite.example")
    with pytest.raises(ValueError, match="would replace"):
        registry.register("static", registry.NaiveEngine)
    with pytest.raises(ValueError, match="not a subclass"):
        registry.register("x", int)

    class Point:
        def __init__(self, name, value, target):
            self.name, self.value, self.target = name, value, target

        def load(self):
            if isinstance(self.target, Exception):
                raise self.target
            return self.target

    import importlib.metadata
    points = [Point("theirs", "theirpkg:Engine", registry.StaticEngine)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points if group == "mlexec.engines" else [])
    assert registry.discover() == ["theirs"] and registry.ENGINES["theirs"] is registry.StaticEngine
    points.append(Point("broken", "theirpkg:Gone", ImportError("no module theirpkg")))
    with pytest.raises(ValueError, match="entry point broken = 'theirpkg:Gone'"):
        registry.discover()


def test_a_model_change_reads_as_one_block():
    from mlexec.suite import gate
    change = gate.ModelChange("models/m.onnx", (3, 5), (100, 130), {
        "mine-m-b1": {"ratio": 1.32, "peak": [1000, 1000 + 2 * 1024 * 1024], "arena": [0, 0], "weights": [10, 10]},
        "naive-m-b1": {"ratio": 0.8}})
    assert change.lines() == ["model changed: models/m.onnx: 3 -> 5 nodes, 1.30x the flops",
                              "  mine-m-b1: 1.32x slower, +2.0 MiB per forward, +0 B weights",
                              "  naive-m-b1: 1.25x faster"]
    verdict = gate.Verdict(reference="code at abc", models=[change])
    again = gate.Verdict.from_dict(json.loads(json.dumps(verdict.as_dict())))
    assert again.models == [change] and "model changed: models/m.onnx" in gate.format_markdown(again)


def test_the_command_line_reports_a_broken_entry_point_in_one_line(monkeypatch, capsys):
    import importlib.metadata

    from mlexec import cli

    class Broken:
        name, value = "theirs", "theirpkg:Engine"

        def load(self):
            raise ImportError("No module named 'theirpkg'")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Broken()])
    assert cli.main(["report", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "entry point theirs = 'theirpkg:Engine'" in err

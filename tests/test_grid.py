"""The table of benchmark models (``mlexec.case.FAMILIES``) is the one place a model is declared:
the suite's matrices, the report's grids, its ``--shapes`` parsing and checks, the analyzer's
point ids and the tests' small models are all read from it."""
from dataclasses import replace

import pytest

from conftest import SMALL_MODELS
from engines import MODELS
from engines.ir.models import transformer
from mlexec import case as case_module
from mlexec import report
from mlexec.analysis import run_analysis
from mlexec.case import FAMILIES, Case, Family
from mlexec.cli import build_parser
from mlexec.report import inputs
from mlexec.suite import grid


def seq_model(dim: int = 16, seq: int = 4, seed: int = 0):
    """A stand-in zoo builder: a two-head encoder block, named "toy" (its own check: dim % 2)."""
    return replace(transformer(dim=dim, seq=seq, heads=2, seed=seed), name="toy")


TOY = Family("toy", batches=(1, 2, 4), dims=(16, 32), seqs=(4,), quick=("2x16x4",),
             report=True, report_batches=(1, 2), report_quick=("1x32x4",), small={"dim": 8, "seq": 2})


@pytest.fixture
def toy(monkeypatch):
    """A benchmark model added the documented way: a zoo builder and one table entry, nothing else."""
    monkeypatch.setitem(MODELS, "toy", seq_model)
    monkeypatch.setitem(FAMILIES, "toy", TOY)
    return TOY


def test_a_new_entry_reaches_the_suite_matrices(toy):
    full, quick = grid.MATRICES["full"](), grid.MATRICES["quick"]()
    assert [c.id for c in full if c.model == "toy"] == [
        "toy-b1-d16-s4", "toy-b2-d16-s4", "toy-b4-d16-s4", "toy-b1-d32-s4", "toy-b2-d32-s4", "toy-b4-d32-s4"]
    assert [c.id for c in quick if c.model == "toy"] == ["toy-b2-d16-s4"]
    assert full[:len(grid.FULL)] == grid.FULL            # the others' cases unchanged, in order


def test_a_new_entry_reaches_the_report_grids_and_its_shapes(toy, capsys):
    assert "toy" in inputs.report_families()
    assert [c.id for c in inputs.grid_of(["toy"])["toy"]] == [
        "toy-b1-d16-s4", "toy-b2-d16-s4", "toy-b1-d32-s4", "toy-b2-d32-s4"]   # its report batches only
    assert inputs.grid_of(["toy"], quick=True) == {"toy": [Case("toy", 1, 32, 4)]}
    # a BATCHxDIMxSEQ shape goes to every chosen model of that form; with no --models to the first
    assert inputs.parse_shapes("2x16x4", ["toy"]) == {"toy": [Case("toy", 2, 16, 4)]}
    assert inputs.parse_shapes("2x16x4", ["transformer", "toy"]) == {
        "transformer": [Case("transformer", 2, 16, 4)], "toy": [Case("toy", 2, 16, 4)]}
    assert inputs.parse_shapes("2x16x4", None) == {"transformer": [Case("transformer", 2, 16, 4)]}
    with pytest.raises(report.ReportError, match="no --shapes for toy; expected at least one BATCHxDIMxSEQ"):
        inputs.parse_shapes("2x16", ["mlp", "toy"])
    assert "BATCHxDIMxSEQ (transformer, toy)" in inputs.shape_forms()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", "--help"])
    assert "--models MODELS comma list from mlp, transformer, toy (default" in " ".join(capsys.readouterr().out.split())


def test_a_new_entry_is_measured_and_checked_by_its_builder(toy):
    """The report measures the new model's quick points; a shape its builder refuses (dim % heads)
    is refused before anything is measured, with the builder's own reason."""
    built = report.run_report(["toy"], ["naive", "static"], quick=True, rounds=1, recheck_rounds=0,
                              block_seconds=0.001, settle_seconds=0, roofs=report.Roofs(100.0, 10.0))
    assert [(r["case"], r["engine"]) for r in built["rows"]] == [("toy-b1-d32-s4", "naive"), ("toy-b1-d32-s4", "static")]
    assert all(not r.get("error") and r["seq"] == 4 for r in built["rows"])
    with pytest.raises(report.ReportError, match="toy with dim=15, seq=4: dim must be divisible by heads=2"):
        report.run_report(["toy"], ["naive"], grid={"toy": [Case("toy", 1, 15, 4)]}, rounds=1)


def test_a_new_entry_names_its_analysis_point(toy):
    result = run_analysis("1.0", model="toy", dim=16, engines="naive", repeat=1)
    assert result["model"]["case"] == "toy-b1-d16-s4"      # the suite's and the report's id


def test_the_tests_small_models_are_the_tables():
    assert set(FAMILIES) == set(MODELS), "every zoo model is a benchmark model: add its entry to mlexec/case.py"
    assert SMALL_MODELS == {name: dict(f.small) for name, f in FAMILIES.items()}
    for name, kwargs in SMALL_MODELS.items():
        assert MODELS[name](**kwargs, seed=1).name == name


def test_the_report_grid_is_a_subset_of_the_one_grid():
    """One grid per model: the suite measures all of it, the report its report batches of it."""
    for name, family in inputs.report_families().items():
        whole = family.grid()
        assert [c for c in grid.FULL if c.model == name] == whole
        picked = inputs.grid_of([name])[name]
        assert set(picked) <= set(whole)
        assert {c.batch for c in picked} == set(family.report_batches or family.batches)
        assert set(inputs.grid_of([name], quick=True)[name]) <= set(picked)
    assert {c.batch for c in inputs.grid_of(["transformer"])["transformer"]} == {1, 8}


@pytest.mark.parametrize("kwargs, message", [
    (dict(quick=("2x8",)), r"quick points \['2x8'\] are not in its grid"),
    (dict(report_batches=(1, 2)), r"report batches \(1, 2\) outside its batches"),
    (dict(report=True), "needs report_quick points"),
    (dict(report=True, report_batches=(1,), report_quick=("4x8",)), r"report_quick points \['4x8'\] are not in"),
    (dict(quick=("1x8x4",)), "expected a bad shape BATCHxDIM, got 1x8x4"),
])
def test_a_selection_outside_the_grid_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Family("bad", batches=(1, 4), dims=(8,), **kwargs)


def test_shape_text():
    assert case_module.shape_parts("1x256x64") == (1, 256, 64)
    for text in ("1x", "x8", "1x-2", "8"):
        with pytest.raises(ValueError, match="expected a shape like"):
            case_module.shape_parts(text)
    assert FAMILIES["transformer"].form == "BATCHxDIMxSEQ" and FAMILIES["mlp"].arity == 2

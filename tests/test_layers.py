"""engines/ as layers: import-linter's contracts in pyproject.toml (each layer imports only those below
it, engines never imports mlexec), and no import circle anywhere in the package, within a layer too."""
from __future__ import annotations

import sys
import textwrap

import pytest

from conftest import ROOT

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")


def cycles(package: str) -> list[tuple[str, ...]]:
    """Each import circle among ``package``'s modules once, as the chain that closes it. A package's
    ``__init__`` importing its own submodules is not a circle (Python loads those in order)."""
    graph = grimp.build_graph(package, cache_dir=None)
    found = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if module.startswith(imported + "."):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                found.add(tuple(sorted({module, *back})))
    return sorted(found)


def test_the_layer_contracts_hold():
    from importlinter.cli import lint_imports
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_engines_has_no_import_circle():
    assert cycles("engines") == []


def test_a_circle_is_found(tmp_path, monkeypatch):
    """The check above can fail: a package whose two modules import each other is reported."""
    pkg = tmp_path / "circled"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import B\nA = 1\n")
    (pkg / "b.py").write_text(textwrap.dedent("""\
        B = 2
        def f():
            from .a import A
            return A
        """))
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "circled", raising=False)
    assert cycles("circled") == [("circled.a", "circled.b")]


def test_the_public_api_is_the_packages_top_level():
    """What users import from ``engines`` (the README, docs/gate.md) stays where it was before the
    layers: the top level, and ``engines.base.Engine`` for an engine of their own."""
    import engines
    import engines.base
    assert sorted(engines.__all__) == ["BatchRefused", "ENGINES", "Engine", "EngineBusy", "EnginePool",
                                       "EngineUnavailable", "FixedBatch", "MODELS", "Model", "OnnxImportError",
                                       "Op", "load_onnx"]
    assert all(hasattr(engines, name) for name in engines.__all__)
    assert engines.base.Engine is engines.Engine and engines.base.EngineUnavailable is engines.EngineUnavailable

"""The protocol engines built on fused extend it through (``FusedEngine``'s docstring): an engine
written against that interface alone works, and the engines in this repository keep to it."""
import ast
import inspect
import math
from pathlib import Path

import numpy as np
import pytest

import engines.planned
from engines import ENGINES, MODELS, EngineUnavailable
from engines.ir.models import ABS_TOL
from engines.planned.compiled import BoundEngine
from engines.planned.fused import FusedEngine, FusedStep, Lowering
from test_fused import forward_peak

PLANNED = Path(engines.planned.__file__).parent


def lower_gelu_out_of_place(lw: Lowering, i: int, op) -> bool:
    """GELU (tanh form) into a buffer of its own, with a scratch buffer: no folding into the next
    linear, unlike fused's in-place 2·gelu."""
    shape = lw.model.shapes[op.output]
    tmp = lw.buffer(op.output + ".t", shape)
    lw.steps.append(FusedStep("gelu_out", lw.output(op.output, shape), (lw.where[op.inputs[0]],), (tmp,)))
    return True


def bind_gelu_out(engine, step, y, ins, scratch) -> list:
    """y = 0.5·x·(1 + tanh(c·(x + 0.044715·x³)))"""
    (x,), (t,), c = ins, scratch, math.sqrt(2 / math.pi)
    return [(np.multiply, (x, x, t)), (np.multiply, (t, 0.044715 * c, t)), (np.add, (t, c, t)),
            (np.multiply, (t, x, t)), (np.tanh, (t, t)), (np.add, (t, 1.0, t)),
            (np.multiply, (t, x, y)), (np.multiply, (y, 0.5, y))]


class ExtendedEngine(FusedEngine):
    """A step kind of its own, a kernel hook overridden, per-engine state: public members only."""
    name = "extended"
    lowerings = {**FusedEngine.lowerings, "gelu": lower_gelu_out_of_place}
    binders = {**FusedEngine.binders, "gelu_out": bind_gelu_out}

    def own_memory(self) -> None:
        super().own_memory()
        self.bound_batches: list[int] = []

    def bind(self, batch: int):
        self.bound_batches.append(batch)
        return super().bind(batch)

    def matvec_call(self, x, col, out):
        self.matvecs = getattr(self, "matvecs", 0) + 1
        return super().matvec_call(x, col, out)


@pytest.fixture
def transformer():
    return MODELS["transformer"](dim=64, seq=16, seed=5)


def build(model, max_batch=8):
    try:
        return ExtendedEngine(model, max_batch)
    except EngineUnavailable as exc:
        pytest.skip(f"fused's requirements are absent: {exc}")


def test_an_engine_from_the_protocol_alone_is_correct(transformer):
    eng = build(transformer)
    kinds = [s.kind for s in eng.steps]
    assert "gelu_out" in kinds and "gelu" not in kinds
    assert eng.matvecs > 0                                  # layernorm's row means on the hook
    for batch in (1, 3, 8):
        x = transformer.random_input(batch, rng=batch)
        np.testing.assert_allclose(eng.forward(x), transformer.reference(x), atol=ABS_TOL, rtol=0)
    assert eng.bound_batches == [8, 1, 3]


def test_its_state_and_buffers_are_its_workers_own(transformer):
    eng = build(transformer)
    worker = eng.worker()
    assert worker.bound_batches == [] and worker.linears is eng.linears
    x = transformer.random_input(2, rng=0)
    y = eng.forward(x).copy()
    np.testing.assert_array_equal(worker.forward(transformer.random_input(2, rng=1)) != y, True)
    np.testing.assert_array_equal(eng.forward(x), y)


def test_its_forward_allocates_nothing(transformer):
    eng = build(transformer)
    assert forward_peak(eng, transformer.random_input(4, rng=0)) <= 4096


# --- the repository's engines keep to the protocol ----------------------------------------------

def _private_uses(tree: ast.Module) -> list[str]:
    """``param._name`` in module-level functions: a free function reaching into an object it is given."""
    found = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        locals_ = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in params | locals_ and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{fn.name}: {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(PLANNED.glob("*.py")), ids=lambda p: p.name)
def test_no_free_function_touches_private_members(path):
    assert _private_uses(ast.parse(path.read_text())) == []


def test_the_private_member_check_finds_one():
    tree = ast.parse("def bind(eng, step):\n    lw = step.lowering\n    return eng._buffer, lw._where\n")
    assert _private_uses(tree) == ["bind: eng._buffer", "bind: lw._where"]


def _private_overrides(cls) -> list[str]:
    bases = [c for c in cls.__mro__[1:] if issubclass(c, BoundEngine)]
    return [name for name in vars(cls) if name.startswith("_") and not name.startswith("__")
            and any(name in vars(base) for base in bases)]


@pytest.mark.parametrize("name", sorted(n for n, c in ENGINES.items()
                                        if inspect.isclass(c) and issubclass(c, FusedEngine)))
def test_engines_on_fused_override_only_public_hooks(name):
    assert _private_overrides(ENGINES[name]) == []


def test_the_override_check_finds_one():
    class Sneaky(FusedEngine):
        def _lower(self, model):
            return super()._lower(model)
    assert _private_overrides(Sneaky) == ["_lower"]

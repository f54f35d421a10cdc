"""ONNX's own backend node tests as single-input model files, for the importer.

The onnx wheel ships no ``data/node`` files, but its generator does:
``onnx.backend.test.case.node.collect_testcases(None)`` builds every node test case in memory,
each a one-node ``ModelProto`` with its inputs and expected outputs. The project's importer
takes one float32 input and one output, so a case is kept when its first input is a float32
array, every input and its one output are plain arrays (no sequences or optionals), and every
input after the first becomes an initializer holding its given value (those are attributes in
all but name: axes, shapes, weights). 924 cases of onnx 1.23's 1,884 qualify.

tests/test_onnx_conformance.py and scripts/conformance_table.py both build the cases here.
"""
from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

import numpy as np

# The tolerance ONNX's backend test runner applies (every node case carries these two).
RTOL = 1e-3
ATOL = 1e-7


@dataclass(frozen=True)
class Case:
    """One conformance case: its file (``model``, serialized), its input and expected output."""
    name: str                 # the onnx test's name, e.g. "test_relu"
    op_type: str              # the op the case tests (an expanded case: its unexpanded sibling's)
    model: bytes              # the one-input file: later inputs are initializers
    x: np.ndarray             # float32, the first input
    expected: np.ndarray      # the one output
    rtol: float = RTOL
    atol: float = ATOL

    @property
    def expanded(self) -> bool:
        """The op's function body, expanded into the ops it is made of (``..._expanded``)."""
        return "_expanded" in self.name


def _plain(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype != object


def _one_input(test) -> bytes | None:
    """The case's model with every input after the first made an initializer, or None when
    the case is not one float32 input and one output of plain arrays."""
    import onnx
    from onnx import numpy_helper
    (inputs, outputs), = test.data_sets
    if (len(outputs) != 1 or not inputs or not all(map(_plain, inputs)) or not _plain(outputs[0])
            or inputs[0].dtype != np.float32 or len(test.model.graph.output) != 1):
        return None
    proto = onnx.ModelProto()
    proto.CopyFrom(test.model)
    graph = proto.graph
    given = list(graph.input)
    if len(given) != len(inputs):
        return None
    if proto.ir_version >= 4:     # before IR 4, every initializer must also be a graph input
        del graph.input[1:]
    for vi, value in zip(given[1:], inputs[1:]):
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), vi.name))
    return proto.SerializeToString()


@functools.lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """Every qualifying node case, in the generator's order (built once per process)."""
    from onnx.backend.test.case import node
    with warnings.catch_warnings():        # the generator's own overflow and divide warnings
        warnings.simplefilter("ignore")
        tests = node.collect_testcases(None)
    op_of = {t.name: t.model.graph.node[0].op_type for t in tests}
    out = []
    for test in tests:
        model = _one_input(test)
        if model is None:
            continue
        (inputs, outputs), = test.data_sets
        op = op_of.get(re.sub(r"_expanded.*", "", test.name), op_of[test.name])
        out.append(Case(test.name, op, model, inputs[0], outputs[0], test.rtol, test.atol))
    return tuple(out)


def by_name() -> dict[str, Case]:
    return {c.name: c for c in cases()}


def matches(case: Case, y: np.ndarray) -> bool:
    """ONNX's own check: same dtype and shape, and allclose at the case's tolerance (NaNs equal)."""
    expected = np.asarray(case.expected)
    y = np.asarray(y)
    return y.dtype == expected.dtype and y.shape == expected.shape and bool(
        np.allclose(y.astype(np.float64), expected.astype(np.float64), rtol=case.rtol, atol=case.atol,
                    equal_nan=True))


def float_engines() -> list[str]:
    """The NumPy engines held to ONNX's tolerance: every registered engine that is no peer and
    keeps the float bar. A quantized engine (``int8``) states a bar of its own, hundreds of times
    ONNX's (docs/int8.md), and is held to it by its own tests, not by this sweep."""
    from engines import ENGINES
    from engines.ir.models import ABS_TOL, REL_TOL
    return [name for name, cls in ENGINES.items()
            if not cls.peer and cls.abs_tol <= ABS_TOL and cls.rel_tol <= REL_TOL]

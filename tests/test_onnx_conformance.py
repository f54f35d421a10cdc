"""ONNX's own backend node tests (tests/conformance.py builds them from the onnx package).

Every case the importer accepts must give ONNX's expected output on every NumPy engine, at ONNX's
own tolerance (rtol 1e-3, atol 1e-7), at the batch the file fixes; every other case must be
refused with an ``OnnxImportError`` that names what it refuses (the node and its op type, or the
input or output), never another exception and never a wrong result.

The whole sweep (every case, six engines) takes about 15 s on 2 cores: the cases are one node on
a few dozen numbers, so it stays in the default run. Each case's model is built once.
"""
import re
import warnings

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX's test cases come from the onnx package (peers extra)")

import conformance  # noqa: E402  (tests/ is on the path: pytest's rootdir conftest)
from engines import ENGINES, EngineUnavailable, OnnxImportError, load_onnx  # noqa: E402

NUMPY_ENGINES = conformance.float_engines()
CASES = conformance.by_name()


def imported(case):
    """The case's model, or the OnnxImportError that refuses it (any other exception fails)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)       # the evaluator on inf/NaN inputs
        try:
            return load_onnx(case.model, name=case.name)
        except OnnxImportError as exc:
            return exc


def _refusal_names_what(case, exc: OnnxImportError) -> bool:
    """Each problem names a node of the file with its op type, or the graph's input or output."""
    import onnx
    nodes = {n.name or n.output[0]: n.op_type for n in onnx.load_from_string(case.model).graph.node}
    for problem in exc.problems:
        node = re.match(r"node '([^']*)'", problem)
        if node:
            if node.group(1) not in nodes or nodes[node.group(1)] not in problem:
                return False
        elif not re.match(r"(input|output|the graph|the output|ONNX shape inference|the file fails)", problem):
            return False
    return True


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case(name):
    case = CASES[name]
    model = imported(case)
    if isinstance(model, OnnxImportError):
        assert _refusal_names_what(case, model), str(model)
        return
    batch = model.fixed_batch.size if model.fixed_batch else len(case.x)
    wrong = []
    for engine in NUMPY_ENGINES:
        try:
            eng = ENGINES[engine](model, batch)
        except EngineUnavailable:
            continue                              # onednn without its library: nothing to check
        with np.errstate(all="ignore"):
            got = eng.forward(case.x)
        if not conformance.matches(case, got):
            wrong.append(engine)
    assert not wrong, f"{name}: wrong output on {wrong}"


def test_the_cases_are_what_the_docs_count():
    # onnx 1.23: 924 cases with a float32 first input, plain-array inputs and one output
    assert len(CASES) >= 900
    case = CASES["test_relu"]
    assert case.x.dtype == np.float32 and conformance.matches(case, np.maximum(case.x, 0))
    assert not conformance.matches(case, np.maximum(case.x, 0) + 1e-3)

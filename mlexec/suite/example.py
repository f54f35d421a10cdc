"""A user's repository as docs/gate.md describes it: their package with their own inference code and
engine, their model file, and the one-line test module that runs the suite on them.

``python -m mlexec.suite.example DIR [--layout src]`` writes it (then ``git init`` it and run
``pytest``). The outside tests (tests/test_outside.py) and ``scripts/gate_rates.py --outside`` build
it and plant regressions in it with ``plant``: what a pull request of theirs might do.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

DIM, HIDDEN = 256, 1024          # the model: DIM -> HIDDEN -> DIM, Gemm, Relu, Gemm
MODEL = "models/mlp.onnx"

# Their inference code: a NumPy MLP read from the ONNX file's weights.
INFER = '''\
"""Our inference code: the MLP of an ONNX file as a NumPy function."""
import numpy as np
import onnx
from onnx import numpy_helper


def load(source: bytes):
    """A function x -> y running the file's Gemm layers, ReLU between them."""
    graph = onnx.load_from_string(source).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    layers = [(weights[n.input[1]], weights[n.input[2]]) for n in graph.node if n.op_type == "Gemm"]

    def forward(x):
        for i, (w, b) in enumerate(layers):
            x = x @ w + b
            if i < len(layers) - 1:
                x = np.maximum(x, 0)
        return x
    return forward
'''

# Their engine: the suite's interface around their callable, with its memory contract.
ENGINE = '''\
"""Our inference path as the benchmark suite runs it."""
from engines.base import Engine, EngineUnavailable

from {package}.infer import load


class MyEngine(Engine):
    """Memory contract: allocates per call (zero_alloc False), at most the model's no-reuse bound
    (every intermediate alive at once), which the suite's memory test enforces."""
    name = "mine"

    def __init__(self, model, max_batch):
        super().__init__(model, max_batch)
        if model.source is None:
            raise EngineUnavailable("runs ONNX files only")
        self.run = load(model.source)

    def _forward(self, x):
        return self.run(x)
'''

TEST_MODULE = '''\
from mlexec.suite.benchmarks import pinned_engine, test_forward, test_peak_memory  # noqa: F401
'''

PYPROJECT = '''\
[project]
name = "{package}"
version = "0.1.0"
dependencies = ["mlexec[bench]", "onnx"]

[tool.pytest.ini_options]
addopts = "--mlexec-matrix=none --mlexec-model={model} --mlexec-engine-module={package}.engine --mlexec-engines=mine,naive"
{pythonpath}'''


def model_bytes(dim: int = DIM, hidden: int = HIDDEN, seed: int = 0) -> bytes:
    """An ONNX MLP dim -> hidden -> dim (Gemm, Relu, Gemm), float32, dynamic batch, seeded weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)
    inits = [init("w1", dim, hidden), init("b1", hidden), init("w2", hidden, dim), init("b2", dim)]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("Gemm", ["a", "w2", "b2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def package_dir(root: Path, layout: str, package: str = "mypkg") -> Path:
    return root / "src" / package if layout == "src" else root / package


def write(root: Path, layout: str = "flat", package: str = "mypkg") -> None:
    """The repository's files under ``root``: flat (``mypkg/``) or src (``src/mypkg/``) layout."""
    if layout not in ("flat", "src"):
        raise ValueError(f"layout: expected flat or src, got {layout!r}")
    pkg = package_dir(root, layout, package)
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "infer.py").write_text(INFER)
    (pkg / "engine.py").write_text(ENGINE.format(package=package))
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test_inference_gate.py").write_text(TEST_MODULE)
    (root / "models").mkdir(exist_ok=True)
    (root / MODEL).write_bytes(model_bytes())
    pythonpath = 'pythonpath = ["src"]\n' if layout == "src" else ""
    (root / "pyproject.toml").write_text(PYPROJECT.format(package=package, model=MODEL, pythonpath=pythonpath))


# --- what a pull request might do -----------------------------------------------------------

SLOW = '''
    def _forward(self, x):
        import time
        t0 = time.perf_counter()
        out = self.run(x)
        until = time.perf_counter() + {factor} * (time.perf_counter() - t0)   # {factor:.0%} slower
        while time.perf_counter() < until:
            pass
        return out
'''

TEMP = '''
    def _forward(self, x):
        import numpy as np
        scratch = np.ones(4096, dtype=np.float32)     # a 16 KiB temporary, alive through the forward
        out = self.run(x)
        del scratch
        return out
'''

PLANTS = ("slow", "temp", "model", "docs")


def plant(root: Path, what: str, layout: str = "flat", package: str = "mypkg", *, slowdown: float = 0.25,
          extra_flops: float = 0.30) -> None:
    """Change the repository as a pull request might: ``slow`` (the engine ``slowdown`` slower),
    ``temp`` (a 16 KiB temporary per forward), ``model`` (the model's hidden layer widened to
    ``extra_flops`` more flops), ``docs`` (a README only: nothing measured changes)."""
    engine = package_dir(root, layout, package) / "engine.py"
    source = engine.read_text()
    plain = "\n    def _forward(self, x):\n        return self.run(x)\n"
    if what == "slow":
        engine.write_text(source.replace(plain, SLOW.format(factor=slowdown)))
    elif what == "temp":
        engine.write_text(source.replace(plain, TEMP))
    elif what == "model":
        (root / MODEL).write_bytes(model_bytes(hidden=round(HIDDEN * (1 + extra_flops))))
    elif what == "docs":
        (root / "README.md").write_text("Our inference service.\n")
    else:
        raise ValueError(f"plant: expected one of {PLANTS}, got {what!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlexec.suite.example", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="the folder to write the repository into")
    parser.add_argument("--layout", choices=["flat", "src"], default="flat", help="default: %(default)s")
    args = parser.parse_args(argv)
    write(args.root, args.layout)
    print(f"wrote {args.root}: git init it, commit, then run pytest")
    return 0


if __name__ == "__main__":
    sys.exit(main())

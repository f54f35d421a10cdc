"""Execution engines for the model zoo, behind one interface and one registry.

The public API: ``ENGINES`` (name -> class), ``MODELS`` (the zoo), ``load_onnx``, ``Engine`` and
its errors, ``EnginePool``, and a model file's fixed batch (``FixedBatch``, ``BatchRefused``). The subpackages are layers, each importing only those below it
(``docs/architecture.md``; a test checks it):

    pool, registry          the engines by name; a pool of workers
    planned | peers         the project's engines (one per module) | other runtimes
    base | importer | kernels   the Engine interface | ONNX -> IR | kernel choice per GEMM
    ir | native             model IR and op tables | MKL, oneDNN, OpenBLAS, OpenMP bindings
    planner                 static memory planning
    memory | errors         aligned buffers | the errors engines raise
"""
from .native import openblas, openmp

openblas.choose()      # before anything below loads NumPy, and with it OpenBLAS
openmp.choose()        # before MKL or oneDNN load GNU OpenMP

from .base import Engine, EngineBusy, EngineUnavailable  # noqa: E402  (after the two choices above)
from .importer.load import OnnxImportError, load_onnx  # noqa: E402
from .ir.models import MODELS, BatchRefused, FixedBatch, Model, Op  # noqa: E402
from .pool import EnginePool  # noqa: E402
from .registry import ENGINES  # noqa: E402

__all__ = ["ENGINES", "MODELS", "BatchRefused", "Engine", "EngineBusy", "EnginePool", "EngineUnavailable",
           "FixedBatch", "Model", "OnnxImportError", "Op", "load_onnx"]

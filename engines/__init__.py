"""Execution engines for the model zoo, behind one interface and one registry.

A new engine is one module with one ``Engine`` subclass and one line below.
"""
from . import openblas_core, openmp_spin

openblas_core.choose()      # before anything below loads NumPy, and with it OpenBLAS
openmp_spin.choose()        # before MKL or oneDNN load GNU OpenMP

from .arena import ArenaEngine
from .base import Engine, EngineBusy, EngineUnavailable
from .fused import FusedEngine
from .models import MODELS, Model, Op
from .naive import NaiveEngine
from .onnx_import import OnnxImportError, load_onnx
from .onednn import OneDnnEngine
from .onnxrt import OnnxRuntimeEngine
from .packed import PackedEngine
from .pool import EnginePool
from .static import StaticEngine
from .torch_compile import TorchCompileEngine
from .torch_eager import TorchEngine

ENGINES: dict[str, type[Engine]] = {
    "naive": NaiveEngine,
    "static": StaticEngine,
    "arena": ArenaEngine,
    "fused": FusedEngine,       # optional extra "fast" (SciPy BLAS)
    "packed": PackedEngine,     # optional extras "fast" and "mkl" (MKL's packed GEMM)
    "onednn": OneDnnEngine,     # optional extras "fast" and "onednn" (oneDNN's convolutions)
    # peers (optional extra "peers"): raise EngineUnavailable when their package is missing
    "onnxruntime": OnnxRuntimeEngine,
    "torch": TorchEngine,
    "torch-compile": TorchCompileEngine,
}

__all__ = ["ENGINES", "MODELS", "Engine", "EngineBusy", "EnginePool", "EngineUnavailable", "Model",
           "OnnxImportError", "Op", "load_onnx"]

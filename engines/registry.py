"""The engine registry: name -> class. A new engine is one module (``planned/`` or ``peers/``) and
one line here; ``docs/architecture.md`` says what it implements."""
from __future__ import annotations

from .base import Engine
from .peers.onnxrt import OnnxRuntimeEngine
from .peers.torch_compile import TorchCompileEngine
from .peers.torch_eager import TorchEngine
from .planned.arena import ArenaEngine
from .planned.fused import FusedEngine
from .planned.naive import NaiveEngine
from .planned.onednn import OneDnnEngine
from .planned.packed import PackedEngine
from .planned.static import StaticEngine

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

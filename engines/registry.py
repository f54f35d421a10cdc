"""The engine registry: name -> class. A new engine of the project is one module (``planned/`` or
``peers/``) and one line here; ``docs/architecture.md`` says what it implements.

Engines of other packages join it through the entry point group ``mlexec.engines`` (name ->
class, ``discover``), a module named to ``register_module``, or a plain ``ENGINES[name] = cls``."""
from __future__ import annotations

import importlib
import inspect

from .base import Engine
from .peers.onnxrt import OnnxRuntimeEngine
from .peers.onnxrt_int8 import OnnxRuntimeInt8Engine
from .peers.torch_compile import TorchCompileEngine
from .peers.torch_eager import TorchEngine
from .planned.arena import ArenaEngine
from .planned.fused import FusedEngine
from .planned.int8 import Int8Engine
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
    "int8": Int8Engine,         # optional extras "fast" and "onednn" (oneDNN's int8 matmul)
    # peers (optional extra "peers"): raise EngineUnavailable when their package is missing
    "onnxruntime": OnnxRuntimeEngine,
    "onnxruntime-int8": OnnxRuntimeInt8Engine,    # the model quantized by onnxruntime.quantization
    "torch": TorchEngine,
    "torch-compile": TorchCompileEngine,
}

ENTRY_POINTS = "mlexec.engines"


def register(name: str, cls: type) -> None:
    """``ENGINES[name] = cls``, checked: an ``Engine`` subclass, and no other class under that name."""
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ValueError(f"engine {name!r}: {cls!r} is not a subclass of engines.base.Engine")
    if ENGINES.get(name, cls) is not cls:
        held = ENGINES[name]
        raise ValueError(f"engine {name!r}: {cls.__module__}.{cls.__qualname__} would replace "
                         f"{held.__module__}.{held.__qualname__}")
    ENGINES[name] = cls


def discover() -> list[str]:
    """Register every engine of the ``mlexec.engines`` entry points of installed packages; their names.
    ValueError naming the entry point when one cannot be loaded or is not an engine."""
    from importlib.metadata import entry_points
    names = []
    for point in entry_points(group=ENTRY_POINTS):
        try:
            cls = point.load()
        except Exception as exc:       # whatever the package's import raises
            raise ValueError(f"entry point {point.name} = {point.value!r} ({ENTRY_POINTS}): {exc!r}") from None
        register(point.name, cls)
        names.append(point.name)
    return names


def register_module(module: str) -> list[str]:
    """Import ``module`` and register every ``Engine`` subclass it defines under its ``name``;
    their names. ValueError when it cannot be imported or defines none."""
    try:
        found = importlib.import_module(module)
    except Exception as exc:           # whatever the user's module raises on import
        raise ValueError(f"engine module {module!r}: {exc!r}") from None
    classes = [c for _, c in inspect.getmembers(found, inspect.isclass)
               if issubclass(c, Engine) and c.__module__ == found.__name__ and c.name != Engine.name]
    if not classes:
        raise ValueError(f"engine module {module!r} defines no engines.base.Engine subclass with a name")
    for cls in classes:
        register(cls.name, cls)
    return [c.name for c in classes]

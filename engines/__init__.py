"""Execution engines for the model zoo, behind one interface and one registry.

A new engine is one module with one ``Engine`` subclass and one line below.
"""
from .arena import ArenaEngine
from .base import Engine, EngineUnavailable
from .models import MODELS, Model, Op
from .naive import NaiveEngine
from .static import StaticEngine

ENGINES: dict[str, type[Engine]] = {
    "naive": NaiveEngine,
    "static": StaticEngine,
    "arena": ArenaEngine,
}

__all__ = ["ENGINES", "MODELS", "Engine", "EngineUnavailable", "Model", "Op"]

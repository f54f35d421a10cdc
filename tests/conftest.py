"""Shared fixtures: small zoo models, engines that skip when their optional dependency is missing."""
from __future__ import annotations

import numpy as np
import pytest

from engines import ENGINES, MODELS, EngineUnavailable

# Small enough for the whole matrix to run in seconds, big enough to exercise
# multi-row tiling, multiple heads and every op kind.
SMALL_MODELS = {
    "mlp": dict(dim=64),
    "mlp-deep": dict(dim=48),
    "transformer": dict(dim=32, seq=8, heads=4),
}


def make_engine(name: str, model, max_batch: int):
    try:
        return ENGINES[name](model, max_batch)
    except EngineUnavailable as exc:
        pytest.skip(f"engine {name!r} unavailable: {exc}")


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture(scope="session")
def small_models():
    return {name: MODELS[name](**kw, seed=1) for name, kw in SMALL_MODELS.items()}

"""Shared test helpers: small zoo models, engines that skip when their optional dependency
is missing, the repository root, and an environment that imports this checkout's code."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT))

from engines import ENGINES, MODELS, EngineUnavailable  # noqa: E402  (after the path is set)
from mlexec.case import FAMILIES  # noqa: E402

# The tests run the engines' fixed kernel defaults: measuring kernels at every build would cost
# seconds per test and make the paths tested depend on the machine's load. tests/test_kernels.py
# turns tuning on, with its own cache folder.
os.environ["MLEXEC_TUNE"] = "0"

# Each benchmark model's small instance (``Family.small`` in mlexec/case.py): small enough for the
# whole matrix to run in seconds, big enough to exercise multi-row tiling, multiple heads and
# every op kind.
SMALL_MODELS = {name: dict(family.small) for name, family in FAMILIES.items()}


def make_engine(name: str, model, max_batch: int):
    try:
        return ENGINES[name](model, max_batch)
    except EngineUnavailable as exc:
        pytest.skip(f"engine {name!r} unavailable: {exc}")


def subprocess_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture(scope="session")
def small_models():
    return {name: MODELS[name](**kw, seed=1) for name, kw in SMALL_MODELS.items()}


@pytest.fixture
def small():
    """Options that keep an analysis fast."""
    return {"dim": 64, "repeat": 3}


@pytest.fixture
def no_onednn(monkeypatch):
    """As on a machine without oneDNN: its package and the system's library both absent."""
    from engines.native import onednn as native_onednn
    monkeypatch.setattr(native_onednn, "package_file", lambda *a: None)
    monkeypatch.setattr(native_onednn.ctypes.util, "find_library", lambda name: None)
    for cached in (native_onednn.load, native_onednn.library):
        cached.cache_clear()
    yield
    for cached in (native_onednn.load, native_onednn.library):
        cached.cache_clear()                # the real library again for the tests after this one

"""Shared test helpers: the repository root, and an environment that imports this checkout's code."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def subprocess_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def small():
    """Options that keep an analysis fast."""
    return {"dim": 64, "repeat": 3}


sys.path.insert(0, str(ROOT))

"""Throw-away engines with planted regressions, to prove the gate fails when it should.

Load with ``pytest -p mlexec.suite.plants``; it registers one engine,
``planted``, a copy of ``static`` whose behaviour ``MLEXEC_PLANT`` picks:

- ``none`` (default): identical to static, the reference run;
- ``slow``: every forward 25 % slower (it spins for a quarter of the time the
  real forward just took, so the slowdown is exact whatever the machine does);
- ``temp``: one extra temporary per forward, a (batch, dim) float32 copy of the
  output, the smallest array a careless kernel would make;
- ``slow,temp``: both.
"""
from __future__ import annotations

import os
import time

from engines import ENGINES
from engines.planned.static import StaticEngine

SLOWDOWN = float(os.environ.get("MLEXEC_PLANT_SLOWDOWN", "0.25"))


class PlantedEngine(StaticEngine):
    name = "planted"

    def __init__(self, model, max_batch):
        super().__init__(model, max_batch)
        # Read once: at a 9 µs forward, reading the environment per call costs 1.20x by itself.
        self.plant = os.environ.get("MLEXEC_PLANT", "none").split(",")

    def _forward(self, x):
        plant = self.plant
        t0 = time.perf_counter()
        out = super()._forward(x)
        if "slow" in plant:
            until = time.perf_counter() + SLOWDOWN * (time.perf_counter() - t0)
            while time.perf_counter() < until:
                pass
        if "temp" in plant:
            out.copy()
        return out


def pytest_configure(config):
    from .session import BASE_ALIASES
    ENGINES.setdefault("planted", PlantedEngine)
    # In the reference code the planted engine is plain static: the regression is in this run only.
    config.stash[BASE_ALIASES] = {"planted": "static"}

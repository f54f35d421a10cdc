"""naive: eager NumPy, the "before" scenario.

Strategy: run the model's ops one by one as plain NumPy expressions
(``x @ W + b``), each returning a fresh array, and drop each tensor after its
last read, as an eager framework's reference counting would. Nothing is
planned, so every forward allocates every intermediate again; the returned
array is the caller's own.
"""
from __future__ import annotations

import numpy as np

from ..base import Engine


class NaiveEngine(Engine):
    name = "naive"
    # measured (memray): 1,104 B above the eager bound on the zoo; on T5's encoder export 2.7 KiB,
    # the 1-1.5 KiB of array headers and views each op holds beyond its arrays, twice over at its peak
    peak_slack_bytes = 4096

    def forward_peak_bytes(self, batch: int) -> int:
        return self.model.eager_peak_bytes(batch)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        return self.model.run_eager(x)

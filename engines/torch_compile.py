"""torch-compile: the torch engine's program through ``torch.compile`` (Inductor), a peer to compare with.

Strategy: the same per-op program as the ``torch`` engine, compiled with
dynamic shapes at construction and warmed up on a max_batch input and a
batch-1 input (Dynamo specializes size 1, so batch 1 gets its own graph;
every other batch reuses the dynamic one). The time that takes is
``compile_seconds`` and stays out of forward. Compiled is not always faster:
on a 2-core CPU at small shapes, eager often wins; measure.
"""
from __future__ import annotations

import time

from .models import Model
from .torch_eager import TorchEngine


class TorchCompileEngine(TorchEngine):
    name = "torch-compile"
    slow_build = True             # 10-50 s of compilation per model on 2 cores

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        torch = self.torch
        start = time.perf_counter()
        self._compiled = torch.compile(self.run, dynamic=True)
        with torch.inference_mode():
            for batch in sorted({self.max_batch, 1}, reverse=True):
                self._compiled(torch.from_numpy(model.random_input(batch, rng=0)))
        self.compile_seconds = time.perf_counter() - start

    def _call(self, x):
        return self._compiled(x)

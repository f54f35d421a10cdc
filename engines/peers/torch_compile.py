"""torch-compile: the torch engine's program through ``torch.compile`` (Inductor), a peer to compare with.

Strategy: the same per-op program as the ``torch`` engine, compiled with
dynamic shapes at construction and warmed up on a max_batch input and a
batch-1 input (Dynamo specializes size 1, so batch 1 gets its own graph;
every other batch reuses the dynamic one). The time that takes is
``compile_seconds`` and stays out of forward. Compiled is not always faster:
on a 2-core CPU at small shapes, eager often wins; measure.

Every engine compiles the same ``TorchEngine.run``, and Dynamo keeps at most
``recompile_limit`` (8) graphs per code object: past that, a process that
built engines for several models and batch sizes (the full matrix, the gate's
A/B, a long report) would run the next ones eagerly under this engine's name
(seen in a full-matrix run: "hit config.recompile_limit (8)"). Construction
raises the limit to ``RECOMPILE_LIMIT``.
"""
from __future__ import annotations

import time

import numpy as np

from ..ir.models import Model
from .torch_eager import TorchEngine


RECOMPILE_LIMIT = 1024     # graphs per code object: one per (model structure, batch 1 or dynamic)


class TorchCompileEngine(TorchEngine):
    name = "torch-compile"
    slow_build = True             # 10-50 s of compilation per model on 2 cores
    quick_skip = "compiles for many seconds per model"

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        torch = self.torch
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, RECOMPILE_LIMIT)
        start = time.perf_counter()
        self._compiled = torch.compile(self.run, dynamic=True)
        with torch.inference_mode():
            rng = np.random.default_rng(0)
            for rows in sorted({self.max_batch, self._min_batch}, reverse=True):    # the IR's rows
                self._compiled(torch.from_numpy(rng.standard_normal((rows, *model.shapes[model.input]),
                                                                    dtype=np.float32)))
        self.compile_seconds = time.perf_counter() - start

    def _call(self, x):
        return self._compiled(x)

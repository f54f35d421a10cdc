"""A few engines over one set of prepared weights, for servers that run forward from many threads.

``EnginePool(name, model, max_batch, size)`` builds the engine once and
``size - 1`` workers from it (``Engine.worker``): planned engines share the
read-only prepared weights and each owns its own activation buffers (one
arena per worker); engines that keep nothing between calls (naive, the peers)
are shared as they are. A thread takes a free engine, waiting while all
``size`` are busy, so at most ``size`` forwards run at once:

    pool = EnginePool("arena", model, max_batch=8, size=2)
    y = pool.run(x)                  # a copy, the caller's own
    pool.run(x, out=buf)             # or into the caller's array: no allocation
    with pool.engine() as engine:    # or the engine itself: its view is valid
        y = engine.forward(x)        # until the block ends
"""
from __future__ import annotations

import queue
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .base import Engine
from .ir.models import Model
from .registry import ENGINES


class EnginePool:
    def __init__(self, name: str, model: Model, max_batch: int, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        first = ENGINES[name](model, max_batch)
        self.engines: list[Engine] = [first] + [first.worker() for _ in range(size - 1)]
        self._free: queue.SimpleQueue[Engine] = queue.SimpleQueue()
        for engine in self.engines:
            self._free.put(engine)

    @contextmanager
    def engine(self) -> Iterator[Engine]:
        """A free engine for this thread until the block ends (waits while all are busy).
        The view its forward returns must not be used after the block."""
        engine = self._free.get()
        try:
            yield engine
        finally:
            release = getattr(engine, "release", None)
            if release is not None:
                release()                      # the next thread to take it may call forward
            self._free.put(engine)

    def run(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """forward(x) on a free engine; the result copied into ``out`` (allocated when None)."""
        with self.engine() as engine:
            y = engine.forward(x)
            if out is None:
                return np.array(y)
            np.copyto(out, y)
            return out

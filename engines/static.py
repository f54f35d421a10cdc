"""static: one pre-allocated buffer per intermediate, the seed's "after" scenario.

Strategy: at construction, allocate a separate float32 buffer for every
intermediate tensor and every kernel scratch, each sized for max_batch. Every
op then writes into its buffer with ``out=``; a smaller batch runs on views of
the same buffers. Nothing is shared, so memory is the no-reuse total, but a
forward allocates no arrays. forward returns a read-only view of the output
buffer, valid until the next call.
"""
from __future__ import annotations

from .compiled import CompiledEngine
from .ops import aligned_empty


class StaticEngine(CompiledEngine):
    name = "static"

    def _storage(self, sizes):
        self.activation_bytes = sum(sizes.values())
        return {t: aligned_empty(n // 4) for t, n in sizes.items()}

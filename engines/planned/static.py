"""static: one pre-allocated buffer per intermediate, the seed's "after" scenario.

Strategy: at construction, allocate a separate float32 buffer for every
intermediate tensor and for the copy of the input (``compiled`` binds every
call in advance), each sized for max_batch, and one workspace for the
kernels' scratch, as large as the largest op needs (scratch lives only during
its op). Every op then writes into its buffer with ``out=``; a smaller batch
runs on views of the same buffers. No tensor shares memory, so memory is the
no-reuse total of the tensors, but a forward allocates no arrays. forward
returns a read-only view of the output buffer, valid until the next call.
"""
from __future__ import annotations

from .compiled import CompiledEngine
from ..memory import aligned_empty
from ..planner import end_to_end


class StaticEngine(CompiledEngine):
    name = "static"

    def storage(self, sizes):
        # Every op's scratch laid end to end from the start of one shared workspace.
        layouts = [end_to_end({s: sizes[s] for s in op.scratch}) for op in self._ops if op.scratch]
        scratch = {s for offsets, _ in layouts for s in offsets}
        store = {t: aligned_empty(n // 4) for t, n in sizes.items() if t not in scratch}
        workspace = aligned_empty(max((total for _, total in layouts), default=0) // 4)
        for offsets, _ in layouts:
            store.update((s, workspace[at // 4:(at + sizes[s]) // 4]) for s, at in offsets.items())
        self.activation_bytes = sum(sizes[t] for t in sizes if t not in scratch) + workspace.nbytes
        return store

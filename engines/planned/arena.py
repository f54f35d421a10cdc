"""arena: compiler-style memory planning into one pre-allocated arena.

Strategy: hand the op schedule, which starts with the copy of the input
(``compiled`` binds every call in advance), to ``planner.plan_memory``
(liveness, in-place aliasing, greedy-by-size offsets), then allocate one
64-byte aligned arena and give each tensor a view at its offset. Tensors
whose lifetimes do not overlap share bytes; relu, residual add, layernorm
and softmax overwrite an input that is not read again. forward returns a
read-only view into the arena, valid until the next call.

Set ``MLEXEC_NO_PLANNER=1`` to give every tensor its own region (no reuse),
to tell a planner bug from a kernel bug (``fused`` and ``packed`` honour it too).
"""
from __future__ import annotations

from .compiled import CompiledEngine, arena_storage


class ArenaEngine(CompiledEngine):
    name = "arena"

    def storage(self, sizes):
        self.plan, arena, store = arena_storage(sizes, self.steps, keep=[self.root(self.model.output)])
        self.activation_bytes = arena.nbytes
        return store

    def report(self) -> dict:
        """The arena beside the two sizes it is judged against, and each linear's kernel."""
        return {"arena_bytes": self.plan.arena_bytes,
                "no_reuse_bytes": self.plan.no_reuse_bytes,
                "lower_bound_bytes": self.plan.lower_bound_bytes, **super().report()}

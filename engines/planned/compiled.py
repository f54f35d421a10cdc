"""What static and arena share: the model lowered to one flat list of NumPy calls over engine-owned buffers.

A subclass decides only where each tensor lives (``storage``). This class
prepares parameters once (weights copied onto cache lines, the largest
left where NumPy put them: ``ops.weight_layout``), and, once per batch size, binds
every op's calls (``OpKind.calls``) to views of those buffers. The caller's
input is copied into an engine buffer first, so that every call can be bound
in advance; a forward is then ``for fn, args in calls: fn(*args)``, with no
per-op Python in between. Nothing in ``forward`` allocates an array: the views
are made at bind time, and every call writes with ``out=``. A linear runs on
the kernel measured fastest for its shape on this machine (``engines.kernels``;
``MLEXEC_TUNE=0``: NumPy's matmul and a pre-tiled bias), into the same buffer.
"""
from __future__ import annotations

import copy
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..base import Engine, EngineBusy
from ..ir.models import Model
from ..kernels import Linears, candidates, joined
from ..ir.ops import OPS, linear_calls
from ..memory import aligned_empty
from ..ir.calls import max_rows, rows2d
from ..planner import Plan, Step, end_to_end, plan_memory


def arena_storage(sizes: dict[str, int], steps: list[Step], keep: list[str]) \
        -> tuple[Plan, np.ndarray, dict[str, np.ndarray]]:
    """Plan ``sizes`` over ``steps`` (``planner.plan_memory``) and carve one 64-byte aligned arena:
    the plan, the arena, and a flat float32 view of it per tensor at the tensor's offset.

    ``MLEXEC_NO_PLANNER=1`` gives every tensor its own region instead (no reuse), to tell a
    planner bug from a kernel bug; the plan is still returned, for its reference sizes.
    """
    plan = plan_memory(sizes, steps, keep=keep)
    offsets, total = plan.offsets, plan.arena_bytes
    if os.environ.get("MLEXEC_NO_PLANNER"):
        offsets, total = end_to_end(sizes)
    arena = aligned_empty(total // 4)
    return plan, arena, {t: arena[offsets[t] // 4:(offsets[t] + n) // 4] for t, n in sizes.items()}


class Bound(NamedTuple):
    """A forward at one batch size, made once: copy the input into ``input``, run ``calls``
    (``fn(*args)`` pairs) in order, return ``output``."""
    input: np.ndarray                 # the engine buffer the caller's input is copied into
    calls: tuple                      # (fn, args) pairs, every array bound in advance
    output: np.ndarray                # a read-only view of the result, valid until the next call


def seeded(bound: Bound) -> list:
    """The bound forward's calls after a copy of a seeded input into its input buffer, for timing:
    a forward repeated must not run on what the last one left there (the plan may reuse the input's
    buffer once it is read: an int8 transformer's timed forwards then ran on garbage that made
    NumPy warn of NaNs)."""
    x = np.random.default_rng(0).standard_normal(bound.input.shape, dtype=np.float32)
    return [(np.copyto, (bound.input, x)), *bound.calls]


class BoundEngine(Engine):
    """An engine whose forward is a flat list of calls, bound once per batch size (``Bound``).

    A subclass provides ``own_memory()`` (allocate this engine's activation buffers; ``worker()``
    calls it on a copy) and ``bind(batch)`` (every call of a forward at that batch, on views of
    those buffers, stored in ``self._bound``).

    One thread at a time: the buffers, and so the view forward returns, are the engine's.
    The first thread to call forward owns the engine; a forward from any other thread
    raises ``EngineBusy`` (never a silently overwritten result), until the owner calls
    ``release()``. A thread-safe check costs one ``get_ident`` and a compare per call, not
    a lock (docs/reliability.md). ``worker()`` gives a copy for another thread that shares
    the prepared weights and owns its own buffers; ``engines.EnginePool`` keeps a few.
    """
    returns_view = True
    zero_alloc = True
    kernel_candidates: tuple[str, ...] = ()      # what its linears may run on (``engines.kernels``)

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        self._bound: dict[int, Bound] = {}
        self._owner: int | None = None            # thread id of the one thread that may call forward
        self._claim_lock = threading.Lock()

    def bind(self, batch: int) -> Bound:
        """Every call of a forward at ``batch``, bound to this engine's buffers; kept for later calls."""
        raise NotImplementedError

    def offered_kernels(self, gemm) -> tuple[str, ...]:
        """The kernels a linear of ``gemm``'s shape may run on: the class's ``kernel_candidates``."""
        return self.kernel_candidates

    @property
    def weight_bytes(self) -> int:
        """The parameters as the steps hold them, plus the copies the kernels made of them
        (``kernel_copies_bytes``), as held now: a kernel chosen at a new batch may add its own."""
        return self._weight_bytes + self.kernel_copies_bytes()

    @weight_bytes.setter
    def weight_bytes(self, value: int) -> None:
        self._weight_bytes = value

    def kernel_copies_bytes(self) -> int:
        """The bytes of the weights' copies this engine's kernels hold (MKL's packs, oneDNN's
        reordered layouts, ``numpy-nk``'s (n, k) copies)."""
        linears = getattr(self, "linears", None)            # none yet while the steps are made
        return 0 if linears is None else linears.state_bytes

    def report(self) -> dict:
        """What each linear runs on (``engines.kernels.Linears.report``), and the bytes of the
        weights' copies its kernels hold, counted in ``weight_bytes``."""
        return {"kernels": self.linears.report(), "kernel_copies_bytes": self.kernel_copies_bytes()}

    def own_memory(self) -> None:
        """Allocate this engine's own activation buffers (``worker`` calls it on a copy)."""
        raise NotImplementedError

    def bind_judged(self, batch: int) -> Bound:
        """``bind(batch)``, with every linear whose GEMM was just measured alone with close rivals
        (``Linears.rivals``) judged again in this engine's own warm forward at ``batch`` on a
        seeded input: one forward per rival, that linear shape forced onto it, timed interleaved
        (``Linears.judge``); then bound on the winners."""
        with self.linears.lock:                    # shared with workers that bind at once
            self.linears.bound_keys.clear()
            bound = self.bind(batch)
            rivals = self.linears.rivals()
            if not rivals:
                return bound
            for key, names in rivals.items():
                forwards, before = {}, self.linears.forced.get(key)
                for name in names:
                    self.linears.forced[key] = name
                    forwards[name] = seeded(self.bind(batch))
                del self.linears.forced[key]
                if before is not None:                  # another batch's verdict for that shape
                    self.linears.forced[key] = before
                self.linears.judge(key, forwards)
            return self.bind(batch)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        if self._owner != _get_ident():
            self._claim()
        bound = self._bound.get(x.shape[0]) or self.bind_judged(x.shape[0])
        np.copyto(bound.input, x)
        for fn, args in bound.calls:
            fn(*args)
        return bound.output

    def _claim(self) -> None:
        with self._claim_lock:
            if self._owner is None:
                self._owner = _get_ident()
                return
        raise EngineBusy(
            f"this {self.name!r} engine belongs to another thread (its buffers, and the view forward "
            f"returns, are shared): give each thread its own engine (engine.worker() shares the weights), "
            f"use engines.EnginePool, or call engine.release() in the owning thread before handing it over")

    def release(self) -> None:
        """Give up this thread's ownership, so another thread may call forward. The view
        returned last is the next owner's to overwrite."""
        if self._owner not in (None, _get_ident()):
            raise EngineBusy(f"release() called from a thread that does not own this {self.name!r} engine")
        self._owner = None

    def worker(self) -> "BoundEngine":
        clone = copy.copy(self)                     # prepared weights and plans: shared, read-only
        clone._bound, clone._owner, clone._claim_lock = {}, None, threading.Lock()
        clone.own_memory()
        return clone


_get_ident = threading.get_ident


@dataclass(frozen=True)
class BoundOp:
    """One op as static and arena run it: ``calls`` (its ``OpKind.calls``) writes tensor ``out``
    from tensors ``inputs``, with ``operands`` prepared once and ``scratch`` tensors of its own."""
    calls: Callable
    out: str
    inputs: tuple[str, ...]
    operands: tuple
    scratch: tuple[str, ...]
    attrs: dict


class CompiledEngine(BoundEngine):
    peak_slack_bytes = 1024       # measured: 72-96 B (MLPs), 824 B (softmax's reduction state)
    # What a linear may run on, measured at build time (engines.kernels); the same output buffer
    # whichever runs, so the memory plan does not change. Untuned: NumPy's matmul + tiled bias.
    kernel_candidates = candidates("numpy", exclude=("mkl",))

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        self.shapes = dict(model.shapes)          # every tensor, scratch included
        self.steps: list[Step] = [Step(reads=(), writes=(model.input,))]   # the copy of the input
        self._ops: list[BoundOp] = []
        self._root: dict[str, str] = {}           # view tensor -> the tensor whose storage it shares
        prepared_bytes = 0
        for op in model.ops:
            kind = OPS[op.kind]
            if kind.view:                         # no call, no buffer: reads of it read its root
                self._root[op.output] = self.root(op.inputs[0])
                continue
            reads = tuple(self.root(t) for t in op.inputs)
            params = [model.params[p] for p in op.params]
            prepared = kind.operands(params, max_rows(model.shapes[op.output], self.max_batch))
            prepared_bytes += sum(a.nbytes for a in prepared)
            scratch = []
            for j, shape in enumerate(kind.scratch_shapes([model.shapes[t] for t in op.inputs], op.attrs)):
                name = f"{op.output}.scratch{j}"
                self.shapes[name] = shape
                scratch.append(name)
            self.steps.append(Step(reads=reads + tuple(scratch), writes=(op.output, *scratch),
                                   inplace=tuple((op.output, reads[i]) for i in kind.inplace if i < len(reads))))
            self._ops.append(BoundOp(kind.calls, op.output, tuple(op.inputs), prepared, tuple(scratch), dict(op.attrs)))
        self.weight_bytes = prepared_bytes
        self.sizes = {t: 4 * max_batch * math.prod(shape) for t, shape in self.shapes.items()
                      if t not in self._root}
        self.own_memory()
        # Kernel choices and their per-weight state are shared with workers.
        self.linears = Linears(self.offered_kernels, lambda gemm: "numpy")
        self.bind_judged(max_batch)              # chooses every linear's kernel now

    def own_memory(self) -> None:
        self._store = self.storage(self.sizes)   # name -> flat float32 array for max_batch

    def storage(self, sizes: dict[str, int]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def root(self, name: str) -> str:
        """The tensor whose storage ``name`` lives in: itself, or what a view op reinterprets."""
        return self._root.get(name, name)

    def view(self, name: str, batch: int) -> np.ndarray:
        shape = (batch, *self.shapes[name])
        return self._store[self.root(name)][:math.prod(shape)].reshape(shape)

    def bind(self, batch: int):
        calls = []
        for op in self._ops:
            views = [self.view(t, batch) for t in (op.out, *op.inputs)]
            if op.calls is linear_calls:          # y = x @ w + b on the kernel measured fastest
                (y, x), (w, b_tiled) = views, op.operands
                calls += self.linears.calls(rows2d(x), rows2d(y), w, b_tiled[0], b_tiled, None)
                continue
            calls += op.calls(*views, *op.operands, *(self.view(s, batch) for s in op.scratch), **op.attrs)
        result = self.view(self.model.output, batch)
        result.flags.writeable = False
        self._bound[batch] = Bound(self.view(self.model.input, batch), joined(calls), result)
        return self._bound[batch]

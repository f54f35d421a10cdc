"""What static and arena share: the model lowered to kernel calls over engine-owned buffers.

A subclass decides only where each tensor lives (``_storage``). This class
prepares parameters once (weights copied onto cache lines, the largest
stored transposed: ``ops.weight_layout``), binds every op's kernel to views
of those buffers for a given batch (once per batch size, then cached), and
runs the bound steps. Nothing in ``forward`` allocates an array: the views are made at bind
time, and every kernel writes with ``out=``.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Engine
from .models import Model
from .ops import OPS
from .planner import Step

_INPUT = object()  # placeholder for the caller's array in a bound step


class CompiledEngine(Engine):
    returns_view = True
    zero_alloc = True
    peak_slack_bytes = 1024       # measured: 72-96 B (MLPs), 824 B (softmax's reduction state)

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        max_rows = max_batch * math.prod(model.shapes[model.input][:-1])
        self.shapes = dict(model.shapes)          # every tensor, scratch included
        self.steps: list[Step] = []
        self._ops = []                            # (kernel, out, inputs, prepared, scratch, attrs)
        prepared_bytes = 0
        for op in model.ops:
            kind = OPS[op.kind]
            params = [model.params[p] for p in op.params]
            prepared = tuple(kind.prepare(*params, max_rows)) if kind.prepare else tuple(params)
            prepared_bytes += sum(a.nbytes for a in prepared)
            scratch = []
            if kind.scratch:
                for j, shape in enumerate(kind.scratch([model.shapes[t] for t in op.inputs])):
                    name = f"{op.output}.scratch{j}"
                    self.shapes[name] = tuple(shape)
                    scratch.append(name)
            self.steps.append(Step(reads=op.inputs + tuple(scratch), writes=(op.output, *scratch),
                                   inplace=tuple((op.output, op.inputs[i]) for i in kind.inplace)))
            self._ops.append((kind.kernel, op.output, op.inputs, prepared, tuple(scratch), dict(op.attrs)))
        self.weight_bytes = prepared_bytes
        planned = [t for t in self.shapes if t != model.input]
        self.sizes = {t: 4 * max_batch * math.prod(self.shapes[t]) for t in planned}
        self._store = self._storage(self.sizes)   # name -> flat float32 array for max_batch
        self._bound: dict[int, tuple] = {}

    def _storage(self, sizes: dict[str, int]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _view(self, name: str, batch: int) -> np.ndarray:
        shape = (batch, *self.shapes[name])
        return self._store[name][:math.prod(shape)].reshape(shape)

    def _bind(self, batch: int):
        steps = []
        for kernel, out, inputs, prepared, scratch, attrs in self._ops:
            args = [self._view(out, batch)]
            args += [_INPUT if t == self.model.input else self._view(t, batch) for t in inputs]
            args += prepared
            args += [self._view(s, batch) for s in scratch]
            steps.append((kernel, tuple(args), attrs, any(a is _INPUT for a in args)))
        result = self._view(self.model.output, batch)
        result.flags.writeable = False
        self._bound[batch] = (steps, result)
        return self._bound[batch]

    def _forward(self, x: np.ndarray) -> np.ndarray:
        steps, result = self._bound.get(x.shape[0]) or self._bind(x.shape[0])
        for kernel, args, attrs, reads_input in steps:
            if reads_input:
                kernel(*[x if a is _INPUT else a for a in args], **attrs)
            else:
                kernel(*args, **attrs)
        return result

"""What every op kind's calls are built from: the ``OpKind`` record, and the helpers that write
into caller-owned memory without a NumPy broadcast buffer (pre-tiled rows, zero rows, columns).

``ops`` (dense kinds) and ``conv`` (CNN kinds) both build on this module; neither imports the other's
internals, and ``ops.OPS`` is the one table of both.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..memory import aligned

# Rows of a pre-tiled bias/gamma/beta: enough to cover small batches in one
# call, small enough (<= 256 KiB) to stay in cache while larger batches are
# swept in chunks.
TILE_BYTES = 256 * 1024


def quantization_step(x, scale: float, zero_point: int, lo: int, hi: int):
    """x on a static 8-bit grid, as a float: (clip(round_half_even(x / scale) + zero_point, lo, hi)
    - zero_point) x scale (ONNX's QuantizeLinear then DequantizeLinear)."""
    return (np.clip(np.rint(x / scale) + zero_point, lo, hi) - zero_point) * scale


def rows2d(a: np.ndarray) -> np.ndarray:
    """View a (batch, ..., width) array as (rows, width)."""
    return a.reshape(-1, a.shape[-1])


# Weight matrices from this size up keep the placement NumPy's allocator gives them (the model's
# own array when it is float32 and C-contiguous: no second copy), the placement naive's x @ w runs
# on; smaller ones get a 64-byte aligned copy. Which is faster depends on the size (an aliasing
# effect more than alignment): from 4 MiB up the aligned copy ran slower and put static and arena
# below naive; below 4 MiB it ran as fast or faster. Weights are no longer stored transposed
# (slower on the hosts measured since). Measured: docs/kernels.md#weight-placement
NUMPY_PLACEMENT_MIN_BYTES = 4 << 20


def weight_layout(w) -> np.ndarray:
    """w (in, out) as an engine holds it: float32 C-contiguous, on a cache line below
    NUMPY_PLACEMENT_MIN_BYTES, where NumPy put it from there up."""
    if 4 * np.size(w) >= NUMPY_PLACEMENT_MIN_BYTES:
        return np.ascontiguousarray(w, dtype=np.float32)
    return aligned(w)


def max_rows(shape, max_batch: int) -> int:
    """The rows of a tensor of per-sample ``shape`` at ``max_batch``: what its op's vectors are
    tiled to. (The model input's rows, used before, tiled a vector over one row where the input
    is raw audio: 168 calls for wav2vec 2.0's (79, 64) LayerNorm at batch 1.)"""
    return max_batch * math.prod(shape[:-1])


def tile(vector: np.ndarray, max_rows: int) -> np.ndarray:
    rows = max(1, min(max_rows, TILE_BYTES // (4 * vector.shape[-1])))
    return aligned(np.broadcast_to(vector, (rows, vector.shape[-1])))


Calls = list  # [(fn, args), ...]


def tiled_calls(ufunc, y: np.ndarray, tiled: np.ndarray, x: np.ndarray | None = None) -> Calls:
    """Calls doing y[r] = ufunc(x[r], v) for every row r (x defaults to y), over row blocks the
    pre-tiled vector covers: no broadcast operand."""
    x = y if x is None else x
    step = tiled.shape[0]
    return [(ufunc, (x[i:i + step], tiled[:len(y[i:i + step])], y[i:i + step])) for i in range(0, len(y), step)]


def maximum(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.maximum(a, b, out=out)    # a positional out is deprecated for np.maximum


def minimum(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.minimum(a, b, out=out)


@functools.lru_cache(maxsize=None)
def zero_rows(width: int) -> np.ndarray:
    """A read-only block of zero rows of this width, as many as fit in TILE_BYTES."""
    zeros = tile(np.zeros(width), TILE_BYTES)
    zeros.flags.writeable = False
    return zeros


@functools.lru_cache(maxsize=None)
def ones_column(width: int) -> np.ndarray:
    """A read-only (width, 1) column of ones, made once per width."""
    col = aligned(np.ones((width, 1)))
    col.flags.writeable = False
    return col


@dataclass(frozen=True)
class OpKind:
    eager: Callable
    calls: Callable
    prepare: Callable | None = None          # (*params, max_rows) -> operands of the calls
    scratch: Callable | None = None          # (in_shapes, **attrs) -> per-sample scratch shapes
    inplace: tuple[int, ...] = ()            # inputs the output may overwrite
    flops_per_element: int = 1               # for elementwise ops
    flops: Callable | None = None            # (in_shapes, out_shape, **attrs) -> FLOPs per sample
    # What ``eager`` holds at its peak besides its output, measured with memray:
    eager_temps: int = 0                     # output-sized temporaries (x @ W before + b)
    eager_row_stats: int = 0                 # (rows, 1) statistics (means, maxima)
    eager_broadcast: bool = False            # a broadcast ufunc call: NumPy's ufunc buffer
    eager_bytes: Callable | None = None      # (in_shapes, out_shape) -> bytes a sample, where not output-sized
    # The output is the input reinterpreted in another shape: an engine that plans memory gives
    # it the input's storage and runs no call; ``calls`` copy, for engines that do not.
    view: bool = False

    def eager_extra_bytes(self, out_shape: tuple[int, ...], in_shapes=()) -> int:
        """Bytes ``eager`` allocates beyond its output, for a full (batch, ...) output shape
        (``in_shapes``: per sample, for ``eager_bytes``)."""
        elements = math.prod(out_shape)
        rows = elements // out_shape[-1]
        extra = 4 * (self.eager_temps * elements + self.eager_row_stats * rows)
        if self.eager_bytes is not None:
            extra += out_shape[0] * self.eager_bytes(in_shapes, out_shape[1:])
        if self.eager_broadcast and rows > 1:   # a single row broadcasts without buffering
            extra += 4 * min(elements, np.getbufsize())
        return extra

    def operands(self, params, max_rows: int) -> tuple:
        """What the calls read for these parameters: prepared once, or the parameters as they are."""
        return tuple(self.prepare(*params, max_rows)) if self.prepare else tuple(params)

    def scratch_shapes(self, in_shapes, attrs: Mapping = {}) -> tuple[tuple[int, ...], ...]:
        """The op's attributes too: a convolution's workspace depends on its kernel, strides, pads."""
        return tuple(tuple(s) for s in self.scratch(in_shapes, **attrs)) if self.scratch else ()

    def flop_count(self, in_shapes, out_shape, attrs: Mapping = {}) -> int:
        if self.flops is not None:
            return self.flops(in_shapes, out_shape, **attrs)
        return self.flops_per_element * math.prod(out_shape)

"""Latency as a ratio measured in one process, the figure the latency gate compares.

Absolute times from two runs can't be compared on a shared machine: back to
back, identical runs differ by 30-60 %. What survives is a ratio of two
workloads timed *interleaved* in the same process, so that whatever slows the
machine slows both. Each benchmark is timed against a frozen yardstick: the
model's own matrix products done with raw ``np.matmul(..., out=)``, which
tracks the engine's dominant cost (BLAS, memory bandwidth) but shares no code
with any engine, so a regression in an engine cannot hide in the yardstick.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from engines.models import Model


def yardstick(model: Model, batch: int):
    """A callable doing the model's matmuls (linear layers and attention) into fixed buffers."""
    calls = []
    x = np.ones(model.input_shape(batch), dtype=np.float32)
    buffers = {model.input: x}
    for op in model.ops:
        out = np.zeros((batch, *model.shapes[op.output]), dtype=np.float32)
        buffers[op.output] = out
        src = buffers[op.inputs[0]]
        if op.kind == "linear":
            w = model.params[op.params[0]]
            calls.append((np.matmul, src.reshape(-1, w.shape[0]), w, out.reshape(-1, w.shape[1])))
        elif op.kind in ("attn_scores", "attn_context"):
            heads = op.attrs["heads"]
            if op.kind == "attn_scores":
                seq, width = src.shape[1], src.shape[2] // 3
                q = src[..., :width].reshape(batch, seq, heads, -1).transpose(0, 2, 1, 3)
                k = src[..., width:2 * width].reshape(batch, seq, heads, -1).transpose(0, 2, 3, 1)
                calls.append((np.matmul, q, k, out))
            else:
                qkv = buffers[op.inputs[1]]
                seq, width = qkv.shape[1], qkv.shape[2] // 3
                v = qkv[..., 2 * width:].reshape(batch, seq, heads, -1).transpose(0, 2, 1, 3)
                ctx = out.reshape(batch, seq, heads, -1).transpose(0, 2, 1, 3)
                calls.append((np.matmul, src, v, ctx))
        else:
            buffers[op.output] = src if src.shape == out.shape else out

    def run():
        for f, a, b, o in calls:
            f(a, b, out=o)
    return run


@dataclass(frozen=True)
class RatioSample:
    ratios: tuple[float, ...]     # per round: time(engine block) / time(yardstick block)
    calls_per_block: int

    @property
    def median(self) -> float:
        return float(np.median(self.ratios))

    @property
    def iqr(self) -> tuple[float, float]:
        q1, q3 = np.percentile(self.ratios, [25, 75])
        return float(q1), float(q3)


def _block(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


def interleaved_ratio(fn, ref, rounds: int = 15, block_seconds: float = 0.004) -> RatioSample:
    """Time ``fn`` and ``ref`` in alternating blocks; return the per-round ratios.

    Blocks repeat a call enough to last ``block_seconds`` (timer resolution and
    scheduler ticks stop mattering), and the order flips every round so that
    neither side always runs on a warmer cache.
    """
    fn(), ref()
    one = max(_block(fn, 1), _block(ref, 1), 1e-7)
    calls = max(1, math.ceil(block_seconds / one))
    ratios = []
    for r in range(rounds):
        if r % 2:
            t_ref, t_fn = _block(ref, calls), _block(fn, calls)
        else:
            t_fn, t_ref = _block(fn, calls), _block(ref, calls)
        ratios.append(t_fn / t_ref)
    return RatioSample(tuple(ratios), calls)

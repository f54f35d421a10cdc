"""NCHW against NHWC for a convolution lowered to im2col + one GEMM, interleaved in one process.

NCHW is ``engines.ir.conv``'s conv kind as engines bind it, with one whole workspace (no row
blocks). NHWC is the same lowering written for channels-last: one strided copy per kernel tap
into a (batch·OH·OW, kh·kw·C + 1) workspace whose last column is ones, then one GEMM against
(kh·kw·C + 1, O) weights; a 1x1 stride-1 conv is the input (batch·H·W, C) times the weights,
then a pre-tiled bias added in row blocks (``ops.linear``).
Prints the fastest call of each (the least disturbed by other load on the cores) and the
ratios of the fastest and of the median calls.

    python -m scripts.conv_layout [--rounds 15]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from engines.ir import conv
from engines.ir.conv import Window, tap_calls
from engines.ir.ops import OPS
from engines.memory import aligned
from engines.ir.calls import tile, tiled_calls

# (name, C, O, H, kernel, stride, pad): ResNet-50 layers at 224x224
LAYERS = [
    ("res2 3x3 64->64 56x56", 64, 64, 56, 3, 1, 1),
    ("res2 1x1 64->256 56x56", 64, 256, 56, 1, 1, 0),
    ("res4 3x3 256->256 14x14", 256, 256, 14, 3, 1, 1),
    ("res4 1x1 1024->256 14x14", 1024, 256, 14, 1, 1, 0),
]


def nchw_calls(batch, c, o, h, k, s, p, rng):
    conv.COL_BYTES = conv.COL_COLUMNS = 1 << 40      # one whole workspace, as the NHWC side has
    kind = OPS["conv"]
    attrs = dict(kernel_shape=(k, k), strides=(s, s), pads=(p,) * 4)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32) / math.sqrt(c * k * k)
    b = rng.standard_normal(o, dtype=np.float32)
    x = rng.standard_normal((batch, c, h, h), dtype=np.float32)
    oh = Window.of(**attrs).out_size(h, h)[0]
    out = np.empty((batch, o, oh, oh), np.float32)
    scratch = [np.empty((batch, *sh), np.float32) for sh in kind.scratch_shapes([(c, h, h)], attrs)]
    return kind.calls(out, x, *kind.operands((w, b), batch * h), *scratch, **attrs)


def nhwc_calls(batch, c, o, h, k, s, p, rng):
    win = Window.of(kernel_shape=(k, k), strides=(s, s), pads=(p,) * 4)
    oh = win.out_size(h, h)[0]
    x = rng.standard_normal((batch, h, h, c), dtype=np.float32)
    out = np.empty((batch * oh * oh, o), np.float32)
    b = rng.standard_normal(o, dtype=np.float32)
    if (k, s, p) == (1, 1, 0):
        w = aligned(rng.standard_normal((c, o), dtype=np.float32))
        return [(np.matmul, (x.reshape(-1, c), w, out))] + tiled_calls(np.add, out, tile(b, len(out)))
    w = aligned(np.concatenate([rng.standard_normal((k * k * c, o), dtype=np.float32), b[None]]))
    col = np.empty((batch * oh * oh, k * k * c + 1), np.float32)
    taps = col[:, :-1].reshape(batch, oh, oh, k, k, c)
    calls = []
    for i, j in win.taps():
        # tap_calls works on the last two axes: move channels first in views, no copy
        dst = taps[:, :, :, i, j].transpose(0, 3, 1, 2)
        calls += tap_calls(dst, x.transpose(0, 3, 1, 2), win, (i, j), 0.0)
    return calls + [(np.copyto, (col[:, -1], 1.0)), (np.matmul, (col, w, out))]


def run(calls):
    for fn, args in calls:
        fn(*args)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| layer | batch | NCHW ms (min) | NHWC ms (min) | NHWC / NCHW (min) | NHWC / NCHW (median) |\n"
          "|---|---|---|---|---|---|")
    for name, c, o, h, k, s, p in LAYERS:
        for batch in (1, 4):
            pair = {"NCHW": nchw_calls(batch, c, o, h, k, s, p, rng), "NHWC": nhwc_calls(batch, c, o, h, k, s, p, rng)}
            times = {key: [] for key in pair}
            for calls in pair.values():
                run(calls)
            for _ in range(args.rounds):          # interleaved: one call of each per round
                for key, calls in pair.items():
                    t = time.perf_counter()
                    run(calls)
                    times[key].append(time.perf_counter() - t)
            low = {key: min(v) * 1e3 for key, v in times.items()}
            med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
            print(f"| {name} | {batch} | {low['NCHW']:.2f} | {low['NHWC']:.2f} | {low['NHWC'] / low['NCHW']:.2f} "
                  f"| {med['NHWC'] / med['NCHW']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

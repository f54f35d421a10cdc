"""Each engine built with kernel tuning and without, timed interleaved with naive on the mlp.

    python scripts/tuned_vs_fixed.py 8x256,32x1024 static,fused,packed [ROUNDS]

Per BATCHxDIM: the kernels the tuned engines chose (and every candidate's time), then the median
time and the median per-round ratio to naive of each engine tuned and fixed. Blocks as
``mlexec report`` times them: 0.3 s of untimed calls, then about 50 ms of timed ones, in the
orders of a Williams design. ``MLEXEC_TUNE=again`` measures afresh instead of reading the cache.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines import ENGINES  # noqa: E402
from engines.ir.models import mlp  # noqa: E402
from mlexec.timing import round_order, settle, time_block  # noqa: E402


def main(shapes: str, engines: str, rounds: int = 7) -> None:
    tuned_mode = os.environ.get("MLEXEC_TUNE", "1")
    tuned_mode = "1" if tuned_mode.strip().lower() in ("0", "off", "false", "no") else tuned_mode
    for shape in shapes.split(","):
        batch, dim = map(int, shape.split("x"))
        model = mlp(dim)
        x = model.random_input(batch, rng=0)
        built = {}
        for name in engines.split(","):
            for label, mode in (("fixed", "0"), ("tuned", tuned_mode)):
                os.environ["MLEXEC_TUNE"] = mode
                t0 = time.perf_counter()
                built[f"{name}/{label}"] = engine = ENGINES[name](model, batch)
                engine.forward(x)
                if label == "tuned":
                    print(f"b{batch} d{dim} {name}: built in {time.perf_counter() - t0:.2f} s;",
                          [(k["gemm"], k["kernel"], k["how"], k["candidates_us"]) for k in engine.report()["kernels"]])
        os.environ["MLEXEC_TUNE"] = "0"
        built["naive"] = ENGINES["naive"](model, batch)
        names = list(built)
        calls = max(1, int(0.05 / max(time_block(built[n].forward, x, 1) for n in names)))
        times = {n: [] for n in names}
        for r in range(rounds):
            for i in round_order(len(names), r):
                settle(built[names[i]].forward, x, 0.3)
                times[names[i]].append(time_block(built[names[i]].forward, x, calls))
        for n in names:
            print(f"  b{batch} d{dim} {n:14s} {1e6 * np.median(times[n]):9.1f} us  "
                  f"x naive {np.median(np.array(times['naive']) / np.array(times[n])):.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))

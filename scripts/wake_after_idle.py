"""What a request after an idle pause costs: per engine, the transformer (d256 s64) at batch 1
steady, then after a batch-4 forward and a pause of 1 ms to 1 s, the first and second batch-1
forwards (median and max of 7 tries). Run it under different OpenMP settings to compare, e.g.

    python scripts/wake_after_idle.py packed,onednn,fused
    OMP_PROC_BIND=true python scripts/wake_after_idle.py packed,onednn

Prints a Markdown table; the CPU and the OpenMP environment are named.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines import ENGINES, MODELS  # noqa: E402
from engines.kernels import cpu_model  # noqa: E402

PAUSES_S = (0.001, 0.01, 0.1, 0.3, 1.0)
TRIES = 7


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def row(name: str, model) -> str:
    engine = ENGINES[name](model, 4)
    x4, x1 = model.random_input(4, 0), model.random_input(1, 1)
    for _ in range(50):
        engine.forward(x4)
        engine.forward(x1)
    steady = np.median([_ms(lambda: engine.forward(x1)) for _ in range(200)])
    cells = []
    for pause in PAUSES_S:
        first, second = [], []
        for _ in range(TRIES):
            engine.forward(x4)
            time.sleep(pause)
            first.append(_ms(lambda: engine.forward(x1)))
            second.append(_ms(lambda: engine.forward(x1)))
        cells.append(f"{np.median(first):.2f} (max {max(first):.2f}) / {np.median(second):.2f}")
    return f"| {name} | {steady:.3f} | " + " | ".join(cells) + " |"


def main(argv: list[str]) -> int:
    names = (argv[0] if argv else "packed,onednn,fused").split(",")
    model = MODELS["transformer"](dim=256, seq=64, heads=8)
    omp = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_"))}
    print(f"Transformer d256 s64, ms; {cpu_model()}; OpenMP environment: {omp or 'as engines set it'}. "
          f"After a batch-4 forward and a pause: first (max of {TRIES}) / second batch-1 forward, medians.\n")
    print("| engine | steady b1 | " + " | ".join(f"pause {p * 1e3:g} ms" for p in PAUSES_S) + " |")
    print("|---|---|" + "---|" * len(PAUSES_S))
    for name in names:
        print(row(name, model), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

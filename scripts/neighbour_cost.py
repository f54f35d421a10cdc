"""What an engine's thread pool costs the code that runs right after it in the same process.

For each pool setting (one subprocess each, since OpenMP reads its settings
when it loads; MKL and oneDNN both run on GNU OpenMP), rounds of: a block of the engine, then at once 20
calls of the neighbour (naive at mlp b8 d256, on NumPy's OpenBLAS), then the
neighbour alone for 0.4 s (longer than any pool spins) and 20 more calls as
its reference, then the engine alone for 0.4 s and a block of it as its
reference. Printed per setting, both ways: the engine's time per call alone
and right after the neighbour, and the neighbour's alone and right after the
engine, each with its ratio (the cost). Medians over the rounds.

    python scripts/neighbour_cost.py                       # packed at mlp b32 d1024, every setting
    python scripts/neighbour_cost.py --engine onednn --shape 8x256
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENGINE_BLOCK_S = 0.02      # the engine's block
NEIGHBOUR_CALLS = 20       # the neighbour's calls timed right after it
QUIET_S = 0.4              # the neighbour alone this long before its reference calls
WAIT_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "MLEXEC_PIN_WORKERS")   # how OpenMP waits, where its workers run: only what a setting names
SETTINGS = {                                   # name -> environment for the subprocess
    "project's (engines.native.openmp)": {},
    "workers unpinned (MLEXEC_PIN_WORKERS=0)": {"MLEXEC_PIN_WORKERS": "0"},
    "GNU's (GOMP_SPINCOUNT=300000)": {"GOMP_SPINCOUNT": "300000"},
    "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
    "GOMP_SPINCOUNT=100": {"GOMP_SPINCOUNT": "100"},
    "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
    "GOMP_SPINCOUNT=3000": {"GOMP_SPINCOUNT": "3000"},
    "GOMP_SPINCOUNT=30000": {"GOMP_SPINCOUNT": "30000"},
}


def _block(fn, x, seconds: float) -> float:
    """Seconds per call over a block of about ``seconds``."""
    calls, start = 0, time.perf_counter()
    while True:
        fn(x)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def _calls(fn, x, calls: int) -> float:
    """Seconds per call over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


def child(engine: str, batch: int, dim: int, rounds: int) -> dict:
    import numpy as np
    from engines import ENGINES, MODELS

    model = MODELS["mlp"](dim=dim)
    eng = ENGINES[engine](model, batch)
    x = model.random_input(batch, rng=0)
    nmodel = MODELS["mlp"](dim=256)
    naive = ENGINES["naive"](nmodel, 8)
    nx = nmodel.random_input(8, rng=0)
    after_engine, after_self, engine_after, engine_alone = [], [], [], []
    for r in range(rounds):
        engine_after.append(_block(eng.forward, x, ENGINE_BLOCK_S))       # right after the neighbour's calls
        after_engine.append(_calls(naive.forward, nx, NEIGHBOUR_CALLS))    # at once, no settling
        _block(naive.forward, nx, QUIET_S)           # longer than any pool's spin: the engine's pool idle
        after_self.append(_calls(naive.forward, nx, NEIGHBOUR_CALLS))
        _block(eng.forward, x, QUIET_S)              # the neighbour's pool idle in turn
        engine_alone.append(_block(eng.forward, x, ENGINE_BLOCK_S))
    med = lambda v: float(np.median(v))                   # noqa: E731
    return {"engine_alone_us": 1e6 * med(engine_alone), "engine_after_neighbour_us": 1e6 * med(engine_after),
            "neighbour_after_engine_us": 1e6 * med(after_engine), "neighbour_after_itself_us": 1e6 * med(after_self),
            "neighbour_cost": med([a / b for a, b in zip(after_engine, after_self)]),
            "engine_cost": med([a / b for a, b in zip(engine_after, engine_alone)])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="packed")
    ap.add_argument("--shape", default="32x1024", help="BATCHxDIM of the engine's mlp (default 32x1024)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of the settings to run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batch, dim = (int(v) for v in args.shape.split("x"))
    if args.child:
        print(json.dumps(child(args.engine, batch, dim, args.rounds)))
        return 0
    from engines.kernels import cpu_model
    print(f"CPU: {cpu_model()}; {args.engine} at mlp b{batch} d{dim}; neighbour naive mlp b8 d256; "
          f"{args.rounds} interleaved rounds")
    print(f"{'setting':<38} {'engine alone':>12} {'after nb':>9} {'cost':>6} {'nb alone':>9} "
          f"{'after engine':>12} {'cost':>6}   (µs a call)")
    for name in args.settings.split(","):
        inherited = {k: v for k, v in os.environ.items() if k not in WAIT_ENV}   # engines set one here
        env = {**inherited, **SETTINGS[name], "PYTHONPATH": str(ROOT), "MLEXEC_TUNE": os.environ.get(
            "MLEXEC_TUNE", "0")}           # untuned by default: packed on MKL's packed GEMM, the pool asked about
        out = subprocess.run([sys.executable, __file__, "--child", "--engine", args.engine, "--shape", args.shape,
                              "--rounds", str(args.rounds)], env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.splitlines()[-1])
        print(f"{name:<38} {r['engine_alone_us']:>12.1f} {r['engine_after_neighbour_us']:>9.1f} "
              f"{r['engine_cost']:>5.2f}x {r['neighbour_after_itself_us']:>9.1f} "
              f"{r['neighbour_after_engine_us']:>12.1f} {r['neighbour_cost']:>5.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

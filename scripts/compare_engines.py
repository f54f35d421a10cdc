#!/usr/bin/env python
"""Compare engines' forward latency in one process, interleaved, with medians and spread.

For every shape, each round times a block of calls per engine, in an order
that rotates every round, so drift and neighbours' load fall on every engine
alike. Reported per engine: the median time per call over rounds, the IQR as
a percentage of it, and the median over rounds of the per-round ratio to
``naive`` and to ``onnxruntime`` (ratio > 1: this engine is faster). Two
roofs are measured in the same process: a 4096^3 float32 matmul (GFLOP/s)
and a 64 MiB copy (GB/s, read + write).

    python scripts/compare_engines.py                 # the MLP and transformer grids
    python scripts/compare_engines.py --quick         # a few points, seconds
    python scripts/compare_engines.py --engines naive,fused,torch-compile --models mlp
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines import ENGINES, MODELS, EngineUnavailable  # noqa: E402

MLP_GRID = [(b, d) for d in (256, 1024, 4096) for b in (1, 8, 32, 128)]
TRANSFORMER_GRID = [(b, d, s) for d in (256, 512) for s in (64, 128) for b in (1, 8)]
QUICK = {"mlp": [(1, 256), (8, 256), (32, 1024), (1, 4096)], "transformer": [(1, 256, 64)]}


def time_block(fn, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


def quartiles(values):
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    return q2, q3 - q1


def roofs(rounds: int) -> dict[str, float]:
    """Peak matmul rate (GFLOP/s, 4096^3 float32) and copy bandwidth (GB/s, 64 MiB, read + write)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4096, 4096), dtype=np.float32)
    c = np.empty_like(a)
    np.matmul(a, a, out=c)
    gemm = [time_block(lambda _: np.matmul(a, a, out=c), None, 1) for _ in range(rounds)]
    src = np.ones(16 * 2**20, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copy = [time_block(lambda _: np.copyto(dst, src), None, 3) for _ in range(rounds)]
    return {"gflops": 2 * 4096**3 / np.median(gemm) / 1e9, "copy_gbs": 2 * src.nbytes / np.median(copy) / 1e9}


def measure(model, batch, names, rounds, block_seconds):
    engines = {}
    for name in names:
        try:
            engines[name] = ENGINES[name](model, batch)
        except EngineUnavailable as exc:
            print(f"  skip {name}: {exc}", file=sys.stderr)
    x = model.random_input(batch, rng=0)
    for eng in engines.values():                  # warm up, and check they agree
        eng.forward(x)
        np.testing.assert_allclose(eng.forward(x), model.reference(x), atol=1e-3, rtol=0)
    probe = min(time_block(eng.forward, x, 1) for eng in engines.values())
    calls = max(1, int(block_seconds / max(probe, 1e-7)))
    times = {name: [] for name in engines}
    order = list(engines)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            engines[name].forward(x)
            times[name].append(time_block(engines[name].forward, x, calls))
    return {name: np.array(t) for name, t in times.items()}


def summarize(times):
    rows = {}
    for name, t in times.items():
        med, iqr = quartiles(t)
        row = {"median_us": med * 1e6, "iqr_pct": 100 * iqr / med}
        for ref in ("naive", "onnxruntime"):
            if ref in times:
                row[f"vs_{ref}"] = float(np.median(times[ref] / t))
        rows[name] = row
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="naive,fused,onnxruntime,torch",
                        help="comma-separated engine names (default: %(default)s)")
    parser.add_argument("--models", default="mlp,transformer", help="mlp and/or transformer (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per shape (default: %(default)s)")
    parser.add_argument("--block-seconds", type=float, default=0.03,
                        help="target duration of one engine's block of calls (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    args = parser.parse_args(argv)
    names = [n for n in args.engines.split(",") if n]
    unknown = set(names) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from {sorted(ENGINES)}")

    roof = roofs(max(3, args.rounds // 2))
    print(f"roofs: matmul 4096^3 {roof['gflops']:.0f} GFLOP/s, copy 64 MiB {roof['copy_gbs']:.1f} GB/s (read+write)")
    print("| model | batch | dim | seq | engine | median µs | IQR % | × naive | × onnxruntime |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model_name in args.models.split(","):
        grid = QUICK.get(model_name, []) if args.quick else (MLP_GRID if model_name == "mlp" else TRANSFORMER_GRID)
        for point in grid:
            batch, dim, seq = (*point, None) if len(point) == 2 else point
            model = MODELS[model_name](dim=dim) if seq is None else MODELS[model_name](dim=dim, seq=seq)
            rows = summarize(measure(model, batch, names, args.rounds, args.block_seconds))
            for name, row in rows.items():
                print(f"| {model_name} | {batch} | {dim} | {seq or '-'} | {name} | {row['median_us']:.1f} | "
                      f"{row['iqr_pct']:.0f} | {row.get('vs_naive', float('nan')):.2f} | "
                      f"{row.get('vs_onnxruntime', float('nan')):.2f} |", flush=True)
            if model_name == "mlp" and dim == 4096 and "fused" in rows:
                sec = rows["fused"]["median_us"] / 1e6
                if batch == 128:
                    rate = model.flops(batch) / sec / 1e9
                    print(f"  fused b128 d4096: {rate:.0f} GFLOP/s = {100 * rate / roof['gflops']:.0f}% of the matmul roof")
                if batch == 1:
                    rate = model.weight_bytes / sec / 1e9
                    print(f"  fused b1 d4096: {rate:.1f} GB/s of weights = {100 * rate / roof['copy_gbs']:.0f}% of the copy rate")


if __name__ == "__main__":
    main()

"""What the one-thread guard costs per forward: guarded vs unguarded, interleaved in one process.

    python scripts/guard_cost.py [--engine static] [--rounds 40] [--calls 200]

Each round times ``--calls`` forwards of each variant in alternating order and keeps the
median per call; the figure is the median over rounds of the per-round ratio. The same
comparison of two identical unguarded engines gives the run-to-run noise to read it against.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from engines import ENGINES, MODELS  # noqa: E402


def unguarded(cls):
    class Unguarded(cls):
        def _forward(self, x):
            bound = self._bound.get(x.shape[0]) or self.bind(x.shape[0])
            np.copyto(bound.input, x)
            for fn, args in bound.calls:
                fn(*args)
            return bound.output
    return Unguarded


def per_call(engine, x, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        engine.forward(x)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def compare(a, b, x, rounds: int, calls: int) -> tuple[float, float, float]:
    """(median a per call, median b per call, median over rounds of a/b), order alternating."""
    ta, tb, ratios = [], [], []
    for r in range(rounds):
        first, second = (a, b) if r % 2 == 0 else (b, a)
        t1, t2 = per_call(first, x, calls), per_call(second, x, calls)
        t_a, t_b = (t1, t2) if r % 2 == 0 else (t2, t1)
        ta.append(t_a), tb.append(t_b), ratios.append(t_a / t_b)
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="static")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    model = MODELS["mlp"](dim=args.dim)
    x = model.random_input(args.batch, 0)
    cls, plain_cls = ENGINES[args.engine], unguarded(ENGINES[args.engine])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{args.engine} mlp b{args.batch} d{args.dim}, {args.rounds} rounds x {args.calls} calls, {cpu}")
    # Where an engine's buffers land moves its time by a few percent (measured: +160 ns for
    # whichever fused engine was built first): each trial builds fresh engines, in turned order.
    for trial in range(2):
        makers = [lambda: cls(model, args.batch)] + [lambda: plain_cls(model, args.batch)] * 2
        built = [make() for make in (makers if trial == 0 else makers[::-1])]
        guarded, plain, plain2 = built if trial == 0 else built[::-1]
        for engine in built:
            per_call(engine, x, 500)
        for label, a, b in (("guard vs none", guarded, plain), ("none vs none (noise)", plain2, plain)):
            ma, mb, ratio = compare(a, b, x, args.rounds, args.calls)
            print(f"  trial {trial} {label:22s} {ma * 1e6:7.2f} us vs {mb * 1e6:7.2f} us  "
                  f"median ratio {ratio:.4f} ({(ma - mb) * 1e9:+.0f} ns)")

if __name__ == "__main__":
    main()

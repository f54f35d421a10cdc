"""Kernel choices made alone and in the forward, on the mlp grid: where they differ, which is faster.

    python scripts/forward_choice.py [BATCHES] [DIMS] [ENGINES]
    python scripts/forward_choice.py 1,8,32,128 256,1024,4096 static,fused,packed,onednn

Per point and engine, two builds from empty kernel caches: one choosing each linear's kernel by
its GEMM timed alone (the rival judging switched off), one as the engines choose now (close
rivals judged again in the engine's own forward). Where the kernels differ, the two engines are
timed interleaved (``mlexec.timing.interleave``, ABBA cycles) and the median ratio is printed:
> 1.00 means the forward's choice runs faster. Prints a Markdown table; the CPU is named.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["MLEXEC_TUNE"] = "1"
from engines import ENGINES  # noqa: E402
from engines.ir.models import mlp  # noqa: E402
from engines.kernels import CACHE_ENV, choice, cpu_model  # noqa: E402
from mlexec.timing import interleave  # noqa: E402


def build(name: str, model, batch: int, in_forward: bool):
    """The engine built from an empty cache, judging rivals in the forward or not."""
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="mlexec-choice-")
    choice._MEMO.clear()
    rivals = choice.FORWARD_RIVALS
    choice.FORWARD_RIVALS = rivals if in_forward else 1
    try:
        return ENGINES[name](model, batch)
    finally:
        choice.FORWARD_RIVALS = rivals


def kernels_of(engine) -> str:
    return ", ".join(f"{r['gemm']}: {r['kernel']}" for r in engine.report()["kernels"])


def main(batches="1,8,32,128", dims="256,1024,4096", engines="static,fused,packed,onednn") -> None:
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores\n")
    print("| batch | dim | engine | alone | in the forward | alone ÷ forward's time (median, ABBA) |")
    print("|---|---|---|---|---|---|")
    for batch in map(int, batches.split(",")):
        for dim in map(int, dims.split(",")):
            model = mlp(dim)
            x = model.random_input(batch, rng=0)
            for name in engines.split(","):
                alone, judged = build(name, model, batch, False), build(name, model, batch, True)
                a, b = kernels_of(alone), kernels_of(judged)
                ratio = "same choice"
                if a != b:
                    timed = interleave(lambda: alone.forward(x), lambda: judged.forward(x), seconds=1.0)
                    ratio = f"{timed.median:.3f} ({min(timed.ratios):.2f}-{max(timed.ratios):.2f})"
                print(f"| {batch} | {dim} | {name} | {a} | {b} | {ratio} |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

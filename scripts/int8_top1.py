"""int8 against its float engine on the CNN classifiers that ship with onnx: top-1 agreement and
error over many seeded random inputs (docs/int8.md, "Accuracy").

    python scripts/int8_top1.py                       # 1,000 inputs per model, one thread
    python scripts/int8_top1.py --inputs 200 --models squeezenet,resnet50

Weights are seeded random (``load_onnx(randomize_weights=17)``, as tests/test_cnn_models.py), so
that the classes are not tied. Each input is drawn from one generator seeded per model; both
engines run the same input at batch 1 (the files fix it). Prints one Markdown table row per model:
top-1 agreement, max abs error over max |output|, and the relative L2 error's median and worst.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from engines import ENGINES, load_onnx  # noqa: E402

MODELS = ("squeezenet", "resnet50", "shufflenet", "densenet121", "inception_v1", "inception_v2")


def light(name: str) -> str:
    import onnx
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


def measure(name: str, inputs: int) -> str:
    model = load_onnx(light(name), randomize_weights=17)
    float_engine, int8 = ENGINES["onednn"](model, 1), ENGINES["int8"](model, 1)
    rng = np.random.default_rng(2026)
    agree, worst_abs, top, rel = 0, 0.0, 0.0, []
    start = time.perf_counter()
    for _ in range(inputs):
        x = model.random_input(1, rng=rng)
        want = np.array(float_engine.forward(x), dtype=np.float64).reshape(-1)
        got = np.array(int8.forward(x), dtype=np.float64).reshape(-1)
        agree += int(np.argmax(got) == np.argmax(want))
        worst_abs = max(worst_abs, float(np.max(np.abs(got - want))))
        top = max(top, float(np.max(np.abs(want))))
        rel.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    seconds = time.perf_counter() - start
    return (f"| {name} | {agree}/{inputs} ({100 * agree / inputs:.1f} %) | {worst_abs:.3g} / {top:.3g} | "
            f"{100 * np.median(rel):.2f} % | {100 * max(rel):.2f} % | {seconds:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"CPU: {cpu}; one thread; {args.inputs} seeded inputs per model; int8 against onednn (float)\n")
    print("| model | top-1 = float | max abs / max \\|output\\| | rel L2, median | rel L2, worst | time |")
    print("|---|---|---|---|---|---|")
    with threadpool_limits(1):
        for name in args.models.split(","):
            print(measure(name, args.inputs), flush=True)


if __name__ == "__main__":
    main()

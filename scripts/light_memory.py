"""The arena planner on the nine CNNs shipped with the onnx package, against ONNX Runtime's peak.

For each ``onnx/backend/test/data/light/*.onnx`` at batch 1, imported with ``engines.load_onnx``
(the IR ops before and after the import passes: BatchNormalization and per-channel Mul/Add
folded into the conv, Relu/Clip fused into it, Flatten/Reshape as views), the ``arena``
engine's plan (``engines.planner.plan_memory`` over the engine's own schedule, every op's
scratch included): the arena, the lower bound (most bytes live at one step) and the
no-reuse total.

ONNX Runtime's peak is one ``session.run`` after two warm-up runs, traced with memray (every
thread, the high-water mark's records summed, as ``mlexec.suite.session.record_peak`` does),
with its CPU memory arena off (each run allocates and frees what it needs), and the first run
with the arena on (its default; warm runs then allocate nothing: the arena kept serves them).

    python -m scripts.light_memory [--models resnet50 squeezenet ...]
"""
from __future__ import annotations

import argparse
import glob
import os
import tempfile

import numpy as np

from engines import ENGINES, load_onnx
from engines.native.threads import blas_threads


def light_models() -> list[str]:
    import onnx
    return sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))


def short(path: str) -> str:
    return os.path.basename(path)[len("light_"):-len(".onnx")]


def figures(path: str) -> dict:
    """Op counts and the arena engine's plan at batch 1 for one file."""
    import onnx
    nodes = [n for n in onnx.load(path).graph.node if n.op_type not in ("ConstantOfShape", "Constant")]
    before, after = load_onnx(path, passes=False), load_onnx(path)
    plan = ENGINES["arena"](after, 1).plan
    return dict(nodes=len(nodes), before=len(before.ops), after=len(after.ops), arena=plan.arena_bytes,
                bound=plan.lower_bound_bytes, no_reuse=plan.no_reuse_bytes)


def onnxruntime_peak(path: str, arena: bool, warm: bool = True) -> int:
    import memray
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = blas_threads()
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = arena
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
    for _ in range(2 if warm else 0):
        session.run(None, {inp.name: x})
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "run.bin")
        with memray.Tracker(trace):
            session.run(None, {inp.name: x})
        reader = memray.FileReader(trace)
        return sum(r.size for r in reader.get_high_watermark_allocation_records(merge_threads=True))


def mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", metavar="NAME", help="short names (resnet50 ...); default: all nine")
    args = parser.parse_args(argv)
    paths = [p for p in light_models() if not args.models or short(p) in args.models]
    print("| model | file nodes | IR ops before / after passes | no reuse MB | lower bound MB | arena MB "
          "| arena / bound | ONNX Runtime peak MB (arena off) | (arena on, first run) | arena / ONNX Runtime |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        f = figures(path)
        off, on = onnxruntime_peak(path, arena=False), onnxruntime_peak(path, arena=True, warm=False)
        print(f"| {short(path)} | {f['nodes']} | {f['before']} / {f['after']} | {mb(f['no_reuse'])} "
              f"| {mb(f['bound'])} | {mb(f['arena'])} | {f['arena'] / f['bound']:.3f} | {mb(off)} | {mb(on)} "
              f"| {f['arena'] / off:.2f} |", flush=True)


if __name__ == "__main__":
    main()

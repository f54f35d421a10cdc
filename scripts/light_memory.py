"""The arena planner on the nine CNNs shipped with the onnx package, against ONNX Runtime's peak.

For each ``onnx/backend/test/data/light/*.onnx`` at batch 1: tensor sizes from
``onnx.shape_inference``, and the schedule the NumPy engines would run once an importer has
applied the usual passes (constants folded away: ``ConstantOfShape`` weights and their
``Unsqueeze``; Flatten/Reshape/Dropout as views; BatchNormalization and Mul/Add by constants
folded into the Conv/Gemm before them, or into a standalone BatchNormalization; Relu fused into
the Conv before it; in place where ``engines.conv``/``engines.ops`` allow it). Each conv, pool,
LRN, batchnorm and softmax also plans its scratch (``OpKind.scratch_shapes``), as the engines
do. ``engines.planner.plan_memory`` then gives the arena, the lower bound (most bytes live at
one step) and the no-reuse total, with and without the scratch, with Concat copy-free (each
part that only the concat reads written straight into the concat's buffer), and with a Conv
whose only reader is a Sum/Add writing onto the other operand (a GEMM with beta=1).

ONNX Runtime's peak is one ``session.run`` after two warm-up runs, traced with memray (every
thread, the high-water mark's records summed, as ``mlexec.suite.session.record_peak`` does),
with its CPU memory arena off (each run allocates and frees what it needs), and the first run
with the arena on (its default; warm runs then allocate nothing: the arena kept serves them).

    python -m scripts.light_memory [--markdown]
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import tempfile

import numpy as np

from engines.ops import OPS
from engines.planner import Step, plan_memory
from engines.threads import blas_threads

VIEWS = {"Reshape", "Flatten", "Dropout", "Identity", "Squeeze", "Unsqueeze"}
AFFINE = {"BatchNormalization", "Mul", "Add"}        # per-channel affine when one operand is constant
INPLACE = {"Relu": (0,), "Sum": (0, 1), "Add": (0, 1), "BatchNormalization": (0,), "Mul": (0,),
           "Softmax": (0,), "Clip": (0,), "Sigmoid": (0,)}


def light_models() -> list[str]:
    import onnx
    return sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))


def attrs_of(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def scratch_bytes(node, in_shape) -> int:
    """Bytes of the scratch the node's op kind plans at batch 1 (per-sample shapes)."""
    a = attrs_of(node)
    if node.op_type == "Conv":
        kind, attrs = "conv", dict(kernel_shape=a["kernel_shape"], strides=a.get("strides", (1, 1)),
                                   pads=a.get("pads", (0, 0, 0, 0)), dilations=a.get("dilations", (1, 1)),
                                   group=a.get("group", 1))
    elif node.op_type in ("MaxPool", "AveragePool"):
        kind = node.op_type.lower()
        attrs = dict(kernel_shape=a["kernel_shape"], strides=a.get("strides", (1, 1)),
                     pads=a.get("pads", (0, 0, 0, 0)), ceil_mode=a.get("ceil_mode", 0))
    elif node.op_type in ("LRN", "BatchNormalization"):
        kind, attrs = "lrn" if node.op_type == "LRN" else "batchnorm", {}
    elif node.op_type == "Softmax":
        kind, attrs = "softmax", {}
    else:
        return 0
    return sum(4 * math.prod(s) for s in OPS[kind].scratch_shapes([in_shape], attrs))


def schedule(path: str, copy_free_concat: bool = False, fuse_residual: bool = False):
    """(sizes, steps, output, scratch names) at batch 1 for the engines' lowering of the file."""
    import onnx
    proto = onnx.shape_inference.infer_shapes(onnx.load(path))
    g = proto.graph
    shape = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
             for v in [*g.input, *g.value_info, *g.output]}
    const = {i.name for i in g.initializer}
    for node in g.node:                      # constant propagation: ConstantOfShape weights, Unsqueeze of them
        if all(i in const or not i for i in node.input):
            const.update(node.output)
    nodes = [n for n in g.node if not set(n.output) <= const]
    readers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    root: dict[str, str] = {}                 # tensor -> tensor whose storage it is
    find = lambda t: find(root[t]) if t in root else t     # noqa: E731
    x = g.input[0].name if g.input[0].name not in const else next(i.name for i in g.input if i.name not in const)
    sizes = {x: 4 * math.prod(shape[x])}
    steps = [Step(reads=(), writes=(x,))]    # the engines copy the input into their memory first
    folds_into = {"Conv", "Gemm"}
    producer: dict[str, str] = {}             # tensor -> op type that wrote it (after folding)
    writer: dict[str, int] = {}               # storage -> index of the step that writes it

    def fused_residual(n, acts, reads) -> bool:
        """A Conv whose only reader is this Sum writes the sum onto the other operand's storage
        (a GEMM with beta=1 accumulating onto the residual, bias and all): no step for the Sum."""
        out = n.output[0]
        for conv, residual in (reads, reads[::-1]):
            i = writer.get(conv)
            if (i is None or not producer.get(conv, "").startswith("Conv") or residual not in writer
                    or writer[residual] > i or sum(len(readers.get(a, [])) for a in acts if find(a) == conv) != 1):
                continue
            st = steps[i]
            steps[i] = Step(st.reads + (residual,), tuple(out if w == conv else w for w in st.writes),
                            ((out, residual),))
            sizes[out] = sizes.pop(conv)
            root[conv] = out
            for a in acts:
                if find(a) == conv and a != conv:
                    root[a] = out
            writer[out], producer[out] = i, "Conv"
            return True
        return False
    for n in nodes:
        acts = [i for i in n.input if i and i not in const]
        out = n.output[0]
        only_reader = len(acts) == 1 and len(readers.get(acts[0], [])) == 1
        if n.op_type in VIEWS:
            root[out] = acts[0]
            producer[out] = producer.get(acts[0])
            continue
        if (n.op_type in AFFINE and len(acts) == 1 and only_reader
                and producer.get(acts[0]) in folds_into | {"BatchNormalization"}):
            root[out] = acts[0]               # folded into the Conv/Gemm (or standalone BN) before it
            producer[out] = producer[acts[0]]
            continue
        if n.op_type == "Relu" and only_reader and producer.get(acts[0]) == "Conv":
            root[out] = acts[0]               # fused into the conv (activation attribute)
            producer[out] = "Conv+Relu"
            continue
        reads = tuple(dict.fromkeys(find(a) for a in acts))
        if fuse_residual and n.op_type in ("Sum", "Add") and len(reads) == 2 and fused_residual(n, acts, reads):
            continue
        if n.op_type == "Concat" and copy_free_concat:
            parts = [a for a in acts if len(readers[a]) == 1 and find(a) == a and a != x]
            if parts:
                for a in parts:               # the part's producer writes into the concat's buffer
                    root[a] = out
                sizes[out] = 4 * math.prod(shape[out])
                for i, st in enumerate(steps):
                    if any(w in parts for w in st.writes):
                        steps[i] = Step(st.reads, tuple(out if w in parts else w for w in st.writes), st.inplace)
                for a in parts:
                    del sizes[a]
                rest = tuple(r for r in reads if r not in parts)
                steps.append(Step(reads=rest + (out,), writes=(out,)))
                producer[out] = "Concat"
                continue
        sizes[out] = 4 * math.prod(shape[out])
        writer[out] = len(steps)
        written = [out]
        extra = scratch_bytes(n, shape[acts[0]][1:]) if acts else 0
        if extra:
            sizes[out + ".scratch"] = extra
            written.append(out + ".scratch")
        inplace = tuple((out, reads[i]) for i in INPLACE.get(n.op_type, ()) if i < len(reads))
        steps.append(Step(reads=reads + tuple(written[1:]), writes=tuple(written), inplace=inplace))
        producer[out] = n.op_type
    # a step's read of a view is a read of its storage; the output is kept past the last step
    output = find(g.output[0].name)
    return sizes, steps, output


def plan(path, copy_free_concat=False, with_scratch=True, fuse_residual=False):
    sizes, steps, output = schedule(path, copy_free_concat, fuse_residual)
    if not with_scratch:
        drop = {t for t in sizes if t.endswith(".scratch")}
        sizes = {t: n for t, n in sizes.items() if t not in drop}
        steps = [Step(tuple(r for r in s.reads if r not in drop), tuple(w for w in s.writes if w not in drop),
                      s.inplace) for s in steps]
    return plan_memory(sizes, steps, keep=[output])


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
    parser.parse_args(argv)
    print("| model | no reuse MB | lower bound MB | arena MB | arena / bound | tensors only: arena / bound MB "
          "| copy-free concat: arena / bound MB | conv+sum fused: arena / bound MB "
          "| ONNX Runtime peak MB (arena off) | (arena on, first run) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in light_models():
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        full, tensors, cf = plan(path), plan(path, with_scratch=False), plan(path, copy_free_concat=True)
        fused = plan(path, fuse_residual=True)
        off, on = onnxruntime_peak(path, arena=False), onnxruntime_peak(path, arena=True, warm=False)
        print(f"| {name} | {mb(full.no_reuse_bytes)} | {mb(full.lower_bound_bytes)} | {mb(full.arena_bytes)} "
              f"| {full.arena_bytes / full.lower_bound_bytes:.3f} "
              f"| {mb(tensors.arena_bytes)} / {mb(tensors.lower_bound_bytes)} "
              f"| {mb(cf.arena_bytes)} / {mb(cf.lower_bound_bytes)} "
              f"| {mb(fused.arena_bytes)} / {mb(fused.lower_bound_bytes)} "
              f"| {mb(off)} | {mb(on)} |", flush=True)


if __name__ == "__main__":
    main()

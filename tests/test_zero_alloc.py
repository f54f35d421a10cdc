"""After the first call, zero-allocation engines allocate no array memory per forward.

What may remain is NumPy's and Python's own bookkeeping (views, argument
tuples, ~1 KiB of reduction-iterator state): a constant, at most 4 KiB, the
same at batch 1 and at a large batch, at the smallest and the largest dim.
The check is that constancy: any temporary whose size depends on the shape
(even a (batch, 1) column) moves the peak at one of the four corners by more
than the spread the engines' own Python bookkeeping shows. Measured twice:
tracemalloc (every NumPy data buffer is traced, cached or not) and memray
(every native malloc, with BLAS pinned to one thread so OpenBLAS's per-call
thread buffers stay out of the figure; see the README).
"""
import os
import tempfile

import numpy as np
import pytest
import tracemalloc
from threadpoolctl import threadpool_limits

from engines import ENGINES, MODELS
from engines.ir import ops
from engines.planned.static import StaticEngine

BOOKKEEPING_BYTES = 4096
# Engines may pick kernels by shape (fused: sgemv for one row, SciPy sgemm for small work,
# NumPy matmul above), so their Python bookkeeping differs between corners. Measured per
# call, traced: NumPy's matmul with out= 464 B of gufunc state, SciPy's sgemm/sgemv 161-176 B
# (f2py hands back a fresh array object, no data), so up to ~460 B between corners. A
# temporary proportional to the batch is >= 1 KiB at MAX_BATCH, and a (dim,) one >= 624 B
# at the largest dims (data and array object): both exceed this spread.
SPREAD_BYTES = 512
# GNU OpenMP allocates a team (1,568 B on an Intel Xeon, under memray) for every parallel region
# MKL opens, on one thread too, and frees it on return: the same bytes every call, but only at the
# corners where MKL goes parallel. Native, so memray's figure alone carries it.
OPENMP_TEAM_BYTES = 2048
ON_MKL = {"packed"}
MAX_BATCH = 256              # big enough that a (batch, 1) float32 column (1 KiB) reaches malloc
CORNERS = {
    "mlp": (dict(dim=16), dict(dim=1024)),
    "mlp-deep": (dict(dim=16), dict(dim=512)),
    "transformer": (dict(dim=16, seq=4, heads=2), dict(dim=128, seq=32, heads=8)),
}
ZERO_ALLOC = sorted(name for name, cls in ENGINES.items() if cls.zero_alloc)


# A planted temporary shows up in every measurement; the interpreter's one-off growth
# (frame stacks, interned tracebacks) only in the first few. So each figure is the
# minimum over a few traced sessions.
SESSIONS = 3
WARMUP = 5      # fills the interpreter's free lists before anything is traced


def tracemalloc_peak(engine, x, calls=3):
    for _ in range(WARMUP):
        engine.forward(x)
    peaks = []
    for _ in range(SESSIONS):
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(calls):
                engine.forward(x)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
    return min(peaks)


def memray_peak(engine, x, calls=3):
    memray = pytest.importorskip("memray", reason="memray is part of the bench extra")
    with threadpool_limits(1), tempfile.TemporaryDirectory() as tmp:
        for _ in range(2):
            engine.forward(x)
        peaks = []
        for session in range(SESSIONS):
            path = os.path.join(tmp, f"{session}.bin")
            with memray.Tracker(path):
                for _ in range(calls):
                    engine.forward(x)
            peaks.append(memray.FileReader(path).metadata.peak_memory)
        return min(peaks)


def corner_peaks(engine_cls, model_name, measure):
    peaks = {}
    for kwargs in CORNERS[model_name]:
        model = MODELS[model_name](**kwargs)
        engine = engine_cls(model, MAX_BATCH)
        for batch in (1, MAX_BATCH):
            peaks[(str(kwargs), batch)] = measure(engine, model.random_input(batch, batch))
    return peaks


def _constant(peaks, spread) -> bool:
    return max(peaks.values()) <= BOOKKEEPING_BYTES and max(peaks.values()) - min(peaks.values()) <= spread


# On a busy machine one corner once read 1 KiB above the others in all its sessions (seen once,
# not reproduced idle or beside a busy process). A temporary the engine makes shows up in every
# measurement, so a corner set that fails is measured again, with fresh engines, and each corner
# keeps its lowest figure: a real temporary still fails (the planted tests below go through this).
REMEASURE = 2


def stable_peaks(engine_cls, model_name, measure, spread=SPREAD_BYTES):
    peaks = corner_peaks(engine_cls, model_name, measure)
    for _ in range(REMEASURE):
        if _constant(peaks, spread):
            break
        again = corner_peaks(engine_cls, model_name, measure)
        peaks = {corner: min(peak, again[corner]) for corner, peak in peaks.items()}
    return peaks


def assert_constant_bookkeeping(peaks, spread=SPREAD_BYTES):
    assert max(peaks.values()) <= BOOKKEEPING_BYTES, peaks
    assert max(peaks.values()) - min(peaks.values()) <= spread, peaks


@pytest.mark.parametrize("model_name", sorted(CORNERS))
@pytest.mark.parametrize("engine_name", ZERO_ALLOC)
def test_no_array_allocation_tracemalloc(engine_name, model_name):
    assert_constant_bookkeeping(stable_peaks(ENGINES[engine_name], model_name, tracemalloc_peak))


@pytest.mark.parametrize("model_name", sorted(CORNERS))
@pytest.mark.parametrize("engine_name", ZERO_ALLOC)
def test_no_native_allocation_memray(engine_name, model_name):
    spread = SPREAD_BYTES + (OPENMP_TEAM_BYTES if engine_name in ON_MKL else 0)
    assert_constant_bookkeeping(stable_peaks(ENGINES[engine_name], model_name, memray_peak, spread), spread)


def test_naive_allocates_and_the_check_sees_it():
    peaks = stable_peaks(ENGINES["naive"], "mlp", tracemalloc_peak)
    with pytest.raises(AssertionError):
        assert_constant_bookkeeping(peaks)


# --- the check must catch one planted temporary, however small ---------------

def _relu_with_column_temporary(out, x):
    def relu():
        np.maximum(x, 0, out=out)
        out[:, :1] * 1.0                  # one (batch, 1) temporary: 4 bytes at batch 1
    return [(relu, ())]


def _relu_with_broadcast_bias(out, x):
    def relu():
        np.maximum(x, 0, out=out)
        np.add(out, np.float32(0) * out[0], out=out)   # the seed's trap: a broadcast operand
    return [(relu, ())]


@pytest.mark.parametrize("measure", [tracemalloc_peak, memray_peak])
@pytest.mark.parametrize("planted", [_relu_with_column_temporary, _relu_with_broadcast_bias])
def test_one_planted_temporary_fails_the_check(planted, measure, monkeypatch):
    # (memray sees malloc only and NumPy serves buffers under 1 KiB from its own cache:
    # the planted column reaches 1 KiB at MAX_BATCH=256 rows, so memray sees it too.)
    monkeypatch.setitem(ops.OPS, "relu", ops.OpKind(ops.relu_eager, planted, inplace=(0,)))

    class Planted(StaticEngine):
        name = "planted"

    with pytest.raises(AssertionError):
        assert_constant_bookkeeping(stable_peaks(Planted, "mlp", measure))


@pytest.mark.parametrize("engine_name", ZERO_ALLOC)
def test_a_layernorm_of_one_row_allocates_nothing_at_batch_1(engine_name):
    """ConvNeXt's head (global pooling, then a LayerNorm over channels) normalizes one row at batch
    1: its statistic is a one-element array, and a ufunc on one allocates (NumPy 2.4: 0.8-1.1 KiB
    a call, past the suite's 1 KiB limit). Measured as the suite's memory pass measures."""
    onnx = pytest.importorskip("onnx", reason="the importer needs the onnx package (peers extra)")
    from onnx import TensorProto, helper

    from engines import EngineUnavailable, load_onnx
    from mlexec.suite.memory import limit_bytes, measure_peak
    rng = np.random.default_rng(0)
    gamma, beta = (onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n) for n in ("g", "b"))
    graph = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], "ln",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], [gamma, beta])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    try:
        engine = ENGINES[engine_name](model, 4)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    x = model.random_input(1, rng=1)
    np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)
    assert measure_peak(engine, x) <= limit_bytes(engine, 1)

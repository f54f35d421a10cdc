"""Every registered engine against the float64 reference, and what forward promises."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engines import ENGINES, MODELS
from engines.planned import fused
from engines.ir import ops
from conftest import SMALL_MODELS, make_engine
from engines.memory import aligned, aligned_empty
from engines.ir.models import ABS_TOL, REL_TOL
from engines.memory import ALIGNMENT

MAX_BATCH = 6


def assert_matches_reference(model, out, x, engine=None):
    """Within the project's bar, or the looser one an engine states (``Engine.abs_tol``: int8)."""
    ref = model.reference(x)
    assert out.shape == ref.shape and out.dtype == np.float32
    abs_err = float(np.max(np.abs(out - ref)))
    rel_err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    abs_tol, rel_tol = (ABS_TOL, REL_TOL) if engine is None else (engine.abs_tol, engine.rel_tol)
    assert abs_err < abs_tol and rel_err < rel_tol, f"max abs {abs_err:.2e}, rel {rel_err:.2e}"


@pytest.mark.parametrize("model_name", sorted(SMALL_MODELS))
@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_every_batch_matches_reference(engine_name, model_name, small_models, rng):
    model = small_models[model_name]
    engine = make_engine(engine_name, model, MAX_BATCH)
    # Large batches first, so a small batch runs on buffers a larger one already dirtied.
    for batch in range(MAX_BATCH, 0, -1):
        x = model.random_input(batch, rng)
        assert_matches_reference(model, np.array(engine.forward(x)), x, engine)


@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_seed_model_at_full_width(engine_name, rng):
    model = MODELS["mlp"](dim=1024, seed=0)
    engine = make_engine(engine_name, model, 32)
    for batch in (1, 7, 32):
        x = model.random_input(batch, rng)
        assert_matches_reference(model, np.array(engine.forward(x)), x, engine)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, MAX_BATCH),
       scale=st.floats(0.01, 10.0))
def test_planned_engines_match_reference_on_random_inputs(seed, batch, scale):
    model = MODELS["transformer"](dim=32, seq=8, heads=4, seed=seed % 1000)
    x = model.random_input(batch, seed) * np.float32(scale)
    for name in ("static", "arena"):
        assert_matches_reference(model, np.array(ENGINES[name](model, MAX_BATCH).forward(x)), x)


@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_returned_array_contract(engine_name, small_models, rng):
    model = small_models["mlp"]
    engine = make_engine(engine_name, model, 4)
    x1, x2 = model.random_input(2, rng), model.random_input(2, rng)
    y1 = engine.forward(x1)
    kept = np.array(y1)
    y2 = engine.forward(x2)
    if engine.returns_view:
        # A read-only view into engine memory, overwritten by the next call.
        assert not y1.flags.writeable
        with pytest.raises(ValueError):
            y1[0, 0] = 1.0
        assert np.shares_memory(y1, y2)
        np.testing.assert_array_equal(y1, y2)
    else:
        assert not np.shares_memory(y1, y2)
        np.testing.assert_array_equal(y1, kept)
    assert_matches_reference(model, np.array(y2), x2, engine)


def test_engines_report_what_they_hold(small_models):
    model = small_models["transformer"]
    naive, static, arena = (ENGINES[n](model, 4) for n in ("naive", "static", "arena"))
    assert naive.activation_bytes == 0
    assert naive.weight_bytes == model.weight_bytes > 0
    # Pre-tiled biases and gammas make planned engines hold a little more than the raw weights.
    assert static.weight_bytes >= model.weight_bytes and arena.weight_bytes == static.weight_bytes
    report = arena.report()
    assert report["lower_bound_bytes"] <= arena.activation_bytes == report["arena_bytes"] < static.activation_bytes
    assert static.activation_bytes <= report["no_reuse_bytes"]   # the tensors' total, scratch shared


@pytest.mark.parametrize("engine", ["packed", "onednn"])
def test_weights_held_count_the_copies_the_kernels_made(engine):
    """MKL's packs, oneDNN's reordered layouts: held beside the steps' own weights, counted in
    ``weight_bytes`` (as the kernels hold them now) and reported apart."""
    eng = make_engine(engine, MODELS["mlp"](dim=256, seed=0), 64)     # untuned: MKL's packed GEMM
    copies = eng.report()["kernel_copies_bytes"]
    held = sum(a.nbytes for step in eng.steps for a in step.operands if isinstance(a, np.ndarray))
    assert copies > 0 and eng.weight_bytes == held + copies


def test_static_gives_each_tensor_its_own_buffer_and_scratch_one_workspace(small_models):
    static = ENGINES["static"](small_models["transformer"], 4)
    per_op = [op.scratch for op in static._ops if op.scratch]
    scratch = {s for names in per_op for s in names}
    tensors = [t for t in static.sizes if t not in scratch]
    assert len(per_op) >= 3 and tensors

    def span(name):
        start = static._store[name].ctypes.data
        return start, start + static.sizes[name]

    def disjoint(names):
        spans = sorted(span(n) for n in names)
        return all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))

    starts = {span(names[0])[0] for names in per_op}
    assert len(starts) == 1                                                # every op's from one start
    workspace = (starts.pop(), max(span(s)[1] for s in scratch))
    assert disjoint(tensors) and all(end <= workspace[0] or start >= workspace[1]
                                     for start, end in map(span, tensors))
    assert all(disjoint(names) for names in per_op)                        # an op's scratch apart
    used = workspace[1] - workspace[0]
    assert 0 <= static.activation_bytes - sum(static.sizes[t] for t in tensors) - used < 64


def test_arena_kill_switch_gives_every_tensor_its_own_region(small_models, monkeypatch, rng):
    model = small_models["transformer"]
    planned = ENGINES["arena"](model, 4)
    monkeypatch.setenv("MLEXEC_NO_PLANNER", "1")
    unplanned = ENGINES["arena"](model, 4)
    assert unplanned.activation_bytes == planned.plan.no_reuse_bytes > planned.activation_bytes
    x = model.random_input(3, rng)
    np.testing.assert_allclose(unplanned.forward(x), planned.forward(x), rtol=1e-6, atol=1e-6)


# --- bad input: a clear error naming what was expected and what came --------

@pytest.fixture(params=sorted(ENGINES))
def engine(request, small_models):
    return make_engine(request.param, small_models["mlp"], 4)


@pytest.mark.parametrize("make_x, error, message", [
    (lambda: np.zeros((2, 65), np.float32), ValueError, r"shape \(batch, 64\).*got shape \(2, 65\)"),
    (lambda: np.zeros(64, np.float32), ValueError, r"got rank 1"),
    (lambda: np.zeros((2, 1, 64), np.float32), ValueError, r"got rank 3"),
    (lambda: np.zeros((5, 64), np.float32), ValueError, r"1 <= batch <= 4.*got batch 5"),
    (lambda: np.zeros((0, 64), np.float32), ValueError, r"got batch 0"),
    (lambda: np.zeros((2, 64), np.float64), TypeError, r"float32.*got dtype float64"),
    (lambda: np.zeros((2, 64), np.int32), TypeError, r"got dtype int32"),
    (lambda: np.zeros((64, 2), np.float32).T, ValueError, r"non-contiguous"),
    (lambda: np.zeros((4, 64), np.float32)[::2], ValueError, r"non-contiguous"),
    (lambda: [[0.0] * 64], TypeError, r"got list"),
])
def test_bad_input_is_refused_with_a_clear_error(engine, make_x, error, message):
    with pytest.raises(error, match=message):
        engine.forward(make_x())


@pytest.mark.parametrize("engine_name", sorted(ENGINES))
@pytest.mark.parametrize("max_batch", [0, -3, 2.0, True, None])
def test_max_batch_below_one_is_refused(engine_name, max_batch, small_models):
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        ENGINES[engine_name](small_models["mlp"], max_batch)


# --- layout: weights and buffers on cache lines -------------------------------

@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       dtype=st.sampled_from([np.float32, np.float64, np.uint8]))
@settings(max_examples=40, deadline=None)
def test_aligned_arrays_start_on_a_cache_line(shape, dtype):
    a = aligned_empty(tuple(shape), dtype)
    assert a.ctypes.data % ALIGNMENT == 0 and a.flags.c_contiguous
    assert a.shape == tuple(shape) and a.dtype == dtype
    src = np.arange(a.size, dtype=np.float64).reshape(a.shape)
    b = aligned(src)
    assert b.ctypes.data % ALIGNMENT == 0 and b.dtype == np.float32
    np.testing.assert_array_equal(b, src.astype(np.float32))


@pytest.mark.parametrize("engine_name", ["static", "arena", "fused", "packed"])
def test_planned_engines_hold_weights_on_cache_lines(engine_name, small_models):
    # NumPy places arrays only 16-byte aligned; OpenBLAS's small sgemm ran 1.3x slower there.
    engine = make_engine(engine_name, small_models["transformer"], 4)
    held = [a for op in getattr(engine, "_ops", None) or engine.steps for a in op.operands if isinstance(a, np.ndarray)]
    matrices = [a for a in held if a.ndim == 2]
    assert len(matrices) >= 4
    assert all(a.ctypes.data % ALIGNMENT == 0 for a in matrices)


@pytest.mark.parametrize("engine_name", ["static", "arena", "fused", "packed"])
def test_weights_stored_transposed_give_the_same_result(engine_name, small_models, monkeypatch, rng):
    # Every kernel takes weights held (out, in) and used through a transposed view (an earlier
    # layout rule, and docs/kernels.md's candidates); force that layout on a small model and check
    # every path that reads them (gemm, one-row gemv, MKL's pack).
    def transposed(w):
        return ops.aligned(np.transpose(w)).T
    monkeypatch.setattr(ops, "weight_layout", transposed)
    monkeypatch.setattr(fused, "weight_layout", transposed)
    for name in ("mlp", "transformer"):
        model = small_models[name]
        engine = make_engine(engine_name, model, 4)
        weights = [op.operands[0] for op in engine._ops if op.calls is ops.linear_calls] \
            if hasattr(engine, "_ops") else [step.operands[0] for step in engine.steps if step.kind.startswith("linear")]
        assert weights and all(w.flags.f_contiguous and not w.flags.c_contiguous for w in weights)
        for batch in (1, 3, 4):
            x = model.random_input(batch, rng)
            assert_matches_reference(model, np.array(engine.forward(x)), x, engine)


# --- softmax: one shift for the tensor, per-row shifts only where a row lies far below ----------

def _softmax32(x, monkeypatch=None, limit=None, block=None, out=None):
    """``ops.softmax_calls`` run on x (float32), in blocks of ``block`` rows (all by default),
    into ``out`` (a new array by default; x itself: in place)."""
    if limit is not None:
        monkeypatch.setattr(ops, "SOFTMAX_SHIFT_LIMIT", limit)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x) if out is None else out
    tmp, stat = np.empty((block or len(x), x.shape[1]), np.float32), np.empty((len(x), 1), np.float32)
    for fn, args in ops.softmax_calls(y, x if out is None else y, tmp, stat):
        fn(*args)
    return y


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 40), width=st.integers(1, 150),
       spread=st.floats(0.0, 200.0), offset=st.floats(-1e4, 1e4), block=st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_softmax_matches_the_reference_whatever_the_rows_spread(seed, rows, width, spread, offset, block):
    # Rows up to 200 apart (past the shift limit, so some take the per-row path) and far from 0,
    # in blocks of any number of rows (the last one short).
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, width)) * 3 + rng.uniform(-spread, 0, (rows, 1)) + offset).astype(np.float32)
    np.testing.assert_allclose(_softmax32(x, block=min(block, rows)), ops.softmax_eager(x.astype(np.float64)),
                               atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("doubled", [False, True])
def test_tanh_gelu_in_blocks_of_rows_in_place_or_not(in_place, doubled, rng):
    """The tanh GELU's passes run per block of its scratch's rows (3 of 10, the last short), each
    block's output written last: the same values into a new array or over the input."""
    x = (rng.standard_normal((10, 7)) * 3).astype(np.float32)
    ref = ops.gelu_eager(x.astype(np.float64)) * (2 if doubled else 1)
    out = x.copy() if in_place else np.empty_like(x)
    for fn, args in ops.gelu_calls(out, out if in_place else x, np.empty((3, 7), np.float32), doubled=doubled):
        fn(*args)
    np.testing.assert_allclose(out, ref, atol=1e-6, rtol=1e-5)
    assert ops.OPS["gelu"].inplace == (0,) and ops.gelu_scratch([(64, 1024)]) == ((64, 1024),)


def test_softmax_scratch_is_one_block_of_rows():
    """The shifted input's scratch: at most SOFTMAX_BLOCK values a sample (one row at least), not
    the input's size (ViT-B/16's 12 x 197 x 197 scores: 1.86 MB)."""
    tmp, stat = ops.softmax_scratch([(12, 197, 197)])
    assert tmp == (ops.SOFTMAX_BLOCK // 197, 197) and stat == (12, 197, 1)
    assert ops.softmax_scratch([(3, 5)]) == ((3, 5), (3, 1))                     # small: all rows
    assert ops.softmax_scratch([(4, 2 * ops.SOFTMAX_BLOCK)])[0] == (1, 2 * ops.SOFTMAX_BLOCK)


def test_softmax_row_far_below_the_peak_takes_the_per_row_shift(monkeypatch, rng):
    x = rng.standard_normal((6, 32)).astype(np.float32)
    x[2] -= 150                              # this row would underflow under the tensor's shift
    ref = ops.softmax_eager(x.astype(np.float64))
    np.testing.assert_allclose(_softmax32(x), ref, atol=1e-6)
    # Without the fallback (limit out of reach) the row underflows: the check is what saves it.
    with np.errstate(divide="ignore", invalid="ignore"):
        broken = _softmax32(x, monkeypatch, limit=1e9)
    assert not np.allclose(broken[2], ref[2], atol=1e-3)
    np.testing.assert_allclose(np.delete(broken, 2, 0), np.delete(ref, 2, 0), atol=1e-6)


def test_softmax_in_place_with_a_row_far_below_the_peak(rng):
    # arena runs softmax in place (y is x): the per-row redo must not read the overwritten input
    # (ONNX's test_softmax_large_number: rows [0, 1, 2, 3] and [10000, ..., 10003]).
    # In blocks of one row, the peak (kept in the last row's statistic) is also that block's own.
    x = np.array([[0, 1, 2, 3], [10000, 10001, 10002, 10003]], np.float32)
    ref = ops.softmax_eager(x.astype(np.float64))
    for block in (1, 2):
        y = x.copy()
        np.testing.assert_allclose(_softmax32(y, block=block, out=y), ref, atol=1e-6)


def test_softmax_propagates_nan_to_its_row_only(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    x[1, 3] = np.nan
    y = _softmax32(x)
    assert np.isnan(y[1]).all() and np.isfinite(np.delete(y, 1, 0)).all()

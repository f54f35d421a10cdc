"""fused and packed (fused on MKL-packed weights): correct against float64 on every model and batch,
allocation-free, returning a read-only view."""
import gc
import tracemalloc

import numpy as np
import pytest

from engines import ENGINES, MODELS, EngineUnavailable
from engines.ir import ops
from engines.ir.models import ABS_TOL, REL_TOL

MAX_BATCH = 9
CASES = {
    "mlp": dict(dim=64),
    "mlp-wide": dict(dim=48, hidden=96, out_dim=24),
    "mlp-deep": dict(dim=64),
    "transformer": dict(dim=64, seq=16),
}


def model_of(case):
    return MODELS["mlp" if case == "mlp-wide" else case](**CASES[case], seed=3)


@pytest.fixture(params=["fused", "packed"])
def fused(request):
    """Builds the engine under test; skipped, with the reason, when its optional packages are absent."""
    def build(model, max_batch=MAX_BATCH):
        try:
            return ENGINES[request.param](model, max_batch)
        except EngineUnavailable as exc:
            pytest.skip(f"{request.param} unavailable: {exc}")
    return build


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference_every_batch(case, fused):
    model = model_of(case)
    eng = fused(model)
    for batch in range(1, MAX_BATCH + 1):
        x = model.random_input(batch, rng=batch)
        y = eng.forward(x)
        ref = model.reference(x)
        assert y.shape == ref.shape
        assert np.abs(y - ref).max() < ABS_TOL, batch
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < REL_TOL, batch


def test_every_linear_path_matches_reference(fused):
    """sgemv (one row), sgemm with the bias fused (small work), matmul + tiled bias (large work)."""
    model = MODELS["mlp"](dim=128, seed=4)
    eng = fused(model, max_batch=200)
    boundary = eng.blas_max_work // (128 * 128)
    for batch in (1, 2, boundary, boundary + 1, 200):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(eng.forward(x), model.reference(x), atol=ABS_TOL, rtol=0)
    eng.blas_max_work = 0                         # every linear on NumPy's matmul, one row included
    eng._bound.clear()
    x = model.random_input(1, rng=0)
    np.testing.assert_allclose(eng.forward(x), model.reference(x), atol=ABS_TOL, rtol=0)


def test_returns_read_only_view_overwritten_by_next_call(fused):
    model = model_of("mlp")
    eng = fused(model)
    assert eng.returns_view and eng.zero_alloc
    a = eng.forward(model.random_input(2, rng=0)).copy()
    y = eng.forward(model.random_input(2, rng=0))
    assert not y.flags.writeable and not y.flags.owndata
    with pytest.raises(ValueError):
        y[...] = 0
    np.testing.assert_array_equal(a, y)
    z = eng.forward(model.random_input(2, rng=1))
    assert np.shares_memory(y, z)                 # the same engine memory, rewritten


def test_input_checks_match_base(fused):
    model = model_of("mlp")
    eng = fused(model)
    x = model.random_input(3, rng=0)
    with pytest.raises(TypeError):
        eng.forward(x.astype(np.float64))
    with pytest.raises(TypeError):
        eng.forward(x.tolist())
    with pytest.raises(ValueError):
        eng.forward(model.random_input(MAX_BATCH + 1))
    with pytest.raises(ValueError):
        eng.forward(np.asfortranarray(model.random_input(3)[:, :8].repeat(8, axis=1)))
    with pytest.raises(ValueError):
        eng.forward(x[None])
    with pytest.raises(ValueError):
        eng.forward(x[:0])


def forward_peak(eng, x, calls=5) -> int:
    """The smallest tracemalloc peak of a forward over a few calls (a lone call can catch
    the interpreter refilling a free list, which is not the forward's allocation)."""
    eng.forward(x)
    eng.forward(x)                                # two warm-ups: bind, and first-call caches
    gc.collect()
    tracemalloc.start()
    try:
        peaks = []
        for _ in range(calls):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            eng.forward(x)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
        return min(peaks)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("case", ["mlp", "mlp-deep", "transformer"])
def test_forward_allocates_nothing(case, fused):
    model = MODELS[case](**CASES[case], seed=3)
    eng = fused(model, max_batch=64)
    small = forward_peak(eng, model.random_input(1, rng=0))
    large = forward_peak(eng, model.random_input(64, rng=0))
    assert small <= 4096 and large <= 4096, (small, large)
    assert abs(small - large) <= 256, (small, large)


def test_buffers_share_an_arena_only_across_disjoint_lifetimes(fused):
    eng = fused(model_of("transformer"))
    spans = {t: (a.ctypes.data, a.ctypes.data + a.nbytes) for t, a in eng._buffers.items()}
    life = eng.plan.lifetimes
    for t, u in ((t, u) for t in spans for u in spans if t < u):
        if life[t][0] <= life[u][1] and life[u][0] <= life[t][1]:     # alive at one step together
            assert spans[t][1] <= spans[u][0] or spans[u][1] <= spans[t][0], (t, u)
    assert eng.plan.lower_bound_bytes <= eng.activation_bytes < eng.plan.no_reuse_bytes


def test_kill_switch_gives_every_buffer_its_own_region(fused, monkeypatch, rng):
    model = model_of("transformer")
    planned = fused(model)
    monkeypatch.setenv("MLEXEC_NO_PLANNER", "1")
    unplanned = fused(model)
    assert unplanned.activation_bytes == planned.plan.no_reuse_bytes > planned.activation_bytes
    x = model.random_input(MAX_BATCH, rng)
    np.testing.assert_allclose(unplanned.forward(x), planned.forward(x), rtol=1e-6, atol=1e-6)


def test_folds_keep_model_untouched(fused):
    model = model_of("transformer")
    before = {k: v.copy() for k, v in model.params.items()}
    fused(model)
    for k, v in model.params.items():
        np.testing.assert_array_equal(v, before[k])


def test_large_inputs_no_overflow_warning(fused):
    """Wide activations reach gelu's far tails; the in-place gelu must neither overflow nor warn."""
    model = model_of("transformer")
    eng = fused(model)
    x = model.random_input(2, rng=5) * np.float32(300)
    with np.errstate(all="raise"):
        y = eng.forward(x)
    ref = model.reference(x)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < REL_TOL


def test_unfusable_ops_fall_back_to_their_kernels(fused):
    """Attention over a relu'd qkv, a layernorm read twice, a gelu not read by a linear:
    no fold applies, each op runs its own kernel, and the answer is unchanged."""
    from engines import Model, Op

    rng = np.random.default_rng(7)
    seq, dim, heads = 8, 16, 2
    params = {
        "ln.g": 1 + 0.1 * rng.standard_normal(dim, dtype=np.float32),
        "ln.b": 0.1 * rng.standard_normal(dim, dtype=np.float32),
        "qkv.w": rng.standard_normal((dim, 3 * dim), dtype=np.float32) / np.float32(4),
        "qkv.b": 0.1 * rng.standard_normal(3 * dim, dtype=np.float32),
    }
    ops = (
        Op("layernorm", ("x",), "ln", ("ln.g", "ln.b"), {"eps": 1e-5}),
        Op("linear", ("ln",), "qkv", ("qkv.w", "qkv.b")),
        Op("relu", ("qkv",), "qkv_r"),
        Op("attn_scores", ("qkv_r",), "scores", (), {"heads": heads}),
        Op("softmax", ("scores",), "probs"),
        Op("attn_context", ("probs", "qkv_r"), "ctx", (), {"heads": heads}),
        Op("add", ("ctx", "ln"), "res"),
        Op("gelu", ("res",), "out"),
    )
    shapes = {"x": (seq, dim), "ln": (seq, dim), "qkv": (seq, 3 * dim), "qkv_r": (seq, 3 * dim),
              "scores": (heads, seq, seq), "probs": (heads, seq, seq), "ctx": (seq, dim),
              "res": (seq, dim), "out": (seq, dim)}
    model = Model("odd", ops, shapes, params)
    eng = fused(model, max_batch=3)
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch)
        ref = model.reference(x)
        y = eng.forward(x)
        assert np.abs(y - ref).max() < ABS_TOL
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < REL_TOL


def test_a_reshape_read_alone_copies_nothing(fused):
    """A reshape is its input's buffer read in another shape where nothing else reads that input;
    where something does, it stays a copy (a later in-place write must not reach the other reader)."""
    from engines import Model, Op

    graph = (Op("relu", ("x",), "r"),
           Op("reshape", ("r",), "flat", (), {"shape": (24,)}),        # r is read again below: a copy
           Op("reshape", ("flat",), "back", (), {"shape": (4, 6)}),     # flat is read here alone: no copy
           Op("add", ("back", "r"), "out"))
    model = Model("views", graph, {"x": (4, 6), "r": (4, 6), "flat": (24,), "back": (4, 6), "out": (4, 6)}, {})
    eng = fused(model, max_batch=3)
    copies = [s.out for s in eng.steps if s.kind == "calls" and s.operands[0] is ops.reshape_calls]
    assert copies == ["flat"] and eng.aliases == {"back": "flat"}, (copies, eng.aliases)
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_array_equal(eng.forward(x), model.reference(x).astype(np.float32))


def test_packed_weights_match_reference():
    """packed: every linear packed once; right for row counts on both sides of the small-work
    boundary (sgemv, SciPy sgemm, the packed gemm), layernorm folds and residual adds included."""
    try:
        model = model_of("transformer")
        eng = ENGINES["packed"](model, max_batch=MAX_BATCH)
    except EngineUnavailable as exc:
        pytest.skip(f"packed unavailable: {exc}")
    linears = [s for s in eng.steps if s.kind.startswith("linear")]
    packs = [key for key in eng.linears.states if key[0] == "mkl"]        # tests run untuned: MKL's packs
    assert len(packs) == len(linears) == sum(op.kind == "linear" for op in model.ops)
    calls = eng.bind(MAX_BATCH)[1]
    fns = [fn for fn, _ in calls]
    row_sums = [f for fn, args in calls if fn is ops.softmax_rows for f, _ in args[-1]]   # bound matvecs
    assert fns.count(eng._mkl.sgemm_compute) == len(linears)   # 144 rows: every linear on its packed weights
    heads = next(op.attrs["heads"] for op in model.ops if op.kind == "attn_context")
    assert fns.count(eng._mkl.sgemm_batch_strided) == MAX_BATCH          # scores: a batch over heads per sample
    assert fns.count(eng._mkl.sgemm) == MAX_BATCH * heads                # context: a gemm per head
    standardized = sum(step.kind == "standardize" for step in eng.steps)
    softmaxes = sum(step.kind == "softmax" for step in eng.steps)
    assert standardized and softmaxes
    # layernorm's row means and variances, softmax's row sums: none on NumPy's BLAS
    assert fns.count(eng._mkl.sgemv) == 2 * standardized
    assert row_sums and all(f is eng._mkl.sgemv for f in row_sums)   # one per block of rows
    assert np.matmul not in fns + row_sums
    for batch in (1, 2, MAX_BATCH):                # rows = batch * 16
        x = model.random_input(batch, rng=batch)
        y, ref = eng.forward(x), model.reference(x)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < REL_TOL, batch


def test_a_generic_op_runs_in_its_inputs_buffer_where_nothing_else_reads_it():
    """fused runs an op whose kind may overwrite an input (``OpKind.inplace``) in that input's
    buffer, as the planner joins them for arena, where no later op reads the input: the negation
    of a tensor the sum reads again gets a buffer of its own, the sum writes over the negation."""
    from engines.ir.models import Model, Op
    ops_ = (Op("tanh", ("x",), "a"), Op("neg", ("a",), "b"), Op("add", ("b", "a"), "y"))
    model = Model("in-place", ops_, {t: (5, 24) for t in ("x", "a", "b", "y")}, {})
    engine = ENGINES["fused"](model, 3)
    outs = [step.out for step in engine.steps]
    assert outs[1] != outs[0] and outs[2] == outs[1], outs
    assert engine.plan.arena_bytes == ENGINES["arena"](model, 3).plan.arena_bytes
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-6, atol=1e-6)


def test_attention_runs_over_blocks_of_heads_where_that_holds_fewer_bytes(monkeypatch):
    """Scores of 8 heads x 128 x 128 (twice ATTENTION_HEAD_BLOCK a sample): the scores, the softmax
    and the context as one step over blocks of 4 heads, the scores never written whole; right at
    every batch, allocating nothing; the arena smaller than with the three steps."""
    from engines.planned import fused
    from tests.test_zero_alloc import tracemalloc_peak
    model = MODELS["transformer"](dim=64, seq=128, heads=8, seed=3)
    engine = ENGINES["fused"](model, 3)
    assert [s.attrs["block"] for s in engine.steps if s.kind == "attn_heads"] == [4]
    assert not any(s.kind in ("attn_scores", "softmax", "attn_context") for s in engine.steps)
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch)
        y, ref = engine.forward(x), model.reference(x)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < REL_TOL, batch
        assert tracemalloc_peak(engine, x) <= 4096
    monkeypatch.setattr(fused, "ATTENTION_HEAD_BLOCK", 8 * 128 * 128)          # all heads in one block
    whole = ENGINES["fused"](model, 3)
    assert not any(s.kind == "attn_heads" for s in whole.steps)
    assert engine.plan.arena_bytes < whole.plan.arena_bytes

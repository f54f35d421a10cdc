"""The int8 engine: its stated tolerance on fresh inputs, weights quantized per output channel and
held as one byte each, activations per row, the integer kernel really run, and how it refuses
without oneDNN. Allocation per forward is checked with every zero-alloc engine
(tests/test_zero_alloc.py); agreement on the small models with every engine (tests/test_engines.py)."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import ROOT, make_engine, subprocess_env
from engines import ENGINES, MODELS, EngineUnavailable
from engines.native.onednn_int8 import quantize_columns
from engines.planned.int8 import LEVELS, Int8Engine, shifted, weight_levels

# The zoo at the benchmark grid's sizes (and one deeper): the figures docs/int8.md derives the
# tolerance from, checked on inputs of seeds the derivation did not use
POINTS = [("mlp", dict(dim=1024)), ("mlp-deep", dict(dim=256)), ("transformer", dict(dim=256, seq=64, heads=8))]


def _errors(engine, model, x):
    y, ref = np.array(engine.forward(x), dtype=np.float64), model.reference(x)
    return float(np.max(np.abs(y - ref))), float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("name, kwargs", POINTS)
def test_within_its_stated_tolerance_on_fresh_inputs(name, kwargs):
    model = MODELS[name](**kwargs, seed=7)
    engine = make_engine("int8", model, 16)
    for batch, seed in ((16, 1001), (3, 1002), (1, 1003)):
        abs_err, rel_err = _errors(engine, model, model.random_input(batch, np.random.default_rng(seed)))
        assert abs_err < engine.abs_tol and rel_err < engine.rel_tol, (batch, abs_err, rel_err)
        # and it is int8's error, not a float engine's: far above the float bar
        assert rel_err > 10 * ENGINES["onednn"].rel_tol


def test_tolerance_is_its_own_and_looser_than_the_float_bar():
    assert Int8Engine.abs_tol > ENGINES["onednn"].abs_tol and Int8Engine.rel_tol > ENGINES["onednn"].rel_tol
    assert Int8Engine.abs_tol <= 0.25 and Int8Engine.rel_tol <= 0.05      # a bar, not a pass for anything


def test_weights_quantized_per_output_channel_and_held_as_one_byte():
    model = MODELS["mlp"](dim=256, seed=3)
    engine = make_engine("int8", model, 4)
    w = model.params["fc1.w"]                       # fc1 reads the input: nothing folded into it
    first = engine.quantized_linears[0]
    levels = weight_levels(None, shifted(None, unsigned=False))    # 64 beside a shifted source (AVX2 alone)
    np.testing.assert_allclose(first.scales, np.abs(w).max(axis=0) / levels, rtol=1e-6)
    q, scales = quantize_columns(w, LEVELS)
    assert q.dtype == np.int8 and np.abs(q).max(axis=0).min() == LEVELS      # every column uses its range
    assert np.max(np.abs(q * scales.astype(np.float64) - w)) <= scales.max() / 2 * (1 + 1e-6)
    for linear in engine.quantized_linears:
        assert linear.weights.plain is None                    # the plain copy was dropped
        assert [a.dtype for _, a, _ in linear.weights.layouts] == [np.int8]
    floats = make_engine("onednn", model, 4).weight_bytes
    assert engine.weight_bytes < floats / 4 + 8 * 2 * 256 + 4096     # a quarter, plus scales and biases


def test_a_column_of_large_weights_leaves_the_others_exact():
    """Per channel, not per tensor: one column 1000x the others does not coarsen their steps."""
    model = MODELS["mlp"](dim=64, seed=5)
    model.params["fc2.w"][:, 0] *= 1000.0
    engine = make_engine("int8", model, 2)
    x = model.random_input(2, 0)
    y, ref = np.array(engine.forward(x)), model.reference(x)
    others = np.abs(y[:, 1:] - ref[:, 1:]).max()
    assert others < engine.abs_tol
    assert others < 1e-3 * np.abs(ref[:, 0]).max()


def test_a_row_does_not_depend_on_the_rest_of_the_batch():
    """Activation scales per row: a sample's result is the same alone or beside a sample 100x larger."""
    model = MODELS["transformer"](dim=32, seq=8, heads=4, seed=2)
    engine = make_engine("int8", model, 2)
    x = model.random_input(2, 0)
    x[1] *= 100.0
    both = np.array(engine.forward(x))
    alone = np.array(engine.forward(np.ascontiguousarray(x[:1])))
    np.testing.assert_array_equal(both[:1], alone)


def test_building_it_warns_of_nothing(monkeypatch, tmp_path):
    """Its kernel and thread trials time whole forwards before any forward of the caller's: each on
    a fresh seeded input (the plan reuses the input's buffer), not on what the last one left."""
    from engines import kernels
    monkeypatch.setenv(kernels.TUNE_ENV, "1")               # the trials run: nothing cached or remembered
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernels.choice, "_MEMO", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_engine("int8", MODELS["transformer"](dim=16, seq=4, heads=2), 256)


def test_relu_outputs_are_quantized_unsigned():
    model = MODELS["mlp-deep"](dim=48, layers=3)
    engine = make_engine("int8", model, 2)
    linears = [s for s in engine.steps if s.kind == "int8_linear"]
    assert [s.attrs["unsigned"] for s in linears] == [False, True, True]


def test_a_small_s8_input_is_scaled_by_its_largest_magnitude_to_the_same_result(monkeypatch):
    """Up to MAGNITUDE_MAX values the scale is max |x| from one reduction of |x|, above it
    max(max x, -min x) from two: the same scales, so the same integers and outputs."""
    model = MODELS["mlp"](dim=256, seed=4)
    x = model.random_input(8, 11)

    def scale_reductions(engine):
        first = next(s for s in engine.steps if s.kind == "int8_linear")
        engine.bind(8)
        return first, [p for p in engine.report()["primitives"] if p["kind"] == "int8_scale" and p["step"] == first.out]

    small = make_engine("int8", model, 8)
    first, reductions = scale_reductions(small)
    assert not first.attrs["unsigned"] and small.shapes[first.scratch[1]] == (256,)     # room for |x|
    assert np.absolute in [fn for fn, _ in small.bind(8).calls] and len(reductions) == 1
    monkeypatch.setattr("engines.planned.int8.MAGNITUDE_MAX", 0)
    large = make_engine("int8", model, 8)
    first, reductions = scale_reductions(large)
    assert large.shapes[first.scratch[1]] == (1,) and len(reductions) == 2
    np.testing.assert_array_equal(np.array(small.forward(x)), np.array(large.forward(x)))


def test_an_all_zero_row_quantizes_to_zero():
    """An all-zero row (a padding token's) gives a finite output within the bar of the float64
    reference, and leaves the other row as it is alone: equal up to the order of rounding of
    the scales (one row's product takes its scale inside the primitive where the CPU has no
    int8 dot products, ``_conv_takes_all``)."""
    model = MODELS["mlp"](dim=256, seed=4)
    engine = make_engine("int8", model, 2)
    x = model.random_input(2, 3)
    x[0] = 0.0
    out = np.array(engine.forward(x))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], model.reference(x[:1])[0], atol=engine.abs_tol)
    alone = np.array(engine.forward(np.ascontiguousarray(x[1:])))
    np.testing.assert_allclose(out[1:], alone, rtol=0, atol=1e-5 * np.abs(alone).max())


@pytest.mark.parametrize("name, kwargs", [("mlp", dict(dim=256)), ("transformer", dict(dim=32, seq=8, heads=4))])
def test_every_linear_is_an_integer_primitive_and_no_reference_code(name, kwargs):
    model = MODELS[name](**kwargs)
    engine = make_engine("int8", model, 4)
    primitives = engine.report()["primitives"]
    linears = [p for p in primitives if p["kind"] == "int8_linear"]
    assert len(linears) == sum(op.kind == "linear" for op in model.ops)
    quantizing = [p for p in primitives if p["kind"] in ("int8_linear", "int8_scale", "int8_quantize")]
    assert not any(p["implementation"].startswith("ref") for p in quantizing), quantizing


def test_the_report_lists_each_linear_once_per_batch_bound():
    """Each batch bound adds its primitives once, under its own batch, though the int8 products
    run on views whose leading axis is 1; binding a batch again replaces its entries."""
    model = MODELS["mlp"](dim=64)
    engine = make_engine("int8", model, 4)
    for batch in (1, 4, 4, 1):
        engine.forward(model.random_input(batch, 0))
    linears = sum(op.kind == "linear" for op in model.ops)
    products = [p["batch"] for p in engine.report()["primitives"] if p["kind"] == "int8_linear"]
    assert sorted(products) == [1] * linears + [4] * linears


@pytest.mark.parametrize("isa", [None, "AVX2"])
def test_onednn_runs_s8_weights_and_8_bit_activations(isa):
    """oneDNN's own log of the products a forward runs: 8-bit sources and weights, f32 out, none
    in float. ``ONEDNN_MAX_CPU_ISA=AVX2`` makes any x86 CPU one without int8 dot products, where
    the linears run as 1x1 int8 convolutions (``ConvForm``) and a signed input as u8 levels around
    a zero point (``shifted``); elsewhere they are matmuls."""
    make_engine("int8", MODELS["mlp"](dim=16), 1)             # skips without oneDNN
    code = ("from engines import ENGINES, MODELS\n"
            "m = MODELS['mlp'](dim=256)\n"
            "e = ENGINES['int8'](m, 4)\n"
            "e.forward(m.random_input(4, 0))\n"
            "print('float products:', e.report()['float_products'])\n"
            "from engines.planned.int8 import saturating\n"
            "print('saturating:', saturating())\n")
    env = {**subprocess_env(), "ONEDNN_VERBOSE": "1", **({"ONEDNN_MAX_CPU_ISA": isa} if isa else {})}
    log = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    products = [line for line in log.splitlines()
                if line.startswith(("onednn_verbose,exec,cpu,matmul", "onednn_verbose,exec,cpu,convolution"))]
    assert products and all("wei_s8" in line and "dst_f32" in line for line in products)
    assert "float products: []" in log
    if "saturating: True" in log:       # fc1 u8 around zero point 128, its weights not halved; fc2 u8
        assert all("src_u8" in line and "sa0.5" not in line for line in products), products
        assert {("attr-zero-points:src0" in line) for line in products} == {True, False}, products
    else:
        assert {("src_u8" in line) for line in products} == {True, False}      # fc1 s8, fc2 (after ReLU) u8
    if isa:
        assert all(",convolution," in line and "jit_uni_int8" in line for line in products), products


def test_without_onednn_it_says_which_extra(no_onednn):
    with pytest.raises(EngineUnavailable, match=r"int8.*pip install -e \.\[onednn\]"):
        ENGINES["int8"](MODELS["mlp"](dim=16), 1)


def test_it_is_checked_for_allocation_with_the_planned_engines():
    from test_zero_alloc import ZERO_ALLOC
    assert "int8" in ZERO_ALLOC and ENGINES["int8"].returns_view


@pytest.mark.parametrize("implementation", ["brg:avx512_core_amx", "brg:avx512_core_vnni"])
@pytest.mark.parametrize("one_thread", [False, True])
def test_every_variant_gives_the_same_result(implementation, one_thread):
    """AMX and VNNI, pool or one thread: the s32 sums are exact, so the outputs agree to rounding."""
    from engines.planned.int8 import Variant
    model = MODELS["transformer"](dim=32, seq=8, heads=4, seed=4)
    x = model.random_input(3, 0)
    expected = np.array(make_engine("int8", model, 3).forward(x))
    forced = type("Forced", (Int8Engine,), {"forced_variant": Variant(implementation, one_thread)})
    try:
        engine = forced(model, 3)
    except ValueError as exc:              # this CPU has no such kernel
        pytest.skip(str(exc))
    np.testing.assert_allclose(engine.forward(x), expected, rtol=1e-5, atol=1e-5)
    matmuls = {p["implementation"] for p in engine.report()["primitives"] if p["kind"] == "int8_linear"}
    assert matmuls == {implementation}


def _vnni_or_skip():
    from engines.native.onednn import library
    from engines.planned.int8 import saturating
    if saturating():
        pytest.skip("no int8 dot products on this CPU: its linears are 1x1 convolutions (ConvForm)")
    return library()


@pytest.mark.parametrize("one_thread", [False, True])
def test_one_row_runs_on_the_inner_product_too_with_the_same_result(one_thread):
    """At one row (one source scale) the inner product's kernels are offered beside the matmul's
    and give the same sums; at several rows with row scales they are not offered (a per-row
    operand on its 2-D output would run oneDNN's reference code)."""
    from engines.planned.int8 import INNER_PRODUCT, Variant
    _vnni_or_skip()
    model = MODELS["mlp"](dim=64, seed=5)
    x = model.random_input(1, 11)
    expected = np.array(make_engine("int8", model, 1).forward(x))
    name = "brgemm:avx512_core_vnni"
    forced = type("Forced", (Int8Engine,), {"forced_variant": Variant(name, one_thread)})
    engine = forced(model, 1)
    np.testing.assert_allclose(engine.forward(x), expected, rtol=1e-5, atol=1e-5)
    assert {p["implementation"] for p in engine.report()["primitives"] if p["kind"] == "int8_linear"} == {name}
    offered = {tuple(m["candidates_us"]) for m in make_engine("int8", model, 1).report()["int8_matmuls"]
               if m["how"] != "default"}
    assert all(set(names) & set(INNER_PRODUCT) for names in offered), offered
    rows = make_engine("int8", model, 3)
    rows.forward(model.random_input(3, 12))
    assert not any(set(m["candidates_us"]) & set(INNER_PRODUCT) for m in rows.report()["int8_matmuls"])


def test_a_layout_of_the_same_bytes_is_held_once():
    """A u8 source's matmul and inner product block one weight matrix alike: one array holds both."""
    from engines.native.onednn import ANY
    from engines.native.onednn_int8 import QuantizedWeights, TypedOwned, implementation
    from engines.planned.int8 import _one
    dnnl = _vnni_or_skip()
    o, k, n = TypedOwned(dnnl), 256, 128
    plain = np.random.default_rng(0).integers(-127, 128, (1, k, n), dtype=np.int8)
    weights = QuantizedWeights(dnnl, plain.copy())
    x, y = np.zeros((1, k), np.uint8), np.zeros((1, n), np.float32)
    matmul = o.matmul_pd(o.strided(_one(x)), o.typed((1, k, n), ANY, np.int8), None, o.strided(_one(y)), o.attr())
    inner = o.inner_product_pd(o.strided(x), o.typed((n, k), ANY, np.int8), None, o.strided(y), o.attr())
    assert implementation(dnnl, matmul).startswith("brg") and implementation(dnnl, inner).startswith("brgemm")
    _, first = weights.take(matmul)
    _, second = weights.take(inner, view=lambda p: p.reshape(k, n).T)
    assert second is first and len(weights.layouts) == 2
    weights.settle()
    assert weights.nbytes == first.nbytes
    np.testing.assert_array_equal(weights.values(), plain)


def test_a_one_row_quantize_runs_outside_the_one_thread_wrapper(monkeypatch):
    """Made on one thread, of one row oneDNN's reduction and reorder run on the calling thread
    anyway: no wrapper (its pool calls cost more than the quantize); of more rows they stay on one
    thread in it."""
    from engines.kernels.table import _LIBS, _one_thread, pool_threads
    from engines.planned import int8
    _vnni_or_skip()
    model = MODELS["mlp"](dim=64, seed=5)
    pooled = type("Pooled", (Int8Engine,), {"forced_variant": int8.Variant("brg:avx512_core_vnni", False)})

    before = pool_threads("openmp-threads")       # (loads the pool's setter)
    set_threads = _LIBS["openmp-threads"][0]
    set_threads(2)                                # a pool of two, whatever the cores here
    monkeypatch.setattr(int8, "pool_threads", lambda pool: 2)
    made_on = []                                  # the pool's threads as each quantize primitive was made
    execute = pooled.execute
    monkeypatch.setattr(pooled, "execute", lambda self, pd, args, step: (
        step.kind in ("int8_quantize", "int8_scale") and made_on.append(pool_threads("openmp-threads")),
        execute(self, pd, args, step))[1])

    def wrapped(batch):
        engine = pooled(model, batch)
        engine.forward(model.random_input(batch, 13))
        return sum(fn is _one_thread for fn, _ in engine._bound[batch].calls)
    try:
        assert wrapped(1) == 0 and wrapped(3) == 2
    finally:
        set_threads(before)
    assert made_on and set(made_on) == {1}        # made on the pool, a one-row reorder split itself over it


def test_the_variants_are_measured_once_per_machine_and_then_read_from_the_kernel_cache(monkeypatch, tmp_path):
    """A second build, as a new process would make it, reads every matmul's variant from the
    kernel cache (``kernels.cached_or_measured``) and measures nothing; before, each process
    measured them again, and on a busy 2-core host chose differently from run to run."""
    from engines import kernels
    from engines.planned import int8
    monkeypatch.setattr(kernels.timing, "waiting_seconds", lambda: 0.0)     # idle, as the busy check sees it
    monkeypatch.setattr(kernels.timing, "others_cpu_seconds", lambda: 0.0)
    monkeypatch.setenv(kernels.TUNE_ENV, "1")
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernels.choice, "_MEMO", {})
    model = MODELS["mlp"](dim=64, seed=2)
    first = make_engine("int8", model, 2).report()["int8_matmuls"]
    assert first and all(m["how"] == "measured" and len(m["candidates_us"]) >= 2 for m in first), first
    (path,) = tmp_path.glob("kernels-*.json")
    assert sum(entry.startswith("int8|") for entry in kernels.cache.read(path)) == len(first)
    monkeypatch.setattr(kernels.choice, "_MEMO", {})                      # as a new process would
    monkeypatch.setattr(int8, "measure_forwards", lambda *a, **k: pytest.fail("measured again"))
    again = make_engine("int8", model, 2).report()["int8_matmuls"]
    assert [(m["gemm"], m["variant"], m["how"]) for m in again] == [(m["gemm"], m["variant"], "cached") for m in first]


@pytest.mark.parametrize("pool_over_one_thread, how", [(1.03, "measured on one core (the pool ran 0.97x"),
                                                       (0.6, "measured")])
def test_variants_timed_without_the_pools_second_core_run_the_pool_and_are_not_cached(
        monkeypatch, tmp_path, pool_over_one_thread, how):
    """A 2-core AMD EPYC host's second core comes and goes for seconds: an empty cache timed the
    pool at 1 x 1024 x 1024 within 4 % of one thread, one thread was cached, and every later fast
    phase ran it 1.75x as long as the pool. With the pool 3 % behind its one-thread twin the pool
    runs, said so, and the next build measures again; with the pool ahead, as before."""
    from engines import kernels
    from engines.planned import int8
    monkeypatch.setattr(kernels.timing, "waiting_seconds", lambda: 0.0)     # idle, as the busy check sees it
    monkeypatch.setattr(kernels.timing, "others_cpu_seconds", lambda: 0.0)
    monkeypatch.setenv(kernels.TUNE_ENV, "1")
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernels.choice, "_MEMO", {})
    monkeypatch.setattr(int8, "LONE_CORE_WORK", 2 * 64 * 64)               # the mlp's 2 x 64 x 64
    monkeypatch.setattr(int8, "measure_forwards", lambda variants, *a, **k: {
        name: 1e-5 if name.endswith("-1t") else pool_over_one_thread * 1e-5 for name in variants})
    matmuls = make_engine("int8", MODELS["mlp"](dim=64, seed=2), 2).report()["int8_matmuls"]
    assert matmuls and all(not m["variant"].endswith("-1t") and m["how"].startswith(how) for m in matmuls), matmuls
    cached = kernels.cache.read(kernels.cache_path())
    assert sum(entry.startswith("int8|") for entry in cached) == (0 if pool_over_one_thread > 1 else len(matmuls))


@pytest.mark.parametrize("avx512", [False, True])
def test_a_gelu_after_a_linear_is_a_pass_of_its_own_without_avx512(monkeypatch, avx512):
    """The transformer's GELU (tanh form) follows its first MLP linear. Without AVX-512 it is a
    step of its own, ``onednn``'s x * x pass (``_gelu_tanh_calls``: oneDNN 3.2's own gelu_tanh as
    the product's post-op ran 15x slower on AVX2); with it, the product's post-op: right either
    way, at every batch, allocating nothing."""
    from engines.planned import int8, onednn
    from tests.test_zero_alloc import tracemalloc_peak
    made, real = [], onednn._gelu_tanh_calls
    monkeypatch.setattr(onednn, "avx512", lambda dnnl: avx512)
    monkeypatch.setattr(onednn, "_gelu_tanh_calls", lambda *a: made.append(a[1].out) or real(*a))
    model = MODELS["transformer"](dim=64, seq=8, heads=4, seed=1)
    engine = make_engine("int8", model, 3)
    linears = [s for s in engine.steps if s.kind == "int8_linear"]
    in_epilogue = any(op[0] == onednn.GELU_TANH for s in linears for op in s.attrs.get("epilogue", ())
                      if not isinstance(op, int8.BinaryPostOp))
    own_step = any(s.kind == "dnnl_eltwise" and s.attrs["activation"] == "gelu" for s in engine.steps)
    assert (in_epilogue, own_step) == (avx512, not avx512)
    for batch in (1, 3):
        abs_err, rel_err = _errors(engine, model, model.random_input(batch, np.random.default_rng(batch)))
        assert abs_err < engine.abs_tol and rel_err < engine.rel_tol, (batch, abs_err, rel_err)
    assert bool(made) != avx512, made
    assert tracemalloc_peak(engine, model.random_input(3, rng=0)) <= 4096


def test_a_batch_size_bound_later_gets_its_layout_from_the_held_one():
    """Bound first at 32 rows (AMX's layout), the plain copy dropped, then at 1 row (VNNI's, with
    s8 compensation): the second layout is made from the first through a temporary plain copy."""
    model = MODELS["mlp"](dim=64, seed=6)
    engine = make_engine("int8", model, 32)
    x = model.random_input(1, 0)
    abs_err, rel_err = _errors(engine, model, x)
    assert abs_err < engine.abs_tol and rel_err < engine.rel_tol
    layouts = [len(linear.weights.layouts) for linear in engine.quantized_linears]
    assert all(n >= 1 for n in layouts) and all(linear.weights.plain is None for linear in engine.quantized_linears)


# --- convolutions: the CNNs that ship with onnx, with random weights (tests/test_cnn_models.py) ---

def _cnn_logits(name: str):
    onnx = pytest.importorskip("onnx", reason="importing ONNX files needs the peers extra")
    import os
    from engines import load_onnx
    from tests.test_cnn_models import logits_of
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")
    return logits_of(load_onnx(path, randomize_weights=17))


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_cnn_convs_run_quantized_and_keep_the_float_top1(name):
    """Every conv (a conv then a max pool too) runs as oneDNN's int8 conv (its AMX or VNNI kernels,
    never its reference code); the class the float engine picks stays the class picked, and the
    logits stay within the relative bar."""
    model = _cnn_logits(name)
    engine = make_engine("int8", model, 1)
    floats = make_engine("onednn", model, 1)
    kinds = [s.kind for s in engine.steps]
    convs = sum(op.kind.startswith("conv") for op in model.ops)
    assert kinds.count("int8_conv") == convs and "dnnl_conv" not in kinds
    impls = {p["implementation"] for p in engine.report()["primitives"] if p["kind"] == "int8_conv"}
    assert impls and not any(i.startswith("ref") for i in impls), impls
    for seed in range(3):
        x = model.random_input(1, np.random.default_rng(seed))
        y, ref = np.array(engine.forward(x), np.float64), model.reference(x)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < engine.rel_tol
        assert np.argmax(y) == np.argmax(np.array(floats.forward(x)))
    # a quarter of the bytes, plus the scales, and the padding oneDNN's layout gives a grouped
    # conv's few channels per group (ShuffleNet's: 1.6x the values, docs/int8.md)
    assert engine.weight_bytes < floats.weight_bytes / 2


def test_cnn_samples_are_quantized_one_by_one():
    model = _cnn_logits("squeezenet")
    engine = make_engine("int8", model, 2)
    x = model.random_input(2, np.random.default_rng(0))
    x[1] *= 50.0
    both = np.array(engine.forward(x))
    np.testing.assert_array_equal(both[:1], np.array(engine.forward(np.ascontiguousarray(x[:1]))))


def test_an_imported_transformer_runs_its_linears_quantized(tmp_path):
    """A model from an ONNX file, not the zoo's builder: the zoo's transformer exported and read back."""
    onnx = pytest.importorskip("onnx", reason="importing ONNX files needs the peers extra")
    from engines import load_onnx
    from engines.peers.onnxrt import export
    path = tmp_path / "transformer.onnx"
    onnx.save(export(MODELS["transformer"](dim=64, seq=16, heads=4, seed=8), onnx), str(path))
    model = load_onnx(str(path))
    engine = make_engine("int8", model, 3)
    assert [s.kind for s in engine.steps].count("int8_linear") == sum(op.kind == "linear" for op in model.ops) == 4
    for batch in (3, 1):
        abs_err, rel_err = _errors(engine, model, model.random_input(batch, np.random.default_rng(batch)))
        assert abs_err < engine.abs_tol and rel_err < engine.rel_tol


def test_a_cnn_allocates_nothing_per_forward():
    """As tests/test_zero_alloc.py checks the zoo: SqueezeNet's int8 convs, quantize reorders and
    pools, under tracemalloc and memray, within the bookkeeping bound."""
    from test_zero_alloc import BOOKKEEPING_BYTES, memray_peak, tracemalloc_peak
    model = _cnn_logits("squeezenet")
    engine = make_engine("int8", model, 2)
    for batch in (1, 2):
        x = model.random_input(batch, np.random.default_rng(batch))
        assert tracemalloc_peak(engine, x) <= BOOKKEEPING_BYTES
        assert memray_peak(engine, x) <= BOOKKEEPING_BYTES


def test_a_product_no_int8_kernel_takes_runs_in_float_and_says_so():
    """oneDNN's brgemm kernels take no 4 x 25 x 25 int8 product here (ONNX's test graphs have such):
    that linear runs its quantized weights in float32, is named in report(), stays within the bar
    and allocates nothing per forward; the 24-wide one runs in int8."""
    from test_zero_alloc import BOOKKEEPING_BYTES, tracemalloc_peak
    for dim, expected in ((25, ["4x25x25"]), (24, [])):
        model = MODELS["mlp"](dim=dim, seed=1)
        engine = make_engine("int8", model, 4)
        x = model.random_input(4, rng=2)
        err, rel = _errors(engine, model, x)
        assert err < engine.abs_tol and rel < engine.rel_tol
        if expected and not engine.report()["float_products"]:
            pytest.skip("this CPU's oneDNN takes a 25-wide int8 product")
        assert engine.report()["float_products"] == expected
        assert tracemalloc_peak(engine, x) <= BOOKKEEPING_BYTES

"""The onednn engine's own promises: oneDNN's fast kernels (never its reference code) on every
light CNN, the layout changed only at the graph's edges where every op has a oneDNN form, and
primitives that outlive the engine that made them for its workers."""
import gc
import glob
import math
import os
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from engines import ENGINES, EngineUnavailable, load_onnx  # noqa: E402
from engines.kernels import choice  # noqa: E402
from engines.native import onednn as native_onednn  # noqa: E402
from engines.planned import onednn  # noqa: E402
from engines.planned.fused import FusedEngine  # noqa: E402
from tests.test_zero_alloc import tracemalloc_peak  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512"]


def light(name: str, **options):
    (path,) = glob.glob(os.path.join(LIGHT, f"light_{name}.onnx"))
    return load_onnx(path, **options)


@pytest.fixture(scope="module", autouse=True)
def needs_onednn():
    try:
        onednn.library()
    except EngineUnavailable as exc:
        pytest.skip(f"oneDNN is not installed here: {exc}")


@pytest.mark.parametrize("name", MODELS)
def test_every_primitive_runs_a_fast_kernel(name):
    report = ENGINES["onednn"](light(name), 1).report()
    kinds = {p["kind"] for p in report["primitives"]}
    assert "conv" in kinds and report["layout"] in ("NHWC", "nChw16c", "nChw8c", "nChw4c")
    slow = [p for p in report["primitives"] if p["implementation"].startswith("ref")]
    assert slow == [], slow


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "inception_v2", "shufflenet", "densenet121"])
def test_the_layout_changes_only_at_the_edges(name):
    """Convs, pools, residual sums, concats, ShuffleNet's channel shuffles and DenseNet's
    batchnorm + ReLU, its global pool and 1x1 classifier conv all run in oneDNN's layout: one
    reorder in (the input), and one out (to the classifier or the flattening) only where the
    layouts differ there: after a global pool they differ only where its channels end inside
    a block."""
    engine = ENGINES["onednn"](light(name), 1)
    reorders = [s for s in engine.steps if s.kind == "dnnl_reorder"]
    assert reorders[0].reads == ("input",) and len(reorders) <= (1 if engine.dnnl.block == 1 else 2), reorders


@pytest.mark.parametrize("layout, copies", [(None, 0), ((102, 8), 0), ((78, 16), 1)],
                         ids=["this-cpu", "nChw8c", "nChw16c"])
def test_one_pixel_is_read_in_either_layout_without_a_copy(layout, copies, monkeypatch):
    """DenseNet's 1,000 classes after its global pool: one pixel, so NHWC and NCHW, and a blocked
    layout whose blocks the channels fill (8 | 1000), hold the same bytes in the same order; the
    model's NCHW output is then its last pool's buffer, with no reorder out. 16-channel blocks end
    in padding there: a reorder. The same answer in each."""
    if layout is None and onednn.library().block != 1:
        pytest.skip("this CPU's oneDNN picks a blocked layout: its cases are the forced ones")
    if layout is not None:
        _skip_where_only_reference_convs(onednn.library(), layout)
        monkeypatch.setattr(onednn.library(), "layout", layout[0])
        monkeypatch.setattr(onednn.library(), "block", layout[1])
    model = light("densenet121", randomize_weights=17)
    engine = ENGINES["onednn"](model, 2)
    out = [s for s in engine.steps if s.kind == "dnnl_reorder" and s.reads != ("input",)]
    assert len(out) == copies, out
    x = model.random_input(2, rng=5)
    ref = model.reference(x)
    assert np.max(np.abs(np.asarray(engine.forward(x), np.float64) - ref)) <= 1e-4 * max(1.0, float(np.max(np.abs(ref))))


def _brgemm() -> bool:
    """Whether oneDNN has its brgemm f32 matmul here (AVX-512): on AVX2 alone, attention's products
    are NumPy's (``test_attention_falls_back_to_numpy_where_onednn_offers_no_brgemm``)."""
    return native_onednn.matmul_implementation(16, 64, 64, False).startswith("brg")


def _conv_implementation(dnnl, tag: int) -> str:
    """oneDNN's implementation of a 3x3, 64-channel conv at 14 x 14 in the layout of format ``tag``."""
    owned = native_onednn.Owned(dnnl)
    dims = (1, 64, 14, 14)
    pd = owned.conv_pd(owned.md(dims, tag), owned.md((64, 64, 3, 3), native_onednn.ANY), owned.md((64,), native_onednn.PLAIN[1]),
                       owned.md(dims, tag), (1, 1), (0, 0), (1, 1), (1, 1), owned.attr())
    try:
        return native_onednn.implementation(dnnl, pd)
    finally:
        owned.release()


def _skip_where_only_reference_convs(dnnl, layout: tuple[int, int]) -> None:
    probe = _conv_implementation(dnnl, layout[0])
    if probe.startswith("ref"):
        pytest.skip(f"oneDNN has only reference convs in nChw{layout[1]}c on this CPU ({probe}: minutes a "
                    f"model); it never picks that layout here")


@pytest.mark.parametrize("layout", [(78, 16), (102, 8)], ids=["nChw16c", "nChw8c"])
@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "shufflenet", "densenet121"])
def test_every_layout_oneDNN_may_pick_gives_the_same_answer(name, layout, monkeypatch):
    """What an AVX-512 or AVX2 host may pick instead of this one's (channels padded to the block,
    concats of padded parts, an RGB input read as NCHW), forced here, against the reference."""
    dnnl = onednn.library()
    _skip_where_only_reference_convs(dnnl, layout)
    monkeypatch.setattr(dnnl, "layout", layout[0])
    monkeypatch.setattr(dnnl, "block", layout[1])
    model = light(name, randomize_weights=17)    # the file's weights tie the softmax (docs/cnn.md)
    x = model.random_input(2, rng=5)
    engine = ENGINES["onednn"](model, 2)
    assert engine.report()["layout"] == f"nChw{layout[1]}c"
    ref = model.reference(x)
    assert np.max(np.abs(np.asarray(engine.forward(x), np.float64) - ref)) <= 1e-4 * max(1.0, float(np.max(np.abs(ref))))


def test_residual_sums_in_place_and_pools_fuse():
    engine = ENGINES["onednn"](light("resnet50"), 1)
    sums = [s for s in engine.steps if s.kind == "dnnl_conv" and s.attrs["residual"]]
    assert len(sums) == 16 and all(s.out == s.reads[1] for s in sums)       # into the residual's buffer
    assert sum(s.attrs["pool"] is not None for s in engine.steps if s.kind == "dnnl_conv") == 1


def test_shufflenets_shuffles_are_one_step_and_its_sums_join_the_grouped_convs():
    """Reshape, Transpose, Reshape: one oneDNN step each; each Sum and its ReLU: post-ops of the
    grouped 1x1 conv before it, summed into the residual's buffer (engines.ir.conv's conv_add takes
    only one group)."""
    engine = ENGINES["onednn"](light("shufflenet"), 1)
    kinds = [s.kind for s in engine.steps]
    assert kinds.count("dnnl_shuffle") == 16 and "calls" not in kinds[:-3]     # only the head on NumPy
    sums = [s for s in engine.steps if s.kind == "dnnl_conv" and s.attrs["residual"]]
    assert len(sums) == 13 and all(s.out == s.reads[1] and s.attrs["conv"]["activation"] == "relu" for s in sums)


def test_a_worker_outlives_the_engine_that_made_it():
    model = light("squeezenet", randomize_weights=17)
    x = model.random_input(2, rng=3)
    engine = ENGINES["onednn"](model, 2)
    worker = engine.worker()
    del engine
    gc.collect()
    got = np.array(worker.forward(x))
    assert np.max(np.abs(got - model.reference(x))) <= 1e-4 * max(1.0, float(np.max(np.abs(got))))


def test_without_onednn_the_engine_says_how_to_get_it(no_onednn):
    with pytest.raises(EngineUnavailable, match=r"pip install -e \.\[onednn\]"):
        ENGINES["onednn"](light("squeezenet"), 1)


@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
def test_linears_run_on_onednns_matmul_where_it_allocates_nothing(model_name, monkeypatch):
    """Untuned, every linear whose matmul oneDNN runs on its brgemm kernels here is that matmul,
    the others one-thread SciPy; right against the float64 reference, from a worker too."""
    from engines import MODELS
    from engines.kernels import TUNE_ENV
    monkeypatch.setenv(TUNE_ENV, "0")
    model = MODELS[model_name](dim=64, seed=3)
    engine = ENGINES["onednn"](model, 4)
    for entry in engine.report()["kernels"]:
        rows, k, n, residual = re.fullmatch(r"(\d+)x(\d+)x(\d+)T?(\+res)?", entry["gemm"]).groups()
        fits = native_onednn.matmul_implementation(int(rows), int(k), int(n), bool(residual)).startswith("brg")
        assert entry["kernel"] == ("onednn-matmul" if fits else "scipy-1t"), entry
    x = model.random_input(4, rng=2)
    worker = engine.worker()
    del engine
    gc.collect()
    np.testing.assert_allclose(np.asarray(worker.forward(x), np.float64), model.reference(x), atol=1e-4, rtol=1e-4)


def test_below_avx512_the_matmul_that_would_allocate_is_not_chosen_and_the_inner_product_is(tmp_path):
    """oneDNN 3.2 capped at AVX2 runs matmul on its jit gemm, which allocates per call: no linear
    takes it then, tuned or not; its inner product has brgemm kernels there, and is measured for
    every linear, right (a process of its own: the cap is read when oneDNN loads)."""
    import subprocess
    import sys
    code = (
        "import numpy as np\nfrom engines import ENGINES, MODELS\nfrom engines.native import onednn\n"
        "assert onednn.matmul_implementation(8, 64, 64, False).startswith('gemm:jit'), "
        "onednn.matmul_implementation(8, 64, 64, False)\n"
        "for shape in ((1, 64, 64, False), (4, 768, 3072, True), (256, 96, 384, False)):\n"
        "    assert onednn.implementation_for('inner_product', *shape).startswith('brgemm'), shape\n"
        "model = MODELS['mlp'](dim=64, seed=3)\n"
        "x = model.random_input(4, rng=1)\n"
        "for tune in ('0', '1'):\n"
        "    import os; os.environ['MLEXEC_TUNE'] = tune\n"
        "    engine = ENGINES['onednn'](model, 4)\n"
        "    report = engine.report()['kernels']\n"
        "    chosen = {e['kernel'] for e in report}\n"
        "    assert 'onednn-matmul' not in chosen, chosen\n"
        "    assert tune == '0' or all('onednn-ip' in e['candidates_us'] for e in report), report\n"
        "    np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-4)\n")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "MLEXEC_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


_ATTENTION_PRODUCTS = """
import numpy as np
from engines import ENGINES, MODELS, kernels
model = MODELS["transformer"](dim=64, seq=16, seed=1)
engine = ENGINES["onednn"](model, 2)
x = model.random_input(2, rng=4)
np.testing.assert_allclose(np.asarray(engine.forward(x), np.float64), model.reference(x), atol=1e-4, rtol=1e-4)
calls = engine._bound[2][1]
pinned = [c for fn, args in calls if fn is kernels.table._one_thread for c in args[-1]]
assert not any(fn is np.matmul for fn, _ in calls), "a NumPy product on its two-thread pool"
print(sum(fn is np.matmul for fn, _ in pinned))
"""


@pytest.mark.parametrize("isa", [None, "AVX2"], ids=["this-cpu", "avx2"])
def test_numpys_products_run_on_one_openblas_thread(isa, tmp_path):
    """Attention's per-head products and the row reductions' matvecs stay off NumPy's two-thread
    pool, which alternating with OpenMP's waited on its spinning workers. With AVX-512 they are
    oneDNN's brgemm matmuls; without it (``ONEDNN_MAX_CPU_ISA=AVX2`` makes any x86 CPU so) oneDNN
    has no brgemm matmul and they are NumPy's, each inside a one-thread call (products below
    MKL_BATCH_MIN_WORK: MKL's batch takes larger ones where it is installed). The answer is right
    either way."""
    import subprocess
    import sys
    env = {**os.environ, "MLEXEC_CACHE_DIR": str(tmp_path), **({"ONEDNN_MAX_CPU_ISA": isa} if isa else {})}
    done = subprocess.run([sys.executable, "-c", _ATTENTION_PRODUCTS], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pinned = int(done.stdout.split()[-1])
    if isa == "AVX2":
        assert pinned >= 2                          # the scores' and the context's products


def _mobilenet_v3_block(pool: str):
    """A MobileNetV3 block as its exporters write it: conv + HardSwish, a depthwise conv, the
    squeeze-excite gate (global mean as ``pool``, conv + ReLU, conv + HardSigmoid, a broadcast
    Mul), a projection conv and the residual Add; then a Sigmoid of a sum no conv takes in."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(1)
    def init(name, *shape):
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
    inits = [init("w1", 16, 16, 1, 1), init("dw", 16, 1, 3, 3), init("s1", 8, 16, 1, 1), init("s2", 16, 8, 1, 1),
             init("w2", 16, 16, 1, 1)]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1"], ["a"]), node("HardSwish", ["a"], ["h"]),
             node("Conv", ["h", "dw"], ["d"], group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    if pool == "global":
        nodes.append(node("GlobalAveragePool", ["d"], ["m"]))
    else:                                  # the dynamo exporter's: rows, their mean, back to (C, 1, 1)
        inits += [onnx.numpy_helper.from_array(np.array(s, np.int64), n)
                  for n, s in (("rows", [-1, 16, 64]), ("back", [-1, 16, 1, 1]))]
        nodes += [node("Reshape", ["d", "rows"], ["r"]), node("ReduceMean", ["r"], ["rm"], axes=[2], keepdims=1),
                  node("Reshape", ["rm", "back"], ["m"])]
    nodes += [node("Conv", ["m", "s1"], ["g1"]), node("Relu", ["g1"], ["g2"]), node("Conv", ["g2", "s2"], ["g3"]),
              node("HardSigmoid", ["g3"], ["g"], alpha=1 / 6, beta=0.5), node("Mul", ["d", "g"], ["sd"]),
              node("Conv", ["sd", "w2"], ["p"]), node("Add", ["p", "x"], ["res"]), node("Sigmoid", ["res"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])], inits)
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())


@pytest.mark.parametrize("pool", ["global", "rows"])
def test_hardswish_and_squeeze_excite_stay_in_onednns_layout(pool):
    """Hard-swish and hard-sigmoid as the convs' post-ops, the gate's pooling and product as oneDNN
    primitives, the residual sum and its sigmoid as the last conv's post-ops: no NumPy step and no
    reorder but at the edges."""
    model = _mobilenet_v3_block(pool)
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    assert kinds.count("dnnl_reorder") == 2 and "calls" not in kinds, kinds
    assert kinds.count("dnnl_binary") == 1 and kinds.count("dnnl_pool") == 1 and "dnnl_eltwise" not in kinds
    convs = [s for s in engine.steps if s.kind == "dnnl_conv"]
    assert {"hardswish", "hardsigmoid", "relu"} <= {s.attrs["conv"].get("activation") for s in convs}
    assert [s.attrs["conv"]["activation"] for s in convs if s.attrs["residual"]] == ["sigmoid"]
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", ["HardSwish", "HardSigmoid", "Sigmoid", "SiLU"])
def test_a_gated_activation_between_linears_is_one_primitive(act):
    """MobileNetV3's classifier, Gemm, HardSwish, Gemm (and the other gated activations there): the
    activation on the plain rows is one oneDNN eltwise primitive, not NumPy's several passes."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(3)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
             for name, shape in (("w0", (16, 24)), ("b0", (24,)), ("w1", (24, 8)), ("b1", (8,)))]
    node = helper.make_node
    gate = ([node("Sigmoid", ["h"], ["s"]), node("Mul", ["h", "s"], ["a"])] if act == "SiLU"
            else [node(act, ["h"], ["a"])])
    nodes = [node("Gemm", ["x", "w0", "b0"], ["h"]), *gate, node("Gemm", ["a", "w1", "b1"], ["y"])]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    assert kinds.count("dnnl_eltwise") == 1 and "calls" not in kinds, kinds
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch) * 4            # across hardswish's and hardsigmoid's bends
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pool, attrs, on_onednn", [
    ("AveragePool", dict(count_include_pad=0), True),                 # PoolFormer's token mixer
    ("AveragePool", dict(count_include_pad=1), True),
    ("AveragePool", dict(count_include_pad=1, ceil_mode=1, strides=[2, 2]), False),
    ("MaxPool", dict(ceil_mode=1, strides=[2, 2]), True),
], ids=["avg-exclude-pads", "avg-include-pads", "avg-include-pads-ceil", "max-ceil"])
def test_a_pool_of_an_nchw_tensor_is_onednns_pool(pool, attrs, on_onednn):
    """A pool whose input is held in NCHW (PoolFormer's read a group norm's output) is oneDNN's
    pool primitive on a native twin of it, not NumPy's shifted passes; an average pool that counts
    pads in ceil_mode stays NumPy's (oneDNN would count the overhang)."""
    from onnx import TensorProto, helper
    node = helper.make_node
    nodes = [node(pool, ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], **attrs)]
    side = 4 if attrs.get("strides") else 7                           # 7x7 in, ceil((7 + 2 - 3) / 2) + 1
    graph = helper.make_graph(nodes, "mixer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, side, side])])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString())
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    assert ("dnnl_pool" in kinds) == on_onednn and ("calls" in kinds) != on_onednn, kinds
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-5, atol=1e-6)
    assert tracemalloc_peak(engine, x) < 4096


def test_a_plain_binary_and_the_eltwise_ops_after_it_are_one_primitive():
    """On plain rows (ConvNeXt's channels-last linears): a bias add, a quotient by a constant along
    the last axis and a constant times the rows (either order), a product and a difference of two
    activations, each with the eltwise ops after it, are oneDNN's binary primitive with those ops
    as post-ops; one with nothing after it stays NumPy's one pass, as does a sum of two."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(4)
    consts = {"bias": rng.standard_normal(8), "half": np.array(0.5),
              "den": rng.uniform(0.5, 2.0, 8), "scale": rng.standard_normal(8)}
    inits = [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()]
    node = helper.make_node
    nodes = [node("Tanh", ["x"], ["a"]),                                       # no linear to fold the bias into
             node("Add", ["a", "bias"], ["b"]), node("Relu", ["b"], ["br"]),             # constant, then ReLU
             node("Mul", ["br", "x"], ["m"]), node("Sigmoid", ["m"], ["ms"]), node("Mul", ["ms", "half"], ["mh"]),
             node("Sub", ["mh", "x"], ["d"]), node("Relu", ["d"], ["dr"]),               # two activations
             node("Div", ["dr", "den"], ["q"]), node("Relu", ["q"], ["qr"]),
             node("Mul", ["scale", "qr"], ["s"]), node("Sigmoid", ["s"], ["ss"]),        # the constant first
             node("Mul", ["ss", "x"], ["alone"]),                                        # nothing after it
             node("Add", ["alone", "x"], ["y"])]
    graph = helper.make_graph(nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 8])], inits)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    engine = ENGINES["onednn"](model, 4)
    binaries = [s for s in engine.steps if s.kind == "dnnl_binary"]
    assert [len(s.operands) for s in binaries] == [1, 0, 0, 1, 1], [(s.out, s.attrs) for s in binaries]
    assert [len(s.attrs["eltwises"]) for s in binaries] == [1, 2, 1, 1, 1]
    numpy = [s.out for s in engine.steps if s.kind == "calls"]
    # tanh; the product alone, then the sum, each in the buffer of the input it may overwrite
    assert numpy == ["a", "ss", "ss"], numpy
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-5, atol=1e-6)


def test_a_transpose_of_plain_rows_is_onednns_reorder():
    """Swin's window partition (a 6-D permutation) and a head split's transpose of a plain tensor:
    each one oneDNN reorder from the input read through the permutation, on its jit code, equal to
    NumPy's transpose bit for bit; no array allocated per warm forward."""
    import tracemalloc
    from onnx import TensorProto, helper
    shape = lambda *dims: onnx.numpy_helper.from_array(np.array(dims, np.int64))  # noqa: E731
    inits = [shape(-1, 2, 3, 2, 3, 4), shape(-1, 6, 6, 4), shape(-1, 36, 2, 2)]
    for init, name in zip(inits, ("windows", "back", "heads")):
        init.name = name
    node = helper.make_node
    nodes = [node("Tanh", ["x"], ["t"]), node("Reshape", ["t", "windows"], ["w"]),
             node("Transpose", ["w"], ["p"], perm=[0, 1, 3, 2, 4, 5]), node("Reshape", ["p", "back"], ["b"]),
             node("Reshape", ["b", "heads"], ["h"]), node("Transpose", ["h"], ["ht"], perm=[0, 2, 1, 3]),
             node("Tanh", ["ht"], ["y"])]
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 6, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 36, 2])], inits)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    engine = ENGINES["onednn"](model, 4)
    assert [s.kind for s in engine.steps].count("dnnl_transpose") == 2, [s.kind for s in engine.steps]
    fused = ENGINES["fused"](model, 4)
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_array_equal(engine.forward(x), fused.forward(x))
    reorders = {p["implementation"] for p in engine.report()["primitives"] if p["kind"] == "transpose"}
    assert reorders and not [i for i in reorders if i.startswith("ref")], reorders
    x = model.random_input(4, rng=0)
    engine.forward(x)
    tracemalloc.start()
    try:
        engine.forward(x)
        assert tracemalloc.get_traced_memory()[1] < 4096
    finally:
        tracemalloc.stop()


def _window_attention():
    """Swin-style attention in small: q and k gathered out of one (tokens, 3, heads, dim) tensor
    and transposed heads first, the query scaled, their product and a ReLU, a constant over
    heads x tokens x tokens added, a sigmoid, a tanh out."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(5)
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("q", 0), ("k", 1))]
    inits += [onnx.numpy_helper.from_array(rng.standard_normal((2, 6, 6)).astype(np.float32), "bias"),
              onnx.numpy_helper.from_array(np.array(0.5, np.float32), "scale")]
    node = helper.make_node
    nodes = [node("Tanh", ["x"], ["t"]),
             node("Gather", ["t", "q"], ["qh"], axis=2), node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
             node("Mul", ["qt", "scale"], ["qs"]),
             node("Gather", ["t", "k"], ["kh"], axis=2), node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
             node("MatMul", ["qs", "kt"], ["s"]), node("Relu", ["s"], ["sr"]),
             node("Add", ["sr", "bias"], ["b"]), node("Sigmoid", ["b"], ["g"]), node("Tanh", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "window", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 3, 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 6, 6])], inits)
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())


def test_window_attention_is_reorders_a_batched_matmul_and_a_binary():
    """Attention that is not the fused kind, as Swin writes it: q and k taken out of the
    projection (Gather) and each transposed heads-first, one reorder each from the part read
    through the permutation; the scores' product oneDNN's batched matmul with its ReLU as a
    post-op, not NumPy's GEMM per matrix; the relative position bias (a constant over heads x
    tokens x tokens) and the activation after it one binary primitive. The query scale stays
    after its transpose (no linear to fold it into). Right at both batches, on jit code, and no
    array allocated per warm forward."""
    model = _window_attention()
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    assert [s.attrs.get("index") is not None for s in engine.steps if s.kind == "dnnl_transpose"] == [True, True], kinds
    assert kinds.count("dnnl_matmul") == 1 and [s.attrs["eltwises"] for s in engine.steps if s.kind == "dnnl_matmul"] != [()]
    assert [s.operands[0].shape for s in engine.steps if s.kind == "dnnl_binary"] == [(2, 6, 6)], kinds
    assert kinds.count("calls") == 3, kinds                                # the tanhs, the query scale
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-5, atol=1e-6)
    implementations = {p["implementation"] for p in engine.report()["primitives"]}
    assert not [i for i in implementations if i.startswith("ref")], implementations
    assert tracemalloc_peak(engine, model.random_input(4, rng=0)) < 4096


def test_a_product_no_brgemm_takes_runs_on_numpy_then_its_post_ops(monkeypatch):
    """Where oneDNN offers no brgemm kernel for a product, NumPy's matmul runs it and its post-ops
    follow as one chain step of their own: still right."""
    monkeypatch.setattr(onednn, "implementation", lambda dnnl, pd: "gemm:jit:f32")
    model = _window_attention()
    engine = ENGINES["onednn"](model, 4)
    assert [s.kind for s in engine.steps].count("dnnl_matmul") == 1
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-5, atol=1e-6)
    ran = [p for p in engine.report()["primitives"] if p["kind"] == "matmul" and p["batch"] == 4]
    assert len(ran) == 1 and ran[0]["step"] == "sr", ran        # the ReLU's chain step; NumPy ran the product


def test_silu_and_a_difference_of_activations_stay_in_onednns_layout():
    """EfficientNet's SiLU, conv · sigmoid(conv), becomes the conv's swish post-op, and a difference
    of two activations oneDNN's binary primitive, all in its layout, right at both batches."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(2)
    w = [onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.4, f"w{i}")
         for i in range(2)]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w0"], ["c"]), node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["silu"]),
             node("Conv", ["silu", "w1"], ["d"]), node("Sub", ["d", "silu"], ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 6, 6])], w)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    assert kinds.count("dnnl_reorder") == 2 and kinds.count("dnnl_binary") == 1 and "calls" not in kinds, kinds
    acts = [s.attrs["conv"].get("activation") for s in engine.steps if s.kind == "dnnl_conv"]
    assert acts == ["silu", None], acts
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)


def test_onnx_sum_of_two_activations_is_onednns_binary_add():
    """Caffe2's ResNet-50 (ONNX's model zoo) sums its residual with ``Sum``, not ``Add``: a sum no
    conv takes in (here of two ReLUs) is one binary primitive in oneDNN's layout, no
    NumPy pass and no reorder between the convs (its QDQ file ran 2.3x slower on ``int8`` through
    NumPy), right at both batches."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(4)
    w = [onnx.numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1, f"w{i}")
         for i in range(2)]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
             node("Conv", ["r", "w1"], ["d"], pads=[1, 1, 1, 1]), node("Relu", ["d"], ["e"]),
             node("Sum", ["e", "r"], ["y"])]
    graph = helper.make_graph(nodes, "sum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 6, 6])], w)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    assert kinds == ["dnnl_reorder", "dnnl_conv", "dnnl_conv", "dnnl_binary", "dnnl_reorder"], kinds
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(dim=32, seq=8, heads=4), dict(dim=64, seq=16, heads=2)])
def test_a_transformers_gelu_and_attention_are_onednn_primitives(kwargs):
    """GELU (tanh form) a oneDNN eltwise on a plain buffer, in place (one pass where NumPy took
    eight); the attention's scores, softmax and context one oneDNN step; right at batch 1 and 8."""
    from engines import MODELS
    model = MODELS["transformer"](**kwargs)
    engine = ENGINES["onednn"](model, 8)
    steps = {s.kind: s for s in engine.steps}
    assert not {"gelu", "softmax", "calls", "dnnl_attn_scores"} & set(steps), sorted(steps)
    assert {"dnnl_attn_heads", "dnnl_attention"} <= set(steps)
    assert steps["dnnl_eltwise"].attrs == {"activation": "gelu"}
    for batch in (1, 8):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)


def _shufflenet_v2_block():
    """ShuffleNet v2's block as torchvision writes it: a conv, its output split in two channel
    halves (8 and 8 of 16), a conv on the second, the first and that concatenated, shuffled
    (Reshape, Transpose, Reshape), then a conv."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(3)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
             for n, s in (("w0", (16, 16, 1, 1)), ("w1", (8, 8, 3, 3)), ("w2", (16, 16, 1, 1)))]
    inits += [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in (("halves", [8, 8]), ("groups", [-1, 2, 8, 6, 6]), ("back", [-1, 16, 6, 6]))]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w0"], ["a"]), node("Relu", ["a"], ["r"]),
             node("Split", ["r", "halves"], ["x1", "x2"], axis=1),
             node("Conv", ["x2", "w1"], ["b"], pads=[1, 1, 1, 1]), node("Concat", ["x1", "b"], ["c"], axis=1),
             node("Reshape", ["c", "groups"], ["g"]), node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3, 4]),
             node("Reshape", ["t", "back"], ["s"]), node("Conv", ["s", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 6, 6])], inits)
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())


@pytest.mark.parametrize("layout", [None, (102, 8), (78, 16)], ids=["this-cpu", "nChw8c", "nChw16c"])
def test_shufflenet_v2s_channel_split_stays_in_onednns_layout(layout, monkeypatch):
    """Each half of the split is a reorder of that part of the tensor in oneDNN's layout: no
    NCHW twin, no NumPy step. In 16-channel blocks the second half starts inside a block, which
    oneDNN cannot take apart: that split reads an NCHW twin, and is still right."""
    if layout is not None:
        dnnl = onednn.library()
        monkeypatch.setattr(dnnl, "layout", layout[0])
        monkeypatch.setattr(dnnl, "block", layout[1])
    model = _shufflenet_v2_block()
    engine = ENGINES["onednn"](model, 4)
    kinds = [s.kind for s in engine.steps]
    if engine.dnnl.block <= 8:
        assert kinds.count("dnnl_slice") == 2 and kinds.count("dnnl_reorder") == 2 and "calls" not in kinds, kinds
    for batch in (1, 4):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)


def _needs_an_openmp_pool():
    from engines.kernels import pool_threads
    if pool_threads("openmp-threads") < 2:
        pytest.skip("OpenMP runs one thread here: nothing to choose")


@pytest.mark.parametrize("one_thread_faster", [True, False], ids=["one-thread", "pool"])
def test_a_short_forward_runs_on_one_thread_where_its_own_forward_was_faster(one_thread_faster, monkeypatch):
    """The forward at a batch is timed on OpenMP's pool and with OpenMP at one thread (its
    primitives made so); the faster runs, named in the report, and both give the pool's answer."""
    _needs_an_openmp_pool()
    timed = []
    def measure(variants):
        timed.append(sorted(variants))
        return {"pool": 2.0, "one thread": 1.0} if one_thread_faster else {"pool": 1.0, "one thread": 2.0}
    monkeypatch.setattr(onednn, "measure_forwards", measure)
    monkeypatch.setattr(choice, "RIVAL_PAUSE_S", 0.0)
    monkeypatch.setattr(onednn, "ONE_THREAD_FORWARD_S", float("inf"))    # a busy host's slow forward still judged
    monkeypatch.setenv("MLEXEC_TUNE", "1")
    model = light("squeezenet")
    engine = ENGINES["onednn"](model, 2)
    chosen = engine.report()["forward_threads"]["2"]
    # the pool at once where it is faster; one thread only after four timings gave the pool no gain
    assert timed == [["one thread", "pool"]] * (4 if one_thread_faster else 1) and chosen["how"] == "measured in the forward"
    assert chosen["threads"] == (1 if one_thread_faster else chosen["pool"])
    assert (len(engine._bound[2].calls) == 1) == one_thread_faster      # one call: OpenMP at one thread around all
    x = model.random_input(2, rng=3)
    monkeypatch.setattr(onednn, "measure_forwards", lambda variants: {"pool": 1.0, "one thread": 2.0})
    pool = ENGINES["onednn"](model, 2)
    np.testing.assert_allclose(engine.forward(x), pool.forward(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("later, threads", [({"pool": 1.0, "one thread": 2.0}, "pool"),
                                             ({"pool": 1.0, "one thread": 1.0}, 1)], ids=["pool-gains", "tie"])
def test_the_pool_runs_where_one_of_four_spread_timings_shows_it_faster(later, threads, monkeypatch):
    """A slow phase of the second core during the first timings (another pool still spinning, a
    neighbour's burst) made the pool look slow or level: a later timing where the pool gains keeps
    it; where it only ties, one thread runs (on a tie the pool gains nothing, and a slow phase
    costs it)."""
    _needs_an_openmp_pool()
    results = iter([{"pool": 2.0, "one thread": 1.0}, {"pool": 1.0, "one thread": 1.0}, {"pool": 1.5, "one thread": 1.0}, later])
    monkeypatch.setattr(onednn, "measure_forwards", lambda variants: next(results))
    monkeypatch.setattr(choice, "RIVAL_PAUSE_S", 0.0)
    monkeypatch.setattr(onednn, "ONE_THREAD_FORWARD_S", float("inf"))
    monkeypatch.setenv("MLEXEC_TUNE", "1")
    chosen = ENGINES["onednn"](light("squeezenet"), 2).report()["forward_threads"]["2"]
    assert chosen["threads"] == (chosen["pool"] if threads == "pool" else 1) and len(chosen["forward_us"]) == 4, chosen


def test_a_long_forward_is_not_timed_on_one_thread(monkeypatch):
    _needs_an_openmp_pool()
    monkeypatch.setattr(onednn, "ONE_THREAD_FORWARD_S", 0.0)
    monkeypatch.setattr(onednn, "measure_forwards", lambda variants: pytest.fail("timed"))
    monkeypatch.setenv("MLEXEC_TUNE", "1")
    chosen = ENGINES["onednn"](light("squeezenet"), 1).report()["forward_threads"]["1"]
    assert chosen["threads"] == chosen["pool"] and chosen["how"].endswith("forward: on the pool"), chosen


@pytest.mark.parametrize("inputs", [2, 30])
def test_a_concat_of_many_tensors_stays_within_the_memory_limit(inputs):
    """oneDNN's concat allocates its argument list at every execution (DenseNet's 25-tensor concats
    read 1.4 KiB under memray against a 1 KiB limit): the limit counts it, and nothing else."""
    from onnx import TensorProto, helper

    from mlexec.suite.memory import limit_bytes, measure_peak
    rng = np.random.default_rng(0)
    w = [onnx.numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.3, f"w{i}")
         for i in range(inputs)]
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"]) for i in range(inputs)]
    nodes.append(helper.make_node("Concat", [f"c{i}" for i in range(inputs)], ["y"], axis=1))
    graph = helper.make_graph(nodes, "cat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16 * inputs, 4, 4])], w)
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    engine = ENGINES["onednn"](model, 2)
    assert [len(s.reads) for s in engine.steps if s.kind == "dnnl_concat"] == [inputs]
    x = model.random_input(1, rng=1)
    np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-4, atol=1e-5)
    peak, limit = measure_peak(engine, x), limit_bytes(engine, 1)
    assert peak <= limit < 4096, (peak, limit)
    # 30 tensors: past the slack of the other planned engines, so the concat's own count is needed
    assert (peak > FusedEngine.peak_slack_bytes) == (inputs == 30), peak


def _masked(model, mask: np.ndarray):
    """``model`` with ``mask`` (flat: a row of the keys, one (seq, seq) for every head, or one per
    head) added to its attention scores, as the importer reads an export's causal or padding mask."""
    from dataclasses import replace
    from engines.ir.models import Op
    ops, shapes = [], dict(model.shapes)
    for op in model.ops:
        if op.kind == "softmax":
            ops.append(Op("binary", op.inputs, "masked", ("mask",), {"fn": "add", "width": mask.size}))
            shapes["masked"] = shapes[op.inputs[0]]
            op = replace(op, inputs=("masked",))
        ops.append(op)
    return replace(model, ops=tuple(ops), shapes=shapes, params={**model.params, "mask": mask.astype(np.float32)})


@pytest.mark.parametrize("mask", [None, "keys", "shared", "per-head"])
@pytest.mark.parametrize("budget", [None, 4 * 4 * 4 * 18 * 4])     # None: one block; else blocks of 4 rows (4, 4, 4, 4, 2)
def test_attention_runs_on_brgemm_in_blocks_of_query_rows(monkeypatch, mask, budget):
    """Scores (+ mask), softmax and context are one step over blocks of query rows on oneDNN's
    brgemm kernels (no NumPy product, no allocating gemm), after one gather of qkv; no buffer holds
    a whole (heads, seq, seq) score matrix where the blocks are smaller; right at every batch,
    with a causal-style mask of each shape an export adds (one row of keys, one (seq, seq) for
    all heads, one per head), broadcast over the batch."""
    from engines import MODELS as ZOO
    heads, seq = 4, 18
    if budget:
        monkeypatch.setattr(onednn, "ATTENTION_BLOCK_BYTES", budget)
        monkeypatch.setattr(onednn, "ATTENTION_MIN_ROWS", 4)
    model = ZOO["transformer"](dim=64, seq=seq, heads=heads, seed=3)
    if mask is not None:
        size = {"keys": seq, "shared": seq * seq, "per-head": heads * seq * seq}[mask]
        model = _masked(model, np.random.default_rng(1).uniform(-30, 0, size))
    engine = ENGINES["onednn"](model, 4)
    (step,) = [s for s in engine.steps if s.kind == "dnnl_attention"]
    assert step.attrs["rows"] == (4 if budget else seq)
    assert (heads, seq, seq) not in engine.shapes.values()              # no scores, no probabilities
    assert engine.shapes[step.scratch[-1]] == (heads * step.attrs["rows"] * seq,)
    for batch in (1, 3, 4):
        x = model.random_input(batch, batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)
    attention = [(p["kind"], p["implementation"]) for p in engine.report()["primitives"] if p["kind"].startswith("att")]
    assert {kind for kind, impl in attention if impl.startswith("brg")} == ({"attention"} if _brgemm() else set())
    assert all(impl.startswith(("brg", "jit")) for _, impl in attention), attention    # never ref:any, gemm:jit


def test_block_rows_fit_the_budget_in_even_blocks():
    budget = onednn.ATTENTION_BLOCK_BYTES
    assert onednn.block_rows(1, 8, 128) == 128                               # 512 KiB: whole
    rows = onednn.block_rows(4, 8, 1024)                                    # 128 MiB whole
    assert rows % onednn.ATTENTION_MIN_ROWS == 0 and 4 * 8 * rows * 1024 * 4 <= budget
    assert onednn.block_rows(64, 16, 4096) == onednn.ATTENTION_MIN_ROWS     # over the budget even so: the fewest rows


def test_attention_scores_alone_where_the_softmax_is_not_the_contexts_alone(monkeypatch):
    """Without the whole chain (here: the chain matcher finds none) the scores and context are
    still oneDNN's brgemm matmuls reading one gathered copy of qkv."""
    from engines import MODELS as ZOO
    monkeypatch.setattr(onednn, "_attention_chain", lambda lw, op: None)
    model = ZOO["transformer"](dim=64, seq=16, heads=4, seed=3)
    engine = ENGINES["onednn"](model, 3)
    for batch in (1, 3):
        x = model.random_input(batch, batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)
    attention = [(p["kind"], p["implementation"]) for p in engine.report()["primitives"] if p["kind"].startswith("att")]
    assert {kind for kind, impl in attention if impl.startswith("brg")} == \
        ({"attn_scores", "attn_context"} if _brgemm() else set())


def test_attention_falls_back_to_numpy_where_onednn_offers_no_brgemm(monkeypatch):
    from engines import MODELS as ZOO
    monkeypatch.setattr(onednn, "implementation", lambda dnnl, pd: "gemm:jit:f32")
    model = _masked(ZOO["transformer"](dim=64, seq=16, heads=4, seed=3), np.linspace(-9, 0, 16 * 16))
    engine = ENGINES["onednn"](model, 2)
    x = model.random_input(2, 0)
    np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)
    ran = [p for p in engine.report()["primitives"] if p["kind"] == "attention" and p["batch"] == 2]
    assert len(ran) == 1            # the softmax: NumPy's products and mask add ran the rest


def bound_functions(calls) -> list:
    """The functions a bound forward calls, inside its one-thread wrappers too."""
    from engines import kernels
    return [f for fn, args in calls for f in (bound_functions(args[-1]) if fn is kernels.table._one_thread else [fn])]


@pytest.mark.parametrize("mask", [None, np.linspace(-9, 0, 16 * 16)], ids=["no-mask", "mask"])
@pytest.mark.parametrize("on_mkl", [True, False], ids=["above", "below"])
def test_without_brgemm_attentions_products_run_on_mkls_batch_from_a_size_on(monkeypatch, mask, on_mkl):
    """Where oneDNN offers no brgemm matmul (AVX2 alone), attention's products run on MKL's
    strided batch on the OpenMP pool from MKL_BATCH_MIN_WORK multiply-adds a product: the scores
    as one call over every sample's heads, the context (written into head columns, which the
    strided batch refuses) one gemm per head; NumPy's on one thread below. Right either way."""
    from engines import MODELS as ZOO
    from engines.native import mkl
    try:
        lib = mkl.load()
    except EngineUnavailable as exc:
        pytest.skip(f"MKL is not installed here: {exc}")
    monkeypatch.setattr(onednn, "implementation", lambda dnnl, pd: "gemm:jit:f32")
    work = 3 * 4 * 16 * 16 * 16                                       # batch 3's products
    monkeypatch.setattr(onednn, "MKL_BATCH_MIN_WORK", work if on_mkl else work + 1)
    model = ZOO["transformer"](dim=64, seq=16, heads=4, seed=3)
    model = model if mask is None else _masked(model, mask)
    engine = ENGINES["onednn"](model, 3)
    for batch in (1, 3):
        x = model.random_input(batch, batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)
    fns = bound_functions(engine._bound[3].calls)
    if on_mkl:
        assert (fns.count(lib.sgemm_batch_strided), fns.count(lib.sgemm), fns.count(np.matmul)) == (1, 3 * 4, 0)
    else:
        assert (fns.count(lib.sgemm_batch_strided), fns.count(lib.sgemm), fns.count(np.matmul)) == (0, 0, 2)


@pytest.mark.parametrize("a_shape, b_shape", [((2, 4, 64, 32), (2, 4, 32, 64)), ((2, 64, 128), (2, 128, 64)),
                                              ((2, 4, 64, 32), (1, 4, 32, 64)), ((2, 2, 4, 64, 32), (2, 2, 4, 32, 64))],
                         ids=["stack", "rank-3", "broadcast", "rank-5"])
def test_every_large_batched_product_is_right(a_shape, b_shape):
    """Above MKL_BATCH_MIN_WORK, a (batch, heads) stack may run on MKL's batch; other ranks and
    broadcast operands (an export's generic MatMul, Swin's windows) stay NumPy's products."""
    from engines import MODELS as ZOO
    engine = ENGINES["onednn"](ZOO["transformer"](dim=64, seq=16, heads=4), 1)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape, dtype=np.float32) for shape in (a_shape, b_shape))
    out = np.empty(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]), np.float32)
    assert math.prod(out.shape) * a_shape[-1] >= onednn.MKL_BATCH_MIN_WORK
    for fn, args in engine.batched_matmul_calls(a, b, out):
        fn(*args)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_scalar_ops_between_quantize_steps_join_their_chain():
    """A quantized file's GELU keeps quantize steps between its ops (x / sqrt 2, erf, x + 1, x · x,
    x · 0.5): the scalar ops become linear post-ops of the quantize step before them, or start a
    chain of their own; right within the quantized bar; c / x stays NumPy's."""
    from engines.ir.models import Model, Op
    from engines.native.onednn import LINEAR
    fq = dict(scale=0.05, zero_point=128, lo=0, hi=255)
    ops = (Op("fake_quant", ("x",), "q0", attrs=fq),
           Op("binary", ("q0",), "d", attrs={"fn": "div", "scalar": 1.4142135}),
           Op("erf", ("d",), "e"),
           Op("binary", ("e",), "a", attrs={"fn": "add", "scalar": 1.0}),
           Op("fake_quant", ("a",), "q1", attrs=fq),
           Op("binary", ("q1",), "m", attrs={"fn": "mul", "scalar": 0.5}),
           Op("binary", ("m",), "r", attrs={"fn": "div", "scalar": 2.0, "swap": True}))     # 2 / x
    model = Model("gelu-between-steps", ops, {t: (6, 40) for t in ("x", "q0", "d", "e", "a", "q1", "m", "r")}, {})
    engine = ENGINES["onednn"](model, 3)
    chains = [s.attrs["eltwises"] for s in engine.steps if s.kind == "dnnl_binary"]
    assert len(chains) == 2 and chains[0][-1][:2] == (LINEAR, pytest.approx(1 / 1.4142135)), chains   # q0, then / sqrt 2
    assert chains[1][0] == (LINEAR, 1.0, 1.0) and chains[1][-1] == (LINEAR, 0.5, 0.0), chains      # + 1, q1, · 0.5
    assert [s.kind for s in engine.steps].count("calls") == 2                  # erf, and 2 / x
    x = model.random_input(3, rng=0) * 4
    np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)


def test_every_layernorm_of_a_plain_tensor_is_onednns_layer_normalization():
    """A layernorm is oneDNN's layer normalization (jit), right at every batch, allocating nothing
    per warm forward: where no linear reads it alone (after it: a quantize step, a transpose, the
    model's end), gamma and beta its scale and shift; where one does, folded into that linear and
    the primitive standardizing only (it was nine NumPy calls)."""
    from engines.ir.models import Model, Op
    from tests.test_zero_alloc import tracemalloc_peak
    rng = np.random.default_rng(0)
    params = {"g": rng.uniform(0.5, 2, 40).astype(np.float32), "b": rng.standard_normal(40).astype(np.float32),
              "w": rng.standard_normal((40, 40)).astype(np.float32), "c": np.zeros(40, np.float32)}
    ops = (Op("layernorm", ("x",), "n", ("g", "b"), {"eps": 1e-5}), Op("relu", ("n",), "r"),
           Op("layernorm", ("r",), "m", ("g", "b"), {"eps": 1e-5}), Op("linear", ("m",), "y", ("w", "c")))
    model = Model("layernorms", ops, {t: (6, 40) for t in ("x", "n", "r", "m", "y")}, params)
    engine = ENGINES["onednn"](model, 3)
    kinds = [s.kind for s in engine.steps]
    assert kinds.count("dnnl_layernorm") == 2 and "standardize" not in kinds, kinds
    assert [len(s.operands) for s in engine.steps if s.kind == "dnnl_layernorm"] == [2, 0]
    assert all(p["implementation"].startswith("jit") for p in engine.report()["primitives"] if p["kind"] == "layernorm")
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch) * 3 + 1
        np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)
    assert tracemalloc_peak(engine, model.random_input(3, rng=0)) <= 4096


def test_a_primitive_whose_call_fails_raises_when_bound(monkeypatch):
    """The forward runs oneDNN's calls unchecked; ``bind`` runs each once with its status checked,
    so a call oneDNN refuses (here: its output argument left out) raises there."""
    from engines import MODELS
    engine = ENGINES["onednn"](MODELS["transformer"](dim=16, seq=4, heads=2), 2)
    real = onednn.OneDnnEngine.execute

    def without_output(self, pd, args, step):
        return real(self, pd, {k: v for k, v in args.items() if k != native_onednn.DST}, step)
    monkeypatch.setattr(onednn.OneDnnEngine, "execute", without_output)
    with pytest.raises(native_onednn.DnnlError, match="execution failed"):
        engine.bind(1)


@pytest.mark.parametrize("values, on_onednn", [(1 << 10, False), (1 << 15, True)])
def test_a_lone_scalar_op_is_a_primitive_from_a_size_on(values, on_onednn):
    """A scalar op no chain follows (a quantized file's x / sqrt 2, read by erf and by the product
    after it) is NumPy's one pass on a small sample and a oneDNN chain step on a large one
    (``LONE_SCALAR_MIN``); right either way."""
    from engines.ir.models import Model, Op
    ops = (Op("erf", ("x",), "a"), Op("binary", ("a",), "d", attrs={"fn": "div", "scalar": 1.4142135}),
           Op("erf", ("d",), "e"), Op("binary", ("a", "e"), "y", attrs={"fn": "mul"}))
    model = Model("lone-scalar", ops, {t: (values,) for t in ("x", "a", "d", "e", "y")}, {})
    engine = ENGINES["onednn"](model, 2)
    divide = next(s for s in engine.steps if s.out == "d")       # the first to write d (erf then runs in place there)
    assert (divide.kind == "dnnl_binary") == on_onednn, [(s.kind, s.reads, s.out) for s in engine.steps]
    for batch in (1, 2):
        x = model.random_input(batch, rng=batch)
        np.testing.assert_allclose(engine.forward(x), model.reference(x), rtol=1e-5, atol=1e-6)


def _gelu_models():
    """The zoo's transformer (its GELU in place on a linear's output) and a GELU of the model's
    input read again after it (not in place)."""
    from engines import MODELS as ZOO
    from engines.ir.models import Model, Op
    ops = (Op("gelu", ("x",), "g"), Op("add", ("g", "x"), "y"))
    return [ZOO["transformer"](dim=64, seq=8, heads=4, seed=1), Model("gelu-input", ops, {t: (5, 24) for t in "xgy"}, {})]


@pytest.mark.parametrize("model", _gelu_models(), ids=lambda m: m.name)
@pytest.mark.parametrize("avx512", [False, True])
def test_gelu_tanh_without_avx512_is_x_times_x_with_post_ops(monkeypatch, model, avx512):
    """Without AVX-512, GELU's tanh form is oneDNN's binary x * x with ``gelu_tanh_chain`` as its
    post-ops (oneDNN 3.2's own gelu_tanh ran 4x slower on AVX2), with it oneDNN's own: right at
    every batch, in place or not, and where tanh saturates (inputs scaled by 8)."""
    made, real = [], onednn._gelu_tanh_calls
    monkeypatch.setattr(onednn, "avx512", lambda dnnl: avx512)
    monkeypatch.setattr(onednn, "_gelu_tanh_calls", lambda *a: made.append(a[1].out) or real(*a))
    engine = ENGINES["onednn"](model, 3)
    assert any(s.kind == "dnnl_eltwise" and s.attrs["activation"] == "gelu" for s in engine.steps)
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch) * 8
        np.testing.assert_allclose(engine.forward(x), model.reference(x), atol=engine.abs_tol, rtol=engine.rel_tol)
    assert bool(made) != avx512, made
    assert tracemalloc_peak(engine, model.random_input(3, rng=0)) <= 4096


@pytest.mark.parametrize("out_shape, add_shape", [((8, 4, 16, 16), (1, 1, 16, 16)), ((8, 4, 16, 16), (8, 1, 1, 16)),
                                                  ((4, 4, 16, 16), (1, 4, 16, 16)), ((3, 2, 5, 7), (7,))])
def test_a_broadcast_add_after_a_product_is_one_onednn_call(out_shape, add_shape):
    """out += add broadcast along any axes (a mask over attention's scores, where no brgemm matmul
    takes it as a post-op: AVX2) is one oneDNN binary call, exact, allocating nothing; it was one
    NumPy add per block (512 for the (8, 1, 1, 16) mask). A strided block of a per-head mask,
    which oneDNN takes only in its reference code, still gets NumPy's adds."""
    from engines.kernels.table import run_calls
    from engines.planned.fused import FusedStep
    engine, rng = ENGINES["onednn"](_gelu_models()[1], 1), np.random.default_rng(0)
    out, add = rng.standard_normal(out_shape).astype(np.float32), rng.standard_normal(add_shape).astype(np.float32)
    expected, step = out + add, FusedStep("dnnl_attention", "scores", ())
    calls = onednn._add_calls(engine, step, out, add)
    assert len(calls) == 1 and engine.report()["primitives"][-1]["implementation"].startswith("jit")
    run_calls(calls)
    np.testing.assert_array_equal(out, expected)
    import tracemalloc
    tracemalloc.start()
    run_calls(calls)
    assert tracemalloc.get_traced_memory()[1] <= 1024
    tracemalloc.stop()
    mask = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)[:, :, 4:8]      # a block of its rows
    out = rng.standard_normal((2, 4, 4, 16)).astype(np.float32)
    expected = out + mask
    run_calls(onednn._add_calls(engine, step, out, mask))
    np.testing.assert_array_equal(out, expected)

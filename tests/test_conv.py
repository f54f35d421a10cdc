"""The CNN op kinds (engines.ir.conv): each kind's calls against its float64 eager form and against
ONNX Runtime on a one-node ONNX model, no array allocation per warm call, and hand-built CNNs
on every NumPy engine."""
from __future__ import annotations

import math
import os
import tempfile
import tracemalloc
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from threadpoolctl import threadpool_limits

from conftest import make_engine
from engines.ir import conv
from engines.ir.conv import CONV_OPS, POOL_PREFIX, Window, fold_batchnorm
from engines.ir.models import Model, Op
from engines.ir.ops import OPS

onnx = pytest.importorskip("onnx", reason="ONNX models are built with the onnx package (extra peers)")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the peer these kinds are checked against")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

BATCHES = (1, 4)
OPSET = 13


def tolerance(ref: np.ndarray) -> float:
    return 2e-5 * max(1.0, float(np.max(np.abs(ref))))


# --- running one kind: as an engine binds it, and as ONNX Runtime runs it ------------------

def bind(kind: str, inputs, params, attrs):
    """The kind's calls bound to fresh buffers, as an engine binds them; scratch and output
    start as NaN so that a call reading memory it never wrote shows."""
    op = OPS[kind]
    batch = inputs[0].shape[0]
    out_shape = op.eager(*inputs, *params, **attrs).shape
    scratch = [np.full((batch, *s), np.nan, np.float32)
               for s in op.scratch_shapes([x.shape[1:] for x in inputs], attrs)]
    out = np.full(out_shape, np.nan, np.float32)
    return out, op.calls(out, *inputs, *op.operands(params, 64), *scratch, **attrs)


def run_calls(calls) -> None:
    for fn, args in calls:
        fn(*args)


def onnx_nodes(kind: str, inputs: list[str], params: list[str], attrs: dict, out: str):
    """The ONNX node(s) computing kind, and extra initializers they need."""
    a = dict(attrs)
    if kind == "conv_maxpool":                # the conv's nodes, then a MaxPool
        pool = {k[len(POOL_PREFIX):]: a.pop(k) for k in list(a) if k.startswith(POOL_PREFIX)}
        a.pop("out_channels")
        nodes, extra = onnx_nodes("conv", inputs, params, a, "conv_out")
        return nodes + [helper.make_node("MaxPool", ["conv_out"], [out], **pool)], extra
    if kind in ("conv", "conv_add"):          # Conv (then Add of the residual), then the activation
        act, lo, hi = a.pop("activation", "none"), a.pop("clip_min", None), a.pop("clip_max", None)
        pre = out if act == "none" else "pre"
        conv_out = "conv_out" if kind == "conv_add" else pre
        nodes = [helper.make_node("Conv", inputs[:1] + params, [conv_out], **a)]
        if kind == "conv_add":
            nodes.append(helper.make_node("Add", [conv_out, inputs[1]], [pre]))
        if act == "none":
            return nodes, {}
        if act == "relu":
            return nodes + [helper.make_node("Relu", ["pre"], [out])], {}
        return (nodes + [helper.make_node("Clip", ["pre", "lo", "hi"], [out])],
                {"lo": np.float32(lo), "hi": np.float32(hi)})
    if kind == "clip":                       # the importer's kind: lo, hi
        return ([helper.make_node("Clip", inputs + ["lo", "hi"], [out])],
                {"lo": np.float32(a["lo"]), "hi": np.float32(a["hi"])})
    if kind == "concat":                     # the importer's kind: a per-sample axis
        return [helper.make_node("Concat", inputs, [out], axis=a["axis"] + 1)], {}
    if kind == "transpose":                  # the importer's kind: a per-sample permutation
        return [helper.make_node("Transpose", inputs, [out], perm=[0, *(p + 1 for p in a["perm"])])], {}
    if kind == "pad":
        return ([helper.make_node("Pad", inputs + ["pads", "value"], [out], mode="constant")],
                {"pads": np.array(a["pads"], np.int64), "value": np.float32(a.get("value", 0.0))})
    names = {"maxpool": "MaxPool", "averagepool": "AveragePool", "globalaveragepool": "GlobalAveragePool",
             "lrn": "LRN", "batchnorm": "BatchNormalization", "sum": "Sum", "sigmoid": "Sigmoid"}
    return [helper.make_node(names[kind], inputs + params, [out], **a)], {}


def onnxruntime_run(kind: str, inputs, params, attrs) -> np.ndarray:
    in_names = [f"in{i}" for i in range(len(inputs))]
    param_names = [f"p{i}" for i in range(len(params))]
    nodes, extra = onnx_nodes(kind, in_names, param_names, attrs, "y")
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in [*zip(param_names, params), *extra.items()]]
    graph = helper.make_graph(
        nodes, kind, [helper.make_tensor_value_info(n, TensorProto.FLOAT, x.shape) for n, x in zip(in_names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(in_names, inputs)))[0]


def check_kind(kind: str, inputs, params=(), with_onnxruntime=True, **attrs):
    """calls == float64 eager == ONNX Runtime, within float32 rounding."""
    ref = OPS[kind].eager(*(x.astype(np.float64) for x in inputs), *(p.astype(np.float64) for p in params), **attrs)
    out, calls = bind(kind, inputs, params, attrs)
    run_calls(calls)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance(ref), err_msg=f"{kind} {attrs}: calls")
    eager32 = OPS[kind].eager(*inputs, *params, **attrs)
    assert eager32.dtype == np.float32, f"{kind}'s eager form in float32 must stay float32 (naive engine)"
    np.testing.assert_allclose(eager32, ref, rtol=0, atol=tolerance(ref), err_msg=f"{kind} {attrs}: eager")
    if with_onnxruntime:
        theirs = onnxruntime_run(kind, inputs, params, attrs)
        np.testing.assert_allclose(theirs, ref, rtol=0, atol=tolerance(ref), err_msg=f"{kind} {attrs}: onnxruntime")


def normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv_params(rng, out_ch, cg, kh, kw):
    return normal(rng, (out_ch, cg, kh, kw), 1 / math.sqrt(cg * kh * kw)), normal(rng, (out_ch,), 0.5)


# --- conv: every lowering, many attribute combinations ---------------------------------

@st.composite
def conv_cases(draw, paths=("dense", "grouped", "depthwise", "1x1", "1x1-grouped")):
    path = draw(st.sampled_from(paths))
    group = {"dense": 1, "1x1": 1}.get(path) or draw(st.integers(2, 4))
    # one channel per group is depthwise: its own path, without a channel multiplier
    cg = {"depthwise": 1, "grouped": draw(st.integers(2, 4))}.get(path) or draw(st.integers(1, 4))
    og = 1 if path == "depthwise" else draw(st.integers(1, 4))
    if path.startswith("1x1"):
        kernel, strides, dilations, pads = (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)
    else:
        kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        dilations = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        pads = tuple(draw(st.integers(0, 2)) for _ in range(4))        # symmetric or not
    hw = [draw(st.integers(d * (k - 1) + 1, 12)) for d, k in zip(dilations, kernel)]
    act = draw(st.sampled_from(["none", "relu", "clip"]))
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations, group=group)
    if act != "none":
        attrs["activation"] = act
    if act == "clip":
        attrs.update(clip_min=-0.5, clip_max=0.8)
    return (group * cg, *hw), group * og, attrs


@settings(max_examples=60, deadline=None)
@given(case=conv_cases(), batch=st.sampled_from(BATCHES), seed=st.integers(0, 2**16))
def test_conv_matches_reference_and_onnxruntime(case, batch, seed):
    (channels, h, w), out_ch, attrs = case
    rng = np.random.default_rng(seed)
    params = conv_params(rng, out_ch, channels // attrs["group"], *attrs["kernel_shape"])
    x = normal(rng, (batch, channels, h, w))
    check_kind("conv", [x], params, **attrs)
    with mock.patch.object(conv, "COL_BYTES", 1):          # im2col one output row at a time
        check_kind("conv", [x], params, with_onnxruntime=False, **attrs)


# About 45 % of the draws are discarded (a conv on another lowering, or an output smaller than
# the pool's window): more than the filtering health check expects, and cheap.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(case=conv_cases(paths=("dense", "grouped")), data=st.data(), batch=st.sampled_from(BATCHES),
       seed=st.integers(0, 2**16))
def test_conv_then_maxpool_matches_reference_and_onnxruntime(case, data, batch, seed):
    (channels, h, w), out_ch, attrs = case
    win = Window.of(**attrs)
    assume(conv.conv_path(channels, win, attrs["group"]) == "im2col")
    oh, ow = win.out_size(h, w)
    _, pool = data.draw(pool_cases("maxpool"))
    span = [d * (k - 1) + 1 for d, k in zip(pool["dilations"], pool["kernel_shape"])]
    assume(oh >= span[0] and ow >= span[1])
    attrs = {**attrs, "out_channels": out_ch, **{POOL_PREFIX + k: v for k, v in pool.items()}}
    rng = np.random.default_rng(seed)
    params = conv_params(rng, out_ch, channels // attrs["group"], *attrs["kernel_shape"])
    x = normal(rng, (batch, channels, h, w))
    check_kind("conv_maxpool", [x], params, **attrs)
    # one pooled row per block, and one conv row per im2col block
    with mock.patch.object(conv, "BAND_BYTES", 1), mock.patch.object(conv, "COL_BYTES", 1):
        check_kind("conv_maxpool", [x], params, with_onnxruntime=False, **attrs)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("act", [{}, dict(activation="relu"), dict(activation="clip", clip_min=-0.5, clip_max=0.8)])
def test_conv_add_matches_reference_and_onnxruntime(act, batch, rng):
    # 24 x 24 planes, 32 outputs, 1 MiB blocks patched to 5 rows: 7 blocks, the last short
    x, r = normal(rng, (batch, 12, 24, 24)), normal(rng, (batch, 32, 24, 24))
    w, b = conv_params(rng, 32, 12, 1, 1)
    check_kind("conv_add", [x, r], (w, b), kernel_shape=(1, 1), **act)
    with mock.patch.object(conv, "COL_BYTES", 5 * 4 * 24 * 24):
        check_kind("conv_add", [x, r], (w, np.zeros_like(b)), with_onnxruntime=False, kernel_shape=(1, 1), **act)
        # in place: the output is the residual's own storage, as the planner gives it
        expected = OPS["conv_add"].eager(x, r, w, b, kernel_shape=(1, 1), **act)
        op = OPS["conv_add"]
        scratch = [np.full((batch, *s), np.nan, np.float32)
                   for s in op.scratch_shapes([x.shape[1:], r.shape[1:]], dict(kernel_shape=(1, 1)))]
        assert scratch[0].shape[1] == 5
        run_calls(op.calls(r, x, r, *op.operands((w, b), 64), *scratch, kernel_shape=(1, 1), **act))
        np.testing.assert_allclose(r, expected, rtol=0, atol=tolerance(expected))


def test_conv_then_maxpool_holds_a_band_not_the_conv_output():
    # SqueezeNet's first conv and pool: 64 x 111 x 111 conv rows (3.2 MB) pooled to 55 x 55
    attrs = dict(kernel_shape=(3, 3), strides=(2, 2), activation="relu", out_channels=64,
                 pool_kernel_shape=(3, 3), pool_strides=(2, 2))
    shapes = OPS["conv_maxpool"].scratch_shapes([(3, 224, 224)], attrs)
    band = shapes[1]
    assert band[0] == 64 and band[2] == 111 and 1 < band[1] < 111
    assert 4 * sum(math.prod(s) for s in shapes) < 4 * 64 * 111 * 111 / 2


@pytest.mark.parametrize("attrs, path", [
    (dict(kernel_shape=(1, 1)), "gemm"),
    (dict(kernel_shape=(1, 1), group=2), "gemm"),
    (dict(kernel_shape=(1, 1), strides=(2, 2)), "im2col"),
    (dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), group=8), "depthwise"),
    (dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), group=2), "im2col"),
])
def test_conv_takes_the_lowering_its_shape_allows(attrs, path):
    from engines.ir.conv import conv_attrs, conv_path
    win, group, _ = conv_attrs(attrs)
    assert conv_path(8, win, group) == path
    if path != "im2col":      # no im2col workspace: at most a per-channel block or one tap
        kk = win.kernel[0] * win.kernel[1]
        col = 8 // group * kk * 16 * 16
        assert all(math.prod(s) < col * group or kk == 1 for s in OPS["conv"].scratch_shapes([(8, 16, 16)], attrs))


@pytest.mark.parametrize("batch", BATCHES)
def test_im2col_in_row_blocks_matches_onnxruntime(batch, rng):
    # 3 x 3 over 32 channels of 48 x 48: 289 x 48 floats a row, 18 rows in 1 MiB, 3 blocks
    attrs = dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), strides=(1, 1), group=1)
    assert OPS["conv"].scratch_shapes([(32, 48, 48)], attrs) == ((1, 289, 18 * 48),)
    check_kind("conv", [normal(rng, (batch, 32, 48, 48))], conv_params(rng, 8, 32, 3, 3), **attrs)


def test_conv_refuses_mismatched_weights():
    x = np.zeros((1, 4, 8, 8), np.float32)
    with pytest.raises(ValueError, match="kernel"):
        OPS["conv"].eager(x, np.zeros((2, 4, 3, 3), np.float32), np.zeros(2, np.float32), kernel_shape=(5, 5))
    depthwise = dict(kernel_shape=(3, 3), group=4)
    with pytest.raises(ValueError, match="channel multiplier"):
        bind("conv", [np.zeros((1, 4, 8, 8), np.float32)], conv_params(np.random.default_rng(0), 8, 1, 3, 3), depthwise)
    with pytest.raises(ValueError, match="2-D only"):
        OPS["conv"].scratch_shapes([(4, 8, 8)], dict(kernel_shape=(3, 3, 3)))


def test_fold_batchnorm_equals_conv_then_batchnorm(rng):
    x = normal(rng, (2, 6, 9, 9))
    w, b = conv_params(rng, 5, 6, 3, 3)
    bn = [normal(rng, (5,)) for _ in range(3)] + [rng.random(5).astype(np.float32) + 0.1]
    attrs = dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    f64 = lambda *a: [np.asarray(v, np.float64) for v in a]   # noqa: E731
    expected = OPS["batchnorm"].eager(OPS["conv"].eager(*f64(x, w, b), **attrs), *f64(*bn), epsilon=1e-3)
    wf, bf = fold_batchnorm(w, b, *bn, eps=1e-3)
    np.testing.assert_allclose(OPS["conv"].eager(*f64(x), wf, bf, **attrs), expected, rtol=1e-10, atol=1e-10)
    # a Gemm's (out, in) weights fold the same way
    wl, bl = normal(rng, (5, 7)), normal(rng, (5,))
    v = normal(rng, (3, 7)).astype(np.float64)
    wlf, blf = fold_batchnorm(wl, bl, *bn, eps=1e-3)
    s = bn[0] / np.sqrt(bn[3].astype(np.float64) + 1e-3)
    np.testing.assert_allclose(v @ wlf.T + blf, (v @ wl.T + bl - bn[2]) * s + bn[1], rtol=1e-10, atol=1e-10)


# --- pools -----------------------------------------------------------------------

@st.composite
def pool_cases(draw, kind):
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    attrs = dict(kernel_shape=kernel, strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
                 pads=tuple(draw(st.integers(0, kernel[i % 2] - 1)) for i in range(4)),   # ORT: pad < kernel
                 ceil_mode=draw(st.integers(0, 1)))
    if kind == "maxpool":
        attrs["dilations"] = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    else:
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    span = [d * (k - 1) + 1 for d, k in zip(attrs.get("dilations", (1, 1)), kernel)]
    return (draw(st.integers(1, 5)), *(draw(st.integers(s, 11)) for s in span)), attrs


@pytest.mark.parametrize("kind", ["maxpool", "averagepool"])
@settings(max_examples=40, deadline=None)
@given(data=st.data(), batch=st.sampled_from(BATCHES))
def test_pools_match_reference_and_onnxruntime(kind, data, batch):
    shape, attrs = data.draw(pool_cases(kind))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    check_kind(kind, [normal(rng, (batch, *shape))], **attrs)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("kind, attrs", [
    ("maxpool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(0, 0, 1, 1))),      # asymmetric (AlexNet)
    ("averagepool", dict(kernel_shape=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1))),  # Inception's, exclude pad
    ("averagepool", dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=1, ceil_mode=1)),
    ("averagepool", dict(kernel_shape=(7, 7), strides=(1, 1), pads=(0, 0, 1, 1))),  # Inception v1's last
])
def test_pools_of_the_light_models(kind, attrs, batch, rng):
    check_kind(kind, [normal(rng, (batch, 6, 9, 9))], **attrs)


def test_ceil_mode_drops_a_window_starting_past_the_input():
    # 5 wide, kernel 2, stride 2, pad 1: ceil gives 4 windows, but the 4th would start in the end pad
    assert Window.of(kernel_shape=(2, 2), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1).out_size(5, 5) == (3, 3)


# --- the other kinds -----------------------------------------------------------------

@pytest.mark.parametrize("batch", BATCHES)
def test_other_kinds_match_reference_and_onnxruntime(batch, rng):
    x = normal(rng, (batch, 7, 6, 5))
    check_kind("globalaveragepool", [x])
    for size, alpha, beta, bias in [(5, 1e-4, 0.75, 1.0), (3, 5e-4, 0.75, 2.0), (4, 0.2, 0.5, 1.5)]:
        # ONNX Runtime refuses an even size; the spec's window (c - 1, c + 2 for 4) is checked eagerly
        check_kind("lrn", [x * 10], size=size, alpha=alpha, beta=beta, bias=bias, with_onnxruntime=size % 2 == 1)
    bn = (normal(rng, (7,)), normal(rng, (7,)), normal(rng, (7,)), rng.random(7).astype(np.float32) + 0.1)
    check_kind("batchnorm", [x], bn, epsilon=1e-5)
    check_kind("pad", [x], pads=(0, 1, 0, 2, 0, 0, 3, 1), value=0.0)
    check_kind("pad", [x], pads=(0, 0, 1, 1, 0, 2, 1, 0), value=-1.5)
    check_kind("sum", [x, normal(rng, x.shape)])
    check_kind("sum", [x, normal(rng, x.shape), normal(rng, x.shape), normal(rng, x.shape)])


# Concat, Transpose, Sigmoid and Clip are the ONNX importer's kinds (engines.ir.ops, per-sample axes):
# what CNNs need of them is checked here where they exist.
IMPORTER_KINDS = ("concat", "transpose", "sigmoid", "clip")
needs_importer_kinds = pytest.mark.skipif(not set(IMPORTER_KINDS) <= set(OPS),
                                          reason="concat/transpose/sigmoid/clip come with the ONNX importer's ops")


@needs_importer_kinds
@pytest.mark.parametrize("batch", BATCHES)
def test_importer_kinds_as_cnns_use_them(batch, rng):
    x = normal(rng, (batch, 7, 6, 5))
    check_kind("concat", [x, normal(rng, (batch, 3, 6, 5)), normal(rng, (batch, 1, 6, 5))], axis=0, order="ttt")
    check_kind("transpose", [x.reshape(batch, 7, 3, 2, 5)], perm=(1, 0, 2, 3))   # ShuffleNet's shuffle
    check_kind("sigmoid", [x * 3])
    check_kind("clip", [x], lo=0.0, hi=6.0)                                      # ReLU6


@pytest.mark.parametrize("batch", BATCHES)
def test_blocked_lrn_and_batchnorm_match_onnxruntime(batch, rng):
    # LRN over 96 channels of 40 x 40 in blocks of 682 pixels; batchnorm over 96 x 96 planes in
    # blocks of 7 channels: both with a partial last block
    assert OPS["lrn"].scratch_shapes([(96, 40, 40)]) == ((96, 682),)
    assert OPS["batchnorm"].scratch_shapes([(16, 96, 96)]) == ((7, 96 * 96),)
    check_kind("lrn", [normal(rng, (batch, 96, 40, 40), 10)], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    bn = (normal(rng, (16,)), normal(rng, (16,)), normal(rng, (16,)), rng.random(16).astype(np.float32) + 0.1)
    check_kind("batchnorm", [normal(rng, (batch, 16, 96, 96))], bn, epsilon=1e-5)


def test_kinds_refuse_what_they_cannot_run():
    x = np.zeros((1, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match="batch"):
        OPS["pad"].eager(x, pads=(1, 0, 0, 0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="constant"):
        OPS["pad"].eager(x, pads=(0,) * 8, mode="reflect")
    with pytest.raises(ValueError, match="unknown attributes"):
        OPS["maxpool"].scratch_shapes([(2, 3, 3)], dict(kernel_shape=(2, 2), storage_order=1))


# --- zero allocation per warm call ----------------------------------------------------

# Shapes large enough that NumPy's ufunc buffer (8192 elements, 32 KiB) would be one, were any
# call to take it: outputs of >= 16 x 24 x 24 = 9216 elements.
ALLOC_CASES = {
    "conv-3x3": ("conv", (16, 24, 24), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), activation="relu"), 16),
    "conv-3x3-row-blocks": ("conv", (16, 64, 64), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), 16),   # 3 blocks
    "conv-3x3-s2-asym": ("conv", (16, 49, 49), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(0, 0, 1, 1)), 16),
    "conv-grouped": ("conv", (16, 24, 24), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), group=4,
                                                activation="clip", clip_min=0.0, clip_max=6.0), 16),
    "conv-1x1": ("conv", (16, 24, 24), dict(kernel_shape=(1, 1)), 32),
    "conv-1x1-grouped": ("conv", (16, 24, 24), dict(kernel_shape=(1, 1), group=4), 32),
    "conv-depthwise": ("conv", (16, 24, 24), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), group=16), 16),
    "conv-add": ("conv_add", (16, 96, 96), dict(kernel_shape=(1, 1), activation="relu"), 32),  # 2 blocks
    "conv-add-small-plane": ("conv_add", (16, 6, 6), dict(kernel_shape=(1, 1)), 32),   # the batch in one call
    "conv-maxpool": ("conv_maxpool", (16, 49, 49),                        # 2 blocks of pooled rows
                     dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), activation="relu", out_channels=16,
                          pool_kernel_shape=(3, 3), pool_strides=(2, 2), pool_pads=(1, 1, 1, 1)), 16),
    "maxpool": ("maxpool", (16, 49, 49), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), None),
    "maxpool-ceil": ("maxpool", (16, 48, 48), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), None),
    "averagepool-exclude-pad": ("averagepool", (16, 24, 24), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), None),
    "averagepool-include-pad": ("averagepool", (16, 24, 24),
                                dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), count_include_pad=1), None),
    "globalaveragepool": ("globalaveragepool", (64, 24, 24), {}, None),
    "lrn": ("lrn", (96, 40, 40), dict(size=5, alpha=1e-4, beta=0.75, bias=1.0), None),   # 3 pixel blocks
    "batchnorm": ("batchnorm", (16, 96, 96), dict(epsilon=1e-5), None),                 # 3 channel blocks
    "pad": ("pad", (16, 24, 24), dict(pads=(0, 0, 1, 2, 0, 0, 2, 1), value=0.0), None),
    "sum": ("sum", (16, 24, 24), {}, None),
}
BOOKKEEPING_BYTES = 4096
WARMUP, SESSIONS = 3, 3


def alloc_case(name, batch, rng):
    kind, shape, attrs, out_ch = ALLOC_CASES[name]
    x = normal(rng, (batch, *shape))
    inputs, params = [x], []
    if kind in ("conv", "conv_add", "conv_maxpool"):
        params = conv_params(rng, out_ch, shape[0] // attrs.get("group", 1), *attrs["kernel_shape"])
    elif kind == "batchnorm":
        params = [normal(rng, (shape[0],)) for _ in range(3)] + [rng.random(shape[0]).astype(np.float32) + 0.1]
    elif kind == "sum":
        inputs = [x, normal(rng, x.shape), normal(rng, x.shape)]
    if kind == "conv_add":
        inputs.append(normal(rng, (batch, out_ch, *shape[1:])))
    _, calls = bind(kind, inputs, params, attrs)
    return calls


def traced_peak(calls) -> int:
    for _ in range(WARMUP):
        run_calls(calls)
    peaks = []
    for _ in range(SESSIONS):
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            run_calls(calls)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
    return min(peaks)


def memray_peak(calls) -> int:
    memray = pytest.importorskip("memray", reason="memray is part of the bench extra")
    with threadpool_limits(1), tempfile.TemporaryDirectory() as tmp:
        for _ in range(WARMUP):
            run_calls(calls)
        peaks = []
        for session in range(SESSIONS):
            path = os.path.join(tmp, f"{session}.bin")
            with memray.Tracker(path):
                run_calls(calls)
            peaks.append(memray.FileReader(path).metadata.peak_memory)
        return min(peaks)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", sorted(ALLOC_CASES))
def test_warm_calls_allocate_no_arrays(name, batch, rng):
    calls = alloc_case(name, batch, rng)
    assert traced_peak(calls) <= BOOKKEEPING_BYTES
    assert memray_peak(calls) <= BOOKKEEPING_BYTES


def test_the_allocation_check_sees_a_ufunc_buffer(rng):
    # A per-channel bias added by broadcasting, the trap the kinds avoid: NumPy's 32 KiB buffer.
    y, bias = normal(rng, (1, 16, 24 * 24)), normal(rng, (16, 1))
    calls = [(np.add, (y, bias, y))]
    assert traced_peak(calls) > BOOKKEEPING_BYTES
    assert memray_peak(calls) > BOOKKEEPING_BYTES


def test_every_kind_has_an_allocation_case():
    # (the importer's own kinds are its tests' to measure)
    assert {case[0] for case in ALLOC_CASES.values()} == set(CONV_OPS)


# --- hand-built CNNs on every NumPy engine ------------------------------------------------

NUMPY_ENGINES = ["naive", "static", "arena", "fused", "packed", "onednn"]


class CNNBuilder:
    """Ops appended by hand from the zoo's Model/Op IR, each output's shape from the eager form."""

    def __init__(self, name, input_shape, seed):
        self.name, self.rng = name, np.random.default_rng(seed)
        self.ops, self.shapes, self.params = [], {"x": input_shape}, {}

    def op(self, kind, inputs, params=(), **attrs):
        name = f"t{len(self.ops)}"
        for i, p in enumerate(params):
            self.params[f"{name}.p{i}"] = p
        probe = [np.zeros((1, *self.shapes[t]), np.float64) for t in inputs]
        self.shapes[name] = OPS[kind].eager(*probe, *params, **attrs).shape[1:]
        self.ops.append(Op(kind, tuple(inputs), name, tuple(f"{name}.p{i}" for i in range(len(params))), attrs))
        return name

    def conv(self, x, out_ch, kernel, group=1, **attrs):
        cg = self.shapes[x][0] // group
        params = conv_params(self.rng, out_ch, cg, *kernel)
        return self.op("conv", [x], params, kernel_shape=kernel, group=group, **attrs)

    def batchnorm(self, x):
        c = self.shapes[x][0]
        bn = [normal(self.rng, (c,)) for _ in range(3)] + [self.rng.random(c).astype(np.float32) + 0.5]
        return self.op("batchnorm", [x], bn, epsilon=1e-5)

    def build(self):
        return Model(self.name, tuple(self.ops), self.shapes, self.params)


def small_cnn(seed=0) -> Model:
    """Every kind, every conv lowering, branches that join (sum; concat where the importer's kinds
    exist), a kind from ops (relu)."""
    b = CNNBuilder("small-cnn", (3, 17, 17), seed)
    c1 = b.conv("x", 8, (3, 3), pads=(1, 1, 1, 1), activation="relu")
    p1 = b.op("maxpool", [c1], kernel_shape=(3, 3), strides=(2, 2), pads=(0, 0, 1, 1))      # 8 x 8 x 8
    g1 = b.batchnorm(b.conv(p1, 8, (1, 1), group=2))
    dw = b.conv(g1, 8, (3, 3), group=8, pads=(1, 1, 1, 1), activation="clip", clip_min=0.0, clip_max=6.0)
    e1 = b.conv(p1, 4, (1, 1))
    e3 = b.conv(p1, 4, (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2))
    joined = b.op("concat", [e1, e3], axis=0, order="tt") if "concat" in OPS else b.conv(p1, 8, (1, 1))
    s = b.op("sum", [dw, joined, p1])
    r = b.op("relu", [s])
    lrn = b.op("lrn", [r], size=3, alpha=1e-2, beta=0.75, bias=1.0)
    a = b.op("averagepool", [lrn], kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)
    pd = b.op("pad", [a], pads=(0, 0, 1, 0, 0, 0, 0, 1), value=0.0)
    if set(IMPORTER_KINDS) <= set(OPS):
        t = b.op("transpose", [pd], perm=(0, 2, 1))
        sg = b.op("sigmoid", [b.conv(t, 6, (2, 2), strides=(2, 2))])
        last = b.op("clip", [sg], lo=0.2, hi=0.7)
    else:
        last = b.conv(pd, 6, (2, 2), strides=(2, 2), activation="clip", clip_min=0.2, clip_max=0.7)
    b.op("globalaveragepool", [last])
    return b.build()


@pytest.mark.parametrize("engine_name", NUMPY_ENGINES)
def test_hand_built_cnn_runs_on_every_numpy_engine(engine_name, rng):
    model = small_cnn()
    engine = make_engine(engine_name, model, 4)
    for batch in (4, 1):                      # the larger first: the smaller runs on dirtied buffers
        x = model.random_input(batch, rng)
        ref = model.reference(x)
        out = np.array(engine.forward(x))
        assert out.shape == ref.shape == (batch, 6, 1, 1)
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance(ref))
    if engine.zero_alloc:
        x = model.random_input(4, rng)
        assert traced_peak([(engine.forward, (x,))]) <= BOOKKEEPING_BYTES


def test_planned_cnn_reuses_memory():
    arena = make_engine("arena", small_cnn(), 1)
    plan = arena.report()
    assert plan["lower_bound_bytes"] <= plan["arena_bytes"] < plan["no_reuse_bytes"]

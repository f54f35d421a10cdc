"""The importer's fusions, one pattern each: a graph built with ``onnx.helper`` holding the pattern
as exporters write it becomes the fused kind and still matches ONNX Runtime on every NumPy engine
at batch 1 and 4; a graph that almost matches stays generic and matches too.

The patterns are those of Hugging Face exports (scripts/export_zoo.py): attention with a folded
causal or padding mask and SDPA's NaN guard (GPT-2, BERT, DistilBERT), an export's mask of zeros
(the dynamo exports of ViT and wav2vec 2.0), T5's unscaled attention with its position bias and
padding mask added one after the other, GPT-2's GELU in tanh form, RMSNorm (T5's and the decoders'),
the decoders' rotary embedding and their attention (key/value heads repeated for grouped queries),
and ConvNeXt's layer scale after its transpose back to channels-first, SiLU (a Sigmoid times its input), and a
residual sum after a conv (ResNet).
"""
import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="importing ONNX files needs the peers extra")
ort = pytest.importorskip("onnxruntime", reason="the comparison runs ONNX Runtime on the file")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engines import ENGINES, load_onnx  # noqa: E402
from engines.importer import passes  # noqa: E402

OWN = ["naive", "static", "arena", "fused", "packed", "onednn"]
BATCHES = (1, 4)
SEQ, DIM, HEADS = 4, 8, 2
N = helper.make_node
RNG = np.random.default_rng(7)


def _i64(*v):
    return np.array(v, dtype=np.int64)


def _f32(v):
    return np.asarray(v, dtype=np.float32)


def build(nodes, inits, in_shape=("N", SEQ, DIM), out_shape=None, opset=17) -> bytes:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape or in_shape))
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def check(data: bytes) -> list[str]:
    """Every NumPy engine against ONNX Runtime on the file at batch 1 and 4, to 1e-4 relative to
    the largest output; the op kinds after the passes."""
    model = load_onnx(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in BATCHES:
        x = model.random_input(batch, rng=batch)
        expected = session.run(None, {"x": x})[0]
        bar = 1e-4 * max(1.0, float(np.abs(expected).max()))
        for name in OWN:
            got = ENGINES[name](model, max(BATCHES)).forward(x)
            assert np.abs(got - expected).max() <= bar, f"{name} at batch {batch}"
    return [op.kind for op in model.ops]


def causal() -> np.ndarray:
    return np.triu(np.full((SEQ, SEQ), -np.inf, np.float32), 1)


def sdpa(mask=None, guard: float | None = 0.0, scale: float = (DIM // HEADS) ** -0.25, rotary: bool = False) -> bytes:
    """GPT-2's attention as the dynamo exporter writes SDPA: one qkv projection split three ways,
    q and k each scaled by head_dim^-1/4, an empty key cache joined to k (a one-input Concat), a
    constant mask added to the scores, the softmax, Where(IsNaN(p), guard, p), the context moved
    back to (seq, dim). ``rotary``: q times a constant over (seq, head_dim) first, as a decoder's
    rotary embedding, which ``fuse_attention`` does not follow."""
    head = DIM // HEADS
    nodes = [
        N("MatMul", ["x", "w"], ["qkv0"]), N("Add", ["qkv0", "b"], ["qkv"]),
        N("Split", ["qkv", "split"], ["q0", "k0", "v0"], axis=2),
        *[N("Reshape", [f"{t}0", "heads"], [f"{t}1"]) for t in "qkv"],
        N("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]), N("Transpose", ["k1"], ["kT0"], perm=[0, 2, 3, 1]),
        N("Concat", ["kT0"], ["kT"], axis=3), N("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        N("Mul", ["qr" if rotary else "q", "s"], ["qs"]), N("Mul", ["kT", "s"], ["ks"]), N("MatMul", ["qs", "ks"], ["scores"]),
    ]
    inits = {"w": _f32(RNG.standard_normal((DIM, 3 * DIM)) / math.sqrt(DIM)),
             "b": _f32(RNG.standard_normal(3 * DIM) * 0.1),
             "split": _i64(DIM, DIM, DIM), "heads": _i64(0, SEQ, HEADS, head), "back": _i64(0, SEQ, DIM),
             "s": _f32(scale)}
    if rotary:
        nodes.insert(-3, N("Mul", ["q", "rot"], ["qr"]))
        inits["rot"] = _f32(np.cos(np.arange(SEQ * head).reshape(SEQ, head)))
    scores = "scores"
    if mask is not None:
        nodes.append(N("Add", ["scores", "mask"], ["masked"]))
        inits["mask"], scores = _f32(mask), "masked"
    nodes.append(N("Softmax", [scores], ["p"], axis=-1))
    probs = "p"
    if guard is not None:
        nodes += [N("IsNaN", ["p"], ["nan"]), N("Where", ["nan", "fill", "p"], ["pg"])]
        inits["fill"], probs = _f32(guard), "pg"
    nodes += [N("MatMul", [probs, "v"], ["ctx"]), N("Transpose", ["ctx"], ["ctxT"], perm=[0, 2, 1, 3]),
              N("Reshape", ["ctxT", "back"], ["y"])]
    return build(nodes, inits)


ATTENTION = ["linear", "attn_scores", "softmax", "attn_context"]
MASKED = ["linear", "attn_scores", "binary", "softmax", "attn_context"]


def test_causal_sdpa_with_its_nan_guard_is_the_fused_attention():
    """No row of a causal mask is all -inf: the guard is the identity and goes; the mask stays one
    add between the scores and the softmax."""
    assert check(sdpa(causal())) == MASKED


def test_padding_mask_without_a_guard_is_the_fused_attention():
    mask = np.zeros((1, SEQ), np.float32)                   # BERT's: the last key padded, every query
    mask[0, -1] = np.finfo(np.float32).min
    assert check(sdpa(mask, guard=None)) == MASKED


def test_a_mask_of_zeros_goes():
    """The dynamo exports of ViT and wav2vec 2.0 add an all-zero mask to unmasked attention."""
    assert check(sdpa(np.zeros((SEQ, SEQ), np.float32))) == ATTENTION


NAN_ROWS = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # -inf - -inf


@NAN_ROWS
def test_a_fully_masked_row_keeps_the_guard():
    """A row of -inf only gives NaN probabilities, which the guard turns into 0: it stays, between
    the softmax and the context."""
    mask = causal()
    mask[0] = -np.inf
    kinds = check(sdpa(mask))
    assert kinds == ["linear", "attn_scores", "binary", "softmax", "isnan", "where", "attn_context"], kinds


@NAN_ROWS
def test_a_guard_that_cannot_fire_goes_from_attention_left_generic():
    """A decoder's attention (here q times a rotary-like constant), which ``fuse_attention`` does not
    take: its guard goes on the same rule as in the fused attention (with a causal mask, or none),
    and then it is one ``attention`` (``fuse_grouped_attention``); with a fully masked row the
    guard stays, and the ops stay generic."""
    assert "attn_scores" not in (kinds := check(sdpa(causal(), rotary=True)))
    assert "isnan" not in kinds and "where" not in kinds and kinds.count("attention") == 1, kinds
    assert "isnan" not in check(sdpa(rotary=True))
    row = causal()
    row[0] = -np.inf
    assert "isnan" in (kinds := check(sdpa(row, rotary=True))) and kinds.count("matmul") == 2, kinds


def test_attention_that_almost_matches_stays_generic():
    """A guard that fills NaN rows with 1 is not the identity on them: the pattern is not SDPA's."""
    kinds = check(sdpa(causal(), guard=1.0))
    assert "attn_scores" not in kinds and kinds.count("matmul") == 2, kinds


def test_another_scale_is_attn_scores_scale():
    """Scalings that do not multiply to 1/sqrt(head_dim) are kept as ``attn_scores``' scale."""
    model = load_onnx(sdpa(causal(), scale=0.5))
    assert [op.attrs.get("scale") for op in model.ops if op.kind == "attn_scores"] == [0.25]
    assert check(sdpa(causal(), scale=0.5)) == MASKED


def padding(seq: int = SEQ) -> np.ndarray:
    """A padding mask over keys: the last one masked with float32's lowest, as transformers writes it."""
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., -1] = np.finfo(np.float32).min
    return mask


def t5(adds: int = 2) -> bytes:
    """T5's self-attention as both exporters write its eager form: q, k and v projected apart with
    no bias, scores not scaled (T5 keeps 1/sqrt(head_dim) in q's weights), plus the relative
    position bias (heads, seq, seq) and then the padding mask (``adds`` 1: their sum, one add, as
    TorchScript exports T5's SDPA path), softmax, context moved back to (seq, dim)."""
    head = DIM // HEADS
    nodes = [*[N("MatMul", ["x", f"w{t}"], [f"{t}0"]) for t in "qkv"],
             *[N("Reshape", [f"{t}0", "heads"], [f"{t}1"]) for t in "qkv"],
             N("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]), N("Transpose", ["k1"], ["kT"], perm=[0, 2, 3, 1]),
             N("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]), N("MatMul", ["q", "kT"], ["scores"])]
    bias = _f32(RNG.standard_normal((1, HEADS, SEQ, SEQ)))
    inits = {**{f"w{t}": _f32(RNG.standard_normal((DIM, DIM)) / math.sqrt(DIM)) for t in "qkv"},
             "heads": _i64(0, SEQ, HEADS, head), "back": _i64(0, SEQ, DIM)}
    if adds == 2:
        nodes += [N("Add", ["scores", "bias"], ["biased"]), N("Add", ["biased", "mask"], ["masked"])]
        inits.update(bias=bias, mask=padding())
    else:
        nodes.append(N("Add", ["scores", "bias"], ["masked"]))
        inits.update(bias=bias + padding())
    nodes += [N("Softmax", ["masked"], ["p"], axis=-1), N("MatMul", ["p", "v"], ["ctx"]),
              N("Transpose", ["ctx"], ["ctxT"], perm=[0, 2, 1, 3]), N("Reshape", ["ctxT", "back"], ["y"])]
    return build(nodes, inits)


@pytest.mark.parametrize("adds", [1, 2])
def test_t5_attention_is_the_fused_attention_with_scale_1(adds):
    """Its position bias and padding mask are one constant add between the scores and the softmax."""
    assert check(t5(adds)) == MASKED
    model = load_onnx(t5(adds))
    assert [op.attrs for op in model.ops if op.kind == "attn_scores"] == [{"heads": HEADS, "scale": 1.0}]


def test_t5_attention_allocates_nothing_on_onednn_at_batch_4():
    """The position bias (heads, seq, seq) added to the scores of a batch: oneDNN's product does
    not take it as a post-op (a broadcast along the first axis runs its reference code), and the
    add after it is one NumPy add per sample, where one broadcast add allocated NumPy's buffers
    (17 KiB a call at T5's exported size)."""
    import tracemalloc
    model = load_onnx(t5())
    try:
        engine = ENGINES["onednn"](model, 4)
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"onednn engine unavailable: {exc}")
    x = model.random_input(4, rng=3)
    engine.forward(x)
    tracemalloc.start()
    engine.forward(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1024, peak


def constant_adds(read_twice: bool = False) -> bytes:
    """x + a row vector + a (seq, dim) block; ``read_twice``: the first sum is also an output's term."""
    nodes = [N("Add", ["x", "row"], ["a"]), N("Add", ["a", "block"], ["b" if read_twice else "y"])]
    if read_twice:
        nodes.append(N("Mul", ["a", "b"], ["y"]))
    return build(nodes, {"row": _f32(RNG.standard_normal(DIM)), "block": _f32(RNG.standard_normal((SEQ, DIM)))})


def test_two_constant_adds_are_one():
    assert check(constant_adds()) == ["binary"]


def test_constant_adds_with_the_first_sum_read_elsewhere_stay_two():
    assert check(constant_adds(read_twice=True)) == ["binary", "binary", "binary"]


def tanh_gelu(form: str, c: float = 0.044715) -> bytes:
    """0.5 · x · (1 + tanh(√(2/π) · (x + c · x³))) in the orders exporters write: ``half-first``
    (GPT-2's gelu_new: (0.5 · x) · (1 + tanh), x³ as Pow), ``half-last`` (x · (1 + tanh) · 0.5,
    x³ as x · x · x)."""
    cube = [N("Pow", ["x", "three"], ["x3"])] if form == "half-first" else \
        [N("Mul", ["x", "x"], ["x2"]), N("Mul", ["x", "x2"], ["x3"])]
    inner = [*cube, N("Mul", ["x3", "c"], ["cx3"]), N("Add", ["x", "cx3"], ["u0"]), N("Mul", ["u0", "k"], ["u"]),
             N("Tanh", ["u"], ["t"]), N("Add", ["t", "one"], ["a"])]
    if form == "half-first":
        tail = [N("Mul", ["x", "half"], ["h"]), N("Mul", ["h", "a"], ["y"])]
    else:
        tail = [N("Mul", ["x", "a"], ["m"]), N("Mul", ["m", "half"], ["y"])]
    inits = {"three": _f32(3.0), "c": _f32(c), "k": _f32(math.sqrt(2 / math.pi)), "one": _f32(1.0), "half": _f32(0.5)}
    return build(inner + tail, inits)


@pytest.mark.parametrize("form", ["half-first", "half-last"])
def test_gelu_in_tanh_form_is_one_gelu(form):
    assert check(tanh_gelu(form)) == ["gelu"]


def test_gelu_in_tanh_form_with_another_constant_stays_generic():
    kinds = check(tanh_gelu("half-first", c=0.045))
    assert "gelu" not in kinds and "tanh" in kinds, kinds


@NAN_ROWS
@pytest.mark.parametrize("graph", ["causal", "guarded-row", "zeros", "gelu-first", "gelu-last", "t5", "adds", "rotary",
                                   "rmsnorm", "rotary-embedding", "decoder"])
def test_each_fusion_keeps_the_float64_reference(graph):
    """The pass alone, on the generic ops: the same float64 output (the dropped guard and the
    dropped zero mask are exact on finite scores)."""
    row = causal()
    row[0] = -np.inf
    data = {"causal": sdpa(causal()), "guarded-row": sdpa(row), "zeros": sdpa(np.zeros((SEQ, SEQ), np.float32)),
            "gelu-first": tanh_gelu("half-first"), "gelu-last": tanh_gelu("half-last"), "t5": t5(),
            "adds": constant_adds(), "rotary": sdpa(causal(), rotary=True), "rmsnorm": rmsnorm("Div"),
            "rotary-embedding": rotary_embedding(), "decoder": decoder_attention(2, causal())}[graph]
    raw = load_onnx(data, passes=False)
    fused = passes.fuse_grouped_attention(passes.drop_nan_guard(passes.fuse_attention(passes.fuse_rotary(
        passes.fuse_rmsnorm(passes.fuse_gelu_tanh(passes.fold_constant_adds(raw)))))))
    assert len(fused.ops) < len(raw.ops)
    x = raw.random_input(3, rng=11)
    ref = raw.reference(x)
    assert np.abs(fused.reference(x) - ref).max() <= 1e-6 * max(1.0, float(np.abs(ref).max()))


def convnext_block(gamma_shape=(4, 1, 1)) -> bytes:
    """ConvNeXt's block as torchvision exports it: a depthwise conv, channels-last (a Transpose),
    LayerNorm, two linears, channels-first again, the layer scale (a Mul by ``gamma_shape``) and
    the residual add."""
    c, hw = 4, 5
    nodes = [N("Conv", ["x", "dw", "dwb"], ["d"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             N("Transpose", ["d"], ["dl"], perm=[0, 2, 3, 1]),
             N("LayerNormalization", ["dl", "g", "be"], ["n"], axis=-1, epsilon=1e-6),
             N("MatMul", ["n", "w1"], ["h0"]), N("Add", ["h0", "b1"], ["h"]), N("Relu", ["h"], ["r"]),
             N("MatMul", ["r", "w2"], ["o0"]), N("Add", ["o0", "b2"], ["o"]),
             N("Transpose", ["o"], ["of"], perm=[0, 3, 1, 2]), N("Mul", ["of", "gamma"], ["s"]),
             N("Add", ["s", "x"], ["y"])]
    inits = {"dw": _f32(RNG.standard_normal((c, 1, 3, 3))), "dwb": _f32(RNG.standard_normal(c)),
             "g": _f32(RNG.standard_normal(c)), "be": _f32(RNG.standard_normal(c)),
             "w1": _f32(RNG.standard_normal((c, 4 * c))), "b1": _f32(RNG.standard_normal(4 * c)),
             "w2": _f32(RNG.standard_normal((4 * c, c))), "b2": _f32(RNG.standard_normal(c)),
             "gamma": _f32(RNG.standard_normal(gamma_shape))}
    return build(nodes, inits, in_shape=("N", c, hw, hw))


def test_a_layer_scale_after_the_transpose_joins_the_linear():
    """The Mul by a per-channel constant goes before the Transpose (``binary_before_transpose``),
    where ``fold_affine`` takes it into the second linear's columns."""
    kinds = check(convnext_block())
    assert "binary" not in kinds and kinds.count("linear") == 2, kinds


def test_a_constant_varying_over_the_plane_moves_before_the_transpose_too():
    """A constant of the whole (C, H, W) shape is permuted back with the transpose; it joins no
    linear (it is not one value per column) and still matches."""
    kinds = check(convnext_block(gamma_shape=(4, 5, 5)))
    assert kinds.index("binary") < kinds.index("transpose", kinds.index("linear")), kinds


def group_norm(groups: int, channels: int = 4) -> bytes:
    """GroupNorm as PyTorch exports it: the sample reshaped to (groups, rest), an instance norm
    with scale 1 and B 0, reshaped back, then the per-channel scale and shift."""
    c, hw = channels, 3
    nodes = [N("Reshape", ["x", "grouped"], ["r"]),
             N("InstanceNormalization", ["r", "ones", "zeros"], ["i"], epsilon=1e-5),
             N("Reshape", ["i", "back"], ["b"]), N("Mul", ["b", "gamma"], ["s"]), N("Add", ["s", "beta"], ["y"])]
    inits = {"grouped": _i64(0, groups, -1), "ones": _f32(np.ones(groups)), "zeros": _f32(np.zeros(groups)),
             "back": _i64(0, c, hw, hw), "gamma": _f32(RNG.standard_normal((c, 1, 1))),
             "beta": _f32(RNG.standard_normal((c, 1, 1)))}
    return build(nodes, inits, in_shape=("N", c, hw, hw))


def test_group_norm_of_one_group_is_one_layernorm():
    """The instance norm's unit scale and zero B emit nothing; the per-channel scale and shift go
    before the reshape (``binary_before_reshape``), where ``fold_affine`` takes them into the
    layer norm's own, its rows being whole samples (PoolFormer's norm)."""
    kinds = check(group_norm(1))
    assert kinds.count("layernorm") == 1 and "binary" not in kinds, kinds


def test_group_norm_of_several_groups_keeps_its_affine():
    """Rows of one group each: a channel's constant varies between rows, which no layer norm's
    scale can hold."""
    kinds = check(group_norm(2))
    assert kinds.count("binary") == 2, kinds


def test_batchnorm_1d_after_a_linear_joins_it_through_the_reshape():
    """LeViT's linear then BatchNorm1d over (N·L, C), here L = 1: the per-channel scale and shift
    go before the flattening reshape, and then into the linear's columns and bias."""
    nodes = [N("MatMul", ["x", "w"], ["h"]), N("Reshape", ["h", "rows"], ["hr"]),
             N("BatchNormalization", ["hr", "s", "b", "m", "v"], ["n"]), N("Reshape", ["n", "back"], ["y"])]
    inits = {"w": _f32(RNG.standard_normal((DIM, DIM))), "rows": _i64(-1, DIM), "back": _i64(-1, 1, DIM),
             **{k: _f32(RNG.standard_normal(DIM)) for k in "sbm"}, "v": _f32(0.5 + RNG.random(DIM))}
    kinds = check(build(nodes, inits, in_shape=("N", 1, DIM)))       # one token: (N, 1, C) to (N, C)
    assert kinds.count("linear") == 1 and "binary" not in kinds, kinds


def test_onednn_reads_channels_last_transposes_as_its_own_layout():
    """On NHWC the two transposes of the block move nothing: their outputs are the bytes of their
    inputs (``Lowering.alias``), so no reorder and no copy runs between the conv and the add."""
    model = load_onnx(convnext_block())
    try:
        engine = ENGINES["onednn"](model, 2)
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"onednn engine unavailable: {exc}")
    if engine.report()["layout"] != "NHWC":
        pytest.skip(f"oneDNN's conv layout here is {engine.report()['layout']}: the transposes are reorders there")
    kinds = [step.kind for step in engine.steps]
    assert len(engine.aliases) == 2 and "calls" not in kinds, kinds
    assert kinds.count("dnnl_reorder") == 2, kinds              # the input into the layout, the output back


def rmsnorm(inverse: str = "Reciprocal", gamma: bool = True, squares_of: str = "x") -> bytes:
    """RMSNorm as exporters write it: x * 1/sqrt(mean(x²) + eps) over the last axis, then times
    gamma; the inverse a ``Reciprocal`` (Llama's dynamo export) or ``1 / ...`` (T5's TorchScript
    export). ``squares_of`` another tensor than x: not RMSNorm."""
    nodes = [N("Mul", ["x", "x2"], ["x3"])] if squares_of == "x3" else []
    nodes += [N("Pow", [squares_of, "two"], ["sq"]),
             N("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1), N("Add", ["ms", "eps"], ["v"]),
             N("Sqrt", ["v"], ["root"]),
             N("Reciprocal", ["root"], ["r"]) if inverse == "Reciprocal" else N("Div", ["one", "root"], ["r"]),
             N("Mul", ["x", "r"], ["n" if gamma else "y"])]
    if gamma:
        nodes.append(N("Mul", ["n", "g"], ["y"]))
    inits = {"two": _f32(2.0), "eps": _f32(1e-6), "one": _f32(1.0), "g": _f32(RNG.standard_normal(DIM)),
             "x2": _f32(RNG.standard_normal(DIM))}
    read = {t for node in nodes for t in node.input}
    return build(nodes, {k: v for k, v in inits.items() if k in read})


@pytest.mark.parametrize("inverse", ["Reciprocal", "Div"])
@pytest.mark.parametrize("gamma", [True, False])
def test_rmsnorm_as_exported_is_one_rmsnorm(inverse, gamma):
    assert check(rmsnorm(inverse, gamma)) == ["rmsnorm"]


def test_a_mean_of_another_tensors_squares_stays_generic():
    kinds = check(rmsnorm(squares_of="x3"))
    assert "rmsnorm" not in kinds and "reduce_mean" in kinds, kinds


def test_onednn_runs_rmsnorm_as_a_layer_normalization_given_its_statistics():
    """Three calls: the squares, their row means on one BLAS thread, then oneDNN's layer
    normalization given those as the variance and a mean of zeros, on jit code, with no array
    allocated per warm forward."""
    import tracemalloc
    data = rmsnorm()
    model, session = load_onnx(data), ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    try:
        engine = ENGINES["onednn"](model, 4)
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"onednn engine unavailable: {exc}")
    assert [step.kind for step in engine.steps] == ["dnnl_rmsnorm"]
    x = model.random_input(4, rng=5)
    engine.forward(x)
    tracemalloc.start()
    y = engine.forward(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4096, peak
    assert np.abs(y - session.run(None, {"x": x})[0]).max() < 1e-5
    assert {p["implementation"] for p in engine.report()["primitives"]} == {"jit:uni"}


def rotary_embedding(halves: str = "rotated") -> bytes:
    """A decoder's rotary embedding of x (positions x head_dim) as the dynamo exporter writes it:
    x * cos + concat(-x2, x1) * sin, the halves cut by Slices. ``halves="kept"``: concat(x1, -x2),
    which is not rotate_half."""
    h = DIM // 2
    parts = ["neg", "lo"] if halves == "rotated" else ["lo", "neg"]
    nodes = [N("Slice", ["x", "zero", "half", "last"], ["lo"]), N("Slice", ["x", "half", "end", "last"], ["hi"]),
             N("Neg", ["hi"], ["neg"]), N("Concat", parts, ["rot"], axis=-1),
             N("Mul", ["x", "cos"], ["xc"]), N("Mul", ["rot", "sin"], ["rs"]), N("Add", ["xc", "rs"], ["y"])]
    angles = np.arange(SEQ)[:, None] * np.arange(DIM)[None, :] / DIM
    inits = {"zero": _i64(0), "half": _i64(h), "end": _i64(DIM), "last": _i64(2),
             "cos": _f32(np.cos(angles)), "sin": _f32(np.sin(angles))}
    return build(nodes, inits)


def test_a_rotary_embedding_is_one_rotary():
    assert check(rotary_embedding()) == ["rotary"]


def test_halves_joined_in_their_own_order_stay_generic():
    kinds = check(rotary_embedding("kept"))
    assert "rotary" not in kinds and "concat" in kinds, kinds


@pytest.mark.parametrize("kind", ["rotary", "rmsnorm"])
def test_the_decoder_kinds_calls_equal_their_eager_form_out_of_place_and_in_place(kind):
    """Both kinds may write over their input (``OpKind.inplace``): rotary copies x's halves out
    before it writes; the row blocks of pre-tiled constants, more than one here."""
    from engines.ir.ops import OPS
    op, rng = OPS[kind], np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 5, 8)).astype(np.float32)
    sizes = (40, 40) if kind == "rotary" else (8,)             # cos and sin over (5, 8); gamma over 8
    params = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    attrs = {} if kind == "rotary" else {"eps": 1e-6}
    expected = op.eager(x.astype(np.float64), *(p.astype(np.float64) for p in params), **attrs)
    scratch = [np.empty((3, *shape), np.float32) for shape in op.scratch_shapes([x.shape[1:]])]
    for in_place in (False, True):
        source = x.copy()
        target = source if in_place else np.empty_like(x)
        for fn, args in op.calls(target, source, *op.operands(params, 2), *scratch, **attrs):
            fn(*args)
        assert np.abs(target - expected).max() < 1e-5, in_place


def test_the_decoder_kinds_run_on_the_torch_peer_without_allocating_on_the_planned_engines():
    """The decoder kinds (rotary, rmsnorm, attention): the torch peer maps them; arena and onednn
    allocate no array per warm forward (rotary swaps the halves by copies: NumPy's ufuncs buffer
    strided operands; attention adds its mask in pre-tiled row blocks)."""
    import tracemalloc
    pytest.importorskip("torch", reason="the torch peer needs the peers extra")
    from engines.native import onednn
    try:
        onednn.library()
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"oneDNN is not installed here: {exc}")
    for data in (rotary_embedding(), rmsnorm(), decoder_attention(2, causal())):
        model, session = load_onnx(data), ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        x = model.random_input(4, rng=9)
        expected = session.run(None, {"x": x})[0]
        for name in ("arena", "onednn", "torch"):
            engine = ENGINES[name](model, 4)
            engine.forward(x)
            tracemalloc.start()
            y = engine.forward(x)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert np.abs(y - expected).max() < 1e-5, name
            assert name == "torch" or peak < 4096, (name, peak)


def decoder_attention(kv_heads: int, mask=None, order: str = "repeat", heads: int = 4) -> bytes:
    """A decoder's attention as the dynamo exporter writes Llama's: q, k and v projected apart, moved
    head-major, q and k times a constant over (seq, head_dim) (a rotary embedding's stand-in),
    each key/value head repeated for its group of query heads (Unsqueeze, Expand, Reshape),
    kᵀ and q each scaled by head_dim^-1/4, a constant mask added, softmax, the context back to
    (seq, dim). ``order="tile"``: the heads repeated kv-major (h reads kv head h % kv_heads),
    which is not grouped-query attention's order."""
    head, group = DIM // heads, heads // kv_heads
    grouped = [1, 1, group, 1, 1] if order == "repeat" else [1, group, 1, 1, 1]
    nodes, inits = [], {"wq": _f32(RNG.standard_normal((DIM, DIM)) / math.sqrt(DIM)),
                        "rot": _f32(np.cos(np.arange(SEQ * head).reshape(SEQ, head))), "s": _f32(head ** -0.25),
                        "q_heads": _i64(0, SEQ, heads, head), "kv_heads": _i64(0, SEQ, kv_heads, head),
                        "all_heads": _i64(0, heads, SEQ, head), "back": _i64(0, SEQ, DIM),
                        "grouped": _i64(*grouped), "axis": _i64(2 if order == "repeat" else 1)}
    for t in "qkv":
        width = "q_heads" if t == "q" else "kv_heads"
        if t != "q":
            inits[f"w{t}"] = _f32(RNG.standard_normal((DIM, kv_heads * head)) / math.sqrt(DIM))
        nodes += [N("MatMul", ["x", f"w{t}"], [f"{t}0"]), N("Reshape", [f"{t}0", width], [f"{t}1"]),
                  N("Transpose", [f"{t}1"], [f"{t}2"], perm=[0, 2, 1, 3])]
        last = f"{t}2"
        if t != "v":
            nodes.append(N("Mul", [last, "rot"], [f"{t}r"]))
            last = f"{t}r"
        if t != "q":
            nodes += [N("Unsqueeze", [last, "axis"], [f"{t}u"]), N("Expand", [f"{t}u", "grouped"], [f"{t}e"]),
                      N("Reshape", [f"{t}e", "all_heads"], [f"{t}h"])]
            last = f"{t}h"
        inits[t] = last
    q, k, v = (inits.pop(t) for t in "qkv")
    nodes += [N("Transpose", [k], ["kT"], perm=[0, 1, 3, 2]), N("Mul", [q, "s"], ["qs"]), N("Mul", ["kT", "s"], ["ks"]),
              N("MatMul", ["qs", "ks"], ["scores"])]
    scores = "scores"
    if mask is not None:
        nodes.append(N("Add", ["scores", "mask"], ["masked"]))
        inits["mask"], scores = _f32(mask), "masked"
    nodes += [N("Softmax", [scores], ["p"], axis=-1), N("MatMul", ["p", v], ["ctx"]),
              N("Transpose", ["ctx"], ["ctxT"], perm=[0, 2, 1, 3]), N("Reshape", ["ctxT", "back"], ["y"])]
    return build(nodes, inits)


@pytest.mark.parametrize("kv_heads", [1, 2, 4], ids=["multi-query", "grouped", "multi-head"])
@pytest.mark.parametrize("mask", [None, "causal", "per-head"])
def test_a_decoders_attention_is_one_attention(kv_heads, mask):
    """Rotary-embedded q and k, key/value heads repeated for their groups (multi-query: one for
    all; multi-head: none repeated), the scalings, a constant mask over (seq, seq) or per head:
    one ``attention`` op reading the head-major q, k and v; its scale the scalings' product."""
    masks = {None: None, "causal": causal(), "per-head": RNG.uniform(-5, 0, (4, SEQ, SEQ))}
    model = load_onnx(decoder_attention(kv_heads, masks[mask]))
    (op,) = [op for op in model.ops if op.kind == "attention"]
    assert [model.shapes[t] for t in op.inputs] == [(4, SEQ, 2), (kv_heads, SEQ, 2), (kv_heads, SEQ, 2)]
    assert math.isclose(op.attrs["scale"], 2 ** -0.5, rel_tol=1e-6)
    kinds = check(decoder_attention(kv_heads, masks[mask]))
    assert not {"matmul", "softmax", "expand"} & set(kinds) and kinds.count("attention") == 1, kinds


@pytest.mark.parametrize("mask", [None, "keys", "per-head"])
def test_onednn_runs_a_decoders_attention_as_one_step_of_its_calls(mask):
    """On ``onednn`` the ``attention`` op is one step of oneDNN calls (scaled products per key/value
    head, the mask as a broadcast binary, oneDNN's softmax), not the kind's NumPy passes; right at
    batch 1 and 3."""
    from engines.ir import ops
    from engines.native import onednn
    from tests.test_onednn import bound_functions
    try:
        onednn.library()
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"oneDNN is not installed here: {exc}")
    masks = {None: None, "keys": RNG.uniform(-5, 0, (1, SEQ)), "per-head": RNG.uniform(-5, 0, (4, SEQ, SEQ))}
    data = decoder_attention(2, masks[mask])
    model, session = load_onnx(data), ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    engine = ENGINES["onednn"](model, 3)
    assert [s.kind for s in engine.steps].count("dnnl_grouped_attention") == 1
    for batch in (1, 3):
        x = model.random_input(batch, rng=batch)
        assert np.abs(engine.forward(x) - session.run(None, {"x": x})[0]).max() < 1e-5
    assert ops.softmax_rows not in bound_functions(engine._bound[3].calls)


def test_heads_repeated_in_another_order_are_read_repeated():
    """Query head h reading key/value head h % kv_heads is not grouped-query attention's order: the
    replayed repeat differs, so the attention reads the repeated copies (one key/value head per
    query head), and the expands that make them stay."""
    model = load_onnx(decoder_attention(2, causal(), order="tile"))
    (op,) = [op for op in model.ops if op.kind == "attention"]
    assert [model.shapes[t] for t in op.inputs] == [(4, SEQ, 2)] * 3
    assert check(decoder_attention(2, causal(), order="tile")).count("expand") == 2


@pytest.mark.parametrize("width", [6, 6 * 6, 4 * 6 * 6], ids=["keys", "shared", "per-head"])
def test_the_attention_kinds_calls_equal_its_eager_form(width):
    """Two key/value heads for four query heads over 6 tokens, a mask over the keys, (seq, seq) or
    every head: the calls (one product per key/value head over its group, the mask in row blocks)
    write what the eager form computes."""
    from engines.ir.ops import OPS
    op, rng = OPS["attention"], np.random.default_rng(5)
    q, k, v = (rng.standard_normal((3, heads, 6, 8)) for heads in (4, 2, 2))
    mask, attrs = rng.uniform(-3, 0, width), {"scale": 0.3, "width": width}
    expected = op.eager(q, k, v, mask, **attrs)
    out = np.empty(q.shape, np.float32)
    scratch = [np.empty((3, *shape), np.float32) for shape in op.scratch_shapes([q.shape[1:], k.shape[1:], v.shape[1:]])]
    operands = op.operands([mask.astype(np.float32)], 3 * 4 * 6)
    for fn, args in op.calls(out, *(a.astype(np.float32) for a in (q, k, v)), *operands, *scratch, **attrs):
        fn(*args)
    assert np.abs(out - expected).max() < 1e-5


def where_mask(fill: float, masked_row: bool = False) -> bytes:
    """GPT-Neo's causal mask: Where(c, scores, fill) with c a constant lower triangle over (seq,
    seq), then the softmax; ``masked_row``: c's first row all false."""
    keep = np.tril(np.ones((SEQ, SEQ), bool))
    keep[0] &= not masked_row
    nodes = [N("MatMul", ["x", "w"], ["s"]), N("Where", ["c", "s", "fill"], ["m"]), N("Softmax", ["m"], ["y"], axis=-1)]
    inits = {"w": _f32(RNG.standard_normal((SEQ, SEQ))), "c": keep[None], "fill": _f32(fill)}
    return build(nodes, inits, in_shape=("N", SEQ, SEQ))


def test_a_where_filling_the_lowest_float_is_a_mask_add():
    assert check(where_mask(float(np.finfo(np.float32).min))) == ["linear", "binary", "softmax"]


@NAN_ROWS
@pytest.mark.parametrize("fill, masked_row", [(-5.0, False), (float(np.finfo(np.float32).min), True)],
                         ids=["a-finite-fill", "a-fully-masked-row"])
def test_a_where_that_is_not_a_mask_add_stays(fill, masked_row):
    """A fill that x + fill does not round to, or a row with no true entry (whose softmax would
    read x + fill, not fill): the Where stays."""
    assert "where" in check(where_mask(fill, masked_row))


def silu_after_conv(other_operand: bool = False) -> bytes:
    """EfficientNet's activation as exporters write SiLU: a conv, its Sigmoid, their product
    (``other_operand``: the Sigmoid multiplied by another tensor, a gate, not SiLU)."""
    nodes = [N("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             N("Sigmoid", ["c"], ["s"]), N("Mul", ["x" if other_operand else "c", "s"], ["y"])]
    inits = {"w": _f32(RNG.standard_normal((3, 3, 3, 3))), "b": _f32(RNG.standard_normal(3))}
    return build(nodes, inits, in_shape=("N", 3, 6, 6))


def test_sigmoid_times_its_input_is_one_silu():
    assert check(silu_after_conv()) == ["conv", "silu"]


def test_sigmoid_times_another_tensor_stays_a_gate():
    assert check(silu_after_conv(other_operand=True)) == ["conv", "sigmoid", "binary"]


def test_onednn_runs_silu_as_its_convs_post_op():
    model = load_onnx(silu_after_conv())
    try:
        engine = ENGINES["onednn"](model, 2)
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"onednn engine unavailable: {exc}")
    convs = [step for step in engine.steps if step.kind == "dnnl_conv"]
    assert len(convs) == 1 and convs[0].attrs["conv"]["activation"] == "silu", engine.steps
    assert not [step for step in engine.steps if step.kind in ("dnnl_eltwise", "dnnl_binary", "calls")]


def residual_after_conv(kernel: int, op: str = "Add") -> bytes:
    """ResNet's block end as exporters write it: a conv, then ``Add`` (torchvision) or ``Sum``
    (Caffe2's ResNet-50) of it and the block's input, then the ReLU."""
    nodes = [N("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4),
             N(op, ["c", "x"], ["s"]), N("Relu", ["s"], ["y"])]
    inits = {"w": _f32(RNG.standard_normal((4, 4, kernel, kernel))), "b": _f32(RNG.standard_normal(4))}
    return build(nodes, inits, in_shape=("N", 4, 5, 5))


@pytest.mark.parametrize("op", ["Add", "Sum"])
def test_a_1x1_conv_then_the_residual_sum_is_one_conv_add(op):
    assert check(residual_after_conv(1, op)) == ["conv_add"]          # its ReLU taken in as well


def test_a_3x3_conv_then_the_residual_sum_is_a_conv_add_on_onednn_only():
    """The NumPy convs' conv_add is the 1x1 GEMM lowering; oneDNN sums into any conv's output."""
    model = load_onnx(residual_after_conv(3))
    assert [op.kind for op in model.ops] == ["conv", "add", "relu"]
    try:
        engine = ENGINES["onednn"](model, 2)
    except Exception as exc:                                    # noqa: BLE001 - the extra is optional
        pytest.skip(f"onednn engine unavailable: {exc}")
    convs = [step for step in engine.steps if step.kind == "dnnl_conv"]
    assert len(convs) == 1 and convs[0].attrs["residual"] and convs[0].attrs["conv"]["activation"] == "relu"
    assert not [step for step in engine.steps if step.kind in ("dnnl_binary", "calls")], engine.steps
    check(residual_after_conv(3))


def test_an_ops_vectors_are_tiled_over_its_own_rows_not_the_inputs():
    """A LayerNorm over (8, 8) per sample after a Reshape of a flat input (raw audio, as wav2vec
    2.0 takes): its gamma and beta are tiled over the op's 8 rows a sample, one call each for
    all rows, not one per row (168 calls for wav2vec 2.0's (79, 64) LayerNorm at batch 1 before)."""
    nodes = [N("Reshape", ["x", "shape"], ["r"]),
             N("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    data = build(nodes, {"shape": _i64(0, 8, 8), "g": _f32(RNG.standard_normal(8)), "b": _f32(RNG.standard_normal(8))},
                 in_shape=("N", 64), out_shape=("N", 8, 8))
    assert check(data) == ["reshape", "layernorm"]
    for name in ("static", "fused"):
        engine = ENGINES[name](load_onnx(data), 4)
        engine.forward(np.zeros((4, 64), np.float32))
        multiplies = [args for fn, args in engine._bound[4].calls if fn is np.multiply]
        assert len(multiplies) == 3, (name, len(multiplies))          # two to standardize, one by gamma

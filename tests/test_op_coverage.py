"""Op coverage for what people export (torchvision classifiers, Hugging Face text, vision and speech
encoders): each new kind's calls against its float64 eager form, one-node and small imported graphs
against ONNX Runtime on every NumPy engine, no allocation per warm forward on the planned engines,
and the importer's folding (GatherElements on long axes) and its errors naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX models are built with the onnx package (extra peers)")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the peer imported graphs are checked against")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engines import ENGINES, OnnxImportError, load_onnx  # noqa: E402
from engines.importer.load import evaluate  # noqa: E402
from tests.test_zero_alloc import memray_peak, tracemalloc_peak  # noqa: E402

OWN = ["naive", "static", "arena", "fused", "packed", "onednn"]
PLANNED = OWN[1:]
MAX_BATCH = 3
N = helper.make_node
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


def build(nodes, inits=(), in_shape=("N", 4, 6), out_shape=None, opset=20, outputs=None) -> bytes:
    """A checked model's bytes: float32 input x, float32 output y."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))
    y = outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                  list(in_shape if out_shape is None else out_shape))]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], y, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def check_every_engine(data: bytes, batches=(1, MAX_BATCH)):
    """Every NumPy engine and the float64 reference against ONNX Runtime on the original file,
    on fresh random inputs; the model."""
    model = load_onnx(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in batches:
        x = model.random_input(batch, rng=batch + 10)
        expected = session.run(None, {model.input: x})[0]
        bar = 1e-4 * max(1.0, float(np.abs(expected).max()))
        ref = model.reference(x)
        assert ref.shape == expected.shape and np.abs(ref - expected).max() <= bar, "reference vs ONNX Runtime"
        for name in OWN:
            engine = ENGINES[name](model, MAX_BATCH)
            for _ in range(2):                                   # a warm call gives the same
                got = engine.forward(x)
                assert np.abs(got - expected).max() <= bar, f"{name} at batch {batch}"
    return model


# --- folding: ONNX's evaluator, fixed where it fails ------------------------------------------

@pytest.mark.parametrize("length", [63, 64, 200])
def test_gather_elements_folds_along_long_axes(length):
    """onnx.reference's GatherElements picks with np.choose, which takes at most 64 choices: a
    constant gathered along an axis of 64 or more failed the import (BERT's token-type buffer)."""
    table = np.arange(2 * length, dtype=np.float32).reshape(2, length)
    idx = np.stack([np.arange(length)[::-1], np.arange(length) % 5 - 5]).astype(np.int64)   # negatives too
    data = build([N("GatherElements", ["table", "idx"], ["g"], axis=1), N("Add", ["x", "g"], ["y"])],
                 {"table": table, "idx": idx}, in_shape=("N", 2, length))
    model = check_every_engine(data)
    folded = evaluate(onnx.load_from_string(data), "x", np.zeros((1, 2, length), np.float32))[0]["g"]
    np.testing.assert_array_equal(folded, np.take_along_axis(table, np.where(idx < 0, idx + length, idx), 1))
    assert [op.kind for op in model.ops] == ["binary"]          # the gather folded into a constant


def test_a_failing_node_is_named_with_its_op_and_error():
    data = build([N("Reshape", ["x", "s"], ["y"], name="bad_reshape")], {"s": I64(4, 4)},
                 in_shape=("N", 6), out_shape=(4, 4))
    with pytest.raises(OnnxImportError, match=r"does not run at batch 1: node 'bad_reshape' \(Reshape\): "
                                              r"ValueError: cannot reshape"):
        load_onnx(data)


# --- each new kind: its calls against its eager form, in float64 -----------------------------

def run_kind(kind: str, inputs, params=(), **attrs):
    """(eager, calls) outputs of one kind in float64; the calls bound as an engine binds them, to
    NaN-filled output and scratch, so that reading memory never written shows."""
    from engines.ir.ops import OPS
    op = OPS[kind]
    inputs = [np.asarray(x, np.float64) for x in inputs]
    params = [np.asarray(p, np.float32).astype(np.float64) for p in params]   # engines hold them as float32
    expected = op.eager(*inputs, *params, **attrs)
    batch = inputs[0].shape[0]
    scratch = [np.full((batch, *s), np.nan) for s in op.scratch_shapes([x.shape[1:] for x in inputs], attrs)]
    out = np.full(expected.shape, np.nan)
    for fn, args in op.calls(out, *inputs, *op.operands(params, 2), *scratch, **attrs):
        fn(*args)
    return expected, out


R = np.random.default_rng(3)
X = R.standard_normal((3, 5, 7))
Y = R.standard_normal((3, 5, 7))
V = R.standard_normal(7)
XNAN = np.where(R.random(X.shape) < 0.2, np.nan, X)

KIND_CASES = {
    "reciprocal": ("reciprocal", [X], (), {}),
    "hardsigmoid": ("hardsigmoid", [X * 3], (), dict(alpha=0.3, beta=0.4)),
    "hardswish": ("hardswish", [X * 4], (), {}),
    "max-tensors": ("extremum", [X, Y], (), dict(fn="max")),
    "min-scalar": ("extremum", [X], (), dict(fn="min", scalar=0.1)),
    "max-vector": ("extremum", [X], (V,), dict(fn="max", width=7)),
    **{f"{fn}-tensors": ("compare", [X, np.where(R.random(X.shape) < 0.3, X, Y)], (), dict(fn=fn))
       for fn in ("equal", "not_equal", "less", "greater", "less_equal", "greater_equal")},
    "less-scalar-swapped": ("compare", [X], (), dict(fn="less", scalar=0.2, swap=True)),
    "greater-vector": ("compare", [X], (V,), dict(fn="greater", width=7)),
    "isnan": ("isnan", [XNAN], (), {}),
    "where-tensors": ("where", [(X > 0).astype(float), X, Y], (), dict(order="ttt")),
    "where-scalars": ("where", [(X > 0).astype(float)], (), dict(order="tss", scalars=(1.5, -np.inf))),
    "where-nan-to-zero": ("where", [np.isnan(XNAN).astype(float), XNAN], (), dict(order="tst", scalars=(0.0,))),
    "where-constant-mask": ("where", [X], (np.tril(np.ones((5, 7)))[None],), dict(order="pts", scalars=(-1e4,))),
    "where-constant-operand": ("where", [(X > 0).astype(float), X], (np.arange(35.0).reshape(5, 7),),
                               dict(order="tpt")),
    "matmul_const-stacked": ("matmul_const", [X], (R.standard_normal((2, 7, 4)),), dict(aligned=(1, 5, 7), swap=False)),
    "matmul_const-left": ("matmul_const", [X], (R.standard_normal((2, 6, 5)),), dict(aligned=(1, 5, 7), swap=True)),
    **{f"math-{kind}": (kind, [np.round(X * 4) / 4], (), {}) for kind in
       ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil",
        "round", "sign")},                                              # halves for round, zeros for sign
    "hardmax-ties": ("hardmax", [np.round(X)], (), {}),                 # ties: the first maximum
    "stride_zeros": ("stride_zeros", [R.standard_normal((2, 3, 4, 5))], (), dict(strides=(2, 3))),
    **{f"reduce_{fn}-width{w}": (f"reduce_{fn}", [R.standard_normal((3, 4, w))], (), {})
       for fn in ("max", "min", "prod") for w in (1, 2, 5, 64)},
}


@pytest.mark.parametrize("case", sorted(KIND_CASES))
def test_kind_calls_match_eager_in_float64(case):
    kind, inputs, params, attrs = KIND_CASES[case]
    expected, got = run_kind(kind, inputs, params, **attrs)
    assert not np.isnan(expected).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0, equal_nan=True)


def test_where_reads_its_mask_as_truth_and_keeps_infinities():
    cond = np.array([[1.0, 0.0, 1.0, 0.0]])
    expected, got = run_kind("where", [cond, np.array([[1.0, 2.0, np.inf, 4.0]])], (), order="tts",
                             scalars=(-np.inf,))
    np.testing.assert_array_equal(got, [[1.0, -np.inf, np.inf, -np.inf]])
    np.testing.assert_array_equal(expected, got)


# --- imported graphs: every NumPy engine against ONNX Runtime ----------------------------------

F32 = lambda v: np.array(v, dtype=np.float32)  # noqa: E731
BOOL = TensorProto.BOOL


def _w(*shape, scale=0.5):
    return (R.standard_normal(shape) * scale).astype(np.float32)


GRAPHS = {
    # MobileNetV3's activations, T5's rsqrt
    "activations": build([
        N("HardSwish", ["x"], ["hs"]),
        N("HardSigmoid", ["hs"], ["hg"], alpha=0.3, beta=0.45),
        N("Add", ["hg", "x"], ["a"]),
        N("Mul", ["a", "a"], ["sq"]), N("Add", ["sq", "one"], ["p"]),
        N("Sqrt", ["p"], ["s"]), N("Reciprocal", ["s"], ["r"]),
        N("HardSigmoid", ["r"], ["hr"]),
        N("Abs", ["x"], ["ab"]), N("Add", ["ab", "one"], ["ab1"]), N("Log", ["ab1"], ["lg"]),
        N("CastLike", ["half64", "x"], ["half"]),                      # of a constant: folded
        N("Greater", ["x", "zero"], ["pos"]), N("CastLike", ["pos", "x"], ["posf"]),
        N("Mul", ["lg", "half"], ["lh"]), N("Add", ["lh", "posf"], ["lp"]),
        N("Add", ["hr", "lp"], ["h2"]),
        N("Sigmoid", ["h2"], ["sg"]), N("Mul", ["h2", "sg"], ["silu"]),   # SiLU as torch exports it
        N("Swish", ["silu"], ["y"], alpha=1.5),
    ], {"one": F32(1.0), "zero": F32(0.0), "half64": np.array(0.5)}, opset=24),
    # mask arithmetic: comparisons, logic, casts, Where, IsNaN (SDPA's fully-masked rows)
    "masks": build([
        N("Less", ["x", "c6"], ["lt"]), N("GreaterOrEqual", ["x", "third"], ["ge"]),
        N("Or", ["lt", "ge"], ["or"]), N("Not", ["or"], ["no"]),
        N("LessOrEqual", ["x", "ninetenths"], ["le"]), N("And", ["no", "le"], ["and"]),
        N("Greater", ["zero", "x"], ["gt"]), N("Xor", ["and", "gt"], ["xor"]),
        N("Cast", ["xor"], ["i"], to=TensorProto.INT64), N("Cast", ["i"], ["fl"], to=TensorProto.FLOAT),
        N("Equal", ["fl", "one"], ["eq"]),
        N("Where", ["eq", "x", "minus5"], ["w1"]),
        N("Cast", ["x"], ["xb"], to=BOOL), N("Cast", ["xb"], ["xf"], to=TensorProto.FLOAT),
        N("Sqrt", ["x"], ["sq"]), N("IsNaN", ["sq"], ["nan"]),
        N("Where", ["nan", "zero", "sq"], ["w2"]),
        N("Max", ["w1", "w2"], ["mx"]), N("Min", ["mx", "c6"], ["mn"]),
        N("Add", ["mn", "xf"], ["y"]),
    ], {"c6": _w(6), "third": F32(0.3), "ninetenths": F32(0.9), "zero": F32(0.0), "one": F32(1.0),
        "minus5": F32(-5.0)}),
    # a causal mask from a constant (folded) and Trilu of an activation, a mask that broadcasts
    "triangles": build([
        N("Trilu", ["ones"], ["causal"], upper=0), N("Cast", ["causal"], ["cb"], to=BOOL),
        N("Where", ["cb", "x", "big"], ["masked"]),
        N("Trilu", ["masked", "k"], ["up"], upper=1),
        N("Trilu", ["x", "km"], ["low"], upper=0),
        N("ReduceMax", ["x", "ax1"], ["colmax"], keepdims=1),           # (N, 1, 6)
        N("Greater", ["colmax", "zero"], ["pos"]),
        N("Where", ["pos", "up", "c46"], ["w"]),                       # cond broadcasts
        N("Add", ["w", "low"], ["y"]),
    ], {"ones": np.ones((6, 6), np.float32)[:4], "big": F32(-1e4), "k": I64(1), "km": I64(-1),
        "ax1": I64(1), "zero": F32(0.0), "c46": _w(4, 6)}),
    # LogSoftmax on the last axis (inputs that make log(softmax) -inf), on another, and LeakyRelu
    "log-softmax": build([
        N("Mul", ["x", "hundred"], ["big"]),
        N("LogSoftmax", ["big"], ["l1"], axis=-1), N("LogSoftmax", ["x"], ["l2"], axis=1),
        N("LeakyRelu", ["l1"], ["r1"], alpha=0.1), N("LeakyRelu", ["x"], ["r2"], alpha=2.0),
        N("Sum", ["r1", "l2", "r2"], ["y"]),
    ], {"hundred": F32(100.0)}),
    "log-softmax-opset11": build([N("LogSoftmax", ["x"], ["y"], axis=1)], opset=11),
    # RMSNormalization (opset 23) over the last axis and over the last two
    "rmsnorm": build([N("RMSNormalization", ["x", "g6"], ["r1"], axis=-1, epsilon=1e-3),
                      N("RMSNormalization", ["r1", "g46"], ["y"], axis=1)],
                     {"g6": 1 + _w(6), "g46": 1 + _w(4, 6)}, opset=23),
    # InstanceNormalization over (N, C, H, W)
    "instancenorm": build([N("InstanceNormalization", ["x", "s", "b"], ["y"])],
                          {"s": 1 + _w(3), "b": _w(3)}, in_shape=("N", 3, 4, 5)),
    # reductions over any axes (opset 18: axes as an input), keepdims either way
    "reductions": build([
        N("ReduceMax", ["x", "ax12"], ["mx"], keepdims=0),             # (N,)
        N("ReduceMin", ["x", "axm1"], ["mn"], keepdims=1),             # (N, 4, 1)
        N("ReduceProd", ["x", "ax1"], ["pr"], keepdims=1),             # (N, 1, 6)
        N("ReduceMin", ["mn", "ax1"], ["mn2"], keepdims=0),            # (N, 1)
        N("Unsqueeze", ["mx", "axm1"], ["mxu"]),                       # (N, 1)
        N("Sub", ["mxu", "mn2"], ["span"]),                            # (N, 1)
        N("Unsqueeze", ["span", "axm1"], ["span3"]),                   # (N, 1, 1)
        N("Mul", ["pr", "span3"], ["m"]),                              # (N, 1, 6)
        N("Mul", ["x", "fifty"], ["big"]),                             # exp(50 x) overflows float32
        N("ReduceLogSumExp", ["big", "ax1"], ["lse"], keepdims=1),     # (N, 1, 6)
        N("ReduceL2", ["x", "ax1"], ["l2"], keepdims=1),
        N("ReduceL1", ["x", "ax1"], ["l1"], keepdims=1),
        N("ReduceSumSquare", ["x", "ax1"], ["ss"], keepdims=1),
        N("Add", ["l1", "one"], ["l1p"]), N("ReduceLogSum", ["l1p", "axm1"], ["ls"], keepdims=1),   # (N, 1, 1)
        N("Sum", ["m", "lse", "l2", "ss"], ["s4"]),
        N("Add", ["s4", "ls"], ["y"]),
    ], {"ax12": I64(1, 2), "axm1": I64(-1), "ax1": I64(1), "fifty": F32(50.0), "one": F32(1.0)},
        out_shape=("N", 1, 6)),
    # Whisper's and wav2vec's front ends: 1-D convolutions and pools over (N, C, L)
    "conv1d": build([
        N("Conv", ["x", "w1", "b1"], ["c0"], kernel_shape=[3], pads=[1, 1]),
        N("InstanceNormalization", ["c0", "s6", "b6"], ["c1"], epsilon=1e-4),     # wav2vec 2.0's GroupNorm
        N("Gelu", ["c1"], ["g1"]),
        N("Conv", ["g1", "w2", "b2"], ["c2"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        N("Conv", ["c2", "wd"], ["c3"], kernel_shape=[5], pads=[2, 2], group=6, dilations=[1]),
        N("MaxPool", ["c3"], ["p1"], kernel_shape=[2], strides=[2]),
        N("AveragePool", ["c3"], ["p2"], kernel_shape=[3], strides=[2], pads=[1, 0], count_include_pad=0),
        N("Concat", ["p1", "p2"], ["pc"], axis=1),
        N("GlobalAveragePool", ["pc"], ["ga"]),
        N("Add", ["pc", "ga"], ["y"]),
    ], {"w1": _w(6, 4, 3), "b1": _w(6), "w2": _w(6, 6, 3), "b2": _w(6), "wd": _w(6, 1, 5), "s6": 1 + _w(6),
        "b6": _w(6)},
        in_shape=("N", 4, 20), out_shape=("N", 12, 5)),
    # BatchNorm1d: after a linear over (N·L, C) (LeViT's), over (N, C, L) and over (N, C)
    "batchnorm-1d": build([
        N("MatMul", ["x", "w"], ["h"]),                                            # (N, 4, 8)
        N("Reshape", ["h", "rows"], ["hr"]),                                        # (N·4, 8)
        N("BatchNormalization", ["hr", "s8", "b8", "m8", "v8"], ["n2"], epsilon=1e-3),
        N("Reshape", ["n2", "back"], ["hb"]),                                       # (N, 4, 8)
        N("BatchNormalization", ["hb", "s4", "b4", "m4", "v4"], ["n3"]),           # channels 4, length 8
        N("ReduceMean", ["n3", "ax2"], ["r"], keepdims=0),                          # (N, 4)
        N("BatchNormalization", ["r", "s4", "b1d", "m4", "v1d"], ["n1"]),
        N("Unsqueeze", ["n1", "axm1"], ["u"]),
        N("Add", ["n3", "u"], ["y"]),
    ], {"w": _w(6, 8), "rows": I64(-1, 8), "back": I64(-1, 4, 8), "ax2": I64(2), "axm1": I64(-1),
        **{f"{k}{c}": v for c in (8, 4) for k, v in (("s", 1 + _w(c)), ("b", _w(c)), ("m", _w(c)),
                                                     ("v", 0.5 + np.abs(_w(c))))},
        "b1d": _w(4), "v1d": 0.5 + np.abs(_w(4))},
        out_shape=("N", 4, 8)),
    # PoolFormer's MLP: a GELU after a 1x1 conv, which no conv takes as its activation
    "conv-gelu": build([
        N("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        N("Gelu", ["c1"], ["g"]),
        N("Conv", ["g", "w2", "b2"], ["y"], kernel_shape=[1, 1]),
    ], {"w1": _w(8, 4, 1, 1), "b1": _w(8), "w2": _w(4, 8, 1, 1), "b2": _w(4)},
        in_shape=("N", 4, 5, 5), out_shape=("N", 4, 5, 5)),
    # elementwise maths, each op inside its domain (Round's halves go to even)
    "math": build([
        N("Tanh", ["x"], ["t"]), N("Asin", ["t"], ["a1"]), N("Acos", ["t"], ["a2"]), N("Atanh", ["t"], ["a3"]),
        N("Abs", ["x"], ["ab"]), N("Add", ["ab", "one"], ["ab1"]), N("Acosh", ["ab1"], ["a4"]),
        N("Sin", ["x"], ["s1"]), N("Cos", ["x"], ["s2"]), N("Tan", ["t"], ["s3"]), N("Atan", ["x"], ["s4"]),
        N("Sinh", ["x"], ["h1"]), N("Cosh", ["x"], ["h2"]), N("Asinh", ["x"], ["h3"]),
        N("Mul", ["x", "four"], ["x4"]), N("Floor", ["x4"], ["f1"]), N("Ceil", ["x4"], ["f2"]),
        N("Round", ["x4"], ["f3"]), N("Floor", ["x4"], ["fl"]), N("Add", ["fl", "half"], ["halves"]),
        N("Round", ["halves"], ["f4"]), N("Sign", ["f1"], ["f5"]),
        N("Sum", ["a1", "a2", "a3", "a4", "s1", "s2", "s3", "s4", "h1", "h2", "h3", "f1", "f2", "f3", "f4", "f5"], ["y"]),
    ], {"one": F32(1.0), "four": F32(4.0), "half": F32(0.5)}),
    # Sum, Mean, Max, Min of any number of operands, broadcasting, constants among them
    "variadic": build([
        N("ReduceMax", ["x", "axm1"], ["col"], keepdims=1),             # (N, 4, 1)
        N("Sum", ["x", "col", "c6", "c46"], ["s"]), N("Mean", ["x", "s", "col", "c6"], ["m"]),
        N("Max", ["x", "m", "col", "c6"], ["mx"]), N("Min", ["mx", "s", "c46", "c6"], ["mn"]),
        N("Mean", ["mn"], ["y"]),
    ], {"axm1": I64(-1), "c6": _w(6), "c46": _w(4, 6)}),
    # auto_pad as explicit pads, LpPool (p 1, 2, 3), GlobalMaxPool, Tile (ONNX's evaluator, which
    # measures the shapes, gets 1-D pools with auto_pad or strides wrong: 2-D only here)
    "windows": build([
        N("Conv", ["x", "w"], ["c"], auto_pad="SAME_LOWER", strides=[2, 1]),               # (N, 3, 3, 5)
        N("MaxPool", ["c"], ["mp"], kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2]),   # (N, 3, 2, 3)
        N("AveragePool", ["c"], ["ap"], kernel_shape=[3, 2], auto_pad="SAME_LOWER", strides=[2, 2]),
        N("LpPool", ["c"], ["l2"], kernel_shape=[2, 3], pads=[1, 1, 0, 1], strides=[2, 2]),
        N("LpPool", ["c"], ["l1"], kernel_shape=[2, 2], p=1, auto_pad="SAME_UPPER", strides=[2, 2]),
        N("LpPool", ["c"], ["l3"], kernel_shape=[2, 2], p=3, auto_pad="VALID", strides=[1, 2]),  # (N, 3, 2, 2)
        N("Sum", ["mp", "ap", "l2", "l1"], ["s"]),
        N("GlobalMaxPool", ["s"], ["g"]), N("Add", ["s", "g"], ["sg"]),
        N("Tile", ["l3", "reps"], ["t"]),                                                   # (N, 3, 2, 6)
        N("Reshape", ["t", "flat"], ["tf"]), N("Reshape", ["sg", "flat"], ["sf"]),
        N("Concat", ["tf", "sf"], ["y"], axis=2),                                           # (N, 3, 30)
    ], {"w": _w(3, 4, 3, 3), "reps": I64(1, 1, 1, 3), "flat": I64(0, 3, -1)},
        in_shape=("N", 4, 6, 5), out_shape=("N", 3, 30)),
    # Hardmax on the last axis, on another (opset 13), and over every axis from 1 on (opset 11)
    "hardmax": build([
        N("Mul", ["x", "two"], ["x2"]), N("Round", ["x2"], ["r"]),                  # ties
        N("Hardmax", ["r"], ["h1"]), N("Hardmax", ["x"], ["h2"], axis=1), N("Add", ["h1", "h2"], ["y"]),
    ], {"two": F32(2.0)}, opset=13),
    "hardmax-opset11": build([N("Hardmax", ["x"], ["y"], axis=1)], opset=11),
    # Pad over some axes (opset 18) and over all; CenterCropPad's body (a crop and a pad); Shrink
    "pads": build([
        N("Pad", ["x", "p1", "zero", "ax"], ["p"]),                     # (N, 7, 6)
        N("Pad", ["p", "p2", "half"], ["q"]),                           # (N, 8, 9)
        N("CenterCropPad", ["q", "size"], ["c"], axes=[1, 2]),          # (N, 4, 10)
        N("Shrink", ["c"], ["s1"], lambd=0.4, bias=0.1), N("Shrink", ["c"], ["s2"]),
        N("Add", ["s1", "s2"], ["y"]),
    ], {"p1": I64(1, 2), "ax": I64(-2), "zero": F32(0.0), "p2": I64(0, 0, 2, 0, 1, 1), "half": F32(0.5),
        "size": I64(4, 10)}, opset=18, out_shape=("N", 4, 10)),
    # Resize: linear, cubic with antialias, nearest over one inner axis, tf_crop_and_resize
    "resize": build([
        N("Resize", ["x", "", "s1"], ["r1"], mode="linear"),                                    # (N, 3, 8, 9)
        N("Resize", ["r1", "", "", "z2"], ["r2"], mode="cubic", antialias=1, axes=[2, 3]),     # (N, 3, 5, 7)
        N("Resize", ["r2", "", "s3"], ["r3"], mode="nearest", axes=[1],
          coordinate_transformation_mode="asymmetric", nearest_mode="floor"),                   # (N, 5, 5, 7)
        N("Resize", ["r3", "roi", "", "z4"], ["y"], mode="linear", axes=[2, 3], extrapolation_value=2.0,
          coordinate_transformation_mode="tf_crop_and_resize"),                                 # (N, 5, 4, 6)
    ], {"s1": F32([1, 1, 2, 1.5]), "z2": I64(5, 7), "s3": F32([1.7]), "z4": I64(4, 6),
        "roi": F32([-0.2, 0.1, 0.9, 1.3])}, in_shape=("N", 3, 4, 6), out_shape=("N", 5, 4, 6), opset=19),
    # LpNormalization (L1 on one axis, L2 on the last), Mod both ways, Compress by a constant condition
    "normalize-mod-compress": build([
        N("LpNormalization", ["x"], ["n1"], axis=1, p=1), N("LpNormalization", ["x"], ["n2"], p=2),
        N("Mul", ["x", "three"], ["x3"]),
        N("Mod", ["x3", "c6"], ["m1"], fmod=1), N("Mod", ["x3", "c6"], ["m2"], fmod=0),
        N("Sum", ["n1", "n2", "m1", "m2"], ["s"]),
        N("Compress", ["s", "keep"], ["y"], axis=2),
    ], {"three": F32(3.0), "c6": F32([0.7, -0.9, 1.3, -1.1, 0.5, 2.0]),
        "keep": np.array([1, 0, 1, 1, 0, 1], bool)}, out_shape=("N", 4, 4), opset=28),   # fmod=0 of floats: 28
    # ConvTranspose: groups, strides, pads, dilations, auto_pad, 1-D (ONNX's evaluator, which measures
    # the shapes, fails on groups of more than one input channel and on output_padding with dilations)
    "conv-transpose": build([
        N("ConvTranspose", ["x", "w1", "b1"], ["t1"], strides=[2, 2], group=4),          # (N, 4, 11, 8)
        N("ConvTranspose", ["t1", "w2"], ["t2"], dilations=[1, 2], pads=[1, 0, 0, 1], strides=[1, 2]),  # (N, 3, 11, 18)
        N("Reshape", ["t2", "flat"], ["f"]),                                            # (N, 3, 198)
        N("ConvTranspose", ["f", "w3", "b3"], ["y"], strides=[3], auto_pad="SAME_UPPER"),   # (N, 2, 594)
    ], {"w1": _w(4, 1, 3, 2), "b1": _w(4), "w2": _w(4, 3, 2, 3), "flat": I64(0, 3, -1), "w3": _w(3, 2, 4),
        "b3": _w(2)}, in_shape=("N", 4, 5, 4), out_shape=("N", 2, 594)),
    # 3-D pools as two 2-D ones: pads, strides, dilations, ceil_mode, count_include_pad either way
    "pools-3d": build([
        N("MaxPool", ["x"], ["m"], kernel_shape=[2, 3, 2], strides=[2, 2, 2], pads=[1, 1, 0, 1, 1, 1],
          dilations=[1, 1, 2], ceil_mode=1),                                                  # (N, 2, 4, 4, 4)
        N("AveragePool", ["x"], ["a"], kernel_shape=[3, 2, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 0, 1],
          ceil_mode=1),
        N("AveragePool", ["x"], ["c"], kernel_shape=[2, 2, 2], strides=[2, 2, 2], pads=[1, 1, 0, 1, 1, 1],
          count_include_pad=1),
        N("LpPool", ["x"], ["l"], kernel_shape=[2, 2, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]),
        N("Sum", ["m", "a", "c", "l"], ["y"]),
    ], in_shape=("N", 2, 6, 6, 7), out_shape=("N", 2, 4, 4, 4)),
    # Upsample (opset 9): nearest by whole scales, older exporters' upsampling
    "upsample": build([N("Upsample", ["x", "scales"], ["u"], mode="nearest"), N("Relu", ["u"], ["y"])],
                      {"scales": F32([1, 1, 2, 3])}, in_shape=("N", 2, 3, 4), out_shape=("N", 2, 6, 12), opset=9),
    # Col2Im: overlapping blocks add up, a fixed linear map of each sample
    "col2im": build([N("Col2Im", ["x", "image", "block"], ["c"], strides=[1, 1], pads=[0, 1, 0, 0]),
                     N("Relu", ["c"], ["y"])],
                    {"image": I64(4, 5), "block": I64(2, 2)}, in_shape=("N", 8, 15), out_shape=("N", 2, 4, 5)),
    # MatMul with a constant of any rank on either side (attention's K and V as initializers), a 1-D one
    "matmul-constants": build([
        N("MatMul", ["x", "kt"], ["s"]),                               # (N, 2, 4, 5): per-head constant
        N("Softmax", ["s"], ["p"]),
        N("MatMul", ["p", "v"], ["c"]),                                # (N, 2, 4, 6)
        N("MatMul", ["left", "c"], ["l"]),                             # (N, 2, 3, 6): constant on the left
        N("MatMul", ["l", "w1"], ["y1"]),                              # (N, 2, 3): a 1-D constant
        N("MatMul", ["row", "l"], ["y2"]),                             # (N, 2, 6): 1-D on the left
        N("MatMul", ["y2", "w2"], ["y3"]),                             # (N, 2, 3): 2-D, a linear
        N("Add", ["y1", "y3"], ["y"]),
    ], {"kt": _w(2, 6, 5), "v": _w(1, 5, 6), "left": _w(3, 4), "w1": _w(6), "row": _w(3), "w2": _w(6, 3)},
        in_shape=("N", 2, 4, 6), out_shape=("N", 2, 3)),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_graph_on_every_engine_against_onnxruntime(graph):
    with np.errstate(invalid="ignore"):                   # "masks" takes sqrt of negatives on purpose
        check_every_engine(GRAPHS[graph])


def test_constant_masks_fold_and_activations_get_kinds():
    kinds = {graph: [op.kind for op in load_onnx(data).ops] for graph, data in GRAPHS.items()}
    assert kinds["triangles"].count("where") == 4        # the masked fill, two Trilus, the broadcast Where
    assert "compare" in kinds["triangles"]               # Greater of an activation; the causal mask folded
    assert {"hardswish", "hardsigmoid", "reciprocal", "abs", "log"} <= set(kinds["activations"])
    assert {"compare", "extremum", "isnan", "where"} <= set(kinds["masks"])
    assert {"sin", "acosh", "atanh", "floor", "ceil", "round", "sign"} <= set(kinds["math"])
    assert kinds["conv1d"].count("conv") == 3 and {"maxpool", "averagepool", "globalaveragepool"} <= set(kinds["conv1d"])


@pytest.mark.parametrize("name", PLANNED)
def test_planned_engines_allocate_nothing_per_forward(name):
    for graph, data in GRAPHS.items():
        model = load_onnx(data)
        engine = ENGINES[name](model, 16)
        with np.errstate(invalid="ignore"):
            peak = tracemalloc_peak(engine, model.random_input(16, rng=0))
        assert peak <= 4096, f"{name} on {graph}: {peak} B per warm forward"


@pytest.mark.parametrize("name", PLANNED)
def test_planned_engines_allocate_nothing_under_memray(name):
    """Native allocations too (a ufunc's buffer, a reduction's state), BLAS on one thread."""
    for graph in ("masks", "reductions", "triangles", "hardmax", "matmul-constants"):
        model = load_onnx(GRAPHS[graph])
        engine = ENGINES[name](model, 16)
        with np.errstate(invalid="ignore"):
            peak = memray_peak(engine, model.random_input(16, rng=0))
        assert peak <= 4096, f"{name} on {graph}: {peak} B per warm forward"


# --- refusals name the node and the op ---------------------------------------------------------

def test_a_cast_that_would_truncate_is_refused_by_name():
    data = build([N("Cast", ["x"], ["i"], to=TensorProto.INT64, name="to_int"),
                  N("Cast", ["i"], ["y"], to=TensorProto.FLOAT)])
    with pytest.raises(OnnxImportError, match=r"node 'to_int': Cast is supported, but not here: a Cast of a "
                                              r"float32 activation to INT64"):
        load_onnx(data)


def test_a_3d_convolution_is_refused_by_name():
    data = build([N("Conv", ["x", "w"], ["y"], name="conv3d")], {"w": _w(2, 2, 2, 2, 2)},
                 in_shape=("N", 2, 4, 4, 4), out_shape=("N", 2, 3, 3, 3))
    with pytest.raises(OnnxImportError, match=r"node 'conv3d': Conv is supported, but not here: .*3-D kernel"):
        load_onnx(data)


def test_a_subgraph_reading_the_input_makes_its_node_dynamic():
    """An If whose branches read x depends on x, though x is none of its inputs: refused by name
    (not folded as a constant, nor a crash)."""
    branch = lambda op: helper.make_graph(  # noqa: E731
        [N(op, ["x"], ["b"])], op, [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4, 6])])
    data = build([N("If", ["cond"], ["y"], name="choose", then_branch=branch("Neg"), else_branch=branch("Relu"))],
                 {"cond": np.array(True)})
    with pytest.raises(OnnxImportError, match=r"node 'choose': If \(domain ai.onnx, opset 20\) is not supported"):
        load_onnx(data)


def test_a_graph_that_mixes_samples_names_the_first_node_that_does():
    data = build([N("Relu", ["x"], ["r"]), N("Softmax", ["r"], ["s"], axis=0, name="over_batch"),
                  N("Add", ["r", "s"], ["y"])])
    with pytest.raises(OnnxImportError, match=r"mixes samples.*first at node 'over_batch' \(Softmax\)"):
        load_onnx(data)


# --- ops defined by a function body: replaced by it before lowering (engines.importer.expand) -----

FUNCTION_GRAPHS = {
    # Elu with its default alpha (the body reads the attribute), Celu's body calls Elu, MVN's axes
    "activation-bodies": build([
        N("Elu", ["x"], ["e"], name="elu"), N("Celu", ["e"], ["c"], alpha=0.7, name="celu"),
        N("Softsign", ["c"], ["s"]), N("Softplus", ["s"], ["p"]),
        N("ThresholdedRelu", ["p"], ["t"], alpha=0.6),
        N("MeanVarianceNormalization", ["t"], ["y"], axes=[2, 3]),
    ], in_shape=("N", 3, 4, 5)),
}


@pytest.mark.parametrize("graph", sorted(FUNCTION_GRAPHS))
def test_function_bodies_on_every_engine_against_onnxruntime(graph):
    model = check_every_engine(FUNCTION_GRAPHS[graph])
    named = {n for names in model.origin.values() for n in names}
    assert {"elu", "celu"} <= named and not any("/" in n for n in named)     # the file's nodes, not the body's


def test_function_bodies_allocate_nothing_per_forward():
    for data in FUNCTION_GRAPHS.values():
        model = load_onnx(data)
        for name in PLANNED:
            engine = ENGINES[name](model, 16)
            assert tracemalloc_peak(engine, model.random_input(16, rng=0)) <= 4096, name


def check_at_fixed_batch(data: bytes):
    """A file that runs at the one batch it fixes: every NumPy engine and the reference against ONNX
    Runtime, twice (warm), and no allocation per warm forward on the planned engines; the model."""
    model = load_onnx(data)
    batch = model.fixed_batch.size if model.fixed_batch else 1
    x = model.random_input(batch, rng=5)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(model.reference(x), expected, rtol=1e-4, atol=1e-5)
    for name in OWN:
        engine = ENGINES[name](model, batch)
        for _ in range(2):
            np.testing.assert_allclose(engine.forward(x), expected, rtol=1e-4, atol=1e-5, err_msg=name)
        assert name == "naive" or tracemalloc_peak(engine, x) <= 4096, name
    return model


def test_attention_runs_as_its_function_body_with_constant_keys_and_values():
    """Attention (opset 23) has no rule of its own: its body, K and V initializers, on every engine."""
    data = build([N("Attention", ["x", "k", "v"], ["y"], is_causal=1, q_num_heads=2, kv_num_heads=2)],
                 {"k": _w(1, 5, 8), "v": _w(1, 5, 6)}, in_shape=(1, 3, 8), out_shape=(1, 3, 6), opset=23)
    model = check_at_fixed_batch(data)
    assert "matmul_const" in [op.kind for op in model.ops]
    # opset 24: absent optional inputs before a given one (the keys' lengths), 4-D
    data = build([N("Attention", ["x", "k", "v", "", "", "", "lens"], ["y"], is_causal=1)],
                 {"k": _w(1, 2, 5, 8), "v": _w(1, 2, 5, 6), "lens": I64(4)}, in_shape=(1, 2, 3, 8),
                 out_shape=(1, 2, 3, 6), opset=24)
    check_at_fixed_batch(data)
    assert "'y/" not in model.fixed_batch.reason          # the file's node, not its body's


def test_a_body_that_does_not_lower_refuses_the_node_by_name():
    data = build([N("AffineGrid", ["x", "size"], ["y"], name="grid")], {"size": I64(1, 1, 3, 4)},
                 in_shape=("N", 2, 3), out_shape=("N", 3, 4, 2))          # its body branches with an If
    with pytest.raises(OnnxImportError, match=r"^node 'grid': AffineGrid \(domain ai.onnx, "
                                              r"opset 20\) is not supported: in its function body, If"):
        load_onnx(data)


def test_grid_sample_with_a_constant_grid_is_a_map_per_channel():
    """GridSample's grid has the input's batch, so a constant grid fixes the batch at 1."""
    data = build([
        N("GridSample", ["x", "grid"], ["g1"], mode="linear"),
        N("GridSample", ["x", "grid"], ["g2"], mode="cubic", padding_mode="reflection", align_corners=1),
        N("GridSample", ["x", "grid"], ["g3"], mode="nearest", padding_mode="border"),
        N("Sum", ["g1", "g2", "g3"], ["y"]),
    ], {"grid": R.uniform(-1.2, 1.2, (1, 3, 6, 2)).astype(np.float32)}, in_shape=(1, 3, 4, 5),
        out_shape=(1, 3, 3, 6), opset=20)
    model = check_at_fixed_batch(data)
    assert [op.kind for op in model.ops].count("linear") == 3


def test_gather_elements_of_an_activation_by_constant_indices():
    """The indices have the input's batch (1 here); SoftmaxCrossEntropyLoss's body gathers so too."""
    idx = R.integers(-6, 6, (1, 4, 3))
    data = build([
        N("GatherElements", ["x", "idx"], ["g"], axis=2),                     # (1, 4, 3), negatives too
        N("Gather", ["x", "cols"], ["t"], axis=2),                             # (1, 4, 3): a take
        N("Add", ["g", "t"], ["s"]),
        N("SoftmaxCrossEntropyLoss", ["s", "labels"], ["l"], reduction="none"),   # (1, 3)
        N("Unsqueeze", ["l", "ax1"], ["lu"]), N("Add", ["s", "lu"], ["y"]),
    ], {"idx": idx, "cols": I64(5, 0, -2), "labels": np.array([[0, 3, 1]], np.int64), "ax1": I64(1)},
        in_shape=(1, 4, 6), out_shape=(1, 4, 3), opset=13)
    model = check_at_fixed_batch(data)
    assert [op.kind for op in model.ops].count("take") >= 3


def test_scatters_of_constant_updates_into_a_file_read_whole():
    """Constant indices address the file's whole shape (batch fixed at 2): read with no batch axis."""
    data = build([
        N("ScatterElements", ["x", "ie", "ue"], ["a"], axis=2),
        N("ScatterElements", ["a", "ie", "ue"], ["b"], axis=2, reduction="add"),
        N("ScatterND", ["b", "ind", "und"], ["c"], reduction="max"),
        N("ScatterND", ["c", "ind2", "und2"], ["y"]),
    ], {"ie": np.array([[[0, 3], [1, 1]], [[-1, 2], [0, 0]]]), "ue": _w(2, 2, 2),
        "ind": np.array([[1, 0], [0, 2], [1, 0]]), "und": _w(3, 4), "ind2": np.array([[1]]), "und2": _w(1, 3, 4)},
        in_shape=(2, 3, 4), opset=18)
    model = check_at_fixed_batch(data)
    assert model.whole and {"where", "binary", "extremum"} <= {op.kind for op in model.ops}


def _recurrent_graph(layout: int, in_shape, out_shape):
    """RNN, then GRU (linear_before_reset) and LSTM (peepholes), each both ways, seq 4, hidden 3."""
    hid, dirs = 3, 2
    rnn_in = in_shape[-1]
    return build([
        N("RNN", ["x", "wr", "rr", "br"], ["y1", ""], hidden_size=hid, direction="bidirectional", layout=layout),
        N("Reshape", ["y1", "flat"], ["f1"]),                                      # (.., 4, 6) time-major or not
        N("GRU", ["f1", "wg", "rg", "bg"], ["y2"], hidden_size=hid, direction="bidirectional", layout=layout,
          linear_before_reset=1),
        N("Reshape", ["y2", "flat"], ["f2"]),
        N("LSTM", ["f2", "wl", "rl", "bl", "", "", "", "pl"], ["", "yh"], hidden_size=hid, direction="reverse",
          layout=layout),
        N("Reshape", ["yh", "flat_h"], ["y"]),
    ], {"wr": _w(dirs, hid, rnn_in), "rr": _w(dirs, hid, hid), "br": _w(dirs, 2 * hid),
        "wg": _w(dirs, 3 * hid, 2 * hid), "rg": _w(dirs, 3 * hid, hid), "bg": _w(dirs, 6 * hid),
        "wl": _w(1, 4 * hid, 2 * hid), "rl": _w(1, 4 * hid, hid), "bl": _w(1, 8 * hid), "pl": _w(1, 3 * hid),
        "flat": I64(*((4, 0, -1) if layout == 0 else (0, 4, -1))), "flat_h": I64(*((1, 0, -1) if layout == 0 else (0, 1, -1)))},
        in_shape=in_shape, out_shape=out_shape, opset=14)


def test_recurrent_ops_unrolled_against_onnxruntime():
    """Time-major (layout 0): X's first axis is time, so the fixed file is read whole."""
    data = _recurrent_graph(0, (4, 2, 5), (1, 2, 3))
    model = check_at_fixed_batch(data)
    assert {"linear", "sigmoid", "tanh", "concat"} <= {op.kind for op in model.ops}


@pytest.mark.parametrize("op, gates, attrs", [("RNN", 1, dict(direction="bidirectional")),
                                              ("GRU", 3, dict(direction="bidirectional", linear_before_reset=1)),
                                              ("GRU", 3, dict(direction="reverse")),
                                              ("LSTM", 4, dict(direction="reverse"))])
@pytest.mark.parametrize("output", ["Y", "Y_h"])
def test_recurrent_ops_batch_first_against_onnx_reference(op, gates, attrs, output):
    """Batch-first (layout 1): the batch is X's first axis, any batch. ONNX Runtime refuses layout 1,
    so ONNX's reference evaluator is the peer (on a contiguous input: given a strided view inside a
    graph, its LSTM's layout-1 path gave other values for the same input)."""
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    inputs = ["x", "w", "r", "b"] + (["", "", "", "p"] if op == "LSTM" else [])
    data = build([N(op, inputs, ["y"] if output == "Y" else ["", "y"], hidden_size=3, layout=1, **attrs)],
                 {"w": _w(dirs, gates * 3, 5), "r": _w(dirs, gates * 3, 3), "b": _w(dirs, 6 * gates), "p": _w(dirs, 9)},
                 in_shape=("N", 4, 5), out_shape=("N", 4, dirs, 3) if output == "Y" else ("N", dirs, 3), opset=14)
    model = load_onnx(data)
    assert model.fixed_batch is None
    from onnx.reference import ReferenceEvaluator
    x = model.random_input(MAX_BATCH, rng=2)
    expected = ReferenceEvaluator(onnx.load_from_string(data)).run(None, {"x": x})[0]
    np.testing.assert_allclose(model.reference(x), expected, rtol=1e-4, atol=1e-6)
    for name in OWN:
        engine = ENGINES[name](model, MAX_BATCH)
        np.testing.assert_allclose(engine.forward(x), expected, rtol=1e-4, atol=1e-5, err_msg=name)
        assert name == "naive" or tracemalloc_peak(engine, x) <= 4096, name


def test_element_moves_by_constant_indices_in_a_file_read_whole():
    """ReverseSequence, GatherND and MaxUnpool move elements by constant indices: a take (and a
    where for MaxUnpool's zeros), found by running each on the elements' positions."""
    data = build([
        N("ReverseSequence", ["x", "lens"], ["r"], batch_axis=1, time_axis=0),             # (2, 4, 6)
        N("GatherND", ["r", "nd"], ["g"]),                                                  # (3, 6)
        N("Reshape", ["g", "img"], ["i"]),                                                  # (1, 2, 3, 3)
        N("MaxUnpool", ["i", "where"], ["u"], kernel_shape=[2, 2], strides=[2, 2]),          # (1, 2, 6, 6)
        N("Reshape", ["u", "back"], ["y"]),                                                 # (2, 4, 9)
    ], {"lens": I64(2, 1, 2, 2), "nd": np.array([[1, 3], [0, 0], [1, 1]]), "img": I64(1, 2, 3, 3),
        "where": R.permutation(36)[:18].reshape(1, 2, 3, 3) % 36, "back": I64(2, 4, 9)},
        in_shape=(2, 4, 6), out_shape=(2, 4, 9), opset=18)
    model = check_at_fixed_batch(data)
    assert model.whole and {"take", "where"} <= {op.kind for op in model.ops}


def _multi_query(nd_indices) -> bytes:
    """Falcon's multi-query attention as its dynamo export writes it: one fused projection of
    4 query heads, one key and one value head; the heads axis moved first (the batch second),
    GatherND picking the key and the value head, and products that broadcast them over the
    query heads."""
    d, heads, hd = 8, 4, 2
    w = (R.standard_normal((d, (heads + 2) * hd)) / 3).astype(np.float32)
    return build([
        N("MatMul", ["x", "w"], ["qkv"]),                                      # (N, 4, 12)
        N("Reshape", ["qkv", "split"], ["r"]),                                 # (N, 4, 6, 2)
        N("Transpose", ["r"], ["t"], perm=[2, 0, 1, 3]),                       # (6, N, 4, 2)
        N("Slice", ["t", "z", "h", "z"], ["q0"]),                              # (4, N, 4, 2)
        N("Transpose", ["q0"], ["q"], perm=[1, 0, 2, 3]),                      # (N, 4, 4, 2)
        N("GatherND", ["t", "ik"], ["k0"]),                                    # (1, N, 4, 2)
        N("GatherND", ["t", "iv"], ["v0"]),
        N("Transpose", ["k0"], ["kt"], perm=[1, 0, 3, 2]),                     # (N, 1, 2, 4)
        N("Transpose", ["v0"], ["v"], perm=[1, 0, 2, 3]),                      # (N, 1, 4, 2)
        N("MatMul", ["q", "kt"], ["s"]),                                       # (N, 4, 4, 4): broadcast
        N("Softmax", ["s"], ["p"], axis=-1),
        N("MatMul", ["p", "v"], ["o"]),                                        # (N, 4, 4, 2): broadcast
        N("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        N("Reshape", ["ot", "back"], ["y"]),                                   # (N, 4, 8)
    ], {"w": w, "split": I64(0, 4, heads + 2, hd), "z": I64(0), "h": I64(heads), "ik": nd_indices[0],
        "iv": nd_indices[1], "back": I64(0, 4, d)}, in_shape=("N", 4, d), out_shape=("N", 4, d))


def test_multi_query_attention_picks_its_heads_per_sample_and_broadcasts_them():
    """GatherND whose indices address an axis before the batch moves each sample's elements
    alike: a take per sample, probed at batch 1 and 2. The products broadcast the one key and
    value head over the query heads (an expand), and the attention reads it once (one key/value
    head in its ``attention`` op, no expand left)."""
    model = check_every_engine(_multi_query((I64(-2)[None], I64(-1)[None])))
    (attention,) = [op for op in model.ops if op.kind == "attention"]
    assert "take" in {op.kind for op in model.ops} and "expand" not in {op.kind for op in model.ops}
    assert model.shapes[attention.inputs[1]][0] == 1
    x = model.random_input(MAX_BATCH, rng=0)
    for name in PLANNED:
        assert tracemalloc_peak(ENGINES[name](model, MAX_BATCH), x) <= 4096, name


def test_a_gather_nd_that_picks_samples_is_refused_by_name():
    """Indices into the batch axis (the first sample, whatever the batch) mix samples: refused,
    naming the node and the output that loses its batch axis."""
    data = build([N("GatherND", ["x", "nd"], ["g"]), N("Add", ["g", "x"], ["y"])], {"nd": I64(0)[None]},
                 in_shape=("N", 4, 6), out_shape=("N", 4, 6))
    with pytest.raises(OnnxImportError, match=r"\(GatherND\): its output 'g' does not keep one batch axis"):
        load_onnx(data)

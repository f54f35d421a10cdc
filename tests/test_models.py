"""The model zoo: seeded weights, declared shapes, and the float64 reference's op semantics."""
import math

import numpy as np
import pytest

from engines import MODELS
from engines.ir import ops
from engines.ir.models import Model, Op


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_seed_same_weights_bit_for_bit(name):
    kw = {"dim": 32, "seq": 4} if name == "transformer" else {"dim": 32}
    a, b, c = MODELS[name](**kw, seed=7), MODELS[name](**kw, seed=7), MODELS[name](**kw, seed=8)
    assert a.params.keys() == b.params.keys()
    for key in a.params:
        assert a.params[key].dtype == np.float32
        assert a.params[key].tobytes() == b.params[key].tobytes()
    assert any(a.params[k].tobytes() != c.params[k].tobytes() for k in a.params)


def test_zoo_shapes_and_defaults():
    seed_mlp = MODELS["mlp"]()
    assert seed_mlp.input_shape(32) == (32, 1024) and seed_mlp.output_shape(32) == (32, 1024)
    assert [op.kind for op in seed_mlp.ops] == ["linear", "relu", "linear"]
    deep = MODELS["mlp-deep"](dim=16)
    assert [op.kind for op in deep.ops].count("linear") == 6
    assert [op.kind for op in deep.ops].count("relu") == 5
    block = MODELS["transformer"](dim=64, seq=8, heads=8)
    assert block.input_shape(3) == (3, 8, 64)
    assert [op.kind for op in block.ops] == [
        "layernorm", "linear", "attn_scores", "softmax", "attn_context", "linear", "add",
        "layernorm", "linear", "gelu", "linear", "add"]
    assert block.shapes["fc1"] == (8, 256)   # the 4x MLP


@pytest.mark.parametrize("name", sorted(MODELS))
def test_declared_shapes_match_what_eager_produces(name):
    kw = {"dim": 32, "seq": 4} if name == "transformer" else {"dim": 32}
    model = MODELS[name](**kw)
    seen = {}
    model.run_eager(model.random_input(3, 0), on_op=lambda op, y: seen.setdefault(op.output, y.shape))
    assert seen == {op.output: (3, *model.shapes[op.output]) for op in model.ops}


@pytest.mark.parametrize("kwargs, message", [
    (dict(dim=0), "dim must be a positive integer"),
    (dict(dim=2.5), "dim must be a positive integer"),
    (dict(dim=30, heads=8), "divisible by heads=8"),
])
def test_builder_rejects_bad_dims(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MODELS["transformer"](**kwargs)


def test_model_rejects_ill_formed_op_lists():
    with pytest.raises(ValueError, match="reads \\['h'\\] before"):
        Model("bad", (Op("relu", ("h",), "y"),), {"x": (4,), "y": (4,)}, {})
    with pytest.raises(ValueError, match="written twice"):
        Model("bad", (Op("relu", ("x",), "y"), Op("relu", ("x",), "y")), {"x": (4,), "y": (4,)}, {})
    with pytest.raises(ValueError, match="unknown kind 'conv3d'"):
        Model("bad", (Op("conv3d", ("x",), "y"),), {"x": (4,), "y": (4,)}, {})


# The reference is only as good as its op semantics: check each against first principles.

def test_reference_gelu_is_the_tanh_approximation(rng):
    x = rng.standard_normal(50)
    want = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x]
    np.testing.assert_allclose(ops.gelu_eager(x), want, rtol=1e-12)


def test_reference_layernorm_normalises_rows(rng):
    x = rng.standard_normal((5, 16)) * 3 + 2
    y = ops.layernorm_eager(x, np.ones(16), np.zeros(16), eps=0.0)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.std(axis=-1), 1, atol=1e-12)


def test_reference_softmax_is_a_distribution_and_shift_invariant(rng):
    x = rng.standard_normal((4, 9)) * 50
    p = ops.softmax_eager(x)
    np.testing.assert_allclose(p.sum(axis=-1), 1, atol=1e-12)
    np.testing.assert_allclose(ops.softmax_eager(x + 1000), p, atol=1e-12)
    assert p.argmax(axis=-1).tolist() == x.argmax(axis=-1).tolist()


def test_reference_attention_matches_a_per_head_loop(rng):
    batch, seq, heads, hd = 2, 5, 3, 4
    dim = heads * hd
    qkv = rng.standard_normal((batch, seq, 3 * dim))
    probs = ops.softmax_eager(ops.attn_scores_eager(qkv, heads=heads))
    ctx = ops.attn_context_eager(probs, qkv, heads=heads)
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * hd, (h + 1) * hd)
            q, k, v = qkv[b, :, cols], qkv[b, :, dim:][:, cols], qkv[b, :, 2 * dim:][:, cols]
            s = q @ k.T / math.sqrt(hd)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            np.testing.assert_allclose(ctx[b, :, cols], p @ v, atol=1e-12)


def test_reference_mlp_is_the_textbook_formula(rng):
    model = MODELS["mlp"](dim=16, hidden=24, out_dim=8, seed=3)
    x = model.random_input(4, rng)
    p = {k: v.astype(np.float64) for k, v in model.params.items()}
    want = np.maximum(x @ p["fc1.w"] + p["fc1.b"], 0) @ p["fc2.w"] + p["fc2.b"]
    np.testing.assert_allclose(model.reference(x), want, rtol=1e-12)
    assert model.flops(4) == 4 * (2 * 16 * 24 + 24 + 24 + 2 * 24 * 8 + 8)

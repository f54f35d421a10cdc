"""What each op computes: once eagerly, once into pre-planned memory.

Every op kind is one `OpKind`:

- ``eager``: plain NumPy expressions that return fresh arrays. Run in float64
  it is the reference every engine is checked against; run in float32 it is
  the naive engine.
- ``calls``: the same maths written into caller-owned memory with ``out=``
  and no array allocation, as the list of NumPy calls ``(fn, args)`` that
  computes it, bound to the engine's arrays once: an engine runs a forward as
  ``for fn, args in calls: fn(*args)``, with no per-op Python in between (at
  mlp-b1-d256 that took static's forward from 36 to 25 µs). Two NumPy traps
  shape these calls: a ufunc with
  a *broadcast* operand (``y += bias``) allocates NumPy's 8192-element buffer
  on every call, and axis reductions keep ~1 KiB of iterator state. So
  broadcast parameters are pre-tiled and applied in row chunks, per-row
  statistics are broadcast with ``np.copyto`` (which needs no buffer) into a
  scratch tensor, and row means are matrix-vector products.
- ``prepare``: turns the model's parameters into what the calls read.
- ``scratch``: per-sample shapes of the temporaries the calls need, from the
  input shapes and the op's attributes; the engine decides where they live.
- ``inplace``: the inputs whose buffer the output may take over when that
  input is not read again.

Calling convention: ``calls(out, *inputs, *prepared, *scratch, **attrs) -> [(fn, args), ...]``,
every array with its batch axis first.

Every tensor is float32 (float64 in the reference). Booleans (comparisons, IsNaN, masks) are
float32 0.0/1.0 and integers float32 whole numbers, so planning and views need no other dtype;
logic is arithmetic on masks and only ``where`` reads one as truth (``COMPARE`` below says how).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..memory import aligned
from .calls import (Calls, OpKind, maximum, minimum, ones_column, quantization_step, rows2d, tile, tiled_calls,
                    weight_layout, zero_rows)
from .conv import CONV_OPS

GELU_C = math.sqrt(2.0 / math.pi)


# --- linear: x @ W + b ------------------------------------------------------

def linear_eager(x, w, b):
    return x @ w + b


def linear_prepare(w, b, max_rows):
    return weight_layout(w), tile(b, max_rows)


def linear_calls(out, x, w, b_tiled) -> Calls:
    y = rows2d(out)
    return [(np.matmul, (rows2d(x), w, y))] + tiled_calls(np.add, y, b_tiled)


def linear_flops(in_shapes, out_shape, **_attrs):
    rows = math.prod(out_shape[:-1])
    return 2 * rows * in_shapes[0][-1] * out_shape[-1] + rows * out_shape[-1]


# --- elementwise ------------------------------------------------------------

def relu_eager(x):
    return np.maximum(x, 0)


def relu_calls(out, x) -> Calls:
    # Against a block of zero rows, not the scalar 0: 4.4 us against 9.3 us at 128 x 256.
    return tiled_calls(maximum, rows2d(out), zero_rows(x.shape[-1]), rows2d(x))


def gelu_eager(x):
    # tanh approximation, as in GPT-2 / BERT. x * x * x, not x**3: NumPy's float32 power
    # took 47 of naive's 67 ms on transformer-b8-d256-s64 (mlexec analyze's per-op table).
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * (x * x * x))))


# Values per sample one block of the tanh GELU's passes covers: its scratch (the zoo's transformer
# at d256 s64, 64 x 1,024 a sample, is one block: its calls are what they were unblocked).
GELU_BLOCK = 1 << 16


def row_block(shape, values: int) -> tuple[int, int]:
    """A scratch of whole rows of ``shape`` (per sample), ``values`` at most (one row at least)."""
    return min(math.prod(shape[:-1]), max(1, values // shape[-1])), shape[-1]


def gelu_scratch(in_shapes, **_attrs):
    return (row_block(in_shapes[0], GELU_BLOCK),)


def gelu_calls(out, x, scratch, doubled: bool = False) -> Calls:
    """0.5·x·(1 + tanh(x·(C + C·0.044715·x²))) in blocks of ``scratch``'s rows, eight passes a
    block, each block's output written last: out may be x. ``doubled``: 2·gelu, seven passes (the
    next linear takes the 0.5, ``fused``)."""
    y, x2, t = rows2d(out), rows2d(x), rows2d(scratch)
    tail = [(np.add, 1.0)] if doubled else [(np.multiply, 0.5), (np.add, 0.5)]
    calls = []
    for i in range(0, len(y), len(t)):
        yb, xb = y[i:i + len(t)], x2[i:i + len(t)]
        tb = t[:len(yb)]
        calls += [(np.multiply, (xb, xb, tb)), (np.multiply, (tb, GELU_C * 0.044715, tb)), (np.add, (tb, GELU_C, tb)),
                  (np.multiply, (tb, xb, tb)), (np.tanh, (tb, tb)), *((fn, (tb, c, tb)) for fn, c in tail),
                  (np.multiply, (tb, xb, yb))]
    return calls


def add_eager(a, b):
    return a + b


def add_calls(out, a, b) -> Calls:
    return [(np.add, (a, b, out))]


# --- layernorm over the last axis --------------------------------------------

def layernorm_eager(x, gamma, beta, *, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def mean_column(width: int) -> np.ndarray:
    """The (width, 1) column that turns a row mean into a matvec."""
    return aligned(np.full((width, 1), 1.0 / width))


def layernorm_prepare(gamma, beta, max_rows):
    return tile(gamma, max_rows), tile(beta, max_rows), mean_column(gamma.shape[-1])


def layernorm_calls(out, x, gamma_t, beta_t, mean_col, tmp, stat, *, eps) -> Calls:
    y = rows2d(out)
    return standardize_calls(y, rows2d(x), rows2d(tmp), rows2d(stat), eps, matvec_calls(mean_col)) \
        + tiled_calls(np.multiply, y, gamma_t) + tiled_calls(np.add, y, beta_t)


def matvec_calls(col: np.ndarray):
    """The default matvec: (x, out) -> the calls for out = x @ col, on NumPy's matmul."""
    return lambda x, out: [(np.matmul, (x, col, out))]


def standardize_calls(y, x, tmp, stat, eps, matvec) -> Calls:
    """Calls for y = (x - mean) / sqrt(var + eps) over rows; ``matvec(a, out)`` gives the calls
    for out = a @ (1/width column), so an engine can put the row means on its own BLAS."""
    return [*matvec(x, stat),                   # mean, as a matvec: no reduction state
            (np.copyto, (tmp, stat)),           # broadcast without the ufunc buffer
            (np.subtract, (x, tmp, y)),         # centred (y may alias x)
            *mean_square_calls(y, tmp, stat, matvec),     # variance
            *rescale_calls(y, y, tmp, stat, eps)]


# --- rmsnorm over the last axis (T5's LayerNorm; Llama's, Qwen2's, Mistral's RMSNorm) ------

def rmsnorm_eager(x, gamma, *, eps):
    return x / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + eps) * gamma


def rmsnorm_prepare(gamma, max_rows):
    return tile(gamma.reshape(-1), max_rows), mean_column(gamma.size)


def rmsnorm_calls(out, x, gamma_t, mean_col, tmp, stat, *, eps) -> Calls:
    y = rows2d(out)
    return mean_square_calls(rows2d(x), rows2d(tmp), rows2d(stat), matvec_calls(mean_col)) \
        + rescale_calls(y, rows2d(x), rows2d(tmp), rows2d(stat), eps) + tiled_calls(np.multiply, y, gamma_t)


def mean_square_calls(x, tmp, stat, matvec) -> Calls:
    """Calls for stat = mean(x²) over rows, the squares in tmp."""
    return [(np.multiply, (x, x, tmp)), *matvec(tmp, stat)]


def rescale_calls(y, x, tmp, stat, eps) -> Calls:
    """Calls for y = x / sqrt(stat + eps), stat (rows, 1) spread over tmp (a broadcast without
    NumPy's ufunc buffer); y may be x."""
    # A ufunc on a one-element array allocates (NumPy 2.4: 0.8-1.1 KiB a call): one row's statistic
    # (a LayerNorm after global pooling, at batch 1) is spread over its row before it is scaled.
    at = tmp if stat.size == 1 else stat
    spread = [(np.copyto, (tmp, stat))]
    scale = [(np.add, (at, eps, at)), (np.sqrt, (at, at)), (np.reciprocal, (at, at))]
    return [*(spread + scale if at is tmp else scale + spread), (np.multiply, (x, tmp, y))]


# --- rotary position embedding over the last axis (Llama's, Qwen2's, Mistral's q and k) --------

def _halves_swapped(x):
    h = x.shape[-1] // 2
    return np.concatenate((x[..., h:], x[..., :h]), axis=-1)


def rotary_eager(x, cos, sin_signed):
    """x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1): ``sin_signed`` is sin with its
    first half negated, so the second term is the halves swapped times it. cos and sin cover the
    trailing axes of their size (positions x head_dim), the same for every leading row."""
    rows = x.reshape(-1, cos.size)
    y = rows * cos.reshape(-1)
    y += _halves_swapped(x).reshape(rows.shape) * sin_signed.reshape(-1)
    return y.reshape(x.shape)


def rotary_calls(out, x, cos_t, sin_t, tmp) -> Calls:
    """tmp = x with its halves swapped (two copies between half views: NumPy's ufuncs buffer
    strided operands, 96 KiB a call, its copies do not), tmp *= the signed sin, y = x * cos,
    y += tmp; the constants pre-tiled over rows (``binary_prepare``)."""
    d, width = x.shape[-1], cos_t.shape[-1]
    h = d // 2
    x2, t2 = x.reshape(-1, d), tmp.reshape(-1, d)
    xs, ys, ts = (a.reshape(-1, width) for a in (x, out, tmp))
    return [(np.copyto, (t2[:, :h], x2[:, h:])), (np.copyto, (t2[:, h:], x2[:, :h])),
            *tiled_calls(np.multiply, ts, sin_t), *tiled_calls(np.multiply, ys, cos_t, xs), (np.add, (ys, ts, ys))]


def rowwise_scratch(in_shapes, **_attrs):
    shape = in_shapes[0]
    return shape, shape[:-1] + (1,)


# --- softmax over the last axis ----------------------------------------------

def softmax_eager(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# Softmax shifts every row by the tensor's largest value, not by its own: one vectorised
# reduction instead of a per-row one, which NumPy pays ~170 ns a row for, and no (rows, 1)
# broadcast pass. The result is the same function (softmax is shift-invariant) as long as no
# row lies far below the peak: a row whose sum is below width * exp(-SOFTMAX_SHIFT_LIMIT) has
# its maximum at most that far down, and only then is the softmax redone with per-row maxima.
# 60 keeps every element within 27 of its row's maximum a normal float32.
SOFTMAX_SHIFT_LIMIT = 60.0
# The rows go through the passes in blocks of about this many values per sample, the shifted
# input (kept for the per-row redo) in a scratch of one block: ViT-B/16's 12 x 197 x 197 scores
# held a 1.86 MB copy, 30 % of its arena's lower bound. Against one block of all rows, AMD EPYC,
# 15 interleaved rounds: 0.93x the time at 2,364 x 197, 0.84x at 18,912 x 197, 0.74x at
# 12,288 x 1,024 (the block stays in cache across the passes), 1.01-1.02x at 1,536 x 128 and
# 6,144 x 64; blocks of a quarter of that were up to 1.6x slower (a call per pass and block).
SOFTMAX_BLOCK = 1 << 16


def softmax_scratch(in_shapes, **_attrs):
    """The shifted input's block (``row_block``) and the per-row statistics."""
    shape = in_shapes[0]
    return row_block(shape, SOFTMAX_BLOCK), shape[:-1] + (1,)


def softmax_calls(out, x, tmp, stat, row_sums=None) -> Calls:
    """out = softmax(x) over the last axis, in blocks of as many rows as ``tmp`` has; ``stat``
    holds one value per row. ``out`` may be ``x`` (in place). ``row_sums(a, out)``, when given,
    returns the calls that write ``a @ ones`` into ``out`` (an engine's own matvec).

    The tensor's peak is kept in the last row's statistic: only the last block writes it, after
    its shift has read it."""
    y2, x2, t2, s2 = rows2d(out), rows2d(x), rows2d(tmp), rows2d(stat)
    rows, block, width = len(x2), len(t2), x2.shape[1]
    peak = s2.reshape(-1)[-1:].reshape(())      # 0-d: a scalar operand, no broadcast pass
    sums = row_sums or (lambda a, o: [(np.matmul, (a, ones_column(width), o))])
    calls = [(np.fmax.reduce, (x2, None, None, peak))]      # NaN-blind: a NaN stays in its own row
    for start in range(0, rows, block):
        rows_here = slice(start, min(start + block, rows))
        y, s = y2[rows_here], s2[rows_here]
        calls.append((softmax_rows, (y, x2[rows_here], t2[:len(y)], s, peak, tuple(sums(y, s)))))
    return calls


def softmax_rows(y, x, tmp, stat, peak, row_sums: Calls) -> None:
    """One block of ``softmax_calls``: y = softmax(x), all (rows, width), shifted by ``peak``
    (0-d), unless a row's sum says it lay too far below it; ``row_sums`` write y @ ones into
    stat. y may be x: the shifted input stays in tmp, which the per-row redo reads."""
    np.subtract(x, peak, out=tmp)
    np.exp(tmp, out=y)
    for fn, args in row_sums:
        fn(*args)
    if not np.minimum.reduce(stat, axis=None) >= x.shape[1] * math.exp(-SOFTMAX_SHIFT_LIMIT):  # false for NaN
        np.maximum.reduce(tmp, axis=1, keepdims=True, out=stat)    # the exact, per-row shift
        np.copyto(y, stat)
        np.subtract(tmp, y, out=y)
        np.exp(y, out=y)
        for fn, args in row_sums:
            fn(*args)
    np.reciprocal(stat, out=stat)
    np.copyto(tmp, stat)
    np.multiply(y, tmp, out=y)


# --- hardmax over the last axis: 1 at each row's first maximum -----------------------------------

def hardmax_eager(x):
    out = np.zeros_like(x)
    np.put_along_axis(out, np.argmax(x, axis=-1)[..., None], 1, axis=-1)
    return out


def hardmax_calls(out, x) -> Calls:
    """Each row's argmax into an index buffer made here, at bind time (as ``where``'s constant
    mask), plus the row's offset; out zeroed, then a 1 put at each index."""
    x2, y = rows2d(x), out.reshape(-1)
    rows, width = x2.shape
    index = np.empty(rows, np.intp)
    offsets = np.arange(rows, dtype=np.intp) * width
    return [(np.argmax, (x2, 1, index)), (np.add, (index, offsets, index)), (np.copyto, (out, 0.0)),
            (np.put, (y, index, 1.0))]


# --- multi-head self-attention, as scores -> softmax -> context ---------------

def qkv_heads(qkv, heads):
    """A fused (batch, seq, 3·dim) tensor as one (3, batch, heads, seq, head_dim) view: q, k, v."""
    batch, seq, width = qkv.shape
    return qkv.reshape(batch, seq, 3, heads, width // (3 * heads)).transpose(2, 0, 3, 1, 4)


def split_heads(qkv, heads):
    """q, k, v as (batch, heads, seq, head_dim) views of a fused (batch, seq, 3·dim) tensor."""
    return qkv_heads(qkv, heads)


def scores_scale(head_dim: int, scale: float | None = None) -> float:
    """``attn_scores``' factor on q @ k^T: its ``scale`` attribute when given (T5's is 1: its
    1/sqrt(head_dim) lives in the q weights), else 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def attn_scores_eager(qkv, *, heads, scale=None):
    q, k, _ = split_heads(qkv, heads)
    return (q @ k.swapaxes(-1, -2)) * scores_scale(q.shape[-1], scale)


def attn_scores_calls(out, qkv, keys, *, heads, scale=None) -> Calls:
    q, k, _ = split_heads(qkv, heads)
    return [(gather_keys, (keys, k, scores_scale(q.shape[-1], scale))),
            (np.matmul, (q, keys_per_head(keys, heads), out))]


def keys_scratch(in_shapes, **_attrs):
    seq, width = in_shapes[0]
    return ((width // 3, seq),)                 # K transposed: (dim, seq), head after head


def keys_per_head(keys, heads):
    """A (batch, dim, seq) K-transposed buffer as (batch, heads, head_dim, seq)."""
    batch, width, seq = keys.shape
    return keys.reshape(batch, heads, width // heads, seq)


def gather_keys(keys, k, scale=1.0) -> None:
    """Copy the strided (batch, heads, seq, head_dim) key view, transposed and scaled, into keys.

    OpenBLAS ran the scores 2.7x faster on contiguous K-transposed blocks than on the
    transposed view of the qkv buffer (120 against 327 us at b1 d256 s128, 1.16 against 2.5 ms
    at b8), and scaling the keys is a pass over seq x dim, not over the heads x seq x seq scores.
    """
    per_head = keys_per_head(keys, k.shape[1])
    np.copyto(per_head, k.swapaxes(-1, -2))     # copyto: strided, without the ufunc buffer
    if scale != 1.0:
        np.multiply(keys, scale, out=keys)


def attn_context_eager(probs, qkv, *, heads):
    _, _, v = split_heads(qkv, heads)
    ctx = probs @ v                               # (batch, heads, seq, head_dim)
    return ctx.transpose(0, 2, 1, 3).reshape(qkv.shape[0], qkv.shape[1], -1)


def head_columns(out, heads):
    """A (batch, seq, dim) tensor as (batch, heads, seq, head_dim) views of its column blocks."""
    batch, seq, width = out.shape
    return out.reshape(batch, seq, heads, width // heads).transpose(0, 2, 1, 3)


def attn_context_calls(out, probs, qkv, *, heads) -> Calls:
    _, _, v = split_heads(qkv, heads)
    # Each head straight into its column block of the (batch, seq, dim) output.
    return [(np.matmul, (probs, v, head_columns(out, heads)))]


def attn_flops(in_shapes, out_shape, **_attrs):
    # scores: (seq x hd) @ (hd x seq) per head; context: (seq x seq) @ (seq x hd) per head
    if len(out_shape) == 3:            # scores (heads, seq, seq) from qkv (seq, 3·dim)
        seq, width = in_shapes[0]
        return 2 * seq * seq * (width // 3)
    seq, width = out_shape             # context (seq, dim)
    return 2 * seq * seq * width


# --- attention of head-major q, k, v: a decoder's (grouped keys and values, a constant mask) ----

def _grouped(t, kv_heads):
    """A (batch, heads, rows, cols) tensor as (batch, kv_heads, group·rows, cols): query head h
    belongs to key/value head h // group, the order grouped-query attention repeats them in."""
    return t.reshape(t.shape[0], kv_heads, -1, t.shape[-1])


def attention_eager(q, k, v, *mask, scale, width=None):
    """softmax(scale · q @ kᵀ (+ mask)) @ v per head, q (heads, seq, head_dim) and k, v
    (kv_heads, kv_seq, head_dim), each key/value head read by heads / kv_heads query heads; the
    mask a constant over the scores' trailing ``width`` values (``binary``'s)."""
    kv_heads = k.shape[-3]
    scores = _grouped(q, kv_heads) @ k.swapaxes(-1, -2)
    scores *= scale
    scores = scores.reshape(*q.shape[:-1], k.shape[-2])
    if mask:
        scores = _pair_eager(np.add, scores, mask, None, width, False)
    return (_grouped(softmax_eager(scores), kv_heads) @ v).reshape(q.shape)


def attention_scratch(in_shapes, **_attrs):
    """The keys, the scores, and the softmax's scratch (``softmax_scratch``)."""
    (heads, seq, _), (kv_heads, kv_seq, head_dim) = in_shapes[:2]
    scores = (heads, seq, kv_seq)
    return ((kv_heads * head_dim, kv_seq), scores, *softmax_scratch([scores]))


def attention_calls(out, q, k, v, *rest, scale, width=None) -> Calls:
    """keys = kᵀ · scale (``gather_keys``), the scores as one product per key/value head over
    its group of query heads, the mask added in row blocks (``binary``'s), softmax in place, the
    context into out: no repeated copy of k or v."""
    *mask, keys, scores, tmp, stat = rest
    kv_heads = k.shape[1]
    calls = [(gather_keys, (keys, k, scale)),
             (np.matmul, (_grouped(q, kv_heads), keys_per_head(keys, kv_heads), _grouped(scores, kv_heads)))]
    if mask:
        calls += _pair_calls(np.add, scores, scores, mask, None, width, False)
    return calls + softmax_calls(scores, scores, tmp, stat) + [
        (np.matmul, (_grouped(scores, kv_heads), v, _grouped(out, kv_heads)))]


def attention_flops(in_shapes, out_shape, **_attrs):
    (heads, seq, head_dim), (_, kv_seq, _) = in_shapes[:2]
    return 4 * heads * seq * kv_seq * head_dim + 5 * heads * seq * kv_seq


def attention_eager_bytes(in_shapes, out_shape):
    """What ``attention_eager`` holds besides its output, per sample: the scores and two more of
    their size at the softmax (the shift, its exponentials), its row statistics, the mask's sum."""
    (heads, seq, _), (_, kv_seq, _) = in_shapes[:2]
    return 4 * (4 * heads * seq * kv_seq + 2 * heads * seq)


# --- generic ops, for imported graphs (engines.importer) -------------------
# Every attribute is per sample: axes count from the first axis after the batch.

def _batch_axis(axis: int) -> int:
    return axis + 1


def unary(eager, calls, flops=1, inplace=(0,)):
    """An elementwise op of one tensor; it may overwrite its input unless its calls read x
    after writing out."""
    return dict(eager=eager, calls=calls, flops_per_element=flops, inplace=inplace)


def _erf():
    try:
        from scipy.special import erf
    except ImportError as exc:     # the base install is NumPy only
        raise RuntimeError(f"the Erf op needs SciPy ({exc}); pip install -e .[fast]") from exc
    return erf


SQRT1_2 = math.sqrt(0.5)


def sigmoid_calls(out, x) -> Calls:
    return [(np.negative, (x, out)), (np.exp, (out, out)), (np.add, (out, 1.0, out)),
            (np.reciprocal, (out, out))]


def silu_calls(out, x) -> Calls:
    """x · sigmoid(x) (SiLU, Swish with alpha 1); reads x after writing out: out must not alias x."""
    return sigmoid_calls(out, x) + [(np.multiply, (out, x, out))]


def gelu_erf_eager(x):
    return 0.5 * x * (1 + _erf()(x * SQRT1_2))


# erf in planned memory: SciPy's float32 erf runs one element at a time in double, 6-7 ms on
# 512 x 1024 (Intel Xeon), most of an encoder layer's forward; ONNX Runtime's whole forward took
# 3.6-4.1 ms. Abramowitz and Stegun 7.1.26 instead, erfc(z) = t (a1 + t (a2 + ... + t a5)) exp(-z^2),
# t = 1 / (1 + p z), z >= 0, |error| <= 1.5e-7, as NumPy passes over row blocks that stay in cache
# (measured 2.3 ms on that array, docs/importing.md).
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
ERF_BLOCK_ELEMENTS = 16384      # scratch per sample, and so the rows one block of calls covers


def erf_scratch(in_shapes, block: int = ERF_BLOCK_ELEMENTS, **_attrs):
    """Two blocks of rows (``row_block``), ``block`` values per sample at most each: erfc's and its t."""
    return (row_block(in_shapes[0], block),) * 2


def _erf_blocks(out, x, scratch, t_scratch, scale: float, finish) -> Calls:
    """Per row block: s = erfc(|x| scale) (t_scratch holding t, then exp(-(x scale)^2)), then
    ``finish(y, x, s, t)``'s calls for the block's result in out. out is written only by
    ``finish``, which reads x at the same element first: out may be x (in place)."""
    y, x, s, t = rows2d(out), rows2d(x), rows2d(scratch), rows2d(t_scratch)
    calls = []
    for i in range(0, len(y), len(s)):
        yb, xb = y[i:i + len(s)], x[i:i + len(s)]
        sb, tb = s[:len(yb)], t[:len(yb)]
        calls += [(np.absolute, (xb, tb)), (np.multiply, (tb, _AS_P * scale, tb)), (np.add, (tb, 1.0, tb)),
                  (np.reciprocal, (tb, tb)), (np.multiply, (tb, _AS_A[4], sb))]
        for a in reversed(_AS_A[:4]):                                  # Horner: s = t (a1 + t (a2 + ...))
            calls += [(np.add, (sb, a, sb)), (np.multiply, (sb, tb, sb))]
        calls += [(np.multiply, (xb, xb, tb)), (np.multiply, (tb, -scale * scale, tb)), (np.exp, (tb, tb)),
                  (np.multiply, (sb, tb, sb))] + finish(yb, xb, sb, tb)
    return calls


def erf_calls(out, x, scratch, t_scratch) -> Calls:
    """erf(x) = sign(x) (1 - erfc(|x|)); out may be x."""
    return _erf_blocks(out, x, scratch, t_scratch, 1.0,
                       lambda y, x, s, t: [(np.subtract, (1.0, s, s)), (np.copysign, (s, x, y))])


def gelu_erf_calls(out, x, scratch, t_scratch) -> Calls:
    """x Phi(x) = (x + |x| (1 - erfc(|x| / sqrt 2))) / 2, with no copysign (4x dearer a pass than a
    multiply here); out may be x."""
    return _erf_blocks(out, x, scratch, t_scratch, SQRT1_2, lambda y, x, s, t: [
        (np.absolute, (x, t)), (np.subtract, (1.0, s, s)), (np.multiply, (t, s, t)), (np.add, (t, x, y)),
        (np.multiply, (y, 0.5, y))])


def clip_eager(x, *, lo=None, hi=None):
    return np.clip(x, lo, hi) if (lo, hi) != (None, None) else x.copy()


def clip_calls(out, x, *, lo=None, hi=None) -> Calls:
    calls, src = [], x
    if lo is not None:
        calls.append((maximum, (src, lo, out)))
        src = out
    if hi is not None:
        calls.append((minimum, (src, hi, out)))
        src = out
    return calls or [(np.copyto, (out, x))]


# Elementwise binary ops by ONNX name. One operand may be a constant: a Python float
# (``scalar``), or a parameter vector that repeats every ``width`` elements, pre-tiled so
# that no call broadcasts (NumPy's ufunc buffer). ``swap``: the constant is the left operand.
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
          "fmod": np.fmod, "mod": np.mod}          # Mod: C's fmod (sign of a), or Python's (sign of b)


def binary_eager(a, *rest, fn, scalar=None, width=None, swap=False):
    return _pair_eager(BINARY[fn], a, rest, scalar, width, swap)


def _pair_eager(ufunc, a, rest, scalar, width, swap):
    """ufunc(a, b) where b is ``rest``'s tensor or parameter, or ``scalar``; ``swap``: b first."""
    if scalar is not None:
        return ufunc(scalar, a) if swap else ufunc(a, scalar)
    (b,) = rest
    if width is None:                                  # two tensors of one shape
        return ufunc(a, b)
    rows = a.reshape(-1, width)
    return (ufunc(b, rows) if swap else ufunc(rows, b)).reshape(a.shape)


def binary_prepare(*args):
    *params, max_rows = args
    return tuple(tile(p, max_rows) for p in params)


def binary_calls(out, a, *rest, fn, scalar=None, width=None, swap=False) -> Calls:
    return _pair_calls(BINARY[fn], out, a, rest, scalar, width, swap)


def _pair_calls(ufunc, out, a, rest, scalar, width, swap) -> Calls:
    """Calls for out = ufunc(a, b), b as in ``_pair_eager``, a parameter b pre-tiled (``binary_prepare``)."""
    if scalar is not None:
        return [(ufunc, (scalar, a, out) if swap else (a, scalar, out))]
    (b,) = rest
    if width is None:
        return [(ufunc, (a, b, out))]
    x, y, step = a.reshape(-1, width), out.reshape(-1, width), b.shape[0]
    calls = []
    for i in range(0, len(y), step):
        block = b[:len(y[i:i + step])]
        calls.append((ufunc, (block, x[i:i + step], y[i:i + step]) if swap
                      else (x[i:i + step], block, y[i:i + step])))
    return calls


def expand_eager(x, *, aligned, shape):
    return np.broadcast_to(x.reshape(x.shape[0], *aligned), (x.shape[0], *shape)).copy()


def expand_calls(out, x, *, aligned, shape) -> Calls:
    return [(np.copyto, (out, x.reshape(x.shape[0], *aligned)))]   # copyto broadcasts unbuffered


def reshape_eager(x, *, shape):
    return x.reshape(x.shape[0], *shape)


def reshape_calls(out, x, *, shape) -> Calls:
    # An engine that plans views gives out x's storage and runs no call; others copy.
    return [(np.copyto, (out, x.reshape(out.shape)))]


def transpose_eager(x, *, perm):
    return x.transpose(0, *map(_batch_axis, perm)).copy()


def transpose_calls(out, x, *, perm) -> Calls:
    return [(np.copyto, (out, x.transpose(0, *map(_batch_axis, perm))))]


def sample_index(index):
    """Per-sample (int | (start, stop, step)) entries as a NumPy index with the batch first."""
    return (slice(None), *(i if isinstance(i, int) else slice(*i) for i in index))


def slice_eager(x, *, index):
    return x[sample_index(index)].copy()


def slice_calls(out, x, *, index) -> Calls:
    return [(np.copyto, (out, x[sample_index(index)]))]


def take_eager(x, *, axis, indices):
    return np.take(x, indices, axis=_batch_axis(axis))


def take_calls(out, x, *, axis, indices) -> Calls:
    # mode "clip": np.take(out=) with bounds checks ("raise") buffers its output; the indices are in
    # range (the importer checks), made an index array once, here.
    return [(np.take, (x, np.asarray(indices, dtype=np.intp), _batch_axis(axis), out, "clip"))]


def _concat_parts(tensors, params, order):
    it, ip = iter(tensors), iter(params)
    return [next(it) if o == "t" else next(ip) for o in order]


def concat_eager(*args, axis, order):
    tensors, params = args[:order.count("t")], args[order.count("t"):]
    batch = tensors[0].shape[0]
    parts = [p if p.ndim == tensors[0].ndim else np.broadcast_to(p, (batch, *p.shape))
             for p in _concat_parts(tensors, params, order)]
    return np.concatenate(parts, axis=_batch_axis(axis))


def concat_calls(out, *args, axis, order) -> Calls:
    tensors, params = args[:order.count("t")], args[order.count("t"):]
    calls, at, lead = [], 0, (slice(None),) * _batch_axis(axis)
    for part in _concat_parts(tensors, params, order):
        n = part.shape[axis + (part.ndim == out.ndim)]
        calls.append((np.copyto, (out[(*lead, slice(at, at + n))], part)))   # a parameter broadcasts
        at += n
    return calls


def matmul_flops(in_shapes, out_shape, **_attrs):
    return 2 * math.prod(out_shape) * in_shapes[0][-1]


def matmul_calls(out, a, b) -> Calls:
    return [(np.matmul, (a, b, out))]


# A product with a constant of any rank (an imported MatMul whose other operand is an initializer:
# attention's K and V). ``aligned``: x's per-sample shape with leading 1s to the constant's rank,
# so that the per-sample constant broadcasts against (batch, *aligned) as ONNX's MatMul does;
# ``swap``: the constant is the left operand. np.matmul broadcasts its stacks without a buffer.

def matmul_const_eager(x, w, *, aligned, swap):
    x = x.reshape(x.shape[0], *aligned)
    return np.matmul(w, x) if swap else np.matmul(x, w)


def matmul_const_calls(out, x, w, *, aligned, swap) -> Calls:
    x = x.reshape(x.shape[0], *aligned)
    return [(np.matmul, (w, x, out) if swap else (x, w, out))]


def matmul_const_flops(in_shapes, out_shape, *, aligned, swap):
    return 2 * math.prod(out_shape) * (aligned[-2] if swap else aligned[-1])


@functools.lru_cache(maxsize=None)
def _mean_row(width: int) -> np.ndarray:
    col = mean_column(width)
    col.flags.writeable = False
    return col


def reduce_mean_calls(out, x) -> Calls:
    return [(np.matmul, (rows2d(x), _mean_row(x.shape[-1]), rows2d(out)))]    # a matvec: no reduction state


def reduce_sum_calls(out, x) -> Calls:
    return [(np.matmul, (rows2d(x), ones_column(x.shape[-1]), rows2d(out)))]



# --- activations, extrema, reductions by a tree, masks (imported graphs) ---------------------

def hardsigmoid_eager(x, *, alpha, beta):
    return np.minimum(np.maximum(x * alpha + beta, 0), 1)


def hardsigmoid_calls(out, x, *, alpha, beta) -> Calls:
    return [(np.multiply, (x, alpha, out)), (np.add, (out, beta, out)),
            (maximum, (out, 0.0, out)), (minimum, (out, 1.0, out))]


HARDSWISH = dict(alpha=1.0 / 6.0, beta=0.5)      # ONNX HardSwish: x · HardSigmoid(x) with these


def hardswish_eager(x):
    return x * hardsigmoid_eager(x, **HARDSWISH)


def hardswish_calls(out, x) -> Calls:
    """Reads x after writing out: out must not alias x."""
    return hardsigmoid_calls(out, x, **HARDSWISH) + [(np.multiply, (out, x, out))]


EXTREMA = {"max": (np.maximum, maximum), "min": (np.minimum, minimum)}    # eager, calls (keyword out)


def extremum_eager(a, *rest, fn, scalar=None, width=None, swap=False):
    return _pair_eager(EXTREMA[fn][0], a, rest, scalar, width, swap)


def extremum_calls(out, a, *rest, fn, scalar=None, width=None, swap=False) -> Calls:
    return _pair_calls(EXTREMA[fn][1], out, a, rest, scalar, width, swap)


def _reduce_tree_calls(ufunc, out, x, scratch) -> Calls:
    """out[r] = ufunc over row r of x, all rows at once: x copied transposed into scratch
    (width, rows), then halves folded onto the first (width -> ceil(width / 2)) until one row
    is left. Every operand contiguous: no ufunc buffer, no reduction state (``np.max(axis=)``
    keeps ~2 KiB per call)."""
    x2 = rows2d(x)
    rows, width = x2.shape
    s = scratch.reshape(-1)[:rows * width].reshape(width, rows)
    calls, n = [(np.copyto, (s, x2.T))], width
    while n > 1:
        h = n // 2
        calls.append((ufunc, (s[:h], s[n - h:n], s[:h])))
        n -= h
    return calls + [(np.copyto, (out.reshape(-1), s[0]))]


def _reduce_kind(eager, ufunc) -> OpKind:
    return OpKind(eager, lambda out, x, scratch: _reduce_tree_calls(ufunc, out, x, scratch),
                  scratch=lambda in_shapes, **_attrs: ((math.prod(in_shapes[0]),),),
                  flops=lambda ins, out, **_attrs: math.prod(ins[0]))


# Boolean values (comparisons, IsNaN, And/Or/Not, a Cast to bool) live in the IR as float32
# buffers holding 0.0 and 1.0, like every other tensor: the planner, the views and every engine
# stay float32 only. Logic is arithmetic on them (Not: 1 - x, And: a·b, Or: max(a, b)); only
# ``where`` reads a mask as truth (non-zero). The comparisons write NumPy's bool result into a
# scratch viewed as bool, then copy it into the float32 output (np.copyto casts without a buffer).
COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "greater": np.greater,
           "less_equal": np.less_equal, "greater_equal": np.greater_equal}


def bool_view(scratch: np.ndarray, shape) -> np.ndarray:
    """The first prod(shape) bytes of a contiguous scratch buffer as a bool array of ``shape``."""
    return scratch.reshape(-1).view(np.bool_)[:math.prod(shape)].reshape(shape)


def mask_scratch(in_shapes, **_attrs):
    """A bool per element of the first input's shape, in float32 words."""
    return ((-(-math.prod(in_shapes[0]) // 4),),)


def compare_eager(a, *rest, fn, scalar=None, width=None, swap=False):
    return _pair_eager(COMPARE[fn], a, rest, scalar, width, swap).astype(a.dtype)


def compare_calls(out, a, *rest, fn, scalar=None, width=None, swap=False) -> Calls:
    *operand, scratch = rest
    mask = bool_view(scratch, out.shape)
    return _pair_calls(COMPARE[fn], mask, a, operand, scalar, width, swap) + [(np.copyto, (out, mask))]


def isnan_calls(out, x, scratch) -> Calls:
    mask = bool_view(scratch, out.shape)
    return [(np.isnan, (x, mask)), (np.copyto, (out, mask))]


def _where_parts(args, order: str, scalars):
    """(cond, a, b) from the tensors, then the parameters, in ``order`` ('t' tensor, 'p' parameter,
    's' the next of ``scalars``); and what follows them (scratch)."""
    tensors = iter(args)
    parts = [next(tensors) if o == "t" else None for o in order]
    for i, o in enumerate(order):
        if o == "p":
            parts[i] = next(tensors)
    values = iter(scalars)
    parts = [next(values) if o == "s" else p for o, p in zip(order, parts)]
    return parts, list(tensors)


def where_eager(*args, order, scalars=()):
    """cond != 0 ? a : b; a parameter has the output's per-sample rank and broadcasts."""
    (cond, a, b), _ = _where_parts(args, order, scalars)
    return np.where(cond != 0, a, b).astype(args[0].dtype, copy=False)     # args[0]: a tensor, full shape


def where_scratch(in_shapes, *, order, **_attrs):
    """A bool mask when the condition is a tensor (the first input)."""
    return mask_scratch(in_shapes) if order[0] == "t" else ()


def where_calls(out, *args, order, scalars=()) -> Calls:
    """out = b, then a copied in where the mask holds: two ``np.copyto`` (broadcasting parameters
    and scalars without a buffer). A parameter condition becomes a bool array once, here, at bind
    time. Reads a after writing out: out must not alias a (nor the condition)."""
    (cond, a, b), rest = _where_parts(args, order, scalars)
    calls = []
    if order[0] == "t":
        mask = bool_view(rest[0], cond.shape)
        calls.append((np.not_equal, (cond, 0.0, mask)))
    else:
        mask = np.not_equal(cond, 0)
    return calls + [(np.copyto, (out, b)), (np.copyto, (out, a, "same_kind", mask))]


# --- zeros between the pixels of (C, H, W): a transposed convolution is a convolution of this ---

def stride_zeros_eager(x, *, strides):
    (sh, sw), (h, w) = strides, x.shape[-2:]
    out = np.zeros((*x.shape[:-2], (h - 1) * sh + 1, (w - 1) * sw + 1), dtype=x.dtype)
    out[..., ::sh, ::sw] = x
    return out


def stride_zeros_calls(out, x, *, strides) -> Calls:
    """Zeros, then x copied onto every stride-th pixel: two ``np.copyto`` (strided, no buffer)."""
    return [(np.copyto, (out, 0.0)), (np.copyto, (out[..., ::strides[0], ::strides[1]], x))]


# --- quantize, then dequantize: a quantized file's QuantizeLinear -> DequantizeLinear -------------
# (engines.importer.quantized). Static: the file's scale and zero point, levels lo..hi. Dynamic
# (scale None): DynamicQuantizeLinear's u8 over the range widened to hold 0, per sample (the file's
# is per tensor, over the whole batch: the same at batch 1; per sample a row's result does not
# depend on the others, and its step is never coarser). x / scale, rounded half to even, as ONNX
# Runtime's QuantizeLinear computes it; the dequantized value is (q - zero_point) * scale.
U8_LEVELS = 255


def dynamic_quant_params(low, high, dtype) -> tuple:
    """DynamicQuantizeLinear's (scale, zero point) for values in [low, high], in ``dtype``'s
    arithmetic; an all-zero range gets scale 1 (every value quantizes to 0, as 0 / 0 would not)."""
    t = np.dtype(dtype).type
    low, high = min(t(low), t(0)), max(t(high), t(0))
    scale = (high - low) / t(U8_LEVELS)
    if scale == 0:
        return t(1), 0.0
    return scale, float(np.rint(np.clip(t(0) - low / scale, 0, U8_LEVELS)))


def fake_quant_eager(x, *, scale=None, zero_point=0, lo=0, hi=U8_LEVELS):
    if scale is not None:
        return quantization_step(x, scale, zero_point, lo, hi)
    out = np.empty_like(x)
    for i, row in enumerate(x.reshape(len(x), -1)):
        s, zp = dynamic_quant_params(row.min(), row.max(), x.dtype)
        out[i] = ((np.clip(np.rint(row / s) + zp, 0, U8_LEVELS) - zp) * s).reshape(x.shape[1:])
    return out


def fake_quant_scratch(in_shapes, *, scale=None, **_attrs):
    """Dynamic: each sample's minimum and maximum."""
    return ((2,),) if scale is None else ()


def _fake_quant(y, x, scale, zero_point, lo, hi) -> None:
    np.divide(x, scale, out=y)
    np.rint(y, out=y)
    maximum(y, lo - zero_point, y)      # rint(x / s) + zp clipped to [lo, hi], less zp: exact in float32
    minimum(y, hi - zero_point, y)
    np.multiply(y, scale, out=y)


def _fake_quant_dynamic(y, x, stat) -> None:
    np.minimum.reduce(x, axis=1, out=stat[:, 0])
    np.maximum.reduce(x, axis=1, out=stat[:, 1])
    for i in range(len(x)):
        s, zp = dynamic_quant_params(stat[i, 0], stat[i, 1], x.dtype)
        _fake_quant(y[i], x[i], s, zp, 0, U8_LEVELS)


def fake_quant_calls(out, x, *scratch, scale=None, zero_point=0, lo=0, hi=U8_LEVELS) -> Calls:
    if scale is None:
        return [(_fake_quant_dynamic, (out.reshape(len(out), -1), x.reshape(len(x), -1),
                                       scratch[0].reshape(len(x), 2)))]
    return [(_fake_quant, (out, x, scale, zero_point, lo, hi))]


# Elementwise maths of one tensor, each one NumPy ufunc (ONNX's Round rounds halves to even, as
# np.rint; Sign of 0 is 0, as np.sign).
MATH = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
        "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
        "floor": np.floor, "ceil": np.ceil, "round": np.rint, "sign": np.sign}


def ufunc_kind(ufunc) -> OpKind:
    """An elementwise kind that is one ufunc call into out (which may be its input)."""
    return OpKind(**unary(ufunc, lambda out, x: [(ufunc, (x, out))]))


OPS: dict[str, OpKind] = {
    "linear": OpKind(linear_eager, linear_calls, prepare=linear_prepare, flops=linear_flops,
                     eager_temps=1, eager_broadcast=True),
    "relu": OpKind(relu_eager, relu_calls, inplace=(0,)),
    "gelu": OpKind(gelu_eager, gelu_calls, scratch=gelu_scratch, inplace=(0,), flops_per_element=8, eager_temps=2),
    "add": OpKind(add_eager, add_calls, inplace=(0, 1)),
    "layernorm": OpKind(layernorm_eager, layernorm_calls, prepare=layernorm_prepare,
                        scratch=rowwise_scratch, inplace=(0,), flops_per_element=8,
                        eager_temps=1, eager_row_stats=3, eager_broadcast=True),
    "rmsnorm": OpKind(rmsnorm_eager, rmsnorm_calls, prepare=rmsnorm_prepare, scratch=rowwise_scratch,
                      inplace=(0,), flops_per_element=5, eager_temps=1, eager_row_stats=3, eager_broadcast=True),
    "rotary": OpKind(rotary_eager, rotary_calls, prepare=binary_prepare, scratch=lambda ins, **_: (ins[0],),
                     inplace=(0,), flops_per_element=3, eager_temps=2, eager_broadcast=True),
    "hardmax": OpKind(hardmax_eager, hardmax_calls),
    "stride_zeros": OpKind(stride_zeros_eager, stride_zeros_calls, flops_per_element=0),
    "softmax": OpKind(softmax_eager, softmax_calls, scratch=softmax_scratch, inplace=(0,),
                      flops_per_element=5, eager_temps=1, eager_row_stats=1, eager_broadcast=True),
    "attn_scores": OpKind(attn_scores_eager, attn_scores_calls, scratch=keys_scratch, flops=attn_flops,
                          eager_temps=1),
    "attn_context": OpKind(attn_context_eager, attn_context_calls, flops=attn_flops, eager_temps=1),
    "attention": OpKind(attention_eager, attention_calls, prepare=binary_prepare, scratch=attention_scratch,
                        flops=attention_flops, eager_bytes=attention_eager_bytes, eager_broadcast=True),
    # generic ops, for imported graphs
    "binary": OpKind(binary_eager, binary_calls, prepare=binary_prepare, inplace=(0, 1),
                     eager_temps=1, eager_broadcast=True),
    "exp": OpKind(**unary(np.exp, lambda out, x: [(np.exp, (x, out))])),
    "sqrt": OpKind(**unary(np.sqrt, lambda out, x: [(np.sqrt, (x, out))])),
    "tanh": OpKind(**unary(np.tanh, lambda out, x: [(np.tanh, (x, out))])),
    "neg": OpKind(**unary(np.negative, lambda out, x: [(np.negative, (x, out))])),
    "erf": OpKind(**unary(lambda x: _erf()(x), erf_calls), scratch=erf_scratch),
    "sigmoid": OpKind(**unary(lambda x: 1 / (1 + np.exp(-x)), sigmoid_calls, flops=4), eager_temps=1),
    "silu": OpKind(**unary(lambda x: x / (1 + np.exp(-x)), silu_calls, flops=5, inplace=()), eager_temps=1),
    "clip": OpKind(**unary(clip_eager, clip_calls, flops=2)),
    "gelu_erf": OpKind(**unary(gelu_erf_eager, gelu_erf_calls, flops=5), scratch=erf_scratch,
                       eager_temps=2),
    "expand": OpKind(expand_eager, expand_calls, flops_per_element=0),
    "reshape": OpKind(reshape_eager, reshape_calls, flops_per_element=0, view=True),
    "transpose": OpKind(transpose_eager, transpose_calls, flops_per_element=0),
    "slice": OpKind(slice_eager, slice_calls, flops_per_element=0),
    "take": OpKind(take_eager, take_calls, flops_per_element=0),
    "concat": OpKind(concat_eager, concat_calls, flops_per_element=0),
    "matmul": OpKind(np.matmul, matmul_calls, flops=matmul_flops),
    "matmul_const": OpKind(matmul_const_eager, matmul_const_calls, flops=matmul_const_flops),
    "reduce_mean": OpKind(lambda x: x.mean(axis=-1, keepdims=True), reduce_mean_calls,
                          flops=lambda ins, out, **_attrs: math.prod(ins[0])),
    "reduce_sum": OpKind(lambda x: x.sum(axis=-1, keepdims=True), reduce_sum_calls,
                         flops=lambda ins, out, **_attrs: math.prod(ins[0])),
    "reduce_max": _reduce_kind(lambda x: x.max(axis=-1, keepdims=True), maximum),
    "reduce_min": _reduce_kind(lambda x: x.min(axis=-1, keepdims=True), minimum),
    "reduce_prod": _reduce_kind(lambda x: x.prod(axis=-1, keepdims=True), np.multiply),
    "reciprocal": OpKind(**unary(np.reciprocal, lambda out, x: [(np.reciprocal, (x, out))])),
    "abs": OpKind(**unary(np.absolute, lambda out, x: [(np.absolute, (x, out))])),
    "log": OpKind(**unary(np.log, lambda out, x: [(np.log, (x, out))])),
    **{kind: ufunc_kind(ufunc) for kind, ufunc in MATH.items()},
    "hardsigmoid": OpKind(**unary(hardsigmoid_eager, hardsigmoid_calls, flops=4), eager_temps=2),
    "fake_quant": OpKind(**unary(fake_quant_eager, fake_quant_calls, flops=4), scratch=fake_quant_scratch,
                         eager_temps=2),
    "hardswish": OpKind(**unary(hardswish_eager, hardswish_calls, flops=5, inplace=()), eager_temps=3),
    "extremum": OpKind(extremum_eager, extremum_calls, prepare=binary_prepare, inplace=(0, 1),
                       eager_broadcast=True),
    "compare": OpKind(compare_eager, compare_calls, prepare=binary_prepare, scratch=mask_scratch,
                      inplace=(0, 1), eager_temps=1, eager_broadcast=True),     # reads all before writing out
    "isnan": OpKind(lambda x: np.isnan(x).astype(x.dtype), isnan_calls, scratch=mask_scratch, inplace=(0,),
                    eager_temps=1),
    "where": OpKind(where_eager, where_calls, scratch=where_scratch, eager_temps=1),
}
OPS.update(CONV_OPS)

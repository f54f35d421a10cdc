"""Convolutional-network op kinds, in ``engines.ir.ops``' form: eager NumPy, and calls into planned memory.

Layout: NCHW, the ONNX files' own (docs/cnn.md has the measurement and the reasons). Every
tensor is (batch, channels, height, width); per-sample shapes leave the batch out. Attribute
names and orders are ONNX's (``pads`` = (top, left, bottom, right), ``group``, axes counted
with the batch), so an importer passes a node's attributes through.

What keeps the calls free of per-call allocation (measured on this machine, numpy 2.4):
a ufunc allocates NumPy's 8192-element buffer whenever an operand is strided or broadcast
along an inner axis (a shifted window view, a (C, 1) per-channel vector), but not when every
operand is contiguous, and ``np.copyto`` and ``np.matmul(out=)`` never do. Scalar operands
are Python floats: a NumPy float64 scalar makes a float32 ufunc compute in float64, through
the buffer. So every kernel here is "gather with copyto, then compute on contiguous blocks":

- **conv** (general): im2col into a planned workspace laid out (group, Cg·kh·kw + 1, columns),
  a block of output rows at a time (``COL_BYTES``): one ``copyto`` per kernel tap (the taps'
  out-of-image parts filled with zeros, so no padded copy of the input), then ONE batched
  ``np.matmul`` for every sample and group into the block's output columns. The bias rides in
  the GEMM as a last weight column against a row of ones, so it costs no pass.
- **conv 1x1, stride 1, no pads**: the GEMM reads the input itself (no im2col); the bias is
  added per sample from a per-channel block broadcast into a small scratch with ``copyto``.
- **depthwise** (group == channels): per-tap multiply-accumulate, k·k passes, no im2col: each
  tap gathered into a scratch, scaled by the tap's per-channel weights (copied into a channel
  block once per tap), added.
- **pools**: tap by tap, gathered then ``np.maximum``/``np.add`` into the output; global
  average pool and LRN's channel window sum as matrix products.
- **conv_add** (a 1x1 conv and the residual Sum after it) and **conv_maxpool** (an im2col conv
  and the max pool after it): the import passes' fusions, so that neither the conv's output
  beside the residual nor the conv's whole output before the pool is ever held.

Concat, Transpose, Sigmoid and Clip are the ONNX importer's generic kinds in ``engines.ir.ops``
(a copy per part, a strided copy, elementwise), not repeated here.

``scratch`` and ``flops`` read the op's attributes (a convolution's workspace depends on its
kernel, strides and pads). Constants that depend on attributes (batchnorm's scale and shift,
LRN's band matrix, average pooling's divisors) are made when the calls are bound, not per call.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .calls import TILE_BYTES, Calls, OpKind, maximum, quantization_step
from ..memory import aligned


def split_view(a: np.ndarray, shape) -> np.ndarray:
    """a reshaped without a copy (raises instead of silently copying, as ``reshape`` would)."""
    v = a.view()
    v.shape = tuple(shape)
    return v


# --- window geometry ---------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """A 2-D sliding window: ONNX's kernel_shape, strides, pads (top, left, bottom, right),
    dilations and ceil_mode, over an (H, W) input."""
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)
    ceil_mode: bool = False

    @classmethod
    def of(cls, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), ceil_mode=0, **_):
        dims = dict(kernel_shape=kernel_shape, strides=strides, dilations=dilations)
        for name, value in dims.items():
            if len(value) != 2 or min(value) < 1:
                raise ValueError(f"{name} must be two positive integers (2-D only), got {tuple(value)}")
        if len(pads) != 4 or min(pads) < 0:
            raise ValueError(f"pads must be four non-negative integers (top, left, bottom, right), got {tuple(pads)}")
        return cls(tuple(map(int, kernel_shape)), tuple(map(int, strides)), tuple(map(int, pads)),
                   tuple(map(int, dilations)), bool(ceil_mode))

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        return tuple(self._out(n, axis) for axis, n in enumerate((h, w)))

    def _out(self, n: int, axis: int) -> int:
        span = self.dilations[axis] * (self.kernel[axis] - 1) + 1
        room = n + self.pads[axis] + self.pads[axis + 2] - span
        if room < 0:
            raise ValueError(f"window {self.kernel} (dilated {span}) larger than the padded input {n}")
        s = self.strides[axis]
        out = (-(-room // s) if self.ceil_mode else room // s) + 1
        # ceil_mode: the last window must start inside the input or its leading pad (as ONNX
        # Runtime and PyTorch count it)
        if self.ceil_mode and (out - 1) * s >= n + self.pads[axis]:
            out -= 1
        return out

    def taps(self):
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def tap_range(self, axis: int, k: int, n: int, lo: int, hi: int) -> tuple[int, int, int]:
        """(first output index, end output index, first input index) of the outputs in [lo, hi)
        whose tap k lands inside the input along this axis; an empty range when none does."""
        s, offset = self.strides[axis], k * self.dilations[axis] - self.pads[axis]
        first = max(lo, -(offset // s))                   # ceil(-offset / s)
        end = min(hi, (n - 1 - offset) // s + 1)
        return first, max(first, end), first * s + offset

    def end_pads(self, h: int, w: int) -> tuple[int, int]:
        """(bottom, right) pads, grown where a ceil_mode window reaches past them."""
        need = [(o - 1) * s + d * (k - 1) + 1
                for o, s, d, k in zip(self.out_size(h, w), self.strides, self.dilations, self.kernel)]
        return max(self.pads[2], need[0] - h - self.pads[0]), max(self.pads[3], need[1] - w - self.pads[1])

    def padded(self, x: np.ndarray, value: float) -> np.ndarray:
        """x with its pads (and the ceil_mode overhang) filled with value: the eager form's input."""
        (pt, pl), (pb, pr) = self.pads[:2], self.end_pads(*x.shape[-2:])
        if not any((pt, pb, pl, pr)):
            return x
        widths = [(0, 0)] * (x.ndim - 2) + [(pt, pb), (pl, pr)]
        return np.pad(x, widths, constant_values=value)

    def windows(self, x: np.ndarray, value: float) -> np.ndarray:
        """(..., OH, OW, kh, kw) windows of x padded with value (eager form)."""
        oh, ow = self.out_size(*x.shape[-2:])
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilations
        win = sliding_window_view(self.padded(x, value), ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(-2, -1))
        return win[..., :(oh - 1) * sh + 1:sh, :(ow - 1) * sw + 1:sw, ::dh, ::dw]


def tap_calls(dst: np.ndarray, x: np.ndarray, win: Window, tap: tuple[int, int], fill: float,
              row0: int = 0) -> Calls:
    """Calls that copy kernel tap (i, j) of the windows of x (..., H, W) into dst (..., rows, OW),
    the output rows row0 .. row0 + rows: one strided ``copyto`` for the part inside the image,
    ``fill`` for the rest (the pads)."""
    (h, w), (rows, ow) = x.shape[-2:], dst.shape[-2:]
    r0, r1, ih = win.tap_range(0, tap[0], h, row0, row0 + rows)
    c0, c1, iw = win.tap_range(1, tap[1], w, 0, ow)
    r0, r1 = r0 - row0, r1 - row0
    (sh, sw) = win.strides
    calls = []
    if r1 > r0 and c1 > c0:
        calls.append((np.copyto, (dst[..., r0:r1, c0:c1],
                                  x[..., ih:ih + (r1 - r0 - 1) * sh + 1:sh, iw:iw + (c1 - c0 - 1) * sw + 1:sw])))
    else:
        r0 = r1 = 0
    strips = [dst[..., :r0, :], dst[..., r1:, :], dst[..., r0:r1, :c0], dst[..., r0:r1, c1:]]
    return calls + [(np.copyto, (s, fill)) for s in strips if s.size]


def per_channel_calls(ufunc, y: np.ndarray, vector: np.ndarray, block: np.ndarray, x=None) -> Calls:
    """Calls doing y[n, c] = ufunc(x[n, c], vector[c]) for (batch, C, P) arrays (x defaults to y):
    the vector broadcast with ``copyto`` (no ufunc buffer) into block, a (rows, P) scratch, a
    channel block at a time, then one contiguous ufunc call per sample and block."""
    x = y if x is None else x
    step = block.shape[0]
    calls = []
    for c in range(0, y.shape[1], step):
        rows = block[:len(vector[c:c + step])]
        calls.append((np.copyto, (rows, vector[c:c + step, None])))
        calls += [(ufunc, (x[n, c:c + step], rows, y[n, c:c + step])) for n in range(y.shape[0])]
    return calls


def block_rows(plane: int) -> int:
    """Rows of a per-channel block of this plane size: up to TILE_BYTES, at least one."""
    return max(1, TILE_BYTES // (4 * plane))


# --- activations fused into a conv --------------------------------------------------

# What a conv's ``activation`` attribute may name, as its eager form: the NumPy engines fuse
# relu and clip into their calls (``activation_calls``); oneDNN's conv takes the others as a
# post-op too (``engines.planned.onednn``, MobileNetV3's hard-swish and squeeze-excite gates,
# EfficientNet's SiLU).
ACTIVATION_EAGER = {
    "none": lambda y: y,
    "relu": lambda y: np.maximum(y, 0),
    "clip": lambda y, clip_min=-np.inf, clip_max=np.inf: np.clip(y, clip_min, clip_max),
    "hardsigmoid": lambda y, act_alpha, act_beta: np.clip(y * act_alpha + act_beta, 0, 1),
    "hardswish": lambda y: y * np.clip(y / 6 + 0.5, 0, 1),
    "sigmoid": lambda y: 1 / (1 + np.exp(-y)),
    "silu": lambda y: y / (1 + np.exp(-y)),
}
ACTIVATIONS = tuple(ACTIVATION_EAGER)
# a conv's activation and, after it, a quantization step it took in (``{scale, zero_point, lo, hi}``,
# oneDNN's convs only: ``importer.passes.fuse_conv_fake_quant``)
ACTIVATION_ATTRS = ("activation", "clip_min", "clip_max", "act_alpha", "act_beta", "fake_quant")


def activation_of(kind: str, attrs) -> dict | None:
    """An activation op (``kind``, its IR attributes) as a conv's activation attributes; None for
    another op."""
    if kind == "clip":
        lo, hi = attrs.get("lo"), attrs.get("hi")
        return {"activation": "clip", "clip_min": -np.inf if lo is None else lo, "clip_max": np.inf if hi is None else hi}
    if kind == "hardsigmoid":
        return {"activation": kind, "act_alpha": float(attrs["alpha"]), "act_beta": float(attrs["beta"])}
    return {"activation": kind} if kind in ACTIVATION_EAGER and kind != "none" else None


def activation_eager(y, activation="none", fake_quant=None, **attrs):
    if activation not in ACTIVATION_EAGER:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    y = ACTIVATION_EAGER[activation](y, **attrs)
    return y if fake_quant is None else quantization_step(y, **fake_quant)


def activation_calls(y, activation="none", clip_min=-np.inf, clip_max=np.inf, fake_quant=None, **other) -> Calls:
    if fake_quant is not None:
        raise ValueError("a conv's calls take no quantization step (oneDNN's conv applies it)")
    if activation == "relu":
        return [(maximum, (y, 0.0, y))]
    if activation == "clip":
        return [(np.clip, (y, float(clip_min), float(clip_max), y))]
    if activation != "none":
        raise ValueError(f"a conv's calls fuse relu or clip only, got {activation!r} (oneDNN's conv fuses it)")
    return []


# The im2col workspace holds a block of output rows at a time: enough rows for COL_COLUMNS
# GEMM columns, and at most COL_BYTES a sample. Whole, VGG-19's second conv alone would need
# 116 MB (577 x 224 x 224 floats); ResNet-50's first, 7.4 MB where its output is 3.2 MB, and
# the workspace is planned beside the output at the model's busiest step. On ResNet-50's
# 3 x 3 layers 1 MiB blocks ran within 1.0-1.2x of one whole workspace; 2048 columns rather
# than 512 took its 7 x 7 stem from 1991 calls to 716 and 3.9 to 3.0 ms (docs/cnn.md).
COL_BYTES = 1 << 20
COL_COLUMNS = 2048

# --- conv ----------------------------------------------------------------------

CONV_ATTRS = ("kernel_shape", "strides", "pads", "dilations", "group", *ACTIVATION_ATTRS)


def conv_attrs(attrs):
    unknown = set(attrs) - set(CONV_ATTRS)
    if unknown:
        raise ValueError(f"conv: unknown attributes {sorted(unknown)}; expected some of {CONV_ATTRS}")
    act = {k: attrs[k] for k in ACTIVATION_ATTRS if k in attrs}
    return Window.of(**attrs), int(attrs.get("group", 1)), act


def conv_path(channels: int, win: Window, group: int) -> str:
    """Which lowering a conv takes: "gemm" (1x1, stride 1, no pads: the input is the GEMM's
    operand), "depthwise" (one channel per group: per-tap multiply-accumulate) or "im2col"."""
    if channels % group:
        raise ValueError(f"conv: {channels} input channels do not split into {group} groups")
    if win.kernel == (1, 1) and win.strides == (1, 1) and not any(win.pads):
        return "gemm"
    if group == channels and group > 1:
        return "depthwise"
    return "im2col"


def conv_lowering(channels: int, attrs) -> str:
    """``conv_path`` of a conv op with these (ONNX) attributes on this many input channels."""
    win, group, _ = conv_attrs(attrs)
    return conv_path(channels, win, group)


def residual_fusable(channels: int, attrs) -> bool:
    """Whether ``conv_add`` runs this conv: the plain-GEMM lowering (1x1, stride 1, no pads) with
    one group, so that each block of output channels is one product of the whole input."""
    return conv_lowering(channels, attrs) == "gemm" and int(attrs.get("group", 1)) == 1


def conv_eager(x, w, b, **attrs):
    """Tap by tap: y += W[:, :, i, j] @ (the inputs under tap (i, j)), per group. Not an einsum over
    every window: that builds the whole im2col (15 MB for one 3x3 64-channel layer at 56 x 56,
    whose output is 0.8 MB); this holds the padded input, one tap and two outputs."""
    win, group, act = conv_attrs(attrs)
    batch, channels = x.shape[:2]
    out_ch, cg, kh, kw = w.shape
    if (kh, kw) != win.kernel or cg * group != channels:
        raise ValueError(f"conv: weight {w.shape} does not match kernel {win.kernel}, "
                         f"{channels} channels in {group} groups")
    oh, ow = win.out_size(*x.shape[-2:])
    (sh, sw), (dh, dw) = win.strides, win.dilations
    xp = win.padded(x, 0.0)
    wg = w.reshape(group, out_ch // group, cg, kh, kw)
    y = np.zeros((batch, group, out_ch // group, oh * ow), np.result_type(x, w))
    for i, j in win.taps():
        tap = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
        y += wg[:, :, :, i, j] @ tap.reshape(batch, group, cg, oh * ow)
    return activation_eager(y.reshape(batch, out_ch, oh, ow) + b[:, None, None], **act)


def conv_prepare(w, b, max_rows):
    """(O, Cg, kh, kw) weights and (O,) bias as one (O, Cg·kh·kw + 1) matrix, the bias last:
    the im2col GEMM's weights, whose workspace carries a row of ones."""
    out_ch = w.shape[0]
    return (aligned(np.concatenate([np.reshape(w, (out_ch, -1)), np.reshape(b, (out_ch, 1))], axis=1)),)


def conv_scratch(in_shapes, **attrs):
    (channels, h, w_), (win, group, _) = in_shapes[0], conv_attrs(attrs)
    oh, ow = win.out_size(h, w_)
    path = conv_path(channels, win, group)
    if path == "gemm":
        return ((block_rows(h * w_), h * w_),)                         # a bias block
    if path == "depthwise":
        return ((channels, oh, ow), (channels, oh * ow))               # a tap; its weights' block
    return (col_shape(channels, win, group, oh, ow),)


def col_shape(channels: int, win: Window, group: int, oh: int, ow: int) -> tuple[int, int, int]:
    """The im2col workspace per sample for output rows of width ow, oh of them at most:
    (group, Cg·kh·kw + 1, col_rows · ow)."""
    return group, channels // group * win.kernel[0] * win.kernel[1] + 1, col_rows(channels, win, oh, ow) * ow


def col_rows(channels: int, win: Window, oh: int, ow: int) -> int:
    """Output rows per im2col block: enough for COL_COLUMNS GEMM columns, within COL_BYTES (one
    sample), at least one."""
    per_row = 4 * (channels * win.kernel[0] * win.kernel[1] + 1) * ow
    return max(1, min(oh, -(-COL_COLUMNS // ow), COL_BYTES // per_row))


def conv_calls(out, x, wb, *scratch, **attrs) -> Calls:
    win, group, act = conv_attrs(attrs)
    batch, channels, h, w_ = x.shape
    out_ch, oh, ow = out.shape[1:]
    cg, kk = channels // group, win.kernel[0] * win.kernel[1]
    if wb.shape != (out_ch, cg * kk + 1):
        raise ValueError(f"conv: prepared weights {wb.shape}, expected {(out_ch, cg * kk + 1)}")
    if out_ch % group:
        raise ValueError(f"conv: {out_ch} output channels do not split into {group} groups")
    path = conv_path(channels, win, group)
    y = split_view(out, (batch, out_ch, oh * ow))
    bias = wb[:, -1]
    if path == "gemm":
        (block,) = scratch
        w_g = split_view(wb, (group, out_ch // group, cg + 1))[..., :cg]
        calls = [(np.matmul, (w_g, split_view(x, (batch, group, cg, h * w_)),
                              split_view(out, (batch, group, out_ch // group, oh * ow))))]
        if np.any(bias):
            calls += per_channel_calls(np.add, y, bias, block[0])
    elif path == "depthwise":
        if out_ch != channels:
            raise ValueError(f"conv: depthwise with a channel multiplier ({out_ch} outputs from "
                             f"{channels} channels) is not supported")
        tap, wblock = scratch
        wblock = wblock[0]
        calls = []
        for t, ij in enumerate(win.taps()):
            dst = out if t == 0 else tap
            calls += tap_calls(dst, x, win, ij, 0.0)
            calls.append((np.copyto, (wblock, wb[:, t, None])))
            d = split_view(dst, (batch, channels, oh * ow))
            calls += [(np.multiply, (d[n], wblock, d[n])) for n in range(batch)]
            if t:
                calls += [(np.add, (y[n], d[n], y[n])) for n in range(batch)]
        if np.any(bias):
            calls.append((np.copyto, (wblock, bias[:, None])))
            calls += [(np.add, (y[n], wblock, y[n])) for n in range(batch)]
    else:
        # Output rows in blocks of col_rows: each block's taps into the workspace, then one GEMM
        # for every sample and group into the block's columns of the output.
        (col,) = scratch
        calls = [(np.copyto, (col[:, :, -1], 1.0))]                      # the bias's row of ones
        calls += _im2col_calls(out, x, wb, col, win, group)
    return calls + activation_calls(out, **act)


def _im2col_calls(dst, x, wb, col, win: Window, group: int, lo: int = 0) -> Calls:
    """Conv output rows lo .. lo + rows of dst (batch, O, rows, OW), a block of the workspace col's
    rows at a time: each block's taps into col, then one GEMM for every sample and group into the
    block's columns of dst. col's last row holds the bias's ones (set by the caller, once)."""
    batch, channels, h, w_ = x.shape
    out_ch, rows_out, ow = dst.shape[1:]
    cg, kk = channels // group, win.kernel[0] * win.kernel[1]
    xg = split_view(x, (batch, group, cg, h, w_))
    w3 = split_view(wb, (group, out_ch // group, cg * kk + 1))
    y4 = split_view(dst, (batch, group, out_ch // group, rows_out * ow))
    rows = col.shape[-1] // ow
    calls = []
    for r0 in range(0, rows_out, rows):
        n = min(rows, rows_out - r0)
        block = col[..., :n * ow]
        col7 = split_view(block[:, :, :-1], (batch, group, cg, *win.kernel, n, ow))
        calls += [c for ij in win.taps() for c in tap_calls(col7[:, :, :, ij[0], ij[1]], xg, win, ij, 0.0, lo + r0)]
        calls.append((np.matmul, (w3, block, y4[..., r0 * ow:(r0 + n) * ow])))
    return calls


def conv_flops(in_shapes, out_shape, **attrs):
    win, group, _ = conv_attrs(attrs)
    out_ch, oh, ow = out_shape
    return out_ch * oh * ow * (2 * in_shapes[0][0] // group * win.kernel[0] * win.kernel[1] + 1)


def fold_batchnorm(w, b, scale, bias, mean, var, eps):
    """Conv (or Gemm) weights followed by BatchNormalization, as one layer's (w, b), in float64.

    y = scale·(w∗x + b − mean)/sqrt(var + eps) + bias, so each output channel o (axis 0 of a
    conv's (O, C, kh, kw) weights; pass a Gemm's weights as (out, in)) scales by
    s[o] = scale[o]/sqrt(var[o] + eps) and the bias becomes (b − mean)·s + bias.
    """
    s = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    w = np.asarray(w, np.float64) * s.reshape((-1,) + (1,) * (np.ndim(w) - 1))
    b = (np.asarray(b, np.float64) - mean) * s + bias
    return w, b


# --- pooling -----------------------------------------------------------------

POOL_ATTRS = ("kernel_shape", "strides", "pads", "dilations", "ceil_mode", "count_include_pad")


def pool_window(attrs) -> Window:
    unknown = set(attrs) - set(POOL_ATTRS)
    if unknown:
        raise ValueError(f"pool: unknown attributes {sorted(unknown)}; expected some of {POOL_ATTRS}")
    return Window.of(**attrs)


def pool_scratch(in_shapes, **attrs):
    channels, h, w = in_shapes[0]
    return ((channels, *pool_window(attrs).out_size(h, w)),)        # one gathered tap


def _pool_calls(ufunc, fill, out, x, tap, win) -> Calls:
    calls = []
    for t, ij in enumerate(win.taps()):
        calls += tap_calls(out if t == 0 else tap, x, win, ij, fill)
        if t:
            calls.append((ufunc, (out, tap, out)))
    return calls


def maxpool_eager(x, **attrs):
    return pool_window(attrs).windows(x, -np.inf).max(axis=(-2, -1))


def maxpool_calls(out, x, tap, **attrs) -> Calls:
    return _pool_calls(maximum, -np.inf, out, x, tap, pool_window(attrs))


def avgpool_eager(x, count_include_pad=0, **attrs):
    win = pool_window(attrs)
    total = win.windows(x, 0.0).sum(axis=(-2, -1))
    return total / _pool_counts(x.shape[-2:], win, bool(count_include_pad)).astype(x.dtype)


@functools.lru_cache(maxsize=None)
def _divisors(shape, win: Window, count_include_pad: bool) -> np.ndarray:
    """Read-only 1/count for every output of an average pool over (C, H, W) inputs, (C, OH, OW)."""
    counts = _pool_counts(shape[-2:], win, count_include_pad)
    divisors = aligned(np.broadcast_to(1.0 / counts, (shape[0], *counts.shape)))
    divisors.flags.writeable = False
    return divisors


def _pool_counts(hw, win: Window, count_include_pad: bool) -> np.ndarray:
    """(OH, OW) element counts of an average pool's windows: the taps inside the image, or with
    count_include_pad inside the image and its pads; never the ceil_mode overhang past the pads
    (as ONNX Runtime counts)."""
    per_axis = []
    for axis, n in enumerate(hw):
        out, s, d = win.out_size(*hw)[axis], win.strides[axis], win.dilations[axis]
        lo, hi = (-win.pads[axis], n + win.pads[axis + 2]) if count_include_pad else (0, n)
        at = np.arange(out)[:, None] * s - win.pads[axis] + np.arange(win.kernel[axis])[None, :] * d
        per_axis.append(((at >= lo) & (at < hi)).sum(axis=1))
    return np.outer(*per_axis).astype(np.float64)


def avgpool_calls(out, x, tap, count_include_pad=0, **attrs) -> Calls:
    win = pool_window(attrs)
    calls = _pool_calls(np.add, 0.0, out, x, tap, win)
    counts = _pool_counts(x.shape[-2:], win, bool(count_include_pad))
    if np.all(counts == counts.flat[0]):
        return calls + [(np.multiply, (out, 1.0 / float(counts.flat[0]), out))]
    divisors = _divisors(x.shape[1:], win, bool(count_include_pad))
    return calls + [(np.multiply, (out[n], divisors, out[n])) for n in range(out.shape[0])]


def pool_flops(in_shapes, out_shape, **attrs):
    win = pool_window(attrs)
    return math.prod(out_shape) * win.kernel[0] * win.kernel[1]


def globalavgpool_eager(x):
    return x.mean(axis=(-2, -1), keepdims=True)


@functools.lru_cache(maxsize=None)
def _mean_column(width: int) -> np.ndarray:
    col = aligned(np.full((width, 1), 1.0 / width))
    col.flags.writeable = False
    return col


def globalavgpool_calls(out, x) -> Calls:
    # Plane means as one matrix-vector product: no reduction state
    batch, channels, h, w = x.shape
    return [(np.matmul, (split_view(x, (batch, channels, h * w)), _mean_column(h * w),
                         split_view(out, (batch, channels, 1))))]


# --- a 1x1 conv and the residual added to it, one op ----------------------------------------

def conv_add_eager(x, r, w, b, **attrs):
    _, _, act = conv_attrs(attrs)
    plain = {k: v for k, v in attrs.items() if k not in ACTIVATION_ATTRS}
    return activation_eager(conv_eager(x, w, b, **plain) + r, **act)


def _residual_rows(out_ch: int, plane: int) -> int:
    """Output channels per block: the fewest blocks of at most COL_BYTES, split evenly."""
    blocks = -(-out_ch // max(1, COL_BYTES // (4 * plane)))
    return -(-out_ch // blocks)


def conv_add_scratch(in_shapes, **attrs):
    channels, h, w_ = in_shapes[0]
    if not residual_fusable(channels, attrs):
        raise ValueError("conv_add: only a 1x1, stride 1, unpadded conv with one group")
    rows = _residual_rows(in_shapes[1][0], h * w_)
    return ((rows, h * w_), (rows, h * w_))              # the GEMM's block; the bias broadcast


def conv_add_calls(out, x, r, wb, gemm, bias_block, **attrs) -> Calls:
    # Per block of output channels and group of samples: the GEMM into a block, the bias added
    # there, then out = residual + block (out may be the residual's own storage: in place, the
    # element read before it is written). NumPy's matmul cannot accumulate onto the residual.
    # As many samples a call as keep the block within COL_BYTES: one a call on ResNet-50's large
    # planes, the whole batch on RegNet's small ones (per-sample calls there cost it 5 % at batch 8).
    _, _, act = conv_attrs(attrs)
    batch, channels, h, w_ = x.shape
    out_ch, plane = out.shape[1], h * w_
    x3, r3, y3 = (split_view(a, (a.shape[0], a.shape[1], plane)) for a in (x, r, out))
    w, bias, step = wb[:, :channels], wb[:, -1], gemm.shape[1]
    per = max(1, min(batch, gemm.shape[0], COL_BYTES // (4 * plane * step)))
    calls = []
    for o in range(0, out_ch, step):
        rows = slice(o, min(out_ch, o + step))
        biases = bias_block[:per, :rows.stop - o]      # one per sample: a broadcast add would buffer
        has_bias = bool(np.any(bias[rows]))
        if has_bias:
            calls.append((np.copyto, (biases, bias[rows, None])))
        for n in range(0, batch, per):
            samples = slice(n, min(batch, n + per))
            block = gemm[:samples.stop - n, :rows.stop - o]
            calls.append((np.matmul, (w[rows], x3[samples], block)))
            if has_bias:
                calls.append((np.add, (block, biases[:len(block)], block)))
            calls.append((np.add, (r3[samples, rows], block, y3[samples, rows])))
            calls += activation_calls(y3[samples, rows], **act)
    return calls


def conv_add_flops(in_shapes, out_shape, **attrs):
    return conv_flops(in_shapes, out_shape, **attrs) + math.prod(out_shape)


# --- a conv and the max pool after it, one op --------------------------------------------

# The pool's attributes ride on the conv's with this prefix; ``out_channels`` sizes the band.
POOL_PREFIX = "pool_"
# The band of conv rows, per sample: with the im2col block and two blocks of pooled rows it is
# the op's scratch, at the step where it replaced the conv's whole output (docs/cnn.md).
BAND_BYTES = 512 * 1024


def split_pool(attrs) -> tuple[dict, dict]:
    """A conv_maxpool's attributes as (the conv's, the pool's)."""
    conv = {k: v for k, v in attrs.items() if not k.startswith(POOL_PREFIX) and k != "out_channels"}
    return conv, {k[len(POOL_PREFIX):]: v for k, v in attrs.items() if k.startswith(POOL_PREFIX)}


def _conv_pool_attrs(attrs):
    """(conv window, group, activation attrs, output channels, pool window) of a conv_maxpool."""
    conv, pool = split_pool(attrs)
    return (*conv_attrs(conv), int(attrs["out_channels"]), pool_window(pool))


def _pool_band(out_ch: int, conv_hw: tuple[int, int], pool: Window) -> tuple[int, int]:
    """(pool output rows per block, conv rows a block reads at most): enough pool rows that their
    conv rows make COL_COLUMNS GEMM columns, as the plain conv's blocks do, within BAND_BYTES."""
    (oh, ow), ph = conv_hw, pool.out_size(*conv_hw)[0]
    s, span = pool.strides[0], pool.dilations[0] * (pool.kernel[0] - 1) + 1
    rows = min(-(-COL_COLUMNS // ow), BAND_BYTES // (4 * out_ch * ow))
    per = max(1, min(ph, (rows - span) // s + 1))
    return per, min(oh, (per - 1) * s + span)


def conv_maxpool_eager(x, w, b, **attrs):
    conv, pool = split_pool(attrs)
    return maxpool_eager(conv_eager(x, w, b, **conv), **pool)


def conv_maxpool_scratch(in_shapes, **attrs):
    (channels, h, w_), (win, group, _, out_ch, pool) = in_shapes[0], _conv_pool_attrs(attrs)
    if conv_path(channels, win, group) != "im2col":
        raise ValueError("conv_maxpool: only a conv on the im2col lowering (not 1x1, not depthwise)")
    oh, ow = win.out_size(h, w_)
    per, band_rows = _pool_band(out_ch, (oh, ow), pool)
    pw = pool.out_size(oh, ow)[1]
    return (col_shape(channels, win, group, band_rows, ow),                     # im2col block
            (out_ch, band_rows, ow), (out_ch, per, pw), (out_ch, per, pw))      # band, max, one tap


def conv_maxpool_calls(out, x, wb, col, band, acc, tap, **attrs) -> Calls:
    # Per block of pool output rows: the conv rows its windows read, into the band (im2col GEMMs,
    # then the activation), pooled tap by tap into acc (contiguous: no ufunc buffer), and acc
    # copied into the block's rows of the output. A 3x3/2 pool's blocks share one conv row, which
    # each computes: 1/(2 x rows per block) more conv work, against the conv's whole output held.
    win, group, act, out_ch, pool = _conv_pool_attrs(attrs)
    batch, _, ph, pw = out.shape
    oh, ow = win.out_size(*x.shape[-2:])
    per = acc.shape[-2]
    s, span = pool.strides[0], pool.dilations[0] * (pool.kernel[0] - 1) + 1
    top, left, _, right = pool.pads

    def block(a, shape):                     # the scratch's first floats as one contiguous array
        return split_view(a.reshape(-1)[:batch * math.prod(shape)], (batch, *shape))

    calls = [(np.copyto, (col[:, :, -1], 1.0))]                        # the bias's row of ones
    for i0 in range(0, ph, per):
        i1 = min(ph, i0 + per)
        lo, hi = max(0, i0 * s - top), min(oh, (i1 - 1) * s - top + span)
        rows = block(band, (out_ch, max(0, hi - lo), ow))
        calls += _im2col_calls(rows, x, wb, col, win, group, lo) + activation_calls(rows, **act)
        local = Window(pool.kernel, pool.strides, (top + lo - i0 * s, left, 0, right), pool.dilations)
        pooled = block(acc, (out_ch, i1 - i0, pw))
        calls += _pool_calls(maximum, -np.inf, pooled, rows, block(tap, (out_ch, i1 - i0, pw)), local)
        calls.append((np.copyto, (out[:, :, i0:i1], pooled)))
    return calls


def conv_maxpool_flops(in_shapes, out_shape, **attrs):
    win, _, _, out_ch, pool = _conv_pool_attrs(attrs)
    conv = conv_flops(in_shapes, (out_ch, *win.out_size(*in_shapes[0][1:])), **split_pool(attrs)[0])
    return conv + math.prod(out_shape) * pool.kernel[0] * pool.kernel[1]


# --- LRN, batchnorm ---------------------------------------------------------------

def lrn_eager(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    """ONNX LRN: x / (bias + alpha/size · sum of x² over channels c-(size-1)//2 .. c+size//2)^beta."""
    sq = np.pad(x * x, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
    window = sliding_window_view(sq, size, axis=1).sum(axis=-1)
    return x / (bias + alpha / size * window) ** beta


@functools.lru_cache(maxsize=None)
def _lrn_band(channels: int, size: int, alpha: float) -> np.ndarray:
    """(C, C) matrix summing each channel's LRN window, times alpha/size: read-only."""
    c = np.arange(channels)
    lo, hi = c - (size - 1) // 2, c + size // 2
    band = aligned(((c[None, :] >= lo[:, None]) & (c[None, :] <= hi[:, None])) * (alpha / size))
    band.flags.writeable = False
    return band


def lrn_calls(out, x, sq, *, size, alpha=1e-4, beta=0.75, bias=1.0) -> Calls:
    # Per sample and block of pixels: the block gathered (copyto), squared, and its channel
    # windows summed by one band-matrix product into the output; then three contiguous passes.
    batch, channels, h, w = x.shape
    band = _lrn_band(channels, size, alpha)
    x3, y3 = (split_view(a, (batch, channels, h * w)) for a in (x, out))
    step = sq.shape[-1]
    calls = []
    for n in range(batch):
        for p in range(0, h * w, step):
            pixels = min(step, h * w - p)
            block = split_view(sq[0].reshape(-1)[:channels * pixels], (channels, pixels))   # contiguous
            calls += [(np.copyto, (block, x3[n, :, p:p + step])),
                      (np.multiply, (block, block, block)),
                      (np.matmul, (band, block, y3[n, :, p:p + step]))]
    return calls + [(np.add, (out, float(bias), out)),
                    (np.power, (out, -float(beta), out)),
                    (np.multiply, (out, x, out))]


def lrn_scratch(in_shapes, **_attrs):
    channels, h, w = in_shapes[0]
    return ((channels, min(h * w, max(1, TILE_BYTES // (4 * channels)))),)    # a block of pixels


def channel_block_scratch(in_shapes, **_attrs):
    channels, h, w = in_shapes[0]
    return ((min(channels, block_rows(h * w)), h * w),)                     # a block of channels


def lrn_flops(in_shapes, out_shape, size, **_attrs):
    return math.prod(out_shape) * (2 * out_shape[0] + 5)


def batchnorm_eager(x, scale, bias, mean, var, *, epsilon=1e-5):
    s = scale / np.sqrt(var + epsilon)
    return x * s[:, None, None] + (bias - mean * s)[:, None, None]


def batchnorm_calls(out, x, scale, bias, mean, var, block, *, epsilon=1e-5) -> Calls:
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    shift = aligned(bias - mean * s)
    s = aligned(s)
    batch, channels = x.shape[:2]
    y, x3 = (split_view(a, (batch, channels, -1)) for a in (out, x))
    return per_channel_calls(np.multiply, y, s, block[0], x3) + per_channel_calls(np.add, y, shift, block[0])


# --- pad, sum -----------------------------------------------------------------------

def _per_sample_pads(pads, ndim):
    """ONNX pads (all begins, then all ends, axes counted with the batch) per sample axis."""
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * ndim or min(pads) < 0 or pads[0] or pads[ndim]:
        raise ValueError(f"pad: pads must be 2 x rank non-negative integers with none on the batch axis, got {pads}")
    return list(zip(pads[1:ndim], pads[ndim + 1:]))


def pad_eager(x, *, pads, value=0.0, mode="constant"):
    if mode != "constant":
        raise ValueError(f"pad: only mode 'constant', got {mode!r}")
    return np.pad(x, [(0, 0)] + _per_sample_pads(pads, x.ndim), constant_values=value)


def pad_calls(out, x, *, pads, value=0.0, mode="constant") -> Calls:
    if mode != "constant":
        raise ValueError(f"pad: only mode 'constant', got {mode!r}")
    widths = _per_sample_pads(pads, x.ndim)
    inner = (slice(None),) + tuple(slice(a, a + n) for (a, _), n in zip(widths, x.shape[1:]))
    calls = [(np.copyto, (out[inner], x))]
    for axis, ((a, b), n) in enumerate(zip(widths, x.shape[1:]), start=1):
        for edge in (slice(0, a), slice(a + n, a + n + b)):
            view = out[(slice(None),) * axis + (edge,)]
            if view.size:
                calls.append((np.copyto, (view, value)))
    return calls


def sum_eager(*xs):
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total


def sum_calls(out, *xs) -> Calls:
    # out may take the first or second input's storage; from the third on, each is read after
    # out was written, so only those two are in place
    return [(np.add, (xs[0], xs[1], out))] + [(np.add, (out, x, out)) for x in xs[2:]]


CONV_OPS: dict[str, OpKind] = {
    # eager: two output-sized temporaries, plus the padded input and one tap (input-sized, which
    # eager_temps cannot say)
    "conv": OpKind(conv_eager, conv_calls, prepare=conv_prepare, scratch=conv_scratch, flops=conv_flops,
                   eager_temps=2),
    "maxpool": OpKind(maxpool_eager, maxpool_calls, scratch=pool_scratch, flops=pool_flops),
    # eager: the conv's output and its temporaries, then the sum
    "conv_add": OpKind(conv_add_eager, conv_add_calls, prepare=conv_prepare, scratch=conv_add_scratch,
                       flops=conv_add_flops, inplace=(1,), eager_temps=3),
    # eager: the conv's output and its two temporaries, each 4 pool outputs behind a stride-2
    # pool (every pool after a conv in the nine light models)
    "conv_maxpool": OpKind(conv_maxpool_eager, conv_maxpool_calls, prepare=conv_prepare,
                           scratch=conv_maxpool_scratch, flops=conv_maxpool_flops, eager_temps=12),
    "averagepool": OpKind(avgpool_eager, avgpool_calls, scratch=pool_scratch, flops=pool_flops),
    "globalaveragepool": OpKind(globalavgpool_eager, globalavgpool_calls, flops=lambda i, o, **_: 2 * math.prod(i[0])),
    "lrn": OpKind(lrn_eager, lrn_calls, scratch=lrn_scratch, flops=lrn_flops, eager_temps=3),
    "batchnorm": OpKind(batchnorm_eager, batchnorm_calls, scratch=channel_block_scratch, inplace=(0,),
                        flops_per_element=2, eager_temps=1),
    "pad": OpKind(pad_eager, pad_calls, flops_per_element=0),
    "sum": OpKind(sum_eager, sum_calls, inplace=(0, 1)),
}

"""torch: the op list run as eager PyTorch ops, a peer to compare with.

Strategy: at construction, convert every parameter once to a torch tensor in
the layout its op wants (linear weights transposed to (out, in) for
``F.linear``) and bind one small function per op kind. forward wraps the
caller's array without copying (``torch.from_numpy``), runs the ops under
``torch.inference_mode()`` with as many intra-op threads as the BLAS pool
NumPy uses, and returns the output as a fresh NumPy array, the caller's own.

Note: torch's thread count is process-wide; building this engine sets it.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ..base import Engine, EngineUnavailable
from ..ir.models import Model
from ..native.threads import blas_threads


def import_torch():
    try:
        import torch
    except ImportError as exc:
        raise EngineUnavailable(f"the torch engines need PyTorch ({exc}); pip install -e .[peers]") from exc
    return torch


def op_functions(torch):
    """One function per op kind: (inputs, params, attrs) -> tensor."""
    F = torch.nn.functional

    def heads(qkv, h):
        # (B, S, 3·D) -> q, k, v each (B, H, S, hd)
        b, s, width = qkv.shape
        parts = qkv.view(b, s, 3, h, width // (3 * h)).permute(2, 0, 3, 1, 4)
        return parts[0], parts[1], parts[2]

    def attn_scores(qkv, *, heads: int, scale: float | None = None):
        q, k, _ = _heads(qkv, heads)
        return torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)

    def attn_context(probs, qkv, *, heads: int):
        _, _, v = _heads(qkv, heads)
        ctx = torch.matmul(probs, v)                      # (B, H, S, hd)
        return ctx.transpose(1, 2).reshape(qkv.shape[0], qkv.shape[1], -1)

    _heads = heads
    return {**_zoo_functions(torch, F, attn_scores, attn_context), **_generic_functions(torch, F)}


def _zoo_functions(torch, F, attn_scores, attn_context):
    return {
        "linear": lambda x, w_t, b: F.linear(x, w_t, b),
        "relu": lambda x: torch.relu(x),
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "add": lambda a, b: a + b,
        "layernorm": lambda x, g, b, *, eps: F.layer_norm(x, (x.shape[-1],), g, b, eps),
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "attn_scores": attn_scores,
        "attn_context": attn_context,
    }


_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
           "pow": operator.pow, "fmod": lambda a, b: a - (a / b).trunc() * b, "mod": operator.mod}


def _generic_functions(torch, F):
    """The generic op kinds of imported graphs (engines.importer), attributes per sample."""
    def binary(a, *rest, fn, scalar=None, width=None, swap=False):
        f = _BINARY[fn]
        if scalar is not None:
            return f(scalar, a) if swap else f(a, scalar)
        (b,) = rest
        if width is None:
            return f(a, b)
        rows = a.reshape(-1, width)
        return (f(b, rows) if swap else f(rows, b)).reshape(a.shape)

    def attention(q, k, v, *mask, scale, width=None):
        """The ``attention`` kind on torch's SDPA, key/value heads repeated in groups."""
        heads, seq, kv_seq = q.shape[1], q.shape[2], k.shape[2]
        trailing = next(dims for dims in ((kv_seq,), (seq, kv_seq), (heads, seq, kv_seq)) if math.prod(dims) == width) \
            if mask else ()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0].reshape(trailing) if mask else None,
                                              scale=scale, enable_gqa=True)

    def sliced(x, spec):
        if any(not isinstance(i, int) and i[2] < 0 for i in spec):
            raise EngineUnavailable("the torch engines have no mapping for a slice with a negative step")
        return x[(slice(None), *(i if isinstance(i, int) else slice(*i) for i in spec))]

    def concat(*args, axis, order):
        tensors, params = iter(args[:order.count("t")]), iter(args[order.count("t"):])
        batch = args[0].shape[0]
        parts = [next(tensors) if o == "t" else next(params) for o in order]
        return torch.cat([p if p.dim() == args[0].dim() else p.expand(batch, *p.shape) for p in parts], dim=axis + 1)

    return {
        "binary": binary,
        "attention": attention,
        "exp": torch.exp, "sqrt": torch.sqrt, "tanh": torch.tanh, "neg": torch.neg, "erf": torch.erf,
        "sigmoid": torch.sigmoid, "silu": F.silu, "reciprocal": torch.reciprocal,
        "rmsnorm": lambda x, g, *, eps: x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * g,
        "rotary": lambda x, cos, sin: (x.reshape(-1, cos.numel()) * cos + torch.cat(
            x.chunk(2, dim=-1)[::-1], dim=-1).reshape(-1, cos.numel()) * sin).reshape(x.shape),
        "clip": lambda x, *, lo=None, hi=None: torch.clamp(x, lo, hi),
        "gelu_erf": F.gelu,
        "expand": lambda x, *, aligned, shape: x.reshape(x.shape[0], *aligned).expand(x.shape[0], *shape),
        "reshape": lambda x, *, shape: x.reshape(x.shape[0], *shape),
        "transpose": lambda x, *, perm: x.permute(0, *(p + 1 for p in perm)),
        "slice": lambda x, *, index: sliced(x, index),
        "take": lambda x, *, axis, indices: torch.index_select(x, axis + 1, torch.tensor(indices)),
        "concat": concat,
        "matmul": torch.matmul,
        "reduce_mean": lambda x: x.mean(dim=-1, keepdim=True),
        "reduce_sum": lambda x: x.sum(dim=-1, keepdim=True),
    }


class TorchEngine(Engine):
    name = "torch"
    peer = True
    own_threads = True            # its intra-op pool: the memory pass counts every thread

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        torch = self.torch = import_torch()
        self.threads = blas_threads()
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        fns = op_functions(torch)
        missing = sorted({op.kind for op in model.ops if op.kind not in fns})
        if missing:
            nodes = [n for op in model.ops if op.kind in missing for n in model.origin.get(op.output, (op.output,))]
            raise EngineUnavailable(f"the torch engines have no mapping for op kind(s) {', '.join(missing)} "
                                    f"(from {', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''})")
        self._program = []        # (fn, input names, param tensors, attrs, output name)
        self.weight_bytes = 0
        for op in model.ops:
            params = []
            for p in op.params:
                array = model.params[p]
                if op.kind == "linear" and array.ndim == 2:
                    array = array.T                      # F.linear wants (out, in)
                tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
                self.weight_bytes += tensor.numel() * tensor.element_size()
                params.append(tensor)
            self._program.append((fns[op.kind], op.inputs, tuple(params), dict(op.attrs), op.output))

    def run(self, x):
        """The model on a torch tensor; traceable by torch.compile."""
        env = {self.model.input: x}
        for fn, inputs, params, attrs, output in self._program:
            env[output] = fn(*(env[t] for t in inputs), *params, **attrs)
        return env[self.model.output]

    def _forward(self, x: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            return self._call(self.torch.from_numpy(x)).numpy()

    def _call(self, x):
        return self.run(x)

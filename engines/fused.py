"""fused: fewer passes and less dispatch, with no allocation per forward.

At construction the op list is rewritten into fused steps and what can be
folded is folded into the weights; every step is then bound once per batch
size to views of engine-owned buffers, planned into one arena as ``arena``
plans its tensors (``planner.plan_memory``; ``MLEXEC_NO_PLANNER=1`` turns it
off). The steps: a linear is ``np.copyto`` of the bias into the output then a
BLAS gemm with beta=1 accumulating onto it (``sgemv`` for one row; large
linears on NumPy's matmul plus a pre-tiled bias add); linear+relu and
linear+residual are one step each; layernorm's gamma/beta, attention's
1/sqrt(head_dim) and gelu's 0.5 fold into the next linear's weights; softmax
runs in place with its row sums on the engine's matvec. Which library runs
each linear is measured at build time on the machine at hand and cached
(``engines.kernels``; off by default: ``MLEXEC_TUNE=1`` turns it on). forward copies the
input into an engine buffer, runs ``for fn, args in steps: fn(*args)`` and
returns a read-only view of the output buffer, valid until the next call.
Needs SciPy's BLAS (extra ``fast``). Measurements behind each choice:
docs/engines.md.
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from .base import EngineUnavailable
from .compiled import BoundEngine, arena_storage
from .kernels import KERNELS, Gemm, Linears, cpu_model
from .models import Model
from .ops import (GELU_C, OPS, gather_keys, head_columns, keys_per_head, keys_scratch, maximum,
                  mean_column, ones_column, rows2d, softmax_rows, split_heads, standardize_calls, tile, tiled_calls,
                  weight_layout, zero_rows)
from .planner import Step


def _import_blas():
    try:
        from scipy.linalg.blas import sgemm, sgemv
    except ImportError as exc:
        raise EngineUnavailable(f"the fused engine needs SciPy's BLAS ({exc}); pip install -e .[fast]") from exc
    return sgemm, sgemv


class FusedEngine(BoundEngine):
    name = "fused"
    peak_slack_bytes = 1024       # measured: 0-96 B under memray
    # Up to this many multiply-adds (rows * in * out) a linear is one SciPy BLAS call with the bias
    # fused (beta=1; sgemv for one row): there the calls, not the flops, are the cost. Above it,
    # NumPy's matmul plus a tiled bias add: the bias pass is noise, NumPy's OpenBLAS was faster than
    # SciPy's on large skinny products here, and staying on one BLAS keeps one thread pool busy
    # instead of two competing for the cores.
    blas_max_work = 1 << 19          # 8 rows at dim 256; at 32 rows x 256 NumPy already won
    # What each linear may run on, measured at build time (engines.kernels): all but MKL's, whose
    # spinning pool is packed's to bring in, and those that allocate per call (oneDNN's sgemm)
    kernel_candidates = tuple(k for k, v in KERNELS.items() if not k.startswith("mkl") and not v.allocates)

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        _import_blas()                    # SciPy's BLAS runs the default kernels: refuse early without it
        self.shapes: dict[str, tuple[int, ...]] = {}   # per-sample shape of every engine buffer
        self.steps = self._lower(model)                 # [(kind, output, inputs, operands, attrs)]
        self.weight_bytes = sum(a.nbytes for _, _, inputs, operands, _ in self.steps
                                for a in (*inputs, *operands) if isinstance(a, np.ndarray))
        self._own_memory()
        # Kernel choices and their per-weight state (MKL's packs) are shared with workers.
        self._linears = Linears(self.kernel_candidates, self._default_kernel)
        self._bind(self.max_batch)        # chooses every linear's kernel now (engines.kernels)

    def _own_memory(self) -> None:
        self.plan, arena, self._buffers = arena_storage(
            {t: 4 * self.max_batch * math.prod(s) for t, s in self.shapes.items()}, self._schedule(), [self._output])
        self.activation_bytes = arena.nbytes

    # --- lowering: ops -> fused steps, weights folded once --------------------

    def _buffer(self, name: str, shape: tuple[int, ...]) -> str:
        self.shapes[name] = tuple(shape)
        return name

    def _schedule(self) -> list[Step]:
        """The steps as the planner sees them: the input copy first, then each step reading its
        buffers and writing its output and its scratch, the buffers it reads that no step outputs.
        An in-place step reads and writes one buffer."""
        outputs = {"input", *(out for _, out, *_ in self.steps)}
        schedule = [Step(reads=(), writes=("input",))]
        for _, out, inputs, _, _ in self.steps:
            names = tuple(t for t in inputs if isinstance(t, str))
            schedule.append(Step(reads=names, writes=(out, *(t for t in names if t not in outputs))))
        return schedule

    def _lower(self, model: Model):
        ops = model.ops
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            for t in op.inputs:
                readers.setdefault(t, []).append(i)
        only_reader = {t: ops[r[0]] if len(r) == 1 else None for t, r in readers.items()}

        where = {model.input: "input"}         # model tensor -> engine buffer holding it
        self._buffer("input", self._sample_shape)
        folded_ln: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # ln output -> (gamma, beta)
        qk_scale: dict[str, tuple[int, float]] = {}               # qkv tensor -> (q width, scale)
        for op in ops:
            if op.kind == "attn_scores":
                width = model.shapes[op.inputs[0]][-1] // 3
                qk_scale[op.inputs[0]] = (width, 1.0 / math.sqrt(width // op.attrs["heads"]))

        steps, skip = [], set()
        doubled: set[str] = set()                                 # tensors stored as 2x their value
        scaled: set[str] = set()                                  # qkv tensors with q pre-scaled
        for i, op in enumerate(ops):
            if i in skip:
                continue
            out_shape = model.shapes[op.output]
            nxt = only_reader.get(op.output)
            if op.kind == "layernorm" and nxt is not None and nxt.kind == "linear":
                gamma, beta = (model.params[p] for p in op.params)
                folded_ln[op.output] = (gamma, beta)
                where[op.output] = self._buffer(op.output, out_shape)
                scratch = (self._buffer(op.output + ".tmp", out_shape),
                           self._buffer(op.output + ".stat", out_shape[:-1] + (1,)))
                steps.append(("standardize", op.output, (where[op.inputs[0]], *scratch),
                              (mean_column(out_shape[-1]),), {"eps": op.attrs["eps"]}))
            elif op.kind == "linear":
                w = model.params[op.params[0]].astype(np.float64)
                b = model.params[op.params[1]].astype(np.float64)
                if op.inputs[0] in folded_ln:                      # layernorm's affine, folded in
                    gamma, beta = (v.astype(np.float64) for v in folded_ln[op.inputs[0]])
                    b = beta @ w + b
                    w = gamma[:, None] * w
                if op.inputs[0] in doubled:                        # gelu stored 2·gelu(x)
                    w *= 0.5
                if op.output in qk_scale and all(ops[r].kind in ("attn_scores", "attn_context")
                                                 for r in readers[op.output]):   # 1/sqrt(d), into q columns
                    scaled.add(op.output)
                    width, scale = qk_scale[op.output]
                    w[:, :width] *= scale
                    b[:width] *= scale
                w32, b32 = weight_layout(w), b.astype(np.float32)
                operands = (w32, b32, tile(b32, self.max_batch * math.prod(out_shape[:-1])))
                src = where[op.inputs[0]]
                if nxt is not None and nxt.kind == "relu" and ops[i + 1] is nxt:
                    skip.add(i + 1)
                    where[op.output] = where[nxt.output] = self._buffer(nxt.output, out_shape)
                    steps.append(("linear_relu", nxt.output, (src,), operands, {}))
                elif (nxt is not None and nxt.kind == "add" and ops[i + 1] is nxt
                      and nxt.inputs.count(op.output) == 1):
                    skip.add(i + 1)
                    residual = where[nxt.inputs[1] if nxt.inputs[0] == op.output else nxt.inputs[0]]
                    where[nxt.output] = self._buffer(nxt.output, out_shape)
                    steps.append(("linear_add", nxt.output, (src, residual), operands, {}))
                else:
                    where[op.output] = self._buffer(op.output, out_shape)
                    steps.append(("linear", op.output, (src,), operands, {}))
            elif op.kind == "attn_scores" and op.inputs[0] in scaled:
                where[op.output] = self._buffer(op.output, out_shape)
                (keys_shape,) = keys_scratch([model.shapes[op.inputs[0]]])
                keys = self._buffer(op.output + ".keys", keys_shape)
                steps.append(("attn_scores", op.output, (where[op.inputs[0]], keys), (), dict(op.attrs)))
            elif op.kind == "attn_context":
                where[op.output] = self._buffer(op.output, out_shape)
                steps.append(("attn_context", op.output, tuple(where[t] for t in op.inputs), (), dict(op.attrs)))
            elif op.kind == "gelu" and only_reader.get(op.inputs[0]) is op and where[op.inputs[0]] != "input":
                where[op.output] = where[op.inputs[0]]             # in place
                halve = nxt is None or nxt.kind != "linear"
                if not halve:
                    doubled.add(op.output)                         # the reader's weights take the 0.5
                steps.append(("gelu", where[op.output], (where[op.inputs[0]],
                              self._buffer(op.output + ".tmp", out_shape)), (), {"halve": halve}))
            elif op.kind == "softmax" and only_reader.get(op.inputs[0]) is op and where[op.inputs[0]] != "input":
                where[op.output] = where[op.inputs[0]]             # in place
                scratch = (self._buffer(op.output + ".tmp", out_shape),
                           self._buffer(op.output + ".stat", out_shape[:-1] + (1,)))
                steps.append(("softmax", where[op.output], (where[op.inputs[0]], *scratch), (), {}))
            else:                                                  # the op's own calls
                kind = OPS[op.kind]
                max_rows = self.max_batch * math.prod(model.shapes[model.input][:-1])
                params = [model.params[p] for p in op.params]
                prepared = kind.operands(params, max_rows)
                scratch = tuple(self._buffer(f"{op.output}.scratch{j}", s) for j, s in
                                enumerate(kind.scratch_shapes([model.shapes[t] for t in op.inputs], op.attrs)))
                where[op.output] = self._buffer(op.output, out_shape)
                steps.append(("calls", op.output, tuple(where[t] for t in op.inputs) + prepared + scratch,
                              (kind.calls,), dict(op.attrs)))
        self._output = where[model.output]
        return steps

    # --- binding: every call of one batch size, made once -----------------------

    def _view(self, name, batch: int) -> np.ndarray:
        if not isinstance(name, str):
            return name                                            # a prepared operand
        shape = (batch, *self.shapes[name])
        return self._buffers[name][:math.prod(shape)].reshape(shape)

    def _linear_calls(self, x2, y2, w, b, b_tiled, residual) -> list:
        """The calls for y2 = x2 @ w + b (+ residual), every array a 2-D view bound in advance, on
        the kernel measured fastest here for this shape (``engines.kernels``)."""
        return self._linears.calls(x2, y2, w, b, b_tiled, residual)

    def _default_kernel(self, gemm: Gemm) -> str:
        """The kernel without tuning (MLEXEC_TUNE=0): SciPy's gemm/gemv with the bias fused up to
        blas_max_work, NumPy's matmul above it and for weights stored transposed."""
        if gemm.rows * gemm.k * gemm.n > self.blas_max_work or gemm.transposed:
            return "numpy"
        return "scipy"

    def report(self) -> dict:
        """What each linear runs on: per GEMM (rows x in x out, T: weights stored transposed) the
        kernel chosen, how (measured, cached, default) and what every candidate measured."""
        return {"cpu": cpu_model(), "kernels": self._linears.report()}

    def _matvec_call(self, x, col, out):
        """The call for out = x @ col, col a (n, 1) column."""
        return (np.matmul, (x, col, out))

    def _batched_matmul_calls(self, a, b, out) -> list:
        """The calls for out[i, h] = a[i, h] @ b[i, h] over (batch, heads) views."""
        return [(np.matmul, (a, b, out))]

    def _bind(self, batch: int):
        calls = []
        for kind, out, inputs, operands, attrs in self.steps:
            y = self._view(out, batch)
            ins = [self._view(t, batch) for t in inputs]
            if kind in ("linear", "linear_relu", "linear_add"):
                residual = rows2d(ins[1]) if kind == "linear_add" else None
                calls += self._linear_calls(rows2d(ins[0]), rows2d(y), *operands, residual)
                if kind == "linear_relu":                          # NaN-propagating, against zero rows
                    calls += tiled_calls(maximum, rows2d(y), zero_rows(y.shape[-1]))
            elif kind == "standardize":
                x, tmp, stat = (rows2d(a) for a in ins)
                (mean_col,) = operands
                calls += standardize_calls(rows2d(y), x, tmp, stat, attrs["eps"],
                                           lambda a, out: [self._matvec_call(a, mean_col, out)])
            elif kind == "softmax":                                # ops' softmax, its sums on _matvec_call
                x, tmp, stat = (rows2d(a) for a in ins)
                y2 = rows2d(y)
                fn, args = self._matvec_call(y2, ones_column(x.shape[1]), stat)
                calls.append((softmax_rows, (y2, x, tmp, stat, partial(fn, *args))))
            elif kind == "attn_scores":                            # scale already in q
                (qkv, keys), heads = ins, attrs["heads"]
                q, k, _ = split_heads(qkv, heads)
                calls += [(gather_keys, (keys, k)),
                          *self._batched_matmul_calls(q, keys_per_head(keys, heads), y)]
            elif kind == "attn_context":                           # each head into its column block
                (probs, qkv), heads = ins, attrs["heads"]
                _, _, v = split_heads(qkv, heads)
                calls += self._batched_matmul_calls(probs, v, head_columns(y, heads))
            elif kind == "gelu":                                   # 2·gelu = x·(1 + tanh(u)), u = Cx(1 + 0.044715x²)
                x, t = ins
                calls += [(np.multiply, (x, x, t)),
                          (np.multiply, (t, GELU_C * 0.044715, t)),
                          (np.add, (t, GELU_C, t)),
                          (np.multiply, (t, x, t)),               # t = u
                          (np.tanh, (t, t)),
                          (np.add, (t, 1.0, t)),
                          (np.multiply, (x, t, y))]
                if attrs["halve"]:
                    calls.append((np.multiply, (y, 0.5, y)))
            else:                                                  # an engines.ops op's calls
                (op_calls,) = operands
                calls += op_calls(y, *ins, **attrs)
        result = self._view(self._output, batch)
        result.flags.writeable = False
        self._bound[batch] = (self._view("input", batch), tuple(calls), result)
        return self._bound[batch]


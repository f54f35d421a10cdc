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
(``engines.kernels``; ``MLEXEC_TUNE=0`` turns it off). forward copies the
input into an engine buffer, runs ``for fn, args in calls: fn(*args)`` and
returns a read-only view of the output buffer, valid until the next call.
Needs SciPy's BLAS (extra ``fast``). Measurements behind each choice:
docs/engines.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..base import EngineUnavailable
from .compiled import Bound, BoundEngine, arena_storage
from ..kernels import KERNELS, Gemm, Linears, candidates, cpu_model, joined
from ..kernels.table import streams
from ..ir.models import Model
from ..ir.ops import (OPS, erf_calls, gather_keys, gelu_calls, gelu_erf_calls, gelu_scratch, head_columns,
                      keys_per_head, keys_scratch, mean_column, rowwise_scratch, scores_scale, softmax_calls,
                      softmax_scratch, split_heads, standardize_calls)
from ..native import mkl, openmp
from ..ir.calls import max_rows, maximum, ones_column, rows2d, tile, tiled_calls, weight_layout, zero_rows
from ..planner import Step


def _import_blas():
    try:
        from scipy.linalg.blas import sgemm, sgemv
    except ImportError as exc:
        raise EngineUnavailable(f"the fused engine needs SciPy's BLAS ({exc}); pip install -e .[fast]") from exc
    return sgemm, sgemv


# the op kinds that run on MKL's vector math instead of their own calls, where an engine loaded it:
# its calls, and the block their scratch is sized for there (``ops.erf_scratch``'s ``block``; None:
# the kind's own)
_VECTOR_MATH = {erf_calls: (mkl.erf_calls, None), gelu_erf_calls: (mkl.gelu_erf_calls, mkl.GELU_BLOCK)}


@dataclass(frozen=True)
class FusedStep:
    """One step of the fused forward. ``kind`` names its entry in ``BIND``; it writes the engine
    buffer ``out``, reads the buffers ``reads`` and uses ``scratch`` buffers of its own, all per
    sample shapes in ``FusedEngine.shapes``; ``operands`` are arrays prepared once (folded weights,
    tiled biases) or, for ``calls``, the ``engines.ir.ops`` calls function of the op."""
    kind: str
    out: str
    reads: tuple[str, ...]
    scratch: tuple[str, ...] = ()
    operands: tuple = ()
    attrs: Mapping = field(default_factory=dict)


class Lowering:
    """What lowering one model keeps between ops: where each model tensor lives, what was folded
    where, and the steps so far. Each ``LOWER`` entry reads and extends it."""

    def __init__(self, engine: "FusedEngine", model: Model):
        self.engine, self.model, self.ops = engine, model, model.ops
        self.readers: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                self.readers.setdefault(t, []).append(i)
        self.only_reader = {t: self.ops[r[0]] if len(r) == 1 else None for t, r in self.readers.items()}
        self.writer = {op.output: op for op in self.ops}              # tensor -> the op that writes it
        self.where = {model.input: self.buffer("input", model.shapes[model.input])}  # tensor -> buffer
        self.folded_ln: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # ln output -> (gamma, beta)
        self.qk_scale: dict[str, tuple[int, float]] = {}               # qkv tensor -> (q width, scale)
        for op in self.ops:
            if op.kind == "attn_scores":
                width = model.shapes[op.inputs[0]][-1] // 3
                scale = scores_scale(width // op.attrs["heads"], op.attrs.get("scale"))
                self.qk_scale[op.inputs[0]] = (width, scale)
        self.doubled: set[str] = set()      # tensors stored as 2x their value (gelu's 0.5 deferred)
        self.scaled: set[str] = set()       # qkv tensors with q pre-scaled
        self.skip: set[int] = set()         # ops already lowered into an earlier step
        self.steps: list[FusedStep] = []

    def buffer(self, name: str, shape) -> str:
        """Declare engine buffer ``name`` of per-sample ``shape`` (planned into the arena with the
        rest); returns the name, which steps use to read, write or scratch it."""
        self.engine.shapes[name] = tuple(shape)
        return name

    def alias(self, name: str, shape, base: str) -> str:
        """Declare buffer ``name`` of per-sample ``shape`` as the bytes of buffer ``base``, the same
        number of elements read another way (a transpose that moves nothing in memory): planned
        and bound as ``base``; returns the name."""
        base = self.engine.aliases.get(base, base)
        if math.prod(shape) != math.prod(self.engine.shapes[base]):
            raise ValueError(f"alias {name!r} of {base!r}: {tuple(shape)} against {self.engine.shapes[base]}")
        self.engine.shapes[name] = tuple(shape)
        self.engine.aliases[name] = base
        return name

    def next_reader(self, op):
        """The op that alone reads ``op``'s output, or None."""
        return self.only_reader.get(op.output)

    def output(self, tensor: str, shape) -> str:
        """A new engine buffer for model tensor ``tensor``."""
        self.where[tensor] = self.buffer(tensor, shape)
        return self.where[tensor]

    def row_scratch(self, op, scratch=rowwise_scratch) -> tuple[str, str]:
        """Buffers for a row-wise op's temporary and per-row statistic (``ops.rowwise_scratch``, or
        ``scratch``'s shapes)."""
        tmp, stat = scratch([self.model.shapes[op.output]])
        return self.buffer(op.output + ".tmp", tmp), self.buffer(op.output + ".stat", stat)

    def in_place(self, op, index: int = 0) -> bool:
        """Whether ``op`` may overwrite its input ``index``: it reads it alone, and it isn't the
        caller's input copy."""
        tensor = op.inputs[index]
        return self.only_reader.get(tensor) is op and self.where[tensor] != "input"


# --- lowering: one entry per op kind fused's own way; False falls back to the op's calls ----------

def _lower_layernorm(lw: Lowering, i: int, op) -> bool:
    """Standardize only: gamma and beta fold into the one linear that reads it."""
    nxt = lw.next_reader(op)
    if nxt is None or nxt.kind != "linear":
        return False
    shape = lw.model.shapes[op.output]
    lw.folded_ln[op.output] = tuple(lw.model.params[p] for p in op.params)
    out = lw.output(op.output, shape)
    lw.steps.append(FusedStep("standardize", out, (lw.where[op.inputs[0]],), lw.row_scratch(op),
                              (mean_column(shape[-1]),), {"eps": op.attrs["eps"]}))
    return True


def _lower_linear(lw: Lowering, i: int, op) -> bool:
    """Folds what earlier steps deferred into the weights; a relu or a residual add right after
    it that alone reads it joins the step."""
    model, ops = lw.model, lw.ops
    given = model.params[op.params[0]]
    b = model.params[op.params[1]].astype(np.float64)
    ln = lw.folded_ln.get(op.inputs[0])                          # layernorm's affine, folded in
    doubled = op.inputs[0] in lw.doubled                         # gelu stored 2·gelu(x)
    scaled = op.output in lw.qk_scale and all(ops[r].kind in ("attn_scores", "attn_context")
                                              for r in lw.readers[op.output])   # 1/sqrt(d), into q columns
    folded = ln is not None or doubled or scaled
    # in float64 only where something folds in: an mlp d4096's two copies took 0.42 s of a 2.6 s build
    w = given.astype(np.float64) if folded else given
    if ln is not None:
        gamma, beta = (v.astype(np.float64) for v in ln)
        b = beta @ w + b
        w = gamma[:, None] * w
    if doubled:
        w *= 0.5
    if scaled:
        lw.scaled.add(op.output)
        width, scale = lw.qk_scale[op.output]
        w[:, :width] *= scale
        b[:width] *= scale
    shape = model.shapes[op.output]
    # an unchanged weight is laid out from the model's own array: a large one is then shared, not copied
    w32, b32 = weight_layout(w), b.astype(np.float32)
    operands = (w32, b32, tile(b32, lw.engine.max_batch * math.prod(shape[:-1])))
    src = lw.where[op.inputs[0]]
    nxt = lw.next_reader(op)
    joins = nxt is not None and i + 1 < len(ops) and ops[i + 1] is nxt
    if joins and nxt.kind == "relu":
        lw.skip.add(i + 1)
        lw.where[op.output] = lw.output(nxt.output, shape)
        lw.steps.append(FusedStep("linear_relu", lw.where[op.output], (src,), operands=operands))
    elif joins and nxt.kind == "add" and nxt.inputs.count(op.output) == 1:
        lw.skip.add(i + 1)
        residual = lw.where[nxt.inputs[1] if nxt.inputs[0] == op.output else nxt.inputs[0]]
        lw.steps.append(FusedStep("linear_add", lw.output(nxt.output, shape), (src, residual), operands=operands))
    else:
        lw.steps.append(FusedStep("linear", lw.output(op.output, shape), (src,), operands=operands))
    return True


# Scores values per sample that one block of heads holds (one head at least): where a softmax and
# the context alone follow the scores, they run head block by head block (``_bind_attn_heads``)
# and the (heads, seq, seq) scores are never written whole (ViT-B/16's 12 x 197 x 197: 1.86 MB).
ATTENTION_HEAD_BLOCK = 1 << 16


def _lower_attn_scores(lw: Lowering, i: int, op) -> bool:
    """Scores on keys gathered once per forward; the 1/sqrt(d) is already in q's weights. Where
    the softmax and the context alone follow and the heads' scores outgrow ATTENTION_HEAD_BLOCK,
    the three as one step over blocks of heads."""
    if op.inputs[0] not in lw.scaled:
        return False
    (keys_shape,) = keys_scratch([lw.model.shapes[op.inputs[0]]])
    keys = lw.buffer(op.output + ".keys", keys_shape)
    heads, (_, seq, kv_seq) = op.attrs["heads"], lw.model.shapes[op.output]
    fit = max(ATTENTION_HEAD_BLOCK // (seq * kv_seq), 1)          # heads whose scores fit the block
    block = max(d for d in range(1, min(fit, heads) + 1) if heads % d == 0)
    chain = _softmax_and_context(lw, op) if _fewer_bytes_in_blocks(heads, block, seq, kv_seq, keys_shape) else None
    if chain is None:
        out = lw.output(op.output, lw.model.shapes[op.output])
        lw.steps.append(FusedStep("attn_scores", out, (lw.where[op.inputs[0]],), (keys,), attrs=dict(op.attrs)))
        return True
    softmax, context = chain
    scores = lw.buffer(op.output + ".block", (block, seq, kv_seq))
    tmp, stat = softmax_scratch([(block, seq, kv_seq)])
    lw.skip.update(lw.ops.index(o) for o in chain)
    out = lw.output(context.output, lw.model.shapes[context.output])
    lw.steps.append(FusedStep("attn_heads", out, (lw.where[op.inputs[0]],),
                              (keys, scores, lw.buffer(op.output + ".tmp", tmp), lw.buffer(op.output + ".stat", stat)),
                              attrs={**op.attrs, "block": block}))
    return True


def _fewer_bytes_in_blocks(heads: int, block: int, seq: int, kv_seq: int, keys_shape) -> bool:
    """Whether the step over blocks of ``block`` heads holds fewer values a sample at once (the
    keys, the context, a block of scores and its softmax scratch) than the three steps do at their
    largest (the whole scores with the keys, the softmax's scratch or the context): at 8 heads of
    128 x 128 in blocks of 4 it held more, 2.10 against 1.84 MB."""
    def scores_and_scratch(n: int) -> tuple[int, int]:
        return n * seq * kv_seq, math.prod(softmax_scratch([(n, seq, kv_seq)])[0])
    keys, context = math.prod(keys_shape), seq * keys_shape[0]
    (whole, whole_tmp), (part, part_tmp) = scores_and_scratch(heads), scores_and_scratch(block)
    return block < heads and keys + context + part + part_tmp < whole + max(keys, context, whole_tmp)


def _softmax_and_context(lw: Lowering, scores):
    """(softmax, attn_context) after ``scores``, each reading the one before alone, the context
    reading the scores' own qkv; else None."""
    softmax = lw.next_reader(scores)
    context = lw.next_reader(softmax) if softmax is not None and softmax.kind == "softmax" else None
    if context is None or context.kind != "attn_context" or context.inputs != (softmax.output, scores.inputs[0]):
        return None
    return softmax, context


def _lower_attn_context(lw: Lowering, i: int, op) -> bool:
    out = lw.output(op.output, lw.model.shapes[op.output])
    lw.steps.append(FusedStep("attn_context", out, tuple(lw.where[t] for t in op.inputs), attrs=dict(op.attrs)))
    return True


def _lower_gelu(lw: Lowering, i: int, op) -> bool:
    """In place; when a linear reads it, stored as 2·gelu and the 0.5 goes into its weights."""
    if not lw.in_place(op):
        return False
    buffer = lw.where[op.output] = lw.where[op.inputs[0]]
    nxt = lw.next_reader(op)
    halve = nxt is None or nxt.kind != "linear"
    if not halve:
        lw.doubled.add(op.output)
    (tmp,) = gelu_scratch([lw.model.shapes[op.output]])
    lw.steps.append(FusedStep("gelu", buffer, (buffer,), (lw.buffer(op.output + ".tmp", tmp),), attrs={"halve": halve}))
    return True


def _lower_softmax(lw: Lowering, i: int, op) -> bool:
    """In place, its row sums on the engine's matvec."""
    if not lw.in_place(op):
        return False
    buffer = lw.where[op.output] = lw.where[op.inputs[0]]
    lw.steps.append(FusedStep("softmax", buffer, (buffer,), lw.row_scratch(op, softmax_scratch)))
    return True


def _lower_reshape(lw: Lowering, i: int, op) -> bool:
    """A reshape of a tensor nothing else reads (a classifier's flatten): the output is the input's
    buffer read in the new shape, and nothing is copied; else the op's own copy."""
    if not lw.in_place(op):
        return False
    lw.where[op.output] = lw.alias(op.output, lw.model.shapes[op.output], lw.where[op.inputs[0]])
    return True


def _lower_calls(lw: Lowering, i: int, op) -> bool:
    """Any other op: its own ``engines.ir.ops`` calls, its operands prepared once; into the buffer
    of an input it may overwrite (``OpKind.inplace``) where nothing else reads that input and the
    buffer has the output's shape, as the planner joins them for ``static`` and ``arena``."""
    kind, model = OPS[op.kind], lw.model
    attrs = dict(op.attrs)
    _, block = _VECTOR_MATH.get(kind.calls, (None, None))
    if block is not None and lw.engine.vector_math is not None:
        attrs["block"] = block
    scratch = tuple(lw.buffer(f"{op.output}.scratch{j}", s) for j, s in
                    enumerate(kind.scratch_shapes([model.shapes[t] for t in op.inputs], attrs)))
    shape = tuple(model.shapes[op.output])
    joinable = [lw.where[op.inputs[j]] for j in kind.inplace if j < len(op.inputs) and lw.in_place(op, j)
                and lw.engine.shapes[lw.where[op.inputs[j]]] == shape]
    if joinable:
        out = lw.where[op.output] = joinable[0]
    else:
        out = lw.output(op.output, shape)
    lw.steps.append(FusedStep("calls", out, tuple(lw.where[t] for t in op.inputs), scratch,
                              (kind.calls, *kind.operands([model.params[p] for p in op.params],
                                                          max_rows(model.shapes[op.output], lw.engine.max_batch))),
                              dict(op.attrs)))
    return True


LOWER: dict[str, Callable[[Lowering, int, object], bool]] = {
    "layernorm": _lower_layernorm, "linear": _lower_linear, "attn_scores": _lower_attn_scores,
    "attn_context": _lower_attn_context, "gelu": _lower_gelu, "softmax": _lower_softmax,
    "reshape": _lower_reshape,
}


# --- binding: one entry per step kind, its calls on views of one batch size -------------------

def _bind_linear(eng, step, y, ins, scratch) -> list:
    residual = rows2d(ins[1]) if step.kind == "linear_add" else None
    calls = eng.linear_calls(rows2d(ins[0]), rows2d(y), *step.operands, residual)
    if step.kind == "linear_relu":                                 # NaN-propagating, against zero rows
        calls += tiled_calls(maximum, rows2d(y), zero_rows(y.shape[-1]))
    return calls


def _bind_standardize(eng, step, y, ins, scratch) -> list:
    (mean_col,) = step.operands
    tmp, stat = (rows2d(a) for a in scratch)
    return standardize_calls(rows2d(y), rows2d(ins[0]), tmp, stat, step.attrs["eps"],
                             lambda a, out: [eng.matvec_call(a, mean_col, out)])


def _softmax_on(eng, y, x, tmp, stat) -> list:
    """ops' softmax of x into y, its row sums on the engine's matvec (``packed``: MKL's)."""
    ones = ones_column(y.shape[-1])
    return softmax_calls(y, x, tmp, stat, lambda a, out: [eng.matvec_call(a, ones, out)])


def _bind_softmax(eng, step, y, ins, scratch) -> list:
    return _softmax_on(eng, y, ins[0], *scratch)


def _bind_attn_scores(eng, step, y, ins, scratch) -> list:
    """The scale is already in q."""
    (qkv,), (keys,), heads = ins, scratch, step.attrs["heads"]
    q, k, _ = split_heads(qkv, heads)
    return [(gather_keys, (keys, k)), *eng.batched_matmul_calls(q, keys_per_head(keys, heads), y)]


def _bind_attn_heads(eng, step, y, ins, scratch) -> list:
    """The keys gathered once; then per block of heads, their scores, softmax in place, and the
    context into their column blocks of y, while the block is in cache."""
    (qkv,), (keys, scores, tmp, stat), heads, block = ins, scratch, step.attrs["heads"], step.attrs["block"]
    q, k, v = split_heads(qkv, heads)
    per_head, columns = keys_per_head(keys, heads), head_columns(y, heads)
    calls = [(gather_keys, (keys, k))]
    for h in range(0, heads, block):
        heads_here = slice(h, h + block)
        calls += [*eng.batched_matmul_calls(q[:, heads_here], per_head[:, heads_here], scores),
                  *_softmax_on(eng, scores, scores, tmp, stat),
                  *eng.batched_matmul_calls(scores, v[:, heads_here], columns[:, heads_here])]
    return calls


def _bind_attn_context(eng, step, y, ins, scratch) -> list:
    """Each head into its column block."""
    (probs, qkv), heads = ins, step.attrs["heads"]
    _, _, v = split_heads(qkv, heads)
    return eng.batched_matmul_calls(probs, v, head_columns(y, heads))


def _bind_gelu(eng, step, y, ins, scratch) -> list:
    """ops' GELU in place, as 2·gelu where the next linear takes the 0.5."""
    return gelu_calls(y, ins[0], scratch[0], doubled=not step.attrs["halve"])


def _bind_calls(eng, step, y, ins, scratch) -> list:
    # the op's own calls (or the engine's kernel for the op), its matrix products on the engine's
    # GEMM (a convolution's, a pool's)
    op_calls, *prepared = step.operands
    calls = eng.op_calls(op_calls, y, ins, prepared, scratch, step.attrs)
    return [c for fn, args in calls for c in (eng.matmul_calls(*args) if fn is np.matmul else [(fn, args)])]


LINEAR_STEPS = ("linear", "linear_relu", "linear_add")      # the step kinds of a linear (its kernel's calls)

BIND: dict[str, Callable] = {
    **dict.fromkeys(LINEAR_STEPS, _bind_linear),
    "standardize": _bind_standardize, "softmax": _bind_softmax, "attn_scores": _bind_attn_scores,
    "attn_context": _bind_attn_context, "attn_heads": _bind_attn_heads, "gelu": _bind_gelu, "calls": _bind_calls,
}


class FusedEngine(BoundEngine):
    """Engines built on fused's steps extend it through this protocol, and only through it (the
    free ``LOWER``/``BIND`` functions use only the public members named here; tests/test_extension.py
    builds an engine from it alone):

    - ``lowerings``: op kind -> ``lower(lw, i, op) -> bool`` appending ``FusedStep``s to the
      ``Lowering`` (buffers by ``lw.buffer``/``lw.output``, another reading of one's bytes by
      ``lw.alias``); False leaves the op to its own calls.
      ``lower_op(lw, i, op)`` runs it; override it to decide per op before fused's table.
    - ``binders``: step kind -> ``bind(engine, step, y, ins, scratch) -> [(fn, args), ...]``, the
      calls of one step on views of one batch size. A new step kind needs an entry here.
    - the kernels steps run on: ``kernel_candidates`` and ``default_kernel(gemm)`` (which library
      a linear may run on, measured at build time), ``matvec_call``, ``batched_matmul_calls``,
      ``matmul_calls`` (NumPy's products in other steps) and ``op_calls`` (an op's own calls).
    - ``own_memory()`` / ``bind(batch)`` (``BoundEngine``): extend them with ``super()`` for
      per-engine state allocated with the buffers, or made once per batch size.

    - ``openmp_pool``: True where the steps run on GNU OpenMP's pool.

    ``shapes`` (buffer -> per-sample shape), ``view(buffer, batch)``, ``linears`` (the kernel
    choices, shared with workers) and ``max_batch`` may be read.
    """
    name = "fused"
    peak_slack_bytes = 1024       # measured: 0-96 B under memray
    # Up to this many multiply-adds (rows * in * out) a linear is one SciPy BLAS call with the bias
    # fused (beta=1; sgemv for one row): there the calls, not the flops, are the cost. Above it,
    # NumPy's matmul plus a tiled bias add: the bias pass is noise, NumPy's OpenBLAS was faster than
    # SciPy's on large skinny products here, and staying on one BLAS keeps one thread pool busy
    # instead of two competing for the cores.
    blas_max_work = 1 << 19          # 8 rows at dim 256; at 32 rows x 256 NumPy already won
    # What each linear may run on, measured at build time (engines.kernels): NumPy's pool, or one
    # thread; not MKL, whose spinning pool is packed's to bring in
    kernel_candidates = candidates("numpy", exclude=("mkl",))
    vector_math = None               # MKL's library where the engine runs erf and GELU on it (``op_calls``)
    lowerings = LOWER                # op kind -> its lowering; an engine with lowerings of its own extends it
    binders = BIND                   # step kind -> its binding; an engine with step kinds of its own extends it
    openmp_pool = False              # steps on GNU OpenMP's pool (MKL, oneDNN): each forward first keeps
                                     # the calling thread off its workers' CPUs (``openmp.keep_aside``)

    def __init__(self, model: Model, max_batch: int):
        super().__init__(model, max_batch)
        _import_blas()                    # SciPy's BLAS runs the default kernels: refuse early without it
        self.shapes: dict[str, tuple[int, ...]] = {}   # per-sample shape of every engine buffer
        self.aliases: dict[str, str] = {}              # buffer -> the buffer whose bytes it reads (``Lowering.alias``)
        self.steps = self._lower(model)
        self.weight_bytes = sum(a.nbytes for step in self.steps for a in step.operands if isinstance(a, np.ndarray))
        self.own_memory()
        # Kernel choices and their per-weight state (MKL's packs) are shared with workers.
        self.linears = Linears(self.offered_kernels, self._linear_default)
        self.bind_judged(self.max_batch)  # chooses every linear's kernel now (engines.kernels)

    def offered_kernels(self, gemm) -> tuple[str, ...]:
        """``kernel_candidates``; where ``on_openblas(gemm)``, NumPy's GEMV on its pool and the
        one-thread kernels instead."""
        if self.on_openblas(gemm):
            return (*(k for k in self.kernel_candidates if KERNELS[k].one_thread), "numpy")
        return super().offered_kernels(gemm)

    def on_openblas(self, gemm) -> bool:
        """Whether an engine of OpenMP's pool runs this linear on OpenBLAS's pool instead: it has
        one row, and every step of the forward is a linear whose weights stream from memory
        (``kernels.table.streams``, as the timing reads them: an MLP of width 2048 or more), so
        that one pool runs the whole forward, and the timing that chooses, as everywhere else.
        OpenBLAS streams a GEMV's weights fastest on some hosts (1 x 4096 x 4096 on an AMD
        EPYC with AVX-512: 37-40 GB/s against 22-28 on oneDNN's matmul and MKL's GEMM, 33-39 on
        MKL's batch of column halves; mlp b1 d2048 there 1.15x faster than on oneDNN's matmul); on
        weights in cache oneDNN's inner product on the pool was faster (1 x 512 x 512: mlp b1 d512
        at 33 us on NumPy's pool against 21-26 on it; docs/kernels.md). Beside convolutions on
        OpenMP's pool, AlexNet's one-row classifier on OpenBLAS's ran 1.3x slower."""
        if not (self.openmp_pool and gemm.rows == 1):
            return False
        return all(step.kind in LINEAR_STEPS and streams(step.operands[0].nbytes) for step in self.steps)

    def _linear_default(self, gemm) -> str:
        return "numpy" if self.on_openblas(gemm) else self.default_kernel(gemm)

    def own_memory(self) -> None:
        sizes = {t: 4 * self.max_batch * math.prod(s) for t, s in self.shapes.items() if t not in self.aliases}
        self.plan, arena, self._buffers = arena_storage(sizes, self._schedule(), [self.aliases.get(self._output, self._output)])
        self.activation_bytes = arena.nbytes

    # --- lowering: ops -> fused steps, weights folded once --------------------

    def _schedule(self) -> list[Step]:
        """The steps as the planner sees them: the input copy first, then each step reading its
        buffers and its scratch, writing its output and its scratch. An in-place step reads and
        writes one buffer."""
        def base(names):
            return tuple(self.aliases.get(n, n) for n in names)
        return [Step(reads=(), writes=("input",))] + [
            Step(reads=base(step.reads + step.scratch), writes=base((step.out, *step.scratch))) for step in self.steps]

    def _lower(self, model: Model) -> list[FusedStep]:
        """Ops -> fused steps (``LOWER``, else the op's own calls), weights folded once."""
        lw = Lowering(self, model)
        for i, op in enumerate(model.ops):
            if i not in lw.skip:
                self.lower_op(lw, i, op)
        self._output = lw.where[model.output]
        return lw.steps

    def lower_op(self, lw: Lowering, i: int, op) -> None:
        """Op i as steps: its ``LOWER`` entry, else its own calls. An engine with steps of its own
        for some kinds extends this."""
        if not self.lowerings.get(op.kind, _lower_calls)(lw, i, op):
            _lower_calls(lw, i, op)

    # --- binding: every call of one batch size, made once -----------------------

    def view(self, name: str, batch: int) -> np.ndarray:
        shape = (batch, *self.shapes[name])
        return self._buffers[self.aliases.get(name, name)][:math.prod(shape)].reshape(shape)

    def linear_calls(self, x2, y2, w, b, b_tiled, residual) -> list:
        """The calls for y2 = x2 @ w + b (+ residual), every array a 2-D view bound in advance, on
        the kernel measured fastest here for this shape (``engines.kernels``)."""
        return self.linears.calls(x2, y2, w, b, b_tiled, residual)

    def default_kernel(self, gemm: Gemm) -> str:
        """The kernel without tuning (MLEXEC_TUNE=0): SciPy's gemm/gemv with the bias fused up to
        blas_max_work, NumPy's matmul above it and for weights stored transposed."""
        if gemm.work > self.blas_max_work or gemm.transposed:
            return "numpy"
        return "scipy"

    def report(self) -> dict:
        """What each linear runs on: per GEMM (rows x in x out, T: weights stored transposed) the
        kernel chosen, how (measured, cached, default) and what every candidate measured; and the
        bytes of its kernels' own copies of the weights (``BoundEngine.report``)."""
        return {"cpu": cpu_model(), **super().report()}

    def matvec_call(self, x, col, out):
        """The call for out = x @ col, col a (n, 1) column."""
        return (np.matmul, (x, col, out))

    def batched_matmul_calls(self, a, b, out) -> list:
        """The calls for out[i, h] = a[i, h] @ b[i, h] over (batch, heads) views."""
        return [(np.matmul, (a, b, out))]

    def matmul_calls(self, a, b, out) -> list:
        """The calls for ``np.matmul(a, b, out=out)`` in an op's own calls."""
        return [(np.matmul, (a, b, out))]

    def op_calls(self, op_calls, y, ins, prepared, scratch, attrs) -> list:
        """The calls of a step that runs an op kind's own calls (``ops.OpKind.calls``): those
        calls, or erf's and GELU's on MKL's vector math where the engine loaded MKL
        (``vector_math``; its default high-accuracy mode, ~1 ulp: 0.22 ms for 8 x 64 x 1024
        floats where the op's 22 NumPy passes took 1.29 ms, docs/importing.md); an engine with a
        faster kernel for the kind returns that kernel's calls."""
        fast, _ = _VECTOR_MATH.get(op_calls, (None, None))
        if fast is None or self.vector_math is None or not all(a.flags.c_contiguous for a in (y, *ins)):
            return op_calls(y, *ins, *prepared, *scratch, **attrs)
        return fast(self.vector_math, y, *ins, *scratch)

    def bind(self, batch: int):
        calls = []
        for step in self.steps:
            calls += self.binders[step.kind](self, step, self.view(step.out, batch),
                                     [self.view(t, batch) for t in step.reads],
                                     [self.view(t, batch) for t in step.scratch])
        result = self.view(self._output, batch)
        result.flags.writeable = False
        calls = joined(calls)
        if self.openmp_pool:
            calls = ((openmp.keep_aside, ()), *calls)
        self._bound[batch] = Bound(self.view("input", batch), calls, result)
        return self._bound[batch]

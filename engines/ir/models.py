"""The model zoo: small models as an ordered list of ops over named float32 tensors.

A model is data, not code: ``ops`` in execution order, the per-sample
``shapes`` of every tensor (the batch axis is implicit and comes first), and
float32 ``params`` drawn from a seeded generator, so the same seed gives the
same weights bit for bit. Engines decide how and where to run it; the model
only knows what it computes (``reference``, in float64).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from .ops import OPS

# The bar every engine's ``forward`` is held to against ``Model.reference`` (float64) on fresh
# random inputs: ABS_TOL on the max abs error (the zoo's weight scaling keeps activations O(1), so
# an absolute bar is meaningful), and REL_TOL on the error's norm over the reference's.
ABS_TOL = 1e-4
REL_TOL = 1e-5
# The bar of quantized computation: the int8 engine's (measured on the zoo, docs/int8.md), and of a
# model with quantize steps (``fake_quant``, from a quantized file) on any engine. Rounding to a
# step is not continuous: where float32 and float64 put a value on two sides of a half step, they
# differ by a whole step there, and what follows carries it (docs/int8.md, "Quantized ONNX files").
QUANTIZED_ABS_TOL = 0.25
QUANTIZED_REL_TOL = 0.05
QUANTIZED_STEPS = 2


class BatchRefused(ValueError):
    """A batch a model does not run at: its file fixes the batch (``Model.fixed_batch``)."""


@dataclass(frozen=True)
class FixedBatch:
    """A file whose input fixes its first axis at ``size``: the model runs at that batch only.

    ``per_sample``: the importer showed the first axis is the batch (samples independent), so the
    IR is per sample as for any model and runs ``size`` rows. Otherwise no axis is the batch (a
    rank-0 or rank-1 input, an op that mixes the first axis with others): the IR's shapes are
    the file's whole shapes, run as one row, and ``Model.rows``/``as_rows``/``from_rows`` put that
    one row around the file's input and output. ``reason`` says which, why, and how to run it: the
    whole message after "batch N refused: "."""
    size: int
    per_sample: bool
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Op:
    kind: str                    # a key of engines.ir.ops.OPS
    inputs: tuple[str, ...]      # tensor names read
    output: str                  # tensor name written (each tensor is written once)
    params: tuple[str, ...] = ()  # parameter names, in the order the op takes them
    attrs: Mapping = field(default_factory=dict)


@dataclass
class Model:
    name: str
    ops: tuple[Op, ...]
    shapes: dict[str, tuple[int, ...]]   # per-sample shape of every tensor
    params: dict[str, np.ndarray]        # float32
    input: str = "x"
    # Imported models (engines.importer): the file's bytes, which the onnxruntime engine
    # runs as they are, and for each op's output the names of the file's nodes it came from.
    source: bytes | None = field(default=None, repr=False)
    origin: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    # A file that fixes its batch: the one batch it runs at, and how (FixedBatch); None: any batch.
    fixed_batch: FixedBatch | None = None

    def __post_init__(self):
        defined = {self.input}
        for op in self.ops:
            if op.kind not in OPS:
                raise ValueError(f"op {op.output!r}: unknown kind {op.kind!r}; expected one of {sorted(OPS)}")
            missing = [t for t in op.inputs if t not in defined]
            if missing:
                raise ValueError(f"op {op.output!r} reads {missing} before they are written")
            if op.output in defined:
                raise ValueError(f"tensor {op.output!r} is written twice")
            defined.add(op.output)

    @property
    def output(self) -> str:
        return self.ops[-1].output

    # --- the batch a caller names, and the rows the IR runs -------------------------------
    # Every method below that takes ``batch`` takes the caller's batch (the file's, for a file
    # that fixes it) and refuses any other with BatchRefused naming the fixed one. Engines run
    # ``rows(batch)`` rows of the per-sample ``shapes``: the batch itself, except for a fixed
    # batch with no batch axis, which is one row of the file's whole shapes.

    @property
    def whole(self) -> bool:
        """True when the IR runs the file's whole shapes as one row (no axis is the batch)."""
        return self.fixed_batch is not None and not self.fixed_batch.per_sample

    def rows(self, batch: int) -> int:
        """The IR's rows for a caller's batch; BatchRefused for a batch the file does not fix."""
        fixed = self.fixed_batch
        if fixed is None or batch == fixed.size:
            return 1 if self.whole else batch
        raise BatchRefused(f"{self.name}: batch {batch} refused: {fixed.reason}")

    def as_rows(self, x: np.ndarray) -> np.ndarray:
        """A caller's input as the IR's (rows, *per-sample) array: a view, never a copy."""
        return x.reshape(1, *x.shape) if self.whole else x

    def from_rows(self, y: np.ndarray) -> np.ndarray:
        """The IR's (rows, *per-sample) output as the caller's: a view, never a copy."""
        return y.reshape(y.shape[1:]) if self.whole else y     # a view; 0-d stays an array

    def input_shape(self, batch: int) -> tuple[int, ...]:
        rows = self.rows(batch)
        return self.shapes[self.input] if self.whole else (rows, *self.shapes[self.input])

    def output_shape(self, batch: int) -> tuple[int, ...]:
        rows = self.rows(batch)
        return self.shapes[self.output] if self.whole else (rows, *self.shapes[self.output])

    def tensor_bytes(self, name: str, batch: int | None = None) -> int:
        """Bytes of one tensor at this batch (default: 1, or the file's fixed batch)."""
        if batch is None:
            batch = 1 if self.fixed_batch is None else self.fixed_batch.size
        return 4 * self.rows(batch) * math.prod(self.shapes[name])

    @property
    def quantized(self) -> bool:
        """True when the model rounds to quantization steps (a quantized file's ``fake_quant``)."""
        return bool(self._quantize_steps())

    @property
    def tolerance(self) -> tuple[float, float]:
        """(abs, rel): the bar any engine's forward is held to on this model against ``reference``;
        with quantize steps, the quantized bar, or QUANTIZED_STEPS of its coarsest step if larger (a
        flip moves a value by a step, and a flip before it can move the output again: measured up to
        1.3 of the coarsest step on ResNet-18's QDQ file, 1.7 with int8's own rounding added)."""
        steps = self._quantize_steps()
        if not steps:
            return ABS_TOL, REL_TOL
        scales = [fq["scale"] for fq in steps if fq.get("scale") is not None]
        return max(QUANTIZED_ABS_TOL, QUANTIZED_STEPS * max(scales, default=0.0)), QUANTIZED_REL_TOL

    def _quantize_steps(self) -> list[dict]:
        """The attributes of every quantize step: a ``fake_quant`` op's, and those an engine's pass
        folded into the op before it (``attrs["fake_quant"]``), so that the bar does not change
        with the engine."""
        return [op.attrs if op.kind == "fake_quant" else op.attrs["fake_quant"] for op in self.ops
                if op.kind == "fake_quant" or isinstance(op.attrs.get("fake_quant"), dict)]

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.params.values())

    def flops(self, batch: int = 1) -> int:
        """Flops of a forward at this batch. Linear in the batch, so it does not refuse one: a
        whole-shape model's flops per row are its one row's over the fixed batch (cost estimates
        ask for ``flops(1)`` and multiply)."""
        one = sum(OPS[op.kind].flop_count([self.shapes[t] for t in op.inputs], self.shapes[op.output], op.attrs)
                  for op in self.ops)
        return round(one * batch / self.fixed_batch.size) if self.whole else batch * one

    def eager_peak_bytes(self, batch: int) -> int:
        """Peak bytes of ``run_eager`` at this batch, the caller's input excluded.

        Replays its liveness: at each op, the tensors still to be read, the new
        output and the op's own temporaries (``OpKind.eager_extra_bytes``).
        """
        rows = self.rows(batch)
        size = lambda t: 4 * rows * math.prod(self.shapes[t])  # noqa: E731
        last_read = {t: i for i, op in enumerate(self.ops) for t in op.inputs}
        live, peak = 0, 0
        for i, op in enumerate(self.ops):
            out = size(op.output)
            extra = OPS[op.kind].eager_extra_bytes((rows, *self.shapes[op.output]), [self.shapes[t] for t in op.inputs])
            peak = max(peak, live + out + extra)
            live += out
            live -= sum(size(t) for t in set(op.inputs) if last_read[t] == i and t != self.input)
        return peak

    def no_reuse_peak_bytes(self, batch: int) -> int:
        """Every intermediate alive at once, plus the largest op's eager temporaries."""
        rows = self.rows(batch)
        return (sum(4 * rows * math.prod(self.shapes[op.output]) for op in self.ops)
                + max(OPS[op.kind].eager_extra_bytes((rows, *self.shapes[op.output]), [self.shapes[t] for t in op.inputs])
                      for op in self.ops))

    def random_input(self, batch: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        rng = np.random.default_rng(rng)
        return rng.standard_normal(self.input_shape(batch), dtype=np.float32)

    def run_eager(self, x: np.ndarray, dtype=np.float32, on_op: Callable | None = None) -> np.ndarray:
        """Run op by op with fresh arrays, dropping each tensor after its last read.

        ``x`` is the IR's (rows, *per-sample) array (``as_rows`` of a caller's input)."""
        last_read = {t: i for i, op in enumerate(self.ops) for t in op.inputs}
        params = {k: v.astype(dtype, copy=False) for k, v in self.params.items()}
        env = {self.input: np.asarray(x, dtype=dtype)}
        for i, op in enumerate(self.ops):
            kind = OPS[op.kind]
            env[op.output] = kind.eager(*(env[t] for t in op.inputs),
                                        *(params[p] for p in op.params), **op.attrs)
            if on_op is not None:
                on_op(op, env[op.output])
            for t in set(op.inputs):
                if last_read[t] == i:
                    del env[t]
        return env[self.output]

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The float64 evaluation every engine is checked against, of a caller's input."""
        x = np.asarray(x)
        if self.whole and x.shape != self.shapes[self.input]:
            raise BatchRefused(f"{self.name}: expected the file's input shape {self.shapes[self.input]}, "
                               f"got {x.shape}")
        if not self.whole:
            self.rows(len(x))
        return self.from_rows(self.run_eager(self.as_rows(x), dtype=np.float64))


class _Builder:
    """Appends ops and draws their weights from one seeded generator."""

    def __init__(self, name: str, input_shape: tuple[int, ...], seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.ops: list[Op] = []
        self.shapes: dict[str, tuple[int, ...]] = {"x": input_shape}
        self.params: dict[str, np.ndarray] = {}

    def _normal(self, shape, std):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def op(self, kind, inputs, name, shape=None, params=(), **attrs) -> str:
        self.shapes[name] = shape if shape is not None else self.shapes[inputs[0]]
        self.ops.append(Op(kind, tuple(inputs), name, tuple(params), attrs))
        return name

    def linear(self, x: str, n_out: int, name: str, gain: float = 1.0) -> str:
        n_in = self.shapes[x][-1]
        # He/LeCun scaling keeps activations O(1) so the ABS_TOL absolute bar is meaningful.
        self.params[f"{name}.w"] = self._normal((n_in, n_out), math.sqrt(gain / n_in))
        self.params[f"{name}.b"] = self._normal((n_out,), 0.1)
        return self.op("linear", [x], name, self.shapes[x][:-1] + (n_out,), [f"{name}.w", f"{name}.b"])

    def layernorm(self, x: str, name: str, eps: float = 1e-5) -> str:
        width = self.shapes[x][-1]
        self.params[f"{name}.g"] = 1 + self._normal((width,), 0.1)
        self.params[f"{name}.b"] = self._normal((width,), 0.1)
        return self.op("layernorm", [x], name, params=[f"{name}.g", f"{name}.b"], eps=eps)

    def build(self) -> Model:
        return Model(self.name, tuple(self.ops), self.shapes, self.params)


def _positive(**dims):
    for key, value in dims.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")


def mlp(dim: int = 1024, hidden: int | None = None, out_dim: int | None = None, seed: int = 0) -> Model:
    """The seed's model: dim -> hidden (ReLU) -> out_dim; 1024 everywhere by default."""
    hidden = dim if hidden is None else hidden
    out_dim = dim if out_dim is None else out_dim
    _positive(dim=dim, hidden=hidden, out_dim=out_dim)
    b = _Builder("mlp", (dim,), seed)
    h = b.op("relu", [b.linear("x", hidden, "fc1", gain=2.0)], "relu1")
    b.linear(h, out_dim, "fc2")
    return b.build()


def mlp_deep(dim: int = 1024, layers: int = 6, seed: int = 0) -> Model:
    """`layers` linear layers of width dim with ReLU between them."""
    _positive(dim=dim, layers=layers)
    b = _Builder("mlp-deep", (dim,), seed)
    h = "x"
    for i in range(1, layers):
        h = b.op("relu", [b.linear(h, dim, f"fc{i}", gain=2.0)], f"relu{i}")
    b.linear(h, dim, f"fc{layers}")
    return b.build()


def transformer(dim: int = 256, seq: int = 64, heads: int = 8, seed: int = 0) -> Model:
    """One pre-LayerNorm encoder block over (batch, seq, dim).

    LN -> QKV -> multi-head attention -> projection -> residual -> LN -> 4x GELU MLP -> residual.
    """
    _positive(dim=dim, seq=seq, heads=heads)
    if dim % heads:
        raise ValueError(f"dim must be divisible by heads={heads}, got dim={dim}")
    b = _Builder("transformer", (seq, dim), seed)
    qkv = b.linear(b.layernorm("x", "ln1"), 3 * dim, "qkv")
    scores = b.op("attn_scores", [qkv], "scores", (heads, seq, seq), heads=heads)
    probs = b.op("softmax", [scores], "probs")
    ctx = b.op("attn_context", [probs, qkv], "ctx", (seq, dim), heads=heads)
    h = b.op("add", ["x", b.linear(ctx, dim, "proj")], "res1")
    up = b.linear(b.layernorm(h, "ln2"), 4 * dim, "fc1")
    down = b.linear(b.op("gelu", [up], "gelu"), dim, "fc2")
    b.op("add", [h, down], "res2")
    return b.build()


MODELS: dict[str, Callable[..., Model]] = {
    "mlp": mlp,
    "mlp-deep": mlp_deep,
    "transformer": transformer,
}

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
    # Why the model runs at batch 1 only (a file that fixes its batch at 1 where the importer
    # cannot show which axis is the batch), or None: any batch.
    fixed_batch: str | None = None

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

    def input_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.shapes[self.input])

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.shapes[self.output])

    def tensor_bytes(self, name: str, batch: int = 1) -> int:
        return 4 * batch * math.prod(self.shapes[name])

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.params.values())

    def flops(self, batch: int = 1) -> int:
        return batch * sum(
            OPS[op.kind].flop_count([self.shapes[t] for t in op.inputs], self.shapes[op.output], op.attrs)
            for op in self.ops)

    def eager_peak_bytes(self, batch: int) -> int:
        """Peak bytes of ``run_eager`` at this batch, the caller's input excluded.

        Replays its liveness: at each op, the tensors still to be read, the new
        output and the op's own temporaries (``OpKind.eager_extra_bytes``).
        """
        last_read = {t: i for i, op in enumerate(self.ops) for t in op.inputs}
        live, peak = 0, 0
        for i, op in enumerate(self.ops):
            out = self.tensor_bytes(op.output, batch)
            extra = OPS[op.kind].eager_extra_bytes(self.output_shape(batch)[:1] + self.shapes[op.output])
            peak = max(peak, live + out + extra)
            live += out
            live -= sum(self.tensor_bytes(t, batch) for t in set(op.inputs)
                        if last_read[t] == i and t != self.input)
        return peak

    def no_reuse_peak_bytes(self, batch: int) -> int:
        """Every intermediate alive at once, plus the largest op's eager temporaries."""
        shape = lambda t: self.output_shape(batch)[:1] + self.shapes[t]  # noqa: E731
        return (sum(self.tensor_bytes(op.output, batch) for op in self.ops)
                + max(OPS[op.kind].eager_extra_bytes(shape(op.output)) for op in self.ops))

    def random_input(self, batch: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        rng = np.random.default_rng(rng)
        return rng.standard_normal(self.input_shape(batch), dtype=np.float32)

    def run_eager(self, x: np.ndarray, dtype=np.float32, on_op: Callable | None = None) -> np.ndarray:
        """Run op by op with fresh arrays, dropping each tensor after its last read."""
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
        """The float64 evaluation every engine is checked against."""
        return self.run_eager(x, dtype=np.float64)


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

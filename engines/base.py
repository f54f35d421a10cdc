"""The one interface every engine implements, and the input checks they share."""
from __future__ import annotations

import numpy as np

from .errors import EngineBusy, EngineUnavailable
from .ir.models import ABS_TOL, REL_TOL, Model

__all__ = ["Engine", "EngineBusy", "EngineUnavailable"]

_F32 = np.dtype(np.float32)


class Engine:
    """``Engine(model, max_batch)`` prepares everything; ``forward(x)`` runs one inference.

    Subclasses set ``name`` and ``returns_view`` and implement ``_forward``.
    ``weight_bytes`` is what the engine holds for parameters (including any
    re-packed copies); ``activation_bytes`` is what it holds for
    intermediates, planned up front (0 for an engine that allocates per call).
    """

    name: str = "?"
    returns_view: bool = False   # True: forward returns a read-only view into engine memory
    zero_alloc: bool = False     # True: after the first call, forward allocates no array memory
    slow_build: bool = False     # True: construction takes many seconds (compilation)
    # Why the suite's quick matrix (MLPs and a transformer, under 3 minutes) leaves it out unless
    # named; "" keeps it in. It runs in the full matrix either way.
    quick_skip: str = ""
    own_threads: bool = False    # True: work runs on a framework's thread pool, not only the caller's
    peer: bool = False           # True: another framework's runtime, here to compare against
    # What a warm forward may allocate beyond forward_peak_bytes: NumPy's and Python's own
    # bookkeeping, measured with memray (see mlexec/suite/memory.py). Frameworks keep more.
    peak_slack_bytes: int = 64 * 1024
    # The bar forward is held to against ``Model.reference`` (float64) on fresh random inputs: max
    # abs error below abs_tol, error norm over the reference's below rel_tol. The float engines keep
    # the project's bar; an engine that computes in lower precision states its own, measured.
    abs_tol: float = ABS_TOL
    rel_tol: float = REL_TOL
    # True: linears (and convs) run on 8-bit integers (``int8``, ``onnxruntime-int8``): the error is
    # quantization's, held to the engine's own bar above; mlexec's float targets leave it out.
    quantized: bool = False

    def __init__(self, model: Model, max_batch: int):
        if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.model = model
        # The IR's rows: max_batch itself, or for a file that fixes its batch, that batch only
        # (BatchRefused otherwise), as one row when the IR runs the file's whole shapes.
        self.max_batch = model.rows(int(max_batch))
        self._min_batch = 1 if model.fixed_batch is None else self.max_batch
        self._whole = model.whole
        self._sample_shape = tuple(model.shapes[model.input])
        self.weight_bytes = model.weight_bytes
        self.activation_bytes = 0

    @property
    def tolerance(self) -> tuple[float, float]:
        """(abs, rel): the bar this engine is held to on its model, the looser of its own and the
        model's (a quantized file's rounding, ``Model.tolerance``)."""
        model_abs, model_rel = self.model.tolerance
        return max(self.abs_tol, model_abs), max(self.rel_tol, model_rel)

    def forward_peak_bytes(self, batch: int) -> int:
        """The most array memory one warm forward may allocate at this batch (0 for planned engines).

        The default, for engines whose allocator we don't control (the peers),
        is the no-reuse bound: every intermediate alive at once, plus the
        largest op's own temporaries.
        """
        return 0 if self.zero_alloc else self.model.no_reuse_peak_bytes(batch)

    def forward(self, x: np.ndarray) -> np.ndarray:
        if self._whole:      # the file's own shape in and out: views around the IR's one row
            y = self._forward(self.check_input(self._rows(x)))
            return y.reshape(y.shape[1:])       # a view, a 0-d array for a rank-0 output
        return self._forward(self.check_input(x))

    def _rows(self, x) -> np.ndarray:
        if isinstance(x, np.ndarray) and x.shape == self._sample_shape:
            return x.reshape(1, *x.shape)
        raise ValueError(f"expected the file's input shape {self._sample_shape} (its batch is fixed at "
                         f"{self.model.fixed_batch.size}); got "
                         f"{x.shape if isinstance(x, np.ndarray) else type(x).__name__}")

    def worker(self) -> "Engine":
        """An engine for another thread, sharing this one's prepared weights (``engines.EnginePool``).

        Here: this engine itself, for engines whose forward keeps nothing in the engine
        between calls (it returns a fresh array); engines that own buffers give a copy with its own.
        """
        return self

    __call__ = forward

    def _forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def check_input(self, x) -> np.ndarray:
        """Refuse, never convert: a conversion would allocate and hide a caller's bug."""
        # The common good input first: composing the messages below costs microseconds a call.
        if (type(x) is np.ndarray and x.dtype is _F32 and x.shape[1:] == self._sample_shape
                and x.flags.c_contiguous and self._min_batch <= x.shape[0] <= self.max_batch):
            return x
        expected = self._sample_shape
        rows = (f"batch = {self.max_batch} (the file fixes it)" if self._min_batch > 1
                else f"1 <= batch <= {self.max_batch}")
        want = f"a C-contiguous float32 array of shape (batch, {', '.join(map(str, expected))}) with {rows}"
        if not isinstance(x, np.ndarray):
            raise TypeError(f"expected {want}; got {type(x).__name__}")
        if x.dtype != np.float32:
            raise TypeError(f"expected {want}; got dtype {x.dtype} (convert with x.astype(np.float32))")
        if x.ndim != 1 + len(expected):
            raise ValueError(f"expected {want}; got rank {x.ndim} with shape {x.shape}")
        if x.shape[1:] != expected:
            raise ValueError(f"expected {want}; got shape {x.shape}")
        if not self._min_batch <= x.shape[0] <= self.max_batch:
            raise ValueError(f"expected {want}; got batch {x.shape[0]}")
        if not x.flags.c_contiguous:
            raise ValueError(f"expected {want}; got a non-contiguous array (use np.ascontiguousarray(x))")
        return x

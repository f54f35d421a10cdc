"""One analysis, shared by the command line and the web app.

``run_analysis(values, ...)`` parses and validates the user's input values,
tiles them (cycling) to the model's input shape, builds the model, runs the
chosen engines and returns a JSON-serializable dict:

- the model, with its point's id as the suite and the report write it
  (``mlexec.case.Case``, e.g. ``mlp-b1-d1024``);

- per engine: median latency of ``forward`` (timed in one process, in two
  passes over the engines, the second in reverse order so drift falls on
  every engine alike; each engine's calls follow ``SETTLE_SECONDS`` of its own
  untimed calls, while the previous engine's thread pool stops spinning),
  speedup vs ``naive`` (with the heap pinned: ``mlexec.heap``), peak bytes
  allocated during one warm ``forward`` (tracemalloc, which sees NumPy's array allocations), the
  engine's planned ``activation_bytes`` and ``weight_bytes``, memory saved vs
  ``naive`` (not for a peer: ``memory_seen`` False, its runtime's allocator is not traced), and
  the max abs error against the float64 reference with a pass/fail at the engine's ``abs_tol``
  (``engines.ir.models.ABS_TOL``, or an int8 engine's own), and ``quantized`` where the engine
  computes in 8 bits (its error is quantization's);
- a per-op breakdown of the eager (naive) run: median time and output bytes
  of every op, with its share of the total and the slowest ops ranked.

Every bad input raises ``AnalysisError`` (a ``ValueError``) whose message says
what was expected and what came; nothing is allocated for a model before its
estimated memory and its estimated compute time (``estimate_seconds``, from
flops, bytes, repeat and engines; any model, zoo or not, can feed it) have been
checked against ``LIMITS``.
"""
from __future__ import annotations

import csv
import io
import math
import statistics
import threading
import tracemalloc
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable, Sequence

import numpy as np

from engines import ENGINES, MODELS, BatchRefused, EngineUnavailable, Model, OnnxImportError, load_onnx
from engines.ir.models import ABS_TOL

from . import heap
from .case import Case
from .defaults import ANALYZER_ENGINES
from .timing import SETTLE_SECONDS, step_times, two_passes

# The stated limits (README, "Input limits"). Checked before anything big is allocated.
LIMITS = {
    "max_input_bytes": 1_000_000,      # text pasted or uploaded, UTF-8
    "max_values": 100_000,             # numbers in the input, before tiling
    "max_abs_value": 1e6,              # |value|; the ABS_TOL check is meant for O(1) activations
    "max_batch": 1024,
    "max_dim": 4096,
    "max_repeat": 500,
    "max_estimated_bytes": 512 * 2**20,  # weights + activations of every copy the analysis holds
    "max_estimated_seconds": 60.0,       # compute budget: estimate_seconds, before anything runs
}

# What estimate_seconds assumes of one core (an analysis may share the machine with others):
# deliberately below this machine kind's measured roofs (190 GFLOP/s for a 4096^3 matmul on both
# cores, 23 GB/s copy; shared/FACTS), so that a loaded machine still finishes near the estimate.
COMPUTE_RATES = {
    "flops_per_second": 20e9,
    "bytes_per_second": 5e9,        # weights and activations streamed once per forward
    "seconds_per_op": 10e-6,        # Python dispatch per op, what dominates small shapes
    "compile_seconds": 30.0,        # an engine with slow_build (torch-compile): 10-50 s on 2 cores
}

# One analysis measures at a time in a process: tracemalloc is process-wide, and
# timings taken while another analysis computes would measure the other one.
# It also bounds a server's memory to one model at a time.
_MEASURE_LOCK = threading.Lock()


class AnalysisError(ValueError):
    """Bad input to an analysis; the message names what was expected and what came."""


# --- input parsing -----------------------------------------------------------

def _short(text: str, width: int = 40) -> str:
    text = str(text)
    return repr(text if len(text) <= width else text[:width] + "...")


def _number(cell, where: str) -> float:
    if isinstance(cell, bool) or cell is None:
        raise AnalysisError(f"expected a number at {where}, got {cell!r}")
    if isinstance(cell, str):
        text = cell.strip()
        if not text:
            raise AnalysisError(f"expected a number at {where}, got an empty value "
                                "(two separators in a row, or a trailing comma?)")
        try:
            value = float(text)
        except ValueError:
            raise AnalysisError(f"expected a number at {where}, got text {_short(text)}") from None
    elif isinstance(cell, (int, float, np.integer, np.floating)):
        value = float(cell)
    else:
        raise AnalysisError(f"expected a number at {where}, got {type(cell).__name__}")
    if not math.isfinite(value):
        raise AnalysisError(f"expected a finite number at {where}, got {value!r} (NaN and inf are refused)")
    if abs(value) > LIMITS["max_abs_value"]:
        raise AnalysisError(f"expected a number with |value| <= {LIMITS['max_abs_value']:g} at {where}, "
                            f"got {value!r}")
    return value


def _rows_from_text(text: str) -> list[list[str]]:
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > LIMITS["max_input_bytes"]:
        raise AnalysisError(f"expected at most {LIMITS['max_input_bytes']:,} bytes of input text, "
                            f"got {size:,} bytes")
    try:
        rows = list(csv.reader(io.StringIO(text), skipinitialspace=True, strict=True))
    except csv.Error as exc:
        raise AnalysisError(f"expected comma-separated numbers, one value or one row per line; "
                            f"malformed CSV: {exc}") from None
    return [row for row in rows if any(cell.strip() for cell in row)]


def _decoded(values: bytes | bytearray) -> str:
    try:
        return bytes(values).decode("utf-8")
    except UnicodeDecodeError:
        raise AnalysisError("expected UTF-8 text of comma-separated numbers, got undecodable bytes") from None


def _rows_from_list(values: list | tuple) -> list[list]:
    if all(isinstance(v, (list, tuple)) for v in values) and values:
        return [list(v) for v in values]
    if any(isinstance(v, (list, tuple)) for v in values):
        raise AnalysisError("expected a list of numbers or a list of rows (lists of numbers), got a mix of both")
    return [list(values)] if values else []


def _rows_of(values) -> list[list]:
    """The input as rows of cells, whichever form it came in."""
    if isinstance(values, (bytes, bytearray)):
        values = _decoded(values)
    if isinstance(values, str):
        return _rows_from_text(values)
    if isinstance(values, np.ndarray):
        return [values.ravel().tolist()] if values.ndim <= 1 else [list(r) for r in values.reshape(len(values), -1).tolist()]
    if isinstance(values, (list, tuple)):
        return _rows_from_list(values)
    raise AnalysisError(f"expected text, a list of numbers or a list of rows, got {type(values).__name__}")


def _check_rows(rows: list[list]) -> None:
    """At least one value, at most ``max_values``, every row as wide as the first."""
    count = sum(len(r) for r in rows)
    if count == 0:
        raise AnalysisError("expected at least one number, got empty input")
    if count > LIMITS["max_values"]:
        raise AnalysisError(f"expected at most {LIMITS['max_values']:,} input values, got {count:,}")
    width = len(rows[0])
    for i, row in enumerate(rows, 1):
        if len(row) != width:
            raise AnalysisError(f"expected every row to have {width} value(s) like row 1 (malformed CSV), "
                                f"got {len(row)} in row {i}")


def parse_values(values) -> np.ndarray:
    """Text (CSV: one value or one row per line), a list of numbers, or a list of rows -> float64 vector."""
    rows = _rows_of(values)
    _check_rows(rows)
    flat = [_number(cell, f"row {i}, column {j}" if len(rows) > 1 else f"position {j}")
            for i, row in enumerate(rows, 1) for j, cell in enumerate(row, 1)]
    return np.asarray(flat, dtype=np.float64)


def tile_values(flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Cycle the values to fill ``shape``: C-contiguous float32, as engines require."""
    return np.ascontiguousarray(np.resize(flat, shape), dtype=np.float32)


# --- options and memory estimate ----------------------------------------------

def _int_option(name: str, value, low: int, high: int) -> int:
    given = value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        try:   # form fields arrive as text
            value = int(value.strip()) if isinstance(value, str) else None
        except ValueError:
            value = None
        if value is None:
            raise AnalysisError(f"expected {name} to be an integer in {low}..{high}, got {given!r}")
    if not low <= value <= high:
        raise AnalysisError(f"expected {name} to be an integer in {low}..{high}, got {value}")
    return int(value)


def _engine_names(engines) -> list[str]:
    if isinstance(engines, str):
        engines = [e for e in (part.strip() for part in engines.split(",")) if e]
    names = list(dict.fromkeys(engines))   # de-duplicate, keep order
    if not names:
        raise AnalysisError(f"expected at least one engine from {sorted(ENGINES)}, got none")
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise AnalysisError(f"unknown engine {', '.join(map(repr, unknown))}; expected one of {sorted(ENGINES)}")
    return names


def _model_size(model_name: str, dim: int) -> tuple[int, int]:
    """(weight bytes, activation bytes per sample) of a model at ``dim``, without building it."""
    weights, activations, _ = _model_cost(model_name, dim)
    return weights, activations


def _model_cost(model_name: str, dim: int) -> tuple[int, int, int]:
    """(weight bytes, activation bytes per sample, flops per sample) at ``dim``, without building it.

    Weights grow as dim^2, activations and flops at most as dim^2 too, so each is the
    quadratic through three tiny builds, evaluated at ``dim``: exact for the zoo's
    models, and it keeps a huge ``dim`` from being allocated to be measured.
    """
    points = []
    for d in (8, 16, 24):
        m = MODELS[model_name](dim=d, seed=0)
        points.append((d, m.weight_bytes, sum(m.tensor_bytes(t) for t in m.shapes), m.flops(1)))

    def at(index: int) -> int:
        total = Fraction(0)
        for i, (xi, *yi) in enumerate(points):
            term = Fraction(yi[index])
            for j, (xj, *_) in enumerate(points):
                if i != j:
                    term *= Fraction(dim - xj, xi - xj)
            total += term
        return max(0, int(total))

    return at(0), at(1), at(2)


def estimate_seconds(flops: int, bytes_moved: int, ops: int, repeat: int, engines: Sequence[str]) -> dict[str, float]:
    """Estimated seconds of compute of one analysis, per part: ``"reference"`` (the float64
    reference and the per-op breakdown) and one entry per engine (build, compile for a
    slow_build engine, warm-up, peak, settling and ``repeat`` timed calls).

    ``flops`` and ``bytes_moved`` are one forward's at the analysis's batch, ``ops`` its op
    count; the rates are ``COMPUTE_RATES``. Any model can feed it (the zoo through
    ``_model_cost``; an uploaded graph from its own op list).
    """
    rates = COMPUTE_RATES
    forward = (flops / rates["flops_per_second"] + bytes_moved / rates["bytes_per_second"]
               + ops * rates["seconds_per_op"])
    parts = {"reference": forward * (2 + 2 + min(repeat, 5))}     # float64 costs about two forwards
    for name in engines:
        slow = getattr(ENGINES.get(name), "slow_build", False)
        parts[name] = ((rates["compile_seconds"] if slow else 0.0) + forward * (repeat + 3)
                       + 2 * max(SETTLE_SECONDS, forward))
    return parts


def check_compute(parts: dict[str, float], repeat: int, what: str) -> float:
    """The total of ``estimate_seconds``' parts, or AnalysisError saying what to lower."""
    total = sum(parts.values())
    budget = LIMITS["max_estimated_seconds"]
    if total <= budget:
        return total
    engines = [name for name in parts if name != "reference"]
    per_call = (parts["reference"] / (4 + min(repeat, 5)))              # one forward's estimate
    fixed = total - per_call * repeat * len(engines)
    fits = int((budget - fixed) / (per_call * len(engines))) if engines and per_call > 0 else 0
    biggest = max(engines, key=parts.get) if engines else "reference"
    advice = [f"lower repeat to {fits} or less" if 1 <= fits < repeat else None, "lower dim or batch",
              f"run fewer engines ({biggest} alone: {parts[biggest]:.0f} s)" if len(engines) > 1 else None]
    raise AnalysisError(
        f"expected an analysis estimated at {budget:.0f} s of compute or less, got an estimated "
        f"{total:.0f} s for {what} with repeat={repeat} and {len(engines)} engine(s); "
        + ", or ".join(a for a in advice if a))


def estimate_bytes(model_name: str, dim: int, batch: int, n_engines: int) -> int:
    """Upper estimate of what one analysis holds: the model in float32 and float64, each engine's copy."""
    weights, per_sample = _model_size(model_name, dim)
    copies = 3 + n_engines    # float32 params, float64 reference params (x2), one per engine
    return copies * (weights + per_sample * batch)


# --- measurement ---------------------------------------------------------------

def _peak_forward_bytes(engine, x) -> int:
    """Peak bytes allocated during one warm forward, as tracemalloc sees them."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = engine.forward(x)
        _, peak = tracemalloc.get_traced_memory()
        del out
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - before)


def _op_breakdown(model, x, runs: int) -> list[dict]:
    sizes: dict[str, int] = {}

    def record(op, array):
        sizes[op.output] = int(array.nbytes)

    rows = model.as_rows(x)        # the IR's rows (a file fixed without a batch axis: one)
    times = step_times(lambda mark: model.run_eager(rows, on_op=mark), runs, each=record)
    medians = [statistics.median(t) for t in times]
    total = sum(medians) or 1.0
    ranked = sorted(range(len(medians)), key=lambda i: medians[i], reverse=True)
    rank = {i: r for r, i in enumerate(ranked, 1)}
    flagged = max(1, min(3, len(medians) // 3))   # the slowest third, at most 3 ops
    return [{"name": op.output, "kind": op.kind, "origin": list(model.origin.get(op.output, ())),
             "median_s": medians[i], "bytes": sizes[op.output],
             "share_pct": 100.0 * medians[i] / total, "rank": rank[i], "slowest": rank[i] <= flagged}
            for i, op in enumerate(model.ops)]


def load_model_file(source, **limits) -> Model:
    """An ONNX file (path or bytes) as a model; any problem with it is an ``AnalysisError``."""
    try:
        return load_onnx(source, **limits)
    except OnnxImportError as exc:
        raise AnalysisError(f"cannot use this model file: {exc}") from None


def run_analysis(values, *, model: str = "mlp", dim: int = 1024, batch: int | None = None,
                 engines: Iterable[str] | str = ANALYZER_ENGINES, repeat: int = 20, seed: int = 0,
                 progress: Callable[[int, int], None] | None = None, model_file: Model | None = None) -> dict:
    """Parse, validate, run and measure; see the module docstring for the result."""
    return measure_analysis(prepare_analysis(values, model=model, dim=dim, batch=batch, engines=engines,
                                             repeat=repeat, seed=seed, model_file=model_file), progress)


def prepare_analysis(values, *, model: str = "mlp", dim: int = 1024, batch: int | None = None,
                     engines: Iterable[str] | str = ANALYZER_ENGINES, repeat: int = 20, seed: int = 0,
                     model_file: Model | None = None) -> dict:
    """Every check of ``run_analysis`` (input, options, memory, compute budget), nothing run:
    the validated job for ``measure_analysis``. Cheap, so a server checks before it queues.

    ``model_file``: an imported model (``load_model_file``) instead of the zoo's ``model`` at
    ``dim``; then ``values`` may be None, for a seeded random input.
    """
    flat = None if values is None and model_file is not None else parse_values(values)
    if batch is None:           # the default: 1, or the batch a model file fixes
        batch = model_file.fixed_batch.size if model_file is not None and model_file.fixed_batch else 1
    batch = _int_option("batch", batch, 1, LIMITS["max_batch"])
    repeat = _int_option("repeat", repeat, 1, LIMITS["max_repeat"])
    seed = _int_option("seed", seed, 0, 2**32 - 1)
    names = _engine_names(engines)
    if model_file is not None:
        m = model_file
        try:
            m.rows(batch)
        except BatchRefused as exc:      # a file that fixes its batch: that batch only
            raise AnalysisError(str(exc)) from None
        estimate = (3 + len(names)) * (m.weight_bytes + m.no_reuse_peak_bytes(batch))
        what = compute_what = f"{m.name!r} at batch={batch}"
        lower = "lower the batch"
        moved, flops, ops = m.weight_bytes + m.no_reuse_peak_bytes(batch), m.flops(batch), len(m.ops)
    else:
        if not isinstance(model, str) or model not in MODELS:
            raise AnalysisError(f"unknown model {model!r}; expected one of {sorted(MODELS)}")
        dim = _int_option("dim", dim, 1, LIMITS["max_dim"])
        try:
            estimate = estimate_bytes(model, dim, batch, len(names))
        except ValueError as exc:
            raise AnalysisError(f"invalid options for model {model!r}: {exc}") from None
        what, lower = f"model {model!r} with dim={dim}, batch={batch}", "lower dim or batch"
        compute_what = f"model {model!r} at dim={dim}, batch={batch}"
        weights, per_sample, flops = _model_cost(model, dim)
        moved, flops, ops = weights + per_sample * batch, flops * batch, len(MODELS[model](dim=8).ops)
    if estimate > LIMITS["max_estimated_bytes"]:
        raise AnalysisError(
            f"expected an analysis that fits in {LIMITS['max_estimated_bytes'] / 2**20:.0f} MiB "
            f"(weights + activations), got an estimated {estimate / 2**20:.0f} MiB for {what}; {lower}")
    check_compute(estimate_seconds(flops, moved, ops, repeat, names), repeat, compute_what)
    if model_file is not None:
        model, dim = model_file, None
    return dict(flat=flat, model_name=model, dim=dim, batch=batch, names=names, repeat=repeat, seed=seed,
                estimate=estimate)


def measure_analysis(job: dict, progress: Callable[[int, int], None] | None = None) -> dict:
    """Run and measure a job from ``prepare_analysis`` (one at a time per process)."""
    with _MEASURE_LOCK:
        return _measure(**job, progress=progress)


@dataclass
class _Progress:
    """Steps done of ``total``, told to ``report`` as each finishes."""
    total: int
    report: Callable[[int, int], None] | None
    done: int = 0

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.report is not None:
            self.report(self.done, self.total)


@dataclass(frozen=True)
class _Subject:
    """The model an analysis runs, the name it reports it by, and its point's id."""
    model: Model
    name: str
    case: Case


@dataclass(frozen=True)
class _Built:
    """Each engine's result so far (unavailable ones with their reason), and those to time."""
    results: dict[str, dict]
    live: dict[str, object]


def _subject(model_name, dim: int | None, batch: int, seed: int) -> _Subject:
    """An imported model as it is (named by its file's stem, no dim), or the zoo's at ``dim``."""
    if isinstance(model_name, Model):
        return _Subject(model_name, model_name.name, Case(model_name.name, batch))
    try:
        model = MODELS[model_name](dim=dim, seed=seed)
    except ValueError as exc:
        raise AnalysisError(f"invalid options for model {model_name!r}: {exc}") from None
    return _Subject(model, model_name, Case.of(model, batch, name=model_name))


def _checked(name: str, engine, x, reference) -> dict:
    """An engine's memory and its error against the reference, from one warm-up forward."""
    y = np.array(engine.forward(x), dtype=np.float64)   # warm-up, and a copy of the view
    error = float(np.max(np.abs(y - reference))) if y.size else 0.0
    tolerance = engine.tolerance[0]      # int8 states its own, looser bar; so does a quantized file
    # quantized: the engine computes in 8 bits, its error is quantization's and its bar its own
    # a peer's runtime allocates through its own allocator, which tracemalloc does not see: its
    # peak is NumPy's share only (ONNX Runtime on a small CNN file: 530 B), no memory saved to claim
    return {"name": name, "available": True, "weight_bytes": int(engine.weight_bytes),
            "activation_bytes": int(engine.activation_bytes), "peak_bytes": _peak_forward_bytes(engine, x),
            "memory_seen": not engine.peer,
            "max_abs_error": error, "tolerance": tolerance, "passed": bool(error <= tolerance),
            "quantized": bool(getattr(engine, "quantized", False))}


def _build_engines(model: Model, x, names: list[str], batch: int, progress: _Progress) -> _Built:
    reference = model.reference(x)
    built = _Built({}, {})
    for name in names:
        try:
            engine = ENGINES[name](model, max_batch=batch)
        except EngineUnavailable as exc:
            built.results[name] = {"name": name, "available": False, "reason": str(exc)}
        else:
            built.results[name] = _checked(name, engine, x, reference)
            built.live[name] = engine
        progress()
    return built


def _add_timings(results: dict[str, dict], samples: dict[str, list[float]]) -> None:
    """Each timed engine's median, best and footprint, then its speedup and memory saved vs naive."""
    for name, times in samples.items():
        res = results[name]
        res.update(median_s=statistics.median(times), min_s=min(times), rounds=len(times),
                   footprint_bytes=res["activation_bytes"] + res["peak_bytes"])
    base = results.get("naive") if "naive" in samples else None
    for name in samples:
        res = results[name]
        res["speedup_vs_naive"] = base["median_s"] / res["median_s"] if base and res["median_s"] > 0 else None
        res["memory_saved_pct"] = (100.0 * (1 - res["footprint_bytes"] / base["footprint_bytes"])
                                   if base and base["footprint_bytes"] > 0 and res["memory_seen"] else None)


def _measure(flat, model_name, dim, batch, names, repeat, seed, estimate, progress) -> dict:
    heap_state = heap.pin()      # naive's temporaries reused, never faulted back in (see mlexec.heap)
    subject = _subject(model_name, dim, batch, seed)
    model = subject.model
    x = (model.random_input(batch, rng=seed) if flat is None
         else tile_values(flat, model.input_shape(batch)))
    op_runs = min(repeat, 5)
    steps = _Progress(len(names) + repeat + op_runs, progress)
    built = _build_engines(model, x, names, batch, steps)
    samples = two_passes({name: engine.forward for name, engine in built.live.items()}, x, repeat,
                         SETTLE_SECONDS, after_pass=steps)
    ops = _op_breakdown(model, x, op_runs)
    steps(op_runs)
    _add_timings(built.results, samples)
    return {
        "model": {"name": subject.name, "case": subject.case.id, "dim": dim, "batch": batch,
                  "seed": seed,
                  "input_shape": list(model.input_shape(batch)),
                  "output_shape": list(model.output_shape(batch)),
                  "flops": int(model.flops(batch)), "weight_bytes": int(model.weight_bytes)},
        "input": {"values": 0 if flat is None else int(flat.size), "tiled_to": int(x.size),
                  "random": flat is None,
                  "first_values": [float(v) for v in (x.reshape(-1) if flat is None else flat)[:8]]},
        "repeat": repeat,
        "heap": heap_state,
        "tolerance": ABS_TOL,
        "estimated_bytes": int(estimate),
        "engines": [built.results[n] for n in names],
        "ops": ops,
        "slowest_ops": [o["name"] for o in sorted(ops, key=lambda o: o["rank"]) if o["slowest"]],
        "all_passed": all(r["passed"] for r in built.results.values() if r["available"]),
    }

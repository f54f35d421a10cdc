"""The report's measurements: each case's engines built, checked against the float64 reference
and timed in interleaved rounds (``mlexec.timing.rounds``), and the table's rows from them."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from engines import ENGINES, EngineUnavailable

from ..case import Case
from ..suite.roofs import Roofs
from .. import timing
from .inputs import ReportError

# The largest max abs error against the float64 reference at which the report still times an
# engine: a looser bar than engines.ir.models.ABS_TOL, the correctness bar the suite and the
# analyzer judge by; the report compares speed, and names any engine above this one untimed. An
# engine that states a looser bar of its own (``Engine.abs_tol``: int8) is held to that one.
MAX_TIMED_ERROR = 1e-3


class Check(NamedTuple):
    """An engine's result at one case, from its check against the float64 reference: its max abs
    error, the bar it is held to (``Engine.tolerance``), whether it computes in 8 bits
    (``Engine.quantized``: its error is quantization's, its bar its own), and the weight bytes it
    holds (int8's are a quarter of float's: its copy roof is counted on them)."""
    max_abs_error: float
    tolerance: float
    quantized: bool
    weight_bytes: int


@dataclass(frozen=True)
class Measured:
    """One case: per engine its seconds per call in each round, the engines not timed because
    their result was wrong (with why), the model's flops and weight bytes, and per engine that
    reports them the kernels its linears ran on. ``rechecked``: more rounds were added. ``checks``:
    per timed engine its error and bar, and the weights it holds."""
    times: dict[str, np.ndarray]
    wrong: dict[str, str]
    flops: int
    weight_bytes: int
    kernels: dict[str, list[str]]
    rechecked: bool = False
    checks: dict[str, Check] = field(default_factory=dict)

    def with_rounds(self, more: "Measured") -> "Measured":
        """These rounds and ``more``'s, judged on all: an engine wrong either time is not timed;
        the rounds stay paired (and are joined) only when the same engines ran both times."""
        times = {name: t for name, t in self.times.items() if name not in more.wrong}
        paired = set(more.times) == set(times)
        if paired:
            times = {name: np.concatenate([times[name], more.times[name]]) for name in times}
        return replace(self, times=times, wrong={**self.wrong, **more.wrong}, rechecked=paired)


def _build(name, model, batch, unavailable: dict[str, str]):
    try:
        return ENGINES[name](model, batch)
    except EngineUnavailable as exc:
        unavailable[name] = str(exc)
        return None


def _kernels_of(engine) -> list[str]:
    """"ROWSxINxOUT: kernel (how; each candidate's µs)" for each GEMM of an engine that chooses its
    kernels (engines.kernels); a candidate dropped early shows as "-"."""
    report = engine.report() if hasattr(engine, "report") else {}
    out = []
    for k in report.get("kernels", []):
        ranked = sorted(k["candidates_us"].items(), key=lambda item: item[1] or float("inf"))
        times = ", ".join(f"{n} {'-' if t is None else f'{t:.4g}'}" for n, t in ranked)
        out.append(f"{k['gemm']}: {k['kernel']} ({k['how']}" + (f"; {times} µs)" if times else ")"))
    return out


def measure(case: Case, names: list[str], rounds: int, block_seconds: float, unavailable: dict[str, str],
            settle_seconds: float = timing.SETTLE_SECONDS, first_round: int = 0) -> Measured:
    """The engines ``names`` at one case, warmed up and checked, then timed for ``rounds``
    rounds; an engine that cannot be built goes into ``unavailable`` (and is skipped from then
    on). ``first_round`` continues the Williams design where earlier rounds of this case stopped."""
    model = case.build()
    x = model.random_input(case.batch, rng=0)
    expected = model.reference(x)
    engines, wrong, checks = {}, {}, {}
    for name in (n for n in names if n not in unavailable):
        eng = _build(name, model, case.batch, unavailable)
        if eng is None:
            continue
        eng.forward(x)                                 # warm up, then check it agrees
        err = float(np.max(np.abs(eng.forward(x) - expected)))
        # int8's own, looser bar, or a quantized file's (an engine outside engines.base: its abs_tol)
        own = eng.tolerance[0] if hasattr(eng, "tolerance") else getattr(eng, "abs_tol", 0.0)
        bar = max(MAX_TIMED_ERROR, own)
        quantized = bool(getattr(eng, "quantized", False))
        if err <= bar:
            engines[name] = eng
            checks[name] = Check(err, float(own or MAX_TIMED_ERROR), quantized, int(getattr(eng, "weight_bytes", 0)))
        else:
            wrong[name] = f"max abs error {err:.2e} > {bar:g}{' (quantized: its own bar)' if quantized else ''}; not timed"
    fns = {name: eng.forward for name, eng in engines.items()}
    calls = timing.block_calls(fns.values(), x, block_seconds) if fns else 0
    times = timing.rounds(fns, x, rounds, calls, settle_seconds, first_round) if fns else {}
    return Measured(times, wrong, model.flops(case.batch), model.weight_bytes,
                    {name: _kernels_of(eng) for name, eng in engines.items()}, checks=checks)


def _paired(ref: np.ndarray, t: np.ndarray) -> tuple[float, list[float]]:
    """The median and IQR over rounds of ref's time over t's in the same round."""
    q1, med, q3 = np.percentile(ref / t, [25, 50, 75])
    return float(med), [float(q1), float(q3)]


def summarize(case: Case, times: dict[str, np.ndarray], flops: int, weight_bytes: int, roofs: Roofs,
              checks: dict[str, Check] | None = None) -> list[dict]:
    """One row per timed engine. The roofline counts the model's float bytes for every engine;
    ``held_bandwidth_fraction`` counts the weights the engine holds (int8's), when ``checks`` has them."""
    # The least time one forward can take: its flops at the peak rate, or its weights streamed once.
    flops_s = flops / (roofs.gflops * 1e9)
    stream_s = weight_bytes / (roofs.gbytes_per_s * 1e9)
    roofline_s = max(flops_s, stream_s)
    rows = []
    for name, t in times.items():
        q1, med, q3 = (float(v) for v in np.percentile(t, [25, 50, 75]))
        vs = {ref: _paired(times[ref], t) if ref in times else (None, None) for ref in ("naive", "onnxruntime")}
        rows.append({
            "case": case.id, "model": case.model, "batch": case.batch, "dim": case.dim, "seq": case.seq,
            "engine": name, "median_s": med, "iqr_pct": 100 * (q3 - q1) / med,
            "vs_naive": vs["naive"][0], "vs_naive_iqr": vs["naive"][1],
            "vs_onnxruntime": vs["onnxruntime"][0], "vs_onnxruntime_iqr": vs["onnxruntime"][1],
            "roofline_s": roofline_s, "roofline_fraction": roofline_s / med,
            "peak_fraction": flops_s / med, "bandwidth_fraction": stream_s / med,
            "rounds_s": [float(v) for v in t], "error": None,
            **_checked(checks.get(name) if checks else None, roofs, med),
        })
    return rows


def _checked(check: Check | None, roofs: Roofs, median_s: float) -> dict:
    """A row's error, its bar and whether it is quantization's; its held weights and their stream."""
    if check is None:
        return {"max_abs_error": None, "tolerance": None, "quantized": False, "held_bytes": None,
                "held_bandwidth_fraction": None}
    return {"max_abs_error": check.max_abs_error, "tolerance": check.tolerance, "quantized": check.quantized,
            "held_bytes": check.weight_bytes,
            "held_bandwidth_fraction": check.weight_bytes / (roofs.gbytes_per_s * 1e9) / median_s}


def table_rows(measured: dict[Case, Measured], roofs: Roofs, names: list[str]) -> list[dict]:
    """The table's rows, case by case in the engines' order, wrong results as error rows."""
    rows = []
    for case, m in measured.items():
        here = summarize(case, m.times, m.flops, m.weight_bytes, roofs, m.checks) if m.times else []
        here += [{"case": case.id, "model": case.model, "batch": case.batch, "dim": case.dim, "seq": case.seq,
                  "engine": name, "error": why} for name, why in m.wrong.items()]
        rows += sorted(here, key=lambda r: names.index(r["engine"]))
    return rows


@contextlib.contextmanager
def limited_threads(threads: int | None):
    """Every thread pool the engines use limited to ``threads``: the BLAS pools and OpenMP's
    (oneDNN's), with every kernel library loaded first, so that the limit reaches the pools that
    an engine would otherwise load later (MKL's, for one) and the peers' count (``blas_threads``)."""
    if threads is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise ReportError("--threads needs threadpoolctl (pip install -e .[bench])") from None
    from engines.kernels import unavailable
    unavailable()
    with threadpool_limits(limits=threads):
        yield

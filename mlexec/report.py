"""``mlexec report``: every engine on a grid of shapes, as a table, a chart, Markdown and JSON.

Every case is measured in rounds; each round times a block of calls per
engine in the orders of a Williams design (``mlexec.timing.round_order``), so
drift, neighbours' load and whatever one engine leaves behind fall on every
engine alike, and each block follows ``settle_seconds`` of untimed calls of the
same engine, while the previous engine's thread pool goes idle. Per engine and
case the table gives the median time per call and its IQR; the ratios to
``naive`` and ``onnxruntime`` as medians of per-round ratios (pairing by round
cancels the host's slow spells); and the fraction of the roofline,
max(flops / matmul roof, weight bytes / copy roof) over the median, with the
roofs calibrated in the same process before and after the grid. naive runs
with glibc's malloc pinned (``mlexec.heap``). A case where a target's figure
lies near or below its bar is measured again with ``recheck_rounds`` more
rounds and judged on all of them (``targets.close_calls``). An engine that
cannot be built is listed once with the reason; one that disagrees with the
float64 reference is not timed at that case. The report names its CPU. Why
each of these, with the measurements: docs/methodology.md.

    mlexec report                          # the MLP and transformer grids (minutes)
    mlexec report --quick                  # a few points, 3 rounds, no rechecks (under a minute)
    mlexec report --engines naive,fused,torch-compile --shapes 1x256,32x1024   # mlp, from the shapes
"""
from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from engines import ENGINES, EngineUnavailable, OnnxImportError, load_onnx
from engines.native import openmp
from engines.kernels import TUNE_ENV, cpu_model, tuning_enabled

from . import heap, targets
from .case import Case
from .defaults import REPORT_ENGINES
from .suite.roofs import Roofs, calibrate
from .timing import SETTLE_SECONDS, round_order, settle, time_block
from .units import fmt_time

DEFAULT_MODELS = ("mlp", "transformer")
# The largest max abs error against the float64 reference at which the report still times an
# engine: a looser bar than engines.models.ABS_TOL, the correctness bar the suite and the
# analyzer judge by; the report compares speed, and names any engine above this one untimed.
MAX_TIMED_ERROR = 1e-3
RECHECK_ROUNDS = 27      # more rounds at a close call: 36 in all with the default 9, the median's spread halved
TIMING = {"rounds": 9, "recheck_rounds": RECHECK_ROUNDS, "block_seconds": 0.03, "settle_seconds": SETTLE_SECONDS}
# --quick: the QUICK grid, timed for a look rather than a verdict (figures to rerun before quoting)
QUICK_TIMING = {"rounds": 3, "recheck_rounds": 0, "block_seconds": 0.01, "settle_seconds": 0.05}
LIMITS = {"max_rounds": 200, "max_block_seconds": 10.0, "max_settle_seconds": 10.0, "max_threads": 256,
          "max_batch": 1024, "max_dim": 8192, "max_seq": 1024}


def file_grid(path, batches: str) -> dict[str, list[Case]]:
    """``--model FILE --batches 1,8``: the file's model at each batch (dim: its input's last axis)."""
    try:
        model = load_onnx(path)
        sizes = [int(b) for b in batches.split(",") if b.strip()]
    except (OnnxImportError, ValueError) as exc:
        raise ReportError(f"--model {path}: {exc}" if isinstance(exc, OnnxImportError)
                          else f"expected --batches like 1,8, got {batches!r}") from None
    if model.fixed_batch and max(sizes, default=1) > 1:
        raise ReportError(f"--model {path}: batch {max(sizes)} refused: {model.fixed_batch}; use --batches 1")
    shape = model.shapes[model.input]
    return {model.name: [Case(model.name, b, shape[-1], shape[0] if len(shape) > 1 else None, str(path))
                         for b in dict.fromkeys(sizes)]}


GRIDS: dict[str, list[Case]] = {
    "mlp": [Case("mlp", b, d) for d in (256, 1024, 4096) for b in (1, 8, 32, 128)],
    "transformer": [Case("transformer", b, d, s) for d in (256, 512) for s in (64, 128) for b in (1, 8)],
}
QUICK: dict[str, list[Case]] = {
    "mlp": [Case("mlp", 1, 256), Case("mlp", 8, 256), Case("mlp", 32, 1024), Case("mlp", 1, 4096)],
    "transformer": [Case("transformer", 1, 256, 64)],
}
_ARITY = {"mlp": 2, "transformer": 3}   # BATCHxDIM, BATCHxDIMxSEQ


class ReportError(ValueError):
    """Bad input to the report; the message says what was expected and what came."""


# ---------------------------------------------------------------- input


def parse_names(text: str, known: Iterable[str], what: str) -> list[str]:
    known = list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ReportError(f"expected at least one {what} from {', '.join(known)}, got {text!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ReportError(f"unknown {what} {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def parse_shapes(text: str, models: list[str] | None) -> dict[str, list[Case]]:
    """``"1x64,8x64,1x32x8"``: BATCHxDIM entries go to mlp, BATCHxDIMxSEQ to transformer.
    ``models`` None: the models the shapes belong to."""
    grid: dict[str, list[Case]] = {m: [] for m in models or ()}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if not re.fullmatch(r"\d+(x\d+){1,2}", entry):
            raise ReportError(f"expected shapes like 8x256 (mlp) or 1x256x64 (transformer), got {entry!r}")
        parts = [int(p) for p in entry.split("x")]
        model = next(m for m, n in _ARITY.items() if n == len(parts))
        if models is None:
            grid.setdefault(model, [])
        if model not in grid:
            raise ReportError(f"shape {entry!r} is a {model} shape, but --models is {','.join(models)}")
        shape = Case(model, *parts)
        if shape not in grid[model]:
            grid[model].append(shape)
    if not grid:
        raise ReportError("expected at least one shape in --shapes, e.g. 8x256 (mlp) or 1x256x64 (transformer)")
    for model, shapes in grid.items():
        if not shapes:
            form = "BATCHxDIM" if _ARITY[model] == 2 else "BATCHxDIMxSEQ"
            raise ReportError(f"no --shapes for {model}; expected at least one {form}")
    return grid


def _check_shape(s: Case) -> None:
    for key, value, limit in (("batch", s.batch, LIMITS["max_batch"]), ("dim", s.dim, LIMITS["max_dim"]),
                              ("seq", s.seq, LIMITS["max_seq"])):
        if value is not None and not 1 <= value <= limit:
            raise ReportError(f"expected {key} in 1..{limit}, got {value} in {s.id}")
    if s.model == "transformer" and s.path is None and s.dim % 8:
        raise ReportError(f"expected a transformer dim divisible by 8 heads, got {s.dim}")


def _check_range(name: str, value, low, high) -> None:
    if not low <= value <= high:
        raise ReportError(f"expected {name} in {low}..{high}, got {value}")


# ---------------------------------------------------------------- measuring


def _build(name, model, batch, unavailable: dict[str, str]):
    try:
        return ENGINES[name](model, batch)
    except EngineUnavailable as exc:
        unavailable[name] = str(exc)
        return None


def measure(case: Case, names: list[str], rounds: int, block_seconds: float,
            unavailable: dict[str, str], settle_seconds: float = SETTLE_SECONDS, first_round: int = 0,
            chosen: dict[str, list[str]] | None = None):
    """(model, per engine the time per call of each round, engines that gave a wrong result).

    ``first_round`` continues the Williams design where earlier rounds of this case stopped;
    ``chosen`` receives, per engine that reports them, the kernels its linears run on."""
    model = case.build()
    x = model.random_input(case.batch, rng=0)
    expected = model.reference(x)
    engines, wrong = {}, {}
    for name in names:
        if name in unavailable:
            continue
        eng = _build(name, model, case.batch, unavailable)
        if eng is None:
            continue
        eng.forward(x)                                 # warm up, then check it agrees
        err = float(np.max(np.abs(eng.forward(x) - expected)))
        if not err <= MAX_TIMED_ERROR:
            wrong[name] = f"max abs error {err:.2e} > {MAX_TIMED_ERROR:g}; not timed"
            continue
        engines[name] = eng
        if chosen is not None:
            chosen[name] = _kernels_of(eng)
    if not engines:
        return model, {}, wrong
    probe = min(time_block(eng.forward, x, 1) for eng in engines.values())
    calls = max(1, int(block_seconds / max(probe, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in engines}
    order = list(engines)
    for r in range(first_round, first_round + rounds):
        for name in (order[i] for i in round_order(len(order), r)):
            settle(engines[name].forward, x, settle_seconds)
            times[name].append(time_block(engines[name].forward, x, calls))
    return model, {name: np.array(t) for name, t in times.items()}, wrong


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


def summarize(case: Case, times: dict[str, np.ndarray], flops: int, weight_bytes: int, roofs: Roofs) -> list[dict]:
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
        })
    return rows


def _rows(measured: dict, roofs: Roofs, names: list[str]) -> list[dict]:
    """The table's rows, case by case in the engines' order, wrong results as error rows."""
    rows = []
    for case, (times, wrong, flops, weight_bytes) in measured.items():
        here = summarize(case, times, flops, weight_bytes, roofs) if times else []
        here += [{"case": case.id, "model": case.model, "batch": case.batch, "dim": case.dim, "seq": case.seq,
                  "engine": name, "error": why} for name, why in wrong.items()]
        rows += sorted(here, key=lambda r: names.index(r["engine"]))
    return rows


def _paired(ref: np.ndarray, t: np.ndarray) -> tuple[float, list[float]]:
    """The median and IQR over rounds of ref's time over t's in the same round."""
    q1, med, q3 = np.percentile(ref / t, [25, 50, 75])
    return float(med), [float(q1), float(q3)]


@contextlib.contextmanager
def _threads(threads: int | None):
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


def run_report(models: Iterable[str] = DEFAULT_MODELS, engines: Iterable[str] = REPORT_ENGINES, *,
               rounds: int = 9, recheck_rounds: int = RECHECK_ROUNDS, block_seconds: float = 0.03,
               settle_seconds: float = SETTLE_SECONDS, quick: bool = False,
               grid: dict[str, list[Case]] | None = None, threads: int | None = None,
               roofs: Roofs | None = None, progress: Callable[[int, int, str | None], None] | None = None) -> dict:
    """Measure the grid and return the report as a JSON-ready dict.

    The cases where a target is a close call (``targets.close_calls``) get
    ``recheck_rounds`` more rounds. ``grid`` (model -> cases) overrides the
    built-in grids; ``roofs`` skips the calibration (tests pass their own).
    """
    models, names = list(models), list(engines)
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ReportError(f"unknown engine {', '.join(map(repr, unknown))}; choose from {', '.join(ENGINES)}")
    if grid is None:
        bad = [m for m in models if m not in GRIDS]
        if bad:
            raise ReportError(f"unknown model {', '.join(map(repr, bad))}; choose from {', '.join(GRIDS)}")
        grid = {m: (QUICK if quick else GRIDS)[m] for m in models}
    cases = [s for m in grid for s in grid[m]]
    for s in cases:
        _check_shape(s)
    _check_range("--rounds", rounds, 1, LIMITS["max_rounds"])
    _check_range("--recheck-rounds", recheck_rounds, 0, LIMITS["max_rounds"])
    _check_range("--block-seconds", block_seconds, 1e-6, LIMITS["max_block_seconds"])
    _check_range("--settle-seconds", settle_seconds, 0.0, LIMITS["max_settle_seconds"])
    if threads is not None:
        _check_range("--threads", threads, 1, LIMITS["max_threads"])

    unavailable: dict[str, str] = {}
    heap_state = heap.pin()
    with _threads(threads):
        # Calibrated before and after the grid, keeping the better of each: a slow spell of the
        # shared host during one calibration would lower the roof and inflate every fraction
        # (one run calibrated 123 GFLOP/s against 175 in the others, and put packed at 188 %).
        before = roofs if roofs is not None else calibrate()
        measured = {}             # case -> (times, wrong, flops, weight bytes)
        kernels = []              # what each tuned engine's linears ran on, per case
        for i, case in enumerate(cases):
            if progress is not None:
                progress(i, len(cases), case.id)
            chosen: dict[str, list[str]] = {}
            model, times, wrong = measure(case, names, rounds, block_seconds, unavailable, settle_seconds,
                                          chosen=chosen)
            kernels += [{"case": case.id, "engine": n, "kernels": k}
                        for n, k in chosen.items() if k]
            measured[case] = (times, wrong, model.flops(case.batch), model.weight_bytes)
            del model
        after = roofs if roofs is not None else calibrate()
        roofs = before.best(after)
        rows = _rows(measured, roofs, names)
        # A fixed number of extra rounds wherever a verdict is a close call, whichever side its
        # median fell on (stopping when it looked good would bias the verdicts), judged on all.
        close = set(targets.close_calls(rows)) if recheck_rounds else set()
        again = [s for s in cases if s.id in close]
        rechecked = []
        for i, case in enumerate(again):
            if progress is not None:
                progress(len(cases) + i, len(cases) + len(again), f"{case.id}, again")
            times, wrong, flops, weight_bytes = measured[case]
            _, more, more_wrong = measure(case, list(times), recheck_rounds, block_seconds, unavailable,
                                          settle_seconds, first_round=rounds)
            times = {name: t for name, t in times.items() if name not in more_wrong}   # wrong once: not timed
            if set(more) == set(times):       # the same engines ran: the rounds stay paired
                times = {name: np.concatenate([times[name], more[name]]) for name in times}
                rechecked.append(case)
            measured[case] = (times, {**wrong, **more_wrong}, flops, weight_bytes)
        if again:
            rows = _rows(measured, roofs, names)
        if progress is not None:
            progress(len(cases) + len(again), len(cases) + len(again), None)
        from engines.native.threads import blas_threads
        used_threads = blas_threads()
    return {
        "cpu": cpu_model(), "kernel_tuning": "on (the default)" if tuning_enabled() else f"off ({TUNE_ENV}=0)",
        "openblas": _openblas_kernels(),
        "openmp": openmp.CHOICE,
        "engines": names, "models": list(grid), "cases": [asdict(s) for s in cases],
        "rounds": rounds, "recheck_rounds": recheck_rounds,
        "rechecked": [s.id for s in rechecked],
        "block_seconds": block_seconds, "settle_seconds": settle_seconds, "threads": used_threads,
        "heap": heap_state, "roofs": asdict(roofs),
        "rows": rows, "kernels": kernels,
        "targets": targets.as_dicts(targets.check(rows)),
        "unavailable": [{"engine": n, "reason": unavailable[n]} for n in names if n in unavailable],
    }


# ---------------------------------------------------------------- output


def _ratio(v, iqr) -> str:
    return "-" if v is None else f"{v:.2f}x ({iqr[0]:.2f}-{iqr[1]:.2f})"


_HEADER = ["case", "engine", "median", "IQR %", "× naive", "× onnxruntime", "of roofline"]


def _cells(row: dict) -> list[str]:
    head = [row["case"], row["engine"]]
    if row.get("error"):
        return head + [row["error"], "", "", "", ""]
    return head + [fmt_time(row["median_s"]), f"{row['iqr_pct']:.0f}", _ratio(row["vs_naive"], row["vs_naive_iqr"]),
                   _ratio(row["vs_onnxruntime"], row["vs_onnxruntime_iqr"]), f"{100 * row['roofline_fraction']:.0f}%"]


def _openblas_kernels() -> str:
    """The kernel family NumPy's OpenBLAS runs (threadpoolctl's ``architecture``) and why; asked at
    the end of a report, so it must not fail it."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "not known (threadpoolctl is not installed)"

    from engines.native import openblas
    arch = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"]
    return f"{arch[0] if arch else 'none loaded'} ({openblas.CHOICE})"


def _preamble(report: dict) -> list[str]:
    r = report["roofs"]
    return [f"CPU: {report.get('cpu', 'not recorded')}; kernel tuning {report.get('kernel_tuning', 'not recorded')}; "
            f"NumPy's OpenBLAS kernels: {report.get('openblas', 'not recorded')}; "
            f"GNU OpenMP (MKL, oneDNN): {report.get('openmp', 'not recorded')}",
            f"roofs: matmul {r['gflops']:.0f} GFLOP/s ({r.get('matmul_by', 'numpy')}), "
            f"copy {r['gbytes_per_s']:.1f} GB/s (read + write); "
            f"{report['threads']} BLAS thread(s), {report['rounds']} interleaved round(s) per shape"
            f"{_rechecked(report)}; heap: {report.get('heap', 'not recorded')}",
            "× naive, × onnxruntime: median (IQR) over rounds of their time over this engine's (> 1: faster); "
            "of roofline: max(flops / matmul roof, weight bytes / copy roof) over the median"]


def _rechecked(report: dict) -> str:
    again = report.get("rechecked") or []
    if not again:
        return ""
    where = ", ".join(again)
    return f", {report['rounds'] + report['recheck_rounds']} at the close call(s) {where}"


def format_table(report: dict) -> str:
    rows = [_HEADER] + [_cells(r) for r in report["rows"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = _preamble(report) + [""] + lines
    out += [f"unavailable: {u['engine']}: {u['reason']}" for u in report["unavailable"]]
    if report["targets"]:
        out += ["", "targets (mlexec/targets.py):"] + ["  " + line for line in _target_lines(report)]
    return "\n".join(out)


def _target_lines(report: dict) -> list[str]:
    return targets.format_lines([targets.Target(**t) for t in report["targets"]])


def format_markdown(report: dict) -> str:
    out = [f"# Engine report: {report.get('cpu', 'CPU not recorded')}", ""] + [line + "  " for line in _preamble(report)] + [""]
    out.append("| " + " | ".join(_HEADER) + " |")
    out.append("|" + "---|" * len(_HEADER))
    out += ["| " + " | ".join(c or " " for c in _cells(r)) + " |" for r in report["rows"]]
    if report["unavailable"]:
        out += ["", "Unavailable:", ""] + [f"- `{u['engine']}`: {u['reason']}" for u in report["unavailable"]]
    if report["targets"]:
        out += ["", "## Targets", ""] + [f"- {line}" for line in _target_lines(report)]
    if report.get("kernels"):
        out += ["", "## Kernels chosen (engines.kernels)", ""]
        out += [f"- {k['case']} {k['engine']}: " + "; ".join(k["kernels"]) for k in report["kernels"]]
    return "\n".join(out) + "\n"


def _figure(report: dict, model: str):
    from matplotlib.figure import Figure   # no pyplot: no global state
    from matplotlib.lines import Line2D

    rows = [r for r in report["rows"] if r["model"] == model and not r.get("error")]
    shapes = list(dict.fromkeys(r["case"] for r in rows))
    names = [n for n in report["engines"] if any(r["engine"] == n for r in rows)]
    fig = Figure(figsize=(max(6.0, 1.1 * len(shapes) * max(1, len(names)) ** 0.5 + 2), 4.5))
    ax = fig.subplots()
    roof_ax = ax.twinx()
    width = 0.8 / max(1, len(names))
    cell = {(r["case"], r["engine"]): r for r in rows}
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i, s in enumerate(shapes) if (s, name) in cell]
        got = [cell[(s, name)] for s in shapes if (s, name) in cell]
        color = f"C{k % 10}"
        ax.bar(xs, [r["vs_naive"] or 0.0 for r in got], width, label=name, color=color)
        roof_ax.plot(xs, [100 * r["roofline_fraction"] for r in got], ls="", marker="D", ms=6, mfc=color,
                     mec="black")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, fontsize="small")
    ax.set_ylabel("speedup vs naive (bars)")
    roof_ax.set_ylabel("% of roofline (diamonds)")
    top = max((100 * r["roofline_fraction"] for r in rows), default=1.0)
    roof_ax.set_ylim(0, 1.1 * top)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], ls="", marker="D", mfc="white", mec="black"))
    labels.append("% of roofline")
    fig.suptitle(f"{model}: speedup vs naive (bars) and fraction of the roofline (diamonds)", fontsize="medium")
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.94), ncol=min(len(labels), 6),
               fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def save(report: dict, out_dir) -> tuple[list[Path], str | None]:
    """Write report.md, report.json and one <model>.png per model; returns (paths, why no chart)."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [out_dir / "report.md", out_dir / "report.json"]
        paths[0].write_text(format_markdown(report), encoding="utf-8")
        paths[1].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return paths, "no chart: matplotlib is missing (pip install -e .[charts])"
        for model in report["models"]:
            if any(r["model"] == model and not r.get("error") for r in report["rows"]):
                path = out_dir / f"{model}.png"
                _figure(report, model).savefig(path, format="png", dpi=100)
                paths.append(path)
    except OSError as exc:
        raise ReportError(f"cannot write the report into {str(out_dir)!r}: {exc.strerror or exc}") from None
    return paths, None


def _finite(obj):
    """NaN/inf would make invalid JSON; none is expected, but never write one."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def main(args) -> int:
    """The ``mlexec report`` subcommand, given its parsed arguments."""
    import sys

    names = parse_names(args.engines, ENGINES, "engine")
    if getattr(args, "model", None):
        grid = {}
        for path in args.model:
            for name, cases in file_grid(path, args.batches).items():
                if name in grid:
                    raise ReportError(f"--model {path}: another --model file is also named {name!r}; rename one")
                grid[name] = cases
        models = list(grid)
    else:
        models = parse_names(args.models, GRIDS, "model") if args.models else None
        grid = parse_shapes(args.shapes, models) if args.shapes else None
        models = list(grid) if grid else (models or list(DEFAULT_MODELS))
    timing = {k: getattr(args, k) if getattr(args, k) is not None else v
              for k, v in (QUICK_TIMING if args.quick else TIMING).items()}
    tty = sys.stderr.isatty()

    def progress(done, total, what):
        # on a terminal one line redrawn; in a log, a line per point
        if what is None and not tty:
            return
        line = f"report: {done}/{total} {what or 'done'}"
        if tty:
            print(f"\r{line:<44}", end="\n" if what is None else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    report = _finite(run_report(models, names, **timing, quick=args.quick, grid=grid,
                                threads=args.threads, progress=progress))
    paths, note = save(report, args.out)
    if args.json:
        print(json.dumps({**report, "files": [str(p) for p in paths]}, indent=2))
    else:
        print(format_table(report))
        print("\nsaved: " + ", ".join(str(p) for p in paths))
    if note:
        print(f"mlexec: {note}", file=sys.stderr)
    return 0

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

The grids are the benchmark models' report cases (``mlexec.case.FAMILIES``). By job:
``inputs`` (grids, --models/--shapes/--model, checks), ``measuring`` (timing and rows),
``output`` (table, Markdown, JSON, charts); this module runs them and is the command.

    mlexec report                          # the MLP and transformer grids (minutes)
    mlexec report --quick                  # a few points, 3 rounds, no rechecks (under a minute)
    mlexec report --engines naive,fused,torch-compile --shapes 1x256,32x1024   # mlp, from the shapes
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable, NamedTuple

from engines import ENGINES
from engines.kernels import TUNE_ENV, cpu_model, tuning_enabled
from engines.native import openmp

from .. import heap, targets
from ..case import Case
from ..defaults import REPORT_ENGINES
from ..suite.roofs import Roofs, calibrate
from ..timing import SETTLE_SECONDS
from .inputs import (DEFAULT_MODELS, LIMITS, ReportError, check_cases, check_range, file_grid, files_grid,
                     grid_of, parse_names, parse_shapes, report_families)
from .measuring import MAX_TIMED_ERROR, Measured, limited_threads, measure, summarize, table_rows
from .output import finite, format_markdown, format_table, save

__all__ = ["DEFAULT_MODELS", "LIMITS", "MAX_TIMED_ERROR", "QUICK_TIMING", "RECHECK_ROUNDS", "TIMING", "Measured",
           "ReportError", "Roofs", "Timing", "file_grid", "format_markdown", "format_table", "main", "measure",
           "parse_names", "parse_shapes", "run_report", "save", "summarize"]

RECHECK_ROUNDS = 27      # more rounds at a close call: 36 in all with the default 9, the median's spread halved


@dataclass(frozen=True)
class Timing:
    """How each case is timed: ``rounds`` interleaved rounds, ``recheck_rounds`` more at a close
    call, each engine's block about ``block_seconds`` after ``settle_seconds`` of untimed calls."""
    rounds: int = 9
    recheck_rounds: int = RECHECK_ROUNDS
    block_seconds: float = 0.03
    settle_seconds: float = SETTLE_SECONDS

    def check(self) -> None:
        check_range("--rounds", self.rounds, 1, LIMITS["max_rounds"])
        check_range("--recheck-rounds", self.recheck_rounds, 0, LIMITS["max_rounds"])
        check_range("--block-seconds", self.block_seconds, 1e-6, LIMITS["max_block_seconds"])
        check_range("--settle-seconds", self.settle_seconds, 0.0, LIMITS["max_settle_seconds"])


TIMING = asdict(Timing())
# --quick: the quick points, timed for a look rather than a verdict (figures to rerun before quoting)
QUICK_TIMING = asdict(Timing(rounds=3, recheck_rounds=0, block_seconds=0.01, settle_seconds=0.05))

Progress = Callable[[int, int, "str | None"], None]


@dataclass(frozen=True)
class _Plan:
    """What one report measures: the engines, model -> cases, and every case in order."""
    names: list[str]
    grid: dict[str, list[Case]]
    cases: list[Case]


def _plan(models: Iterable[str], engines: Iterable[str], quick: bool, grid: dict[str, list[Case]] | None) -> _Plan:
    names = list(engines)
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ReportError(f"unknown engine {', '.join(map(repr, unknown))}; choose from {', '.join(ENGINES)}")
    grid = grid_of(list(models), quick) if grid is None else grid
    return _Plan(names, grid, [s for m in grid for s in grid[m]])


def _measure_all(plan: _Plan, timing: Timing, unavailable: dict[str, str], progress: Progress) -> dict[Case, Measured]:
    measured = {}
    for i, case in enumerate(plan.cases):
        progress(i, len(plan.cases), case.id)
        measured[case] = measure(case, plan.names, timing.rounds, timing.block_seconds, unavailable,
                                 timing.settle_seconds)
    return measured


def _recheck(plan: _Plan, measured: dict[Case, Measured], again: list[Case], timing: Timing,
             unavailable: dict[str, str], progress: Progress) -> None:
    """``timing.recheck_rounds`` more rounds at each case of ``again``, continuing its design."""
    first = len(plan.cases)
    for i, case in enumerate(again):
        progress(first + i, first + len(again), f"{case.id}, again")
        more = measure(case, list(measured[case].times), timing.recheck_rounds, timing.block_seconds, unavailable,
                       timing.settle_seconds, first_round=timing.rounds)
        measured[case] = measured[case].with_rounds(more)


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


def _environment() -> dict:
    """The machine and library facts a report states first."""
    return {"cpu": cpu_model(), "kernel_tuning": "on (the default)" if tuning_enabled() else f"off ({TUNE_ENV}=0)",
            "openblas": _openblas_kernels(), "openmp": f"{openmp.CHOICE}; {openmp.PINNED}"}


def run_report(models: Iterable[str] = DEFAULT_MODELS, engines: Iterable[str] = REPORT_ENGINES, *,
               rounds: int = Timing.rounds, recheck_rounds: int = Timing.recheck_rounds,
               block_seconds: float = Timing.block_seconds, settle_seconds: float = Timing.settle_seconds,
               quick: bool = False, grid: dict[str, list[Case]] | None = None, threads: int | None = None,
               roofs: Roofs | None = None, progress: Progress | None = None) -> dict:
    """Measure the grid and return the report as a JSON-ready dict.

    The cases where a target is a close call (``targets.close_calls``) get
    ``recheck_rounds`` more rounds. ``grid`` (model -> cases) overrides the
    models' report cases; ``roofs`` skips the calibration (tests pass their own).
    """
    plan = _plan(models, engines, quick, grid)
    timing = Timing(rounds, recheck_rounds, block_seconds, settle_seconds)
    timing.check()
    if threads is not None:
        check_range("--threads", threads, 1, LIMITS["max_threads"])
    check_cases(plan.cases)           # last: it builds each shape's model
    progress = progress or (lambda done, total, what: None)
    unavailable: dict[str, str] = {}
    heap_state = heap.pin()
    with limited_threads(threads):
        # Calibrated before and after the grid, keeping the better of each: a slow spell of the
        # shared host during one calibration would lower the roof and inflate every fraction.
        before = roofs if roofs is not None else calibrate()
        measured = _measure_all(plan, timing, unavailable, progress)
        roofs = before.best(roofs if roofs is not None else calibrate())
        rows = table_rows(measured, roofs, plan.names)
        # A fixed number of extra rounds wherever a verdict is a close call, whichever side its
        # median fell on (stopping when it looked good would bias the verdicts), judged on all.
        close = set(targets.close_calls(rows)) if timing.recheck_rounds else set()
        again = [s for s in plan.cases if s.id in close]
        _recheck(plan, measured, again, timing, unavailable, progress)
        rows = table_rows(measured, roofs, plan.names) if again else rows
        progress(len(plan.cases) + len(again), len(plan.cases) + len(again), None)
        from engines.native.threads import blas_threads
        used_threads = blas_threads()
    return {
        **_environment(),
        "engines": plan.names, "models": list(plan.grid), "cases": [asdict(s) for s in plan.cases],
        "rounds": rounds, "recheck_rounds": recheck_rounds,
        "rechecked": [s.id for s in again if measured[s].rechecked],
        "block_seconds": block_seconds, "settle_seconds": settle_seconds, "threads": used_threads,
        "heap": heap_state, "roofs": asdict(roofs),
        "rows": rows,
        "kernels": [{"case": case.id, "engine": n, "kernels": k}
                    for case, m in measured.items() for n, k in m.kernels.items() if k],
        "targets": targets.as_dicts(targets.check(rows)),
        "unavailable": [{"engine": n, "reason": unavailable[n]} for n in plan.names if n in unavailable],
    }


class _Chosen(NamedTuple):
    """The models a command line names, and their cases when it gave them (None: the models'
    report cases)."""
    models: list[str]
    grid: dict[str, list[Case]] | None


def _chosen(args) -> _Chosen:
    """--model files, else --shapes (for --models), else --models (default: ``DEFAULT_MODELS``)."""
    if getattr(args, "model", None):
        grid = files_grid(args.model, args.batches)
        return _Chosen(list(grid), grid)
    models = parse_names(args.models, report_families(), "model") if args.models else None
    grid = parse_shapes(args.shapes, models) if args.shapes else None
    return _Chosen(list(grid) if grid else (models or list(DEFAULT_MODELS)), grid)


def _progress_printer() -> Progress:
    import sys
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
    return progress


def main(args) -> int:
    """The ``mlexec report`` subcommand, given its parsed arguments."""
    import json
    import sys

    names = parse_names(args.engines, ENGINES, "engine")
    chosen = _chosen(args)
    timing = {k: getattr(args, k) if getattr(args, k) is not None else v
              for k, v in (QUICK_TIMING if args.quick else TIMING).items()}
    report = finite(run_report(chosen.models, names, **timing, quick=args.quick, grid=chosen.grid,
                               threads=args.threads, progress=_progress_printer()))
    paths, note = save(report, args.out)
    if args.json:
        print(json.dumps({**report, "files": [str(p) for p in paths]}, indent=2))
    else:
        print(format_table(report))
        print("\nsaved: " + ", ".join(str(p) for p in paths))
    if note:
        print(f"mlexec: {note}", file=sys.stderr)
    return 0

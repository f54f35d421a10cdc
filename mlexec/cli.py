"""The ``mlexec`` command line: ``analyze`` (one analysis as a table or JSON), ``history`` and ``report``.

Bad input prints one line, ``mlexec: error: ...``, to stderr and exits 2;
never a traceback. Success exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engines import ENGINES, MODELS

from .analysis import LIMITS, AnalysisError, load_model_file, run_analysis
from .baselines import BaselineError
from .defaults import ANALYZER_ENGINES, REPORT_ENGINES
from .history import DEFAULT_THRESHOLD
from .report import DEFAULT_MODELS as REPORT_MODELS, QUICK_TIMING, TIMING, ReportError
from .report.inputs import report_families, shape_forms
from .units import fmt_bytes, fmt_time




def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def error_label(engine: dict) -> str:
    """An engine's max abs error; a quantized engine's labelled so, with the bar it is held to."""
    if engine.get("quantized"):
        return f"{engine['max_abs_error']:.2e} quantized (bar {engine['tolerance']:g})"
    return f"{engine['max_abs_error']:.2e}"


def format_result(result: dict) -> str:
    m = result["model"]
    given = "a seeded random input" if result["input"].get("random") else f"{result['input']['values']} value(s)"
    size = "" if m["dim"] is None else f" dim={m['dim']}"
    out = [f"model {m['name']}{size} batch={m['batch']} input {tuple(m['input_shape'])} "
           f"from {given}, {result['repeat']} timed calls per engine", ""]
    rows = [["engine", "median", "speedup", "peak fwd", "activations", "weights", "mem saved", "max abs err", "check"]]
    for e in result["engines"]:
        if not e["available"]:
            rows.append([e["name"], "unavailable: " + e["reason"], *[""] * 7])
            continue
        rows.append([e["name"], fmt_time(e["median_s"]),
                     "-" if e["speedup_vs_naive"] is None else f"{e['speedup_vs_naive']:.2f}x",
                     *(fmt_bytes(e[k] if e["memory_seen"] else None) for k in ("peak_bytes", "activation_bytes")),
                     fmt_bytes(e["weight_bytes"]),
                     "-" if e["memory_saved_pct"] is None else f"{e['memory_saved_pct']:.1f}%",
                     error_label(e), "pass" if e["passed"] else f"FAIL (> {e.get('tolerance', result['tolerance']):g})"])
    out.append(_table(rows))
    unseen = [e["name"] for e in result["engines"] if e["available"] and not e["memory_seen"]]
    if unseen:
        out.append(f"peak fwd, activations, mem saved: not measured for {', '.join(unseen)} (a runtime's own "
                   "allocator, which tracemalloc does not see)")
    out += ["", "naive run, per op (* = among the slowest):"]
    origins = any(o.get("origin") for o in result["ops"])       # an imported model: its file's nodes
    ops = [["op", "kind", "median", "share", "output"] + (["from nodes"] if origins else [])]
    for o in result["ops"]:
        ops.append([("* " if o["slowest"] else "  ") + o["name"], o["kind"], fmt_time(o["median_s"]),
                    f"{o['share_pct']:.1f}%", fmt_bytes(o["bytes"])]
                   + ([", ".join(o["origin"])] if origins else []))
    out.append(_table(ops))
    return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    """argparse's own errors, in the one-line form (exit 2)."""

    def error(self, message):
        self.exit(2, f"mlexec: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlexec", description="ML Execution & Optimization Analyzer")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    a = sub.add_parser("analyze", help="run the engines on your input values and compare them")
    src = a.add_mutually_exclusive_group()
    src.add_argument("--input", help='comma-separated numbers, e.g. "1.0, 0.5"')
    src.add_argument("--input-file", type=Path,
                     help="CSV file (one value or one row per line) or a NumPy .npy array")
    a.add_argument("--model", default="mlp",
                   help=f"one of {', '.join(MODELS)} (default mlp), or an ONNX file (path.onnx); "
                        f"with a file, the input may be left out for a seeded random one")
    a.add_argument("--dim", type=int, default=1024, help=f"model width, 1..{LIMITS['max_dim']} (default 1024)")
    a.add_argument("--batch", type=int, default=None,
                   help=f"batch size, 1..{LIMITS['max_batch']} (default 1, or the batch a --model file fixes)")
    a.add_argument("--engines", default=",".join(ANALYZER_ENGINES),
                   help=f"comma list from {', '.join(ENGINES)} (default {','.join(ANALYZER_ENGINES)})")
    a.add_argument("--repeat", type=int, default=20, help=f"timed calls per engine, 1..{LIMITS['max_repeat']} (default 20)")
    a.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    a.add_argument("--json", action="store_true", help="print the result as JSON")

    h = sub.add_parser("history", help="each benchmark's trend over the saved runs, with step changes")
    h.add_argument("--root", type=Path, default=Path("baselines"), help="saved runs: ROOT/<machine-id>/*.json")
    h.add_argument("--machine", help="only this machine id")
    h.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"relative change that counts as a step (default {DEFAULT_THRESHOLD})")
    h.add_argument("--html", type=Path, metavar="DIR",
                   help="also write the history page as a static site into DIR (index.html, one page per machine)")
    h.add_argument("--out", type=Path, metavar="DIR", help="also write one matplotlib chart per machine and model")
    h.add_argument("--format", choices=("png", "svg"), default="png", help="chart format for --out (png)")

    r = sub.add_parser("report", help="engine x shape table with ratios to naive, ONNX Runtime and the roofline")
    r.add_argument("--quick", action="store_true",
                   help=f"a few shapes, {QUICK_TIMING['rounds']} rounds, no close-call rounds, "
                        f"{QUICK_TIMING['settle_seconds']} s settling: well under a minute "
                        "with the default engines, a few seconds for a few small points")
    r.add_argument("--models", help=f"comma list from {', '.join(report_families())} (default {','.join(REPORT_MODELS)}; "
                                    "with --shapes, the models those shapes belong to)")
    r.add_argument("--engines", default=",".join(REPORT_ENGINES),
                   help=f"comma list from {', '.join(ENGINES)} (default {','.join(REPORT_ENGINES)})")
    r.add_argument("--model", type=Path, metavar="FILE.onnx", action="append",
                   help="an ONNX file to report on instead of --models, repeatable (see docs/importing.md)")
    r.add_argument("--batches", default="1,8", help="batch sizes for --model (default 1,8)")
    r.add_argument("--shapes", help=f"instead of the built-in grid: {shape_forms()} entries, "
                                    "e.g. 1x256,8x256,1x256x64")
    r.add_argument("--rounds", type=int, help=f"interleaved rounds per shape (default {TIMING['rounds']})")
    r.add_argument("--recheck-rounds", type=int,
                   help="more rounds at each shape where a target's bar lies inside the interquartile range "
                        "of a deciding figure's rounds or above its median, judged on all rounds; 0: none "
                        f"(default {TIMING['recheck_rounds']})")
    r.add_argument("--block-seconds", type=float,
                   help=f"target duration of one engine's block of calls (default {TIMING['block_seconds']})")
    r.add_argument("--settle-seconds", type=float,
                   help="untimed calls of each engine before its block, while the previous engine's "
                        f"thread pool stops spinning (default {TIMING['settle_seconds']})")
    r.add_argument("--threads", type=int, help="BLAS threads for every engine (default: as configured)")
    r.add_argument("--out", type=Path, default=Path("reports/engines"),
                   help="where report.md, report.json and the charts go (default reports/engines)")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _read_input_file(path: Path) -> str:
    limit = LIMITS["max_input_bytes"]
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise AnalysisError(f"cannot read --input-file {str(path)!r}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise AnalysisError(f"expected at most {limit:,} bytes of input text, got more in {str(path)!r}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AnalysisError(f"expected UTF-8 text of comma-separated numbers in {str(path)!r}, "
                            "got undecodable bytes") from None


def _model_file(name: str):
    """--model as an imported model when it names an ONNX file, else None (a zoo name)."""
    if name in MODELS:
        return None
    if not name.endswith(".onnx") and not Path(name).is_file():
        raise AnalysisError(f"unknown model {name!r}; expected one of {', '.join(MODELS)} or an ONNX file (.onnx)")
    return load_model_file(Path(name))


def _read_npy(path: Path):
    import numpy as np
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"cannot read --input-file {str(path)!r} as a NumPy array: {exc}") from None


def _analyze(args) -> int:
    model_file = _model_file(args.model)
    if args.input is not None:
        values = args.input
    elif args.input_file is not None:
        values = _read_npy(args.input_file) if args.input_file.suffix == ".npy" else _read_input_file(args.input_file)
    elif model_file is None:
        raise AnalysisError("expected --input or --input-file (a model file may go without: a seeded random input)")
    else:
        values = None
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            try:
                from tqdm import tqdm
            except ImportError:       # the "progress" extra is optional
                return
            bar = tqdm(total=total, delay=1, file=sys.stderr, desc="analyzing", unit="step", leave=False)
        bar.update(done - bar.n)

    try:
        result = run_analysis(values, model=args.model, dim=args.dim, batch=args.batch, engines=args.engines,
                              repeat=args.repeat, seed=args.seed, progress=progress, model_file=model_file)
    finally:
        if bar is not None:
            bar.close()
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 0


def _history(args) -> int:
    from . import history

    if args.threshold <= 0:
        raise AnalysisError(f"expected --threshold > 0, got {args.threshold}")
    data = history.collect(args.root, args.machine, threshold=args.threshold)
    if not data.machines:
        where = f"{args.root}/{args.machine or '<machine-id>'}/NNNN_<name>.json"
        skipped = "; skipped " + "; ".join(data.skipped) if data.skipped else ""
        raise AnalysisError(f"no readable saved runs; expected files like {where}{skipped}")
    print(history.format_text(data))
    if args.html:
        history.write_site(data, args.html)
        print(f"\nhistory page: {args.html / 'index.html'}")
    if args.out:
        print("charts: " + ", ".join(str(p) for p in history.render_charts(data, args.out, fmt=args.format)))
    return 0


def _report(args) -> int:
    from . import report

    return report.main(args)


def main(argv: list[str] | None = None) -> int:
    from engines.registry import discover
    try:
        discover()      # installed packages' engines (entry point group mlexec.engines) join --engines
    except ValueError as exc:
        print(f"mlexec: error: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        return {"analyze": _analyze, "history": _history, "report": _report}[args.command](args)
    except (AnalysisError, BaselineError, ReportError) as exc:
        print(f"mlexec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mlexec: error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

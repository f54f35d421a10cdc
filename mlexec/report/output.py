"""A report as text: the terminal table, Markdown, JSON, and two PNG charts per model (speedup
bars and roofline at each point; a heat map of every point per engine)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .. import targets
from ..units import fmt_time
from .inputs import ReportError

_HEADER = ["case", "engine", "median", "IQR %", "× naive", "× onnxruntime", "of roofline", "max abs error"]


def _ratio(v, iqr) -> str:
    return "-" if v is None else f"{v:.2f}x ({iqr[0]:.2f}-{iqr[1]:.2f})"


def error_cell(row: dict) -> str:
    """The max abs error against the float64 reference; a quantized engine's labelled, with its own bar."""
    err = row.get("max_abs_error")
    if err is None:
        return "-"
    if row.get("quantized"):
        return f"{err:.3f} quantized (bar {row['tolerance']:g})"
    return f"{err:.1e}"


def _cells(row: dict) -> list[str]:
    head = [row["case"], row["engine"]]
    if row.get("error"):
        return head + [row["error"], "", "", "", "", ""]
    return head + [fmt_time(row["median_s"]), f"{row['iqr_pct']:.0f}", _ratio(row["vs_naive"], row["vs_naive_iqr"]),
                   _ratio(row["vs_onnxruntime"], row["vs_onnxruntime_iqr"]), f"{100 * row['roofline_fraction']:.0f}%",
                   error_cell(row)]


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
            "of roofline: max(flops / matmul roof, weight bytes / copy roof) over the median; "
            "max abs error: against the float64 reference on the timed input (quantized: 8-bit, held to its own bar)"]


def _rechecked(report: dict) -> str:
    again = report.get("rechecked") or []
    if not again:
        return ""
    where = ", ".join(again)
    return f", {report['rounds'] + report['recheck_rounds']} at the close call(s) {where}"


def _target_lines(report: dict) -> list[str]:
    return targets.format_lines([targets.Target(**t) for t in report["targets"]])


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


def _bars(fig, rows: list[dict], shapes: list[str], names: list[str]):
    """Speedup bars and roofline diamonds per engine, side by side at each shape; the two axes."""
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
    return ax, roof_ax


def _figure(report: dict, model: str):
    from matplotlib.figure import Figure   # no pyplot: no global state
    from matplotlib.lines import Line2D

    rows = [r for r in report["rows"] if r["model"] == model and not r.get("error")]
    shapes = list(dict.fromkeys(r["case"] for r in rows))
    names = [n for n in report["engines"] if any(r["engine"] == n for r in rows)]
    fig = Figure(figsize=(max(6.0, 1.1 * len(shapes) * max(1, len(names)) ** 0.5 + 2), 4.5))
    ax, roof_ax = _bars(fig, rows, shapes, names)
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


HEAT_REFS = (("vs_naive", "naive"), ("vs_onnxruntime", "onnxruntime"))
HEAT_RANGE = 4.0             # the colour scale's ends: 1/4x and 4x, on a log scale centred at 1.0x


def _heat_axes(rows: list[dict]) -> tuple[list[int], list[str]]:
    """A grid's batches (columns) and its rows: dims, or dim x seq for a sequence model."""
    batches = sorted({r["batch"] for r in rows})
    lines = list(dict.fromkeys(f"d{r['dim']}" + (f" s{r['seq']}" if r.get("seq") else "")
                               for r in sorted(rows, key=lambda r: (r["dim"] or 0, r.get("seq") or 0))))
    return batches, lines


def _heatmap(report: dict, model: str):
    """Every point of a model's grid: one panel per engine and reference (speedup over naive, over
    ONNX Runtime), batch across and dim (x seq) down, each cell coloured on a log scale around
    1.0x and labelled with its median ratio; a blank cell was not measured. None when no engine
    was measured against naive or ONNX Runtime (a run without either)."""
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    rows = [r for r in report["rows"] if r["model"] == model and not r.get("error")]
    refs = [(key, label) for key, label in HEAT_REFS if any(r.get(key) is not None for r in rows)]
    names = [n for n in report["engines"] if any(r["engine"] == n and any(r.get(k) is not None for k, _ in refs)
                                                 for r in rows)]
    if not names:
        return None
    batches, lines = _heat_axes(rows)
    fig = Figure(figsize=(2.2 + 0.55 * len(batches) * len(refs), 1.0 + (0.45 * len(lines) + 0.6) * len(names)))
    axes = fig.subplots(len(names), len(refs), squeeze=False)
    norm = LogNorm(1 / HEAT_RANGE, HEAT_RANGE)
    image = None
    for i, name in enumerate(names):
        for j, (key, label) in enumerate(refs):
            grid = np.full((len(lines), len(batches)), np.nan)
            for r in rows:
                if r["engine"] == name and r.get(key) is not None:
                    line = f"d{r['dim']}" + (f" s{r['seq']}" if r.get("seq") else "")
                    grid[lines.index(line), batches.index(r["batch"])] = r[key]
            ax = axes[i][j]
            if name == label:                   # an engine against itself: no panel
                ax.axis("off")
                continue
            image = ax.imshow(np.clip(grid, 1 / HEAT_RANGE, HEAT_RANGE), cmap="RdYlGn", norm=norm, aspect="auto")
            for (y, x), v in np.ndenumerate(grid):
                if np.isfinite(v):
                    ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=6.5)
            ax.set_xticks(range(len(batches)), [f"b{b}" for b in batches], fontsize="x-small")
            ax.set_yticks(range(len(lines)), lines, fontsize="x-small")
            ax.set_title(f"{name} vs {label}", fontsize="small")
    fig.suptitle(f"{model}: speedup at every point (median ratio; > 1: the engine is faster)", fontsize="medium")
    fig.tight_layout(rect=(0, 0, 0.92, 0.97))
    if image is not None:
        ticks = [1 / HEAT_RANGE, 0.5, 1.0, 2.0, HEAT_RANGE]
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, ticks=ticks)
        bar.ax.set_yticklabels([f"{t:g}x" for t in ticks])
        bar.ax.minorticks_off()
    return fig


def save(report: dict, out_dir) -> tuple[list[Path], str | None]:
    """Write report.md, report.json and per model <model>.png (bars) and <model>-grid.png (a heat
    map of every point, ``_heatmap``); returns (paths, why no chart)."""
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
                for path, figure in ((out_dir / f"{model}.png", _figure), (out_dir / f"{model}-grid.png", _heatmap)):
                    fig = figure(report, model)
                    if fig is not None:
                        fig.savefig(path, format="png", dpi=100)
                        paths.append(path)
    except OSError as exc:
        raise ReportError(f"cannot write the report into {str(out_dir)!r}: {exc.strerror or exc}") from None
    return paths, None


def finite(obj):
    """NaN/inf would make invalid JSON; none is expected, but never write one."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj

"""Each benchmark's trend over commits, from the saved runs, with step changes pointed out.

``collect(root)`` turns every saved run (``mlexec.baselines.iter_runs``) into
one series per (machine, benchmark): median latency and, when the benchmark
recorded it, ``extra_info["peak_bytes"]``, one point per saved run.
``find_steps`` marks a step change at a point when the median of that point
and the following ones (up to ``window``) differs from the median of the
preceding ones by more than ``threshold`` (relative), and the change
persists: at least two points after it agree, or it is the newest point
("new", not yet confirmed). Only points with the same
``extra_info["version"]`` (workload version) are compared: a version change
starts a new segment. ``format_table`` prints benchmarks x commits;
``render_charts`` draws one chart per (machine, group) with matplotlib.
"""
from __future__ import annotations

import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .baselines import iter_runs
from .units import fmt_bytes, fmt_time

DEFAULT_THRESHOLD = 0.2
DEFAULT_WINDOW = 3


@dataclass
class Point:
    commit: str          # short commit id
    file: str            # saved run's file name
    median: float        # seconds
    peak_bytes: int | None
    version: object      # extra_info["version"], None when absent
    step: dict = field(default_factory=dict)   # metric -> "up" | "down" | "new-up" | "new-down"


@dataclass
class Series:
    machine: str
    name: str
    group: str
    points: list[Point] = field(default_factory=list)


def collect(root, machine_id: str | None = None, skipped: list | None = None) -> tuple[list[str], list[Series]]:
    """(commit columns in saved order, one Series per machine and benchmark). With ``skipped``
    a list, unreadable runs are left out and their errors (naming the file) appended there."""
    commits: list[str] = []
    series: dict[tuple[str, str], Series] = {}
    for path, run in iter_runs(root, machine_id, errors=skipped):
        commit = str(run["commit_info"].get("id") or "?")[:8]
        if run["commit_info"].get("dirty"):
            commit += "+"
        if commit not in commits:
            commits.append(commit)
        machine = path.parent.name
        for bench in run["benchmarks"]:
            extra = bench.get("extra_info") or {}
            name = bench.get("fullname") or bench["name"]
            s = series.setdefault((machine, name), Series(machine, name, bench.get("group") or "default"))
            peak = extra.get("peak_bytes")
            s.points.append(Point(commit, path.name, float(bench["stats"]["median"]),
                                  int(peak) if isinstance(peak, (int, float)) and not isinstance(peak, bool) else None,
                                  extra.get("version")))
    result = sorted(series.values(), key=lambda s: (s.machine, s.group, s.name))
    for s in result:
        find_steps(s.points)
    return commits, result


def _steps(values: list[float | None], versions: list, threshold: float, window: int) -> dict[int, str]:
    found: dict[int, str] = {}
    start = 0   # first index of the current segment (same version, no step inside)
    for i in range(1, len(values)):
        if versions[i] != versions[i - 1] or values[i] is None or values[i - 1] is None:
            start = i
            continue
        before = [v for v in values[max(start, i - window):i] if v is not None]
        after = []
        for j in range(i, min(len(values), i + window)):
            if versions[j] != versions[i] or values[j] is None:
                break
            after.append(values[j])
        if not before or not after:
            continue
        base = statistics.median(before)
        if base <= 0:
            continue
        change = statistics.median(after) / base - 1
        here = values[i] / base - 1
        if abs(change) > threshold and abs(here) > threshold and (change > 0) == (here > 0):
            direction = "up" if change > 0 else "down"
            found[i] = direction if len(after) >= 2 else f"new-{direction}"
            start = i
    return found


def find_steps(points: list[Point], threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW) -> None:
    """Mark step changes on ``points`` (in place), per metric: median and peak_bytes."""
    versions = [p.version for p in points]
    for p in points:
        p.step = {}
    for metric in ("median", "peak_bytes"):
        values = [getattr(p, metric) for p in points]
        for i, direction in _steps(values, versions, threshold, window).items():
            points[i].step[metric] = direction




_MARK = {"up": "^", "down": "v", "new-up": "^?", "new-down": "v?"}


def format_table(commits: list[str], series: list[Series]) -> str:
    """Benchmarks x commits: median latency [/ peak bytes], with step marks and version changes."""
    header = ["benchmark", *commits]
    rows = [header]
    for s in series:
        by_commit = {}
        previous = None
        for p in s.points:
            cell = fmt_time(p.median) + _MARK.get(p.step.get("median"), "")
            if p.peak_bytes is not None:
                cell += " / " + fmt_bytes(p.peak_bytes) + _MARK.get(p.step.get("peak_bytes"), "")
            if previous is not None and p.version != previous:
                cell += f" [v{p.version}]"
            previous = p.version
            by_commit[p.commit] = cell
        rows.append([f"{s.machine}/{s.name}", *(by_commit.get(c, "-") for c in commits)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    steps = [(s, p, metric, d) for s in series for p in s.points for metric, d in p.step.items()]
    lines.append("")
    lines.append("cells: median latency / peak bytes; ^ v step up/down that persists, "
                 "^? v? on the newest point (unconfirmed); [vN] workload version changed (not compared)")
    if steps:
        lines.append("step changes:")
        for s, p, metric, d in steps:
            lines.append(f"  {s.machine}/{s.name}: {metric} {d} at {p.commit} ({p.file})")
    else:
        lines.append("step changes: none")
    return "\n".join(lines)


def _figure(group_series: list[Series], title: str):
    from matplotlib.figure import Figure   # no pyplot: no global state, safe in a server thread

    has_peak = any(p.peak_bytes is not None for s in group_series for p in s.points)
    fig = Figure(figsize=(8, 5.5 if has_peak else 3.5))
    axes = fig.subplots(2 if has_peak else 1, 1, sharex=True, squeeze=False)[:, 0]
    for s in group_series:
        xs = list(range(len(s.points)))
        label = s.name.rsplit("::", 1)[-1]
        line, = axes[0].plot(xs, [p.median * 1e3 for p in s.points], marker="o", label=label)
        steps = [i for i, p in enumerate(s.points) if "median" in p.step]
        axes[0].plot(steps, [s.points[i].median * 1e3 for i in steps], "o", ms=12, mfc="none",
                     mec="red", mew=2)
        if has_peak:
            peaks = [(i, p.peak_bytes) for i, p in enumerate(s.points) if p.peak_bytes is not None]
            axes[1].plot([i for i, _ in peaks], [b / 1024 for _, b in peaks], marker="o", color=line.get_color())
        ticks = [p.commit for p in s.points]
    axes[0].set_ylabel("median latency (ms)")
    axes[0].set_title(title)
    axes[0].legend(fontsize="small")
    if has_peak:
        axes[1].set_ylabel("peak KiB")
    axes[-1].set_xticks(range(len(ticks)), ticks, rotation=30, fontsize="small")
    axes[-1].set_xlabel("commit (red ring: step change)")
    fig.tight_layout()
    return fig


def groups(series: list[Series]) -> dict[tuple[str, str], list[Series]]:
    out: dict[tuple[str, str], list[Series]] = {}
    for s in series:
        out.setdefault((s.machine, s.group), []).append(s)
    return out


def render_charts(series: list[Series], out_dir, fmt: str = "png") -> list[Path]:
    """One chart file per (machine, group) in ``out_dir``; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (machine, group), members in groups(series).items():
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{machine}_{group}")
        path = out_dir / f"{safe}.{fmt}"
        _figure(members, f"{machine}: {group}").savefig(path, format=fmt)
        paths.append(path)
    return paths


def chart_svgs(series: list[Series]) -> list[tuple[str, str]]:
    """(title, inline SVG text) per (machine, group), for the web page."""
    out = []
    for (machine, group), members in groups(series).items():
        buffer = io.StringIO()
        _figure(members, f"{machine}: {group}").savefig(buffer, format="svg")
        svg = buffer.getvalue()
        out.append((f"{machine}: {group}", svg[svg.find("<svg"):]))
    return out

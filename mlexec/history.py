"""Each benchmark's trend over commits, from the saved runs, with step changes pointed out.

``collect(root)`` reads every saved run under ``root/<machine-id>/`` into one
``Series`` per (machine, benchmark): median latency and, when recorded,
``extra_info["peak_bytes"]``, one point per saved run, placed on the
machine's commit axis (every series of a machine shares it). A file that
cannot be read is skipped and named in ``History.skipped``; the rest is shown.

``find_steps`` marks a step at a point when the median of that point and the
following ones (up to ``window``) differs from the median of the preceding
ones by more than ``threshold``, and the point itself agrees. A step is
confirmed when at least two points after it agree; on the newest point it is
not confirmed yet. Only points of the same ``extra_info["version"]``
(workload version) are compared.

Faces: ``format_text`` (the terminal, at most 120 columns), ``page_context``
(the web page and ``write_site``, a static copy of it), ``render_charts``
(one matplotlib chart per machine and model).
"""
from __future__ import annotations

import re
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .baselines import BaselineError, load_run
from .case import ID_PATTERN, Case
from .suite.gate import MEMORY_GROWTH_BYTES
from .units import fmt_bytes, fmt_time

DEFAULT_THRESHOLD = 0.2
DEFAULT_WINDOW = 3
METRICS = {"median": "latency", "peak_bytes": "peak memory"}
# A memory step must also be as large as the growth the gate fails on: 72 B -> 96 B is not a step.
MEMORY_FLOOR_BYTES = MEMORY_GROWTH_BYTES
WEB_DIR = Path(__file__).parent / "web"


@dataclass
class Point:
    commit: str          # short commit id
    file: str            # saved run's file name
    median: float        # seconds
    peak_bytes: int | None
    version: object      # extra_info["version"], None when absent
    step: dict = field(default_factory=dict)   # metric -> "up" | "down" | "new-up" | "new-down"
    x: int = 0           # position on the machine's commit axis


@dataclass(frozen=True)
class Step:
    metric: str          # "median" | "peak_bytes"
    index: int           # the first changed point
    direction: str       # "up" | "down"
    before: float        # median of the points before
    after: float         # median of the changed point and those after it
    confirmed: bool      # False: the newest point, not yet seen again


@dataclass
class Series:
    machine: str
    name: str            # pytest-benchmark's fullname
    group: str
    engine: str = ""
    model: str = ""
    batch: int | None = None
    dim: int | None = None
    seq: int | None = None
    points: list[Point] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def short(self) -> str:
        """``arena · mlp · b1 · d1024``: the engine and the case's id parts (``mlexec.case.Case``);
        the test's parameter id when the run does not say."""
        if not (self.engine and self.model and self.batch):
            return self.name.rsplit("::", 1)[-1]
        return " · ".join([self.engine, *Case(self.model, self.batch, self.dim, self.seq).parts])


@dataclass
class Machine:
    name: str
    commits: list[str] = field(default_factory=list)    # the x axis, in saved order
    files: list[str] = field(default_factory=list)
    dates: list[str] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)


@dataclass
class History:
    root: str
    machines: list[Machine]
    skipped: list[str]   # one line per unreadable file, naming it
    threshold: float = DEFAULT_THRESHOLD

    def machine(self, name: str | None) -> Machine | None:
        """The named machine, or the one with the newest saved run."""
        if name is not None:
            return next((m for m in self.machines if m.name == name), None)
        return max(self.machines, key=lambda m: max(m.dates, default=""), default=None)


def _labels(bench: dict) -> dict:
    """engine, model, batch, dim, seq from extra_info, else from the test id ``engine-model-bB-dD[-sS]``."""
    extra = bench.get("extra_info") or {}
    if extra.get("engine") and extra.get("model") and extra.get("batch"):
        return {k: extra.get(k) for k in ("engine", "model", "batch", "dim", "seq")}
    param = bench.get("param") or bench["name"].partition("[")[2].rstrip("]")
    match = ID_PATTERN.match(str(param))
    if match:
        from engines import ENGINES
        head = match["head"]
        engine = max((e for e in ENGINES if head.startswith(e + "-")), key=len, default="")
        if engine:
            return {"engine": engine, "model": head[len(engine) + 1:], "batch": int(match["batch"]),
                    "dim": int(match["dim"]), "seq": int(match["seq"]) if match["seq"] else None}
    return {}


def _sort_key(s: Series):
    from engines import ENGINES, MODELS
    model = list(MODELS).index(s.model) if s.model in MODELS else len(MODELS)
    engine = list(ENGINES).index(s.engine) if s.engine in ENGINES else len(ENGINES)
    return (model, s.model or s.group, engine, s.engine, s.batch or 0, s.dim or 0, s.seq or 0, s.name)


def collect(root, machine_id: str | None = None, threshold: float = DEFAULT_THRESHOLD,
            window: int = DEFAULT_WINDOW) -> History:
    """Every saved run under ``root/<machine-id>/*.json`` (only ``machine_id``'s when given)."""
    root = Path(root)
    dirs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    machines, skipped = [], []
    for directory in dirs:
        if machine_id is not None and directory.name != machine_id:
            continue
        machine = Machine(directory.name)
        series: dict[str, Series] = {}
        for path in sorted(directory.glob("*.json")):
            try:
                run = load_run(path)
            except BaselineError as exc:
                skipped.append(str(exc))
                continue
            commit = str(run["commit_info"].get("id") or "?")[:8] + ("+" if run["commit_info"].get("dirty") else "")
            machine.commits.append(commit)
            machine.files.append(path.name)
            machine.dates.append(run["datetime"])
            for bench in run["benchmarks"]:
                extra = bench.get("extra_info") or {}
                name = bench.get("fullname") or bench["name"]
                if name not in series:
                    series[name] = Series(machine.name, name, bench.get("group") or "default", **_labels(bench))
                peak = extra.get("peak_bytes")
                peak = int(peak) if isinstance(peak, (int, float)) and not isinstance(peak, bool) else None
                series[name].points.append(Point(commit, path.name, float(bench["stats"]["median"]), peak,
                                                 extra.get("version"), x=len(machine.commits) - 1))
        if machine.commits:
            machine.series = sorted(series.values(), key=_sort_key)
            for s in machine.series:
                s.steps = find_steps(s.points, threshold, window)
            machines.append(machine)
    return History(str(root), machines, skipped, threshold)


def _steps(values: list[float | None], versions: list, threshold: float, window: int,
           floor: float = 0.0) -> list[tuple]:
    """(index, direction, before, after, confirmed) for each step in ``values`` larger than ``floor``."""
    found = []
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
        later = statistics.median(after)
        change, here = later / base - 1, values[i] / base - 1
        if (abs(change) > threshold and abs(here) > threshold and (change > 0) == (here > 0)
                and abs(later - base) >= floor):
            found.append((i, "up" if change > 0 else "down", base, later, len(after) >= 2))
            start = i
    return found


def find_steps(points: list[Point], threshold: float = DEFAULT_THRESHOLD,
               window: int = DEFAULT_WINDOW) -> list[Step]:
    """The step changes in ``points``, per metric (median, peak_bytes); also marked on each point's ``step``."""
    versions = [p.version for p in points]
    for p in points:
        p.step = {}
    steps = []
    for metric in METRICS:
        values = [getattr(p, metric) for p in points]
        floor = MEMORY_FLOOR_BYTES if metric == "peak_bytes" else 0.0
        for i, direction, before, after, confirmed in _steps(values, versions, threshold, window, floor):
            points[i].step[metric] = direction if confirmed else f"new-{direction}"
            steps.append(Step(metric, i, direction, before, after, confirmed))
    return sorted(steps, key=lambda s: (s.index, s.metric))


def fmt_metric(metric: str, value) -> str:
    return fmt_time(value) if metric == "median" else fmt_bytes(value)


def step_rows(machine: Machine) -> list[dict]:
    """One row per step change: benchmark, metric, last good commit, first changed commit, before, after."""
    rows = []
    for s in machine.series:
        for st in s.steps:
            rows.append({"benchmark": s.short, "engine": s.engine, "model": s.model, "batch": s.batch or "",
                         "metric": METRICS[st.metric],
                         "good": s.points[st.index - 1].commit, "changed": s.points[st.index].commit,
                         "file": s.points[st.index].file, "direction": st.direction,
                         "before": fmt_metric(st.metric, st.before), "after": fmt_metric(st.metric, st.after),
                         "change": f"{st.after / st.before - 1:+.0%}", "confirmed": st.confirmed})
    return rows


# --- the terminal --------------------------------------------------------------------------------------

_ARROW = {"up": "↑", "down": "↓"}


def _table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(row):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return [line(rows[0]).rstrip(), "  ".join("-" * w for w in widths), *(line(r).rstrip() for r in rows[1:])]


def _span(first, last, fmt) -> str:
    if first is None:
        return "-"
    return fmt(first) if last == first else f"{fmt(first)} → {fmt(last)}"


def _marks(s: Series) -> str:
    """``lat ↑ ↓?, mem ↑, new version``: a series' steps per metric, and whether its workload changed."""
    marks = []
    for metric, label in (("median", "lat"), ("peak_bytes", "mem")):
        arrows = [_ARROW[st.direction] + ("" if st.confirmed else "?") for st in s.steps if st.metric == metric]
        if arrows:
            marks.append(f"{label} {' '.join(arrows)}")
    if len({p.version for p in s.points}) > 1:
        marks.append("new version")
    return ", ".join(marks)


def _series_row(s: Series) -> list[str]:
    """One benchmark's row: first → last within the newest workload version (another version's
    figures are not comparable)."""
    last = s.points[-1]
    first = next(p for p in s.points if p.version == last.version)
    peaks = [p.peak_bytes for p in s.points if p.peak_bytes is not None and p.version == last.version]
    return [s.short, str(len(s.points)), _span(first.median, last.median, fmt_time),
            f"{last.median / first.median - 1:+.0%}" if first is not last and first.median else "-",
            _span(peaks[0] if peaks else None, peaks[-1] if peaks else None, fmt_bytes), _marks(s)]


def _step_lines(machine: Machine) -> list[str]:
    steps = step_rows(machine)
    if not steps:
        return ["step changes: none"]
    return ["step changes:"] + _table(
        [["benchmark", "metric", "last good", "changed", "before → after", "change", "confirmed"]]
        + [[r["benchmark"], r["metric"].replace("peak memory", "memory"), r["good"], r["changed"],
            f"{r['before']} → {r['after']}", r["change"], "yes" if r["confirmed"] else "not yet"] for r in steps],
        right={5})


def format_text(history: History) -> str:
    """Per machine: one row per benchmark (first → last latency and peak memory, steps), then the steps."""
    out = [f"skipped {line}" for line in history.skipped]
    for machine in history.machines:
        out += ["", f"machine {machine.name}",
                f"{len(machine.commits)} saved run(s), {machine.commits[0]} ({machine.dates[0][:10]}) to "
                f"{machine.commits[-1]} ({machine.dates[-1][:10]})", ""]
        header = ["benchmark", "runs", "latency, first → last", "change", "peak, first → last", "steps"]
        out += _table([header] + [_series_row(s) for s in machine.series], right={1, 3})
        out += [""] + _step_lines(machine)
    out += ["", "step: a change of more than the threshold (for memory, also 1 KiB or more) that the next runs",
            "confirm; ? or 'not yet': on the newest run, not confirmed yet; other workload versions are not compared"]
    return "\n".join(out).lstrip("\n")


# --- the web page and its static copy --------------------------------------------------------------------

_W, _H, _LEFT, _RIGHT, _TOP, _PANEL, _GAP = 320, 150, 64, 8, 8, 52, 22


def _panel(series: Series, metric: str, n: int, top: float) -> list[str]:
    """One panel of a chart: a polyline per workload version over the shared commit axis, a dot per run."""
    css = "lat" if metric == "median" else "mem"
    parts = [f'<text x="2" y="{top + 10}" class="axis-label">{"latency" if css == "lat" else "memory"}</text>',
             f'<line x1="{_LEFT}" y1="{top + _PANEL}" x2="{_W - _RIGHT}" y2="{top + _PANEL}" class="axis"/>']
    points = [p for p in series.points if getattr(p, metric) is not None]
    if not points:
        return parts + [f'<text x="{_LEFT + 4}" y="{top + _PANEL / 2}" class="none">not recorded</text>']
    high = max(getattr(p, metric) for p in points)
    scale = 1.1 * high or 1.0
    parts += [f'<text x="2" y="{top + 24}" class="tick">{fmt_metric(metric, high)}</text>',
              f'<text x="2" y="{top + _PANEL}" class="tick">0</text>']

    def xy(p: Point) -> tuple[float, float]:
        x = _LEFT + ((_W - _LEFT - _RIGHT) * p.x / (n - 1) if n > 1 else (_W - _LEFT - _RIGHT) / 2)
        return x, top + _PANEL - _PANEL * getattr(p, metric) / scale

    segment: list[Point] = []
    for p in points + [None]:     # a new workload version starts a new line
        if p is None or (segment and p.version != segment[-1].version):
            if len(segment) > 1:
                coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in map(xy, segment))
                parts.append(f'<polyline points="{coords}" class="{css}"/>')
            segment = []
        if p is not None:
            segment.append(p)
    for p in points:
        x, y = xy(p)
        step = metric in p.step
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{4 if step else 2.2}" '
                     f'class="{"step" if step else css + "-dot"}"><title>{p.commit} ({p.file}): '
                     f'{fmt_metric(metric, getattr(p, metric))}</title></circle>')
    return parts


def chart_svg(series: Series, commits: list[str]) -> str:
    """A small inline SVG: latency over the machine's commits above, peak memory below; steps ringed."""
    parts = [f'<svg viewBox="0 0 {_W} {_H}" class="spark" role="img" aria-label="{series.short}">']
    parts += _panel(series, "median", len(commits), _TOP)
    parts += _panel(series, "peak_bytes", len(commits), _TOP + _PANEL + _GAP)
    parts.append(f'<text x="{_LEFT}" y="{_H - 2}" class="tick">{commits[0]}</text>')
    if len(commits) > 1:
        parts.append(f'<text x="{_W - _RIGHT}" y="{_H - 2}" class="tick end">{commits[-1]}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def page_context(history: History, machine_name: str | None = None) -> dict:
    """What ``templates/history.html`` shows for one machine: groups of charts, the step table, the filter."""
    machine = history.machine(machine_name)
    context = {"root": history.root, "skipped": history.skipped, "machines": [m.name for m in history.machines],
               "machine": machine, "unknown_machine": machine_name if machine_name and machine is None else None,
               "groups": [], "steps": [], "filters": {}, "threshold": history.threshold}
    if machine is None:
        return context
    groups: dict[str, dict[str, list]] = {}
    for s in machine.series:
        groups.setdefault(s.model or s.group, {}).setdefault(s.engine or "-", []).append(
            {"series": s, "short": s.short, "svg": chart_svg(s, machine.commits)})
    context["groups"] = [(model, list(engines.items())) for model, engines in groups.items()]
    context["steps"] = step_rows(machine)
    context["filters"] = {
        "engine": list(dict.fromkeys(s.engine for s in machine.series if s.engine)),
        "model": list(dict.fromkeys(s.model for s in machine.series if s.model)),
        "batch": sorted({s.batch for s in machine.series if s.batch}),
    }
    context["runs"] = list(zip(machine.files, machine.commits, (d[:16].replace("T", " ") for d in machine.dates)))
    return context


def site_file(machine: str) -> str:
    """The static site's page for one machine."""
    return "machine-" + re.sub(r"[^A-Za-z0-9._-]+", "_", machine) + ".html"


def write_site(history: History, out_dir) -> list[Path]:
    """The history page as static files (index.html for the newest machine, one page per machine, CSS, JS)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(WEB_DIR / "templates"), autoescape=True)
    template = env.get_template("history.html")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("history.css", "history.js"):
        shutil.copyfile(WEB_DIR / "static" / name, out_dir / name)
        written.append(out_dir / name)
    pages = [(m.name, site_file(m.name)) for m in history.machines]
    default = history.machine(None)
    if default is not None:
        pages.insert(0, (default.name, "index.html"))
    for machine, filename in pages or [(None, "index.html")]:
        html = template.render(asset=lambda name: name, machine_href=site_file, static=True,
                               **page_context(history, machine))
        path = out_dir / filename
        tmp = path.with_suffix(".html.part")
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written


# --- matplotlib charts -----------------------------------------------------------------------------------

def _chart(fig, machine: Machine, model: str, members: list[Series]):
    """``fig`` as one machine's chart of one model: latency above, peak memory below, a colour per engine."""
    top, bottom = fig.subplots(2, 1, sharex=True)
    engines = list(dict.fromkeys(s.engine or s.short for s in members))
    colors = {e: f"C{i % 10}" for i, e in enumerate(engines)}   # one colour per engine, a line per shape
    for s in members:
        color = colors[s.engine or s.short]
        label = s.engine or s.short
        top.plot([p.x for p in s.points], [p.median * 1e6 for p in s.points], marker="o", ms=3,
                 color=color, label=label if label not in top.get_legend_handles_labels()[1] else None)
        steps = [p for p in s.points if "median" in p.step]
        top.plot([p.x for p in steps], [p.median * 1e6 for p in steps], "o", ms=10, mfc="none",
                 mec="red", mew=1.5)
        peaks = [p for p in s.points if p.peak_bytes]
        bottom.plot([p.x for p in peaks], [p.peak_bytes for p in peaks], marker="o", ms=3, color=color)
    top.set_yscale("log")
    top.set_ylabel("median latency (µs)")
    top.set_title(f"{model} on {machine.name}: a line per shape, a colour per engine", fontsize="medium")
    bottom.set_yscale("log")
    bottom.set_ylabel("peak memory (bytes)")
    bottom.set_xticks(range(len(machine.commits)), machine.commits, rotation=30, fontsize="small")
    bottom.set_xlabel("commit (red ring: step change)")
    fig.legend(loc="outside right upper", fontsize="small")
    return fig


def render_charts(history: History, out_dir, fmt: str = "png") -> list[Path]:
    """One chart file per machine and model (latency above, peak memory below, x by commit); returns the paths."""
    from matplotlib.figure import Figure   # no pyplot: no global state, safe in a server thread

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for machine in history.machines:
        by_model: dict[str, list[Series]] = {}
        for s in machine.series:
            by_model.setdefault(s.model or s.group, []).append(s)
        for model, members in by_model.items():
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{machine.name}_{model}")
            path = out_dir / f"{safe}.{fmt}"
            fig = _chart(Figure(figsize=(10, 6), layout="constrained"), machine, model, members)
            fig.savefig(path, format=fmt)
            paths.append(path)
    return paths

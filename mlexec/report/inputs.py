"""What ``mlexec report`` measures: its grids, read from the table of benchmark models
(``mlexec.case.FAMILIES``), the ``--models``, ``--shapes`` and ``--model FILE`` it is given, and
every check on them, made before anything is measured."""
from __future__ import annotations

from typing import Iterable

from engines import BatchRefused, OnnxImportError, load_onnx

from ..case import FAMILIES, Case, Family, shape_parts

LIMITS = {"max_rounds": 200, "max_block_seconds": 10.0, "max_settle_seconds": 10.0, "max_threads": 256,
          "max_batch": 1024, "max_dim": 8192, "max_seq": 1024}


class ReportError(ValueError):
    """Bad input to the report; the message says what was expected and what came."""


def report_families() -> dict[str, Family]:
    """The benchmark models the report measures (``Family.report``), in the table's order."""
    return {name: f for name, f in FAMILIES.items() if f.report}


DEFAULT_MODELS = tuple(report_families())     # as the table stood at import


def grid_of(models: Iterable[str], quick: bool = False) -> dict[str, list[Case]]:
    """Each model's report cases (``Family.report_cases``): its report batches of the one grid,
    or its ``--quick`` points."""
    families = report_families()
    bad = [m for m in models if m not in families]
    if bad:
        raise ReportError(f"unknown model {', '.join(map(repr, bad))}; choose from {', '.join(families)}")
    return {m: families[m].report_cases(quick) for m in models}


def parse_names(text: str, known: Iterable[str], what: str) -> list[str]:
    known = list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ReportError(f"expected at least one {what} from {', '.join(known)}, got {text!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ReportError(f"unknown {what} {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def shape_forms() -> str:
    """``BATCHxDIM (mlp) and BATCHxDIMxSEQ (transformer)``: the forms ``--shapes`` takes, by model."""
    by_form: dict[str, list[str]] = {}
    for f in report_families().values():
        by_form.setdefault(f.form, []).append(f.name)
    return " and ".join(f"{form} ({', '.join(names)})" for form, names in by_form.items())


def _examples(families: dict[str, Family]) -> str:
    """``1x256 (mlp) or 1x256x64 (transformer)``: a shape of each form the report takes."""
    first = {}
    for f in families.values():
        first.setdefault(f.arity, f)
    return " or ".join(f"{f.report_quick[0]} ({f.name})" for f in first.values())


def _shape_cases(entry: str, families: dict[str, Family], models: list[str] | None) -> list[Case]:
    """One ``--shapes`` entry as a case of each chosen model whose shapes have as many numbers
    (with no --models, of the first report model that takes it)."""
    try:
        parts = shape_parts(entry)
    except ValueError:
        parts = ()
    fits = [f for f in families.values() if f.arity == len(parts)]
    if not fits:
        raise ReportError(f"expected shapes like {_examples(families)}, got {entry!r}")
    if models is None:
        return [fits[0].case(parts)]
    chosen = [f for f in fits if f.name in models]
    if not chosen:
        raise ReportError(f"shape {entry!r} is a {fits[0].name} shape, but --models is {','.join(models)}")
    return [f.case(parts) for f in chosen]


def parse_shapes(text: str, models: list[str] | None) -> dict[str, list[Case]]:
    """``"1x64,8x64,1x32x8"``: each shape goes to the models whose shapes have as many numbers
    (``Family.form``: BATCHxDIM to mlp, BATCHxDIMxSEQ to the transformer); ``models`` None: the
    models the shapes belong to. A repeated shape is measured once."""
    families = report_families()
    grid: dict[str, list[Case]] = {m: [] for m in models or ()}
    for entry in (e.strip() for e in text.split(",")):
        for case in _shape_cases(entry, families, models) if entry else ():
            shapes = grid.setdefault(case.model, [])
            if case not in shapes:
                shapes.append(case)
    if not grid:
        raise ReportError(f"expected at least one shape in --shapes, e.g. {_examples(families)}")
    for model, shapes in grid.items():
        if not shapes:
            raise ReportError(f"no --shapes for {model}; expected at least one {families[model].form}")
    return grid


def file_grid(path, batches: str) -> dict[str, list[Case]]:
    """``--model FILE --batches 1,8``: the file's model at each batch (dim: its input's last axis)."""
    try:
        model = load_onnx(path)
        sizes = [int(b) for b in batches.split(",") if b.strip()]
    except (OnnxImportError, ValueError) as exc:
        raise ReportError(f"--model {path}: {exc}" if isinstance(exc, OnnxImportError)
                          else f"expected --batches like 1,8, got {batches!r}") from None
    for size in sizes:
        try:
            model.rows(size)
        except BatchRefused as exc:      # a file that fixes its batch: that batch only
            raise ReportError(f"--model {path}: {exc}; use --batches {model.fixed_batch.size}") from None
    return {model.name: [Case.of(model, b, str(path)) for b in dict.fromkeys(sizes)]}


def files_grid(paths, batches: str) -> dict[str, list[Case]]:
    """Every ``--model`` file's grid; two files of one name would give it two meanings: refused."""
    grid: dict[str, list[Case]] = {}
    for path in paths:
        for name, cases in file_grid(path, batches).items():
            if name in grid:
                raise ReportError(f"--model {path}: another --model file is also named {name!r}; rename one")
            grid[name] = cases
    return grid


def check_range(name: str, value, low, high) -> None:
    if not low <= value <= high:
        raise ReportError(f"expected {name} in {low}..{high}, got {value}")


def _check_limits(case: Case) -> None:
    for key, limit in (("batch", LIMITS["max_batch"]), ("dim", LIMITS["max_dim"]), ("seq", LIMITS["max_seq"])):
        value = getattr(case, key)
        if value is not None and not 1 <= value <= limit:
            raise ReportError(f"expected {key} in 1..{limit}, got {value} in {case.id}")


def check_cases(cases: list[Case]) -> None:
    """Every case within ``LIMITS``, and every zoo shape one its builder accepts: each distinct
    shape is built once here, so a shape the model refuses (a transformer dim its heads don't
    divide) fails before minutes of measuring, by the builder's own check."""
    for case in cases:
        _check_limits(case)
    shapes = {(c.model, c.dim, c.seq): c for c in cases if c.path is None}
    for case in shapes.values():
        try:
            case.build()
        except ValueError as exc:
            given = ", ".join(f"{k}={v}" for k, v in case.model_kwargs.items())
            raise ReportError(f"{case.model} with {given}: {exc}") from None

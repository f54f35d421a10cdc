"""A measured point, one model at one batch size, and its one id (``mlp-b32-d1024``): what the
suite parametrizes, the report measures, the targets judge and history names; and ``FAMILIES``,
the one table of benchmark models that every grid is read from.

To add a benchmark model: a builder in ``engines/ir/models.py``'s zoo (``MODELS``), then one
``Family`` entry in ``FAMILIES`` below. The suite's matrices (``mlexec.suite.grid``), the
report's grids and its ``--shapes`` parsing (``mlexec.report``), and the tests' small models
(``tests/conftest.py``) all read that entry; nothing else names the model."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Mapping

from engines import MODELS
from engines.ir.models import Model

# An id with a prefix (a test's ``engine-model-bB-dD[-sS]``): ``head`` is everything before the batch.
ID_PATTERN = re.compile(r"^(?P<head>.+?)-b(?P<batch>\d+)-d(?P<dim>\d+)(?:-s(?P<seq>\d+))?$")

# Bump when the measured workload changes in a way the case fields don't show
# (inputs, calls per round, what the memory pass runs): older baselines are skipped.
WORKLOAD_REVISION = 1


@dataclass(frozen=True)
class Case:
    """One model at one batch size. A zoo model is named by ``model`` with its ``dim`` (and
    ``seq``); a model file by ``path`` (its stem names the case; loaded by ``engines.load_onnx``;
    ``dim`` and ``seq``, when given, describe its input and are not part of its id)."""
    model: str
    batch: int
    dim: int | None = None
    seq: int | None = None     # transformer only
    path: str | None = None    # a model file instead of a zoo model

    @property
    def parts(self) -> list[str]:
        """``["mlp", "b32", "d1024"]``, ``["transformer", "b1", "d256", "s64"]``; a model file's
        ``["mymodel", "b8"]``. Every name of a case is these parts joined."""
        if self.path:
            return [self.model, f"b{self.batch}"]
        return ([self.model, f"b{self.batch}"] + ([f"d{self.dim}"] if self.dim is not None else [])
                + ([f"s{self.seq}"] if self.seq else []))

    @property
    def id(self) -> str:
        """``mlp-b32-d1024``: the suite's test ids, the report's rows, the targets' points."""
        return "-".join(self.parts)

    @property
    def model_kwargs(self) -> dict:
        return {"dim": self.dim, **({"seq": self.seq} if self.seq else {})}

    @classmethod
    def of(cls, model: Model, batch: int, path: str | None = None, name: str | None = None) -> "Case":
        """The case of a built model, named ``name`` (default: the model's own): ``dim`` its
        input's last axis, ``seq`` its first when a sample has two or more (the zoo's sequence
        models take (seq, dim) per sample)."""
        shape = model.shapes[model.input]
        return cls(name or model.name, batch, shape[-1] if shape else None, shape[0] if len(shape) > 1 else None, path)

    def build(self) -> Model:
        if self.path:
            import engines
            load = getattr(engines, "load_onnx", None)
            if load is None:
                raise NotImplementedError(f"{self.path}: this checkout's engines cannot import model files")
            return load(self.path)
        return MODELS[self.model](**self.model_kwargs, seed=0)

    @cached_property
    def version(self) -> str:
        """A zoo case's ops and shapes; a model file's content (how an importer lowers the same
        file is engine code, which the gate measures, not a new workload)."""
        if self.path:
            content = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()
            return hashlib.sha256(json.dumps([WORKLOAD_REVISION, self.id, content]).encode()).hexdigest()[:12]
        return workload_version(self.id, self.build())


def workload_version(case_id: str, model: Model) -> str:
    """Changes when the case, the model's ops or its shapes change; not with engine code."""
    text = json.dumps([WORKLOAD_REVISION, case_id,
                       [(op.kind, op.inputs, op.output, sorted(op.attrs.items())) for op in model.ops],
                       sorted(model.shapes.items())], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# --- the benchmark models ----------------------------------------------------------------------

SHAPE_PATTERN = re.compile(r"\d+(?:x\d+)+")     # "8x256", "1x256x64": BATCHxDIM[xSEQ]


def shape_parts(text: str) -> tuple[int, ...]:
    """``"1x256x64"`` -> (1, 256, 64); ValueError when it is not BATCHxDIM[xSEQ...] in digits."""
    if not SHAPE_PATTERN.fullmatch(text):
        raise ValueError(f"expected a shape like 8x256 or 1x256x64, got {text!r}")
    return tuple(int(p) for p in text.split("x"))


@dataclass(frozen=True)
class Family:
    """One benchmark model: a zoo builder (``engines.MODELS[name]``), its shape parameters and
    the one grid it is measured on. The faces' selections (the suite's quick matrix, the report's
    batches and its ``--quick`` points) are subsets of that grid, checked here, not grids of
    their own: the suite measures the whole grid; the report takes ``report_batches`` of it
    because it times every engine in many interleaved rounds per point, where a large-batch
    point that adds minutes and answers no question the report asks is left out.

    Shape constraints are the builder's own (a transformer dim its heads don't divide): the
    report builds each shape before it measures any (``mlexec.report.inputs.check_cases``)."""
    name: str                                   # a key of engines.MODELS
    batches: tuple[int, ...]                    # the grid: every batch x dim (x seq)
    dims: tuple[int, ...]
    seqs: tuple[int, ...] = ()                  # a sequence model's lengths; () for BATCHxDIM
    # The suite's quick matrix (``--mlexec-matrix quick``, a pull request's gate: the corners that
    # tell the story in minutes): points of the grid as shapes, "1x256" or "1x256x64", in order.
    quick: tuple[str, ...] = ()
    report: bool = False                        # ``mlexec report`` measures it (its --models)
    report_batches: tuple[int, ...] | None = None     # the report's subset of ``batches``; None: all
    report_quick: tuple[str, ...] = ()          # ``mlexec report --quick``: a look in under a minute
    # Builder arguments of a small instance: the tests run every engine on it (tests/conftest.py).
    small: Mapping[str, int] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not set(self.report_batches or ()) <= set(self.batches):
            raise ValueError(f"{self.name}: report batches {self.report_batches} outside its batches {self.batches}")
        for what, points, allowed in (("quick", self.quick, self.grid()),
                                      ("report_quick", self.report_quick, self.report_cases())):
            outside = [p for p in points if self.point(p) not in allowed]
            if outside:
                raise ValueError(f"{self.name}: {what} points {outside} are not in its grid")
        if self.report and not self.report_quick:
            raise ValueError(f"{self.name}: a model the report measures needs report_quick points")

    @property
    def params(self) -> tuple[str, ...]:
        """The ``Case`` fields a shape gives after the batch: ("dim",) or ("dim", "seq")."""
        return ("dim", "seq") if self.seqs else ("dim",)

    @property
    def arity(self) -> int:
        """Numbers in one of its shapes: 2 for BATCHxDIM, 3 for BATCHxDIMxSEQ."""
        return 1 + len(self.params)

    @property
    def form(self) -> str:
        return "x".join(["BATCH", *(p.upper() for p in self.params)])

    def case(self, parts: tuple[int, ...]) -> Case:
        """The case of one shape's numbers, (batch, dim[, seq]); ValueError for another arity."""
        if len(parts) != self.arity:
            raise ValueError(f"expected a {self.name} shape {self.form}, got {'x'.join(map(str, parts))}")
        return Case(self.name, parts[0], **dict(zip(self.params, parts[1:])))

    def point(self, text: str) -> Case:
        return self.case(shape_parts(text))

    def grid(self, batches: tuple[int, ...] | None = None) -> list[Case]:
        """Its grid (only ``batches`` when given): by dim, then seq, then batch."""
        return [Case(self.name, b, d, s) for d in self.dims for s in self.seqs or (None,)
                for b in (self.batches if batches is None else batches)]

    def report_cases(self, quick: bool = False) -> list[Case]:
        """What ``mlexec report`` measures of it: its report batches of the grid, or its
        ``report_quick`` points with ``--quick``."""
        return [self.point(p) for p in self.report_quick] if quick else self.grid(self.report_batches)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    # every batch from one sample to a GEMM-bound 128, and every dim from cache-resident to streamed
    # weights: a kernel or a rule tuned on a few points must hold between them (1 x 1024 did not)
    Family("mlp", batches=(1, 2, 4, 8, 16, 32, 64, 128), dims=(256, 512, 1024, 2048, 4096),
           # dispatch-bound (b1, d256), BLAS-bound (b32/b128, d1024, the seed's headline shape)
           quick=("1x256", "32x256", "1x1024", "32x1024", "128x1024"),
           # the targets' points: per-op overhead (b<=8, d256), the peer, the bandwidth roof (b1 d4096)
           report=True, report_quick=("1x256", "8x256", "32x1024", "1x4096"),
           small={"dim": 64}),
    Family("mlp-deep", batches=(1, 8, 32, 128), dims=(256, 1024, 4096),
           quick=("8x256",),                    # a deep stack
           small={"dim": 48}),
    Family("transformer", batches=(1, 8, 32, 128), dims=(256, 512), seqs=(64, 128),
           quick=("1x256x64", "8x256x64"),      # both batch ends
           # b32/b128 are GEMM-bound, as the mlp's large batches already show: the report keeps b1/b8
           report=True, report_batches=(1, 8), report_quick=("1x256x64",),
           small={"dim": 32, "seq": 8, "heads": 4}),   # several heads, multi-row tiles, every op kind
)}

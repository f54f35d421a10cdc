"""A measured point, one model at one batch size, and its one id (``mlp-b32-d1024``): what the
suite parametrizes, the report measures, the targets judge and history names."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

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

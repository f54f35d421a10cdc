"""The benchmark grid: which model shapes each engine is measured on."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

from engines import MODELS
from engines.models import Model

# Bump when the measured workload changes in a way the case fields don't show
# (inputs, calls per round, what the memory pass runs): older baselines are skipped.
WORKLOAD_REVISION = 1


@dataclass(frozen=True)
class Case:
    model: str
    batch: int
    dim: int
    seq: int | None = None     # transformer only

    @property
    def id(self) -> str:
        seq = f"-s{self.seq}" if self.seq else ""
        return f"{self.model}-b{self.batch}-d{self.dim}{seq}"

    @property
    def model_kwargs(self) -> dict:
        return {"dim": self.dim, **({"seq": self.seq} if self.seq else {})}

    def build(self) -> Model:
        return MODELS[self.model](**self.model_kwargs, seed=0)

    @cached_property
    def version(self) -> str:
        return workload_version(self.id, self.build())


def workload_version(case_id: str, model: Model) -> str:
    """Changes when the case, the model's ops or its shapes change; not with engine code."""
    text = json.dumps([WORKLOAD_REVISION, case_id,
                       [(op.kind, op.inputs, op.output, sorted(op.attrs.items())) for op in model.ops],
                       sorted(model.shapes.items())], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cases(models, batches, dims, seqs=(None,)):
    return [Case(m, b, d, s) for m in models for d in dims for s in seqs for b in batches]


FULL = (_cases(["mlp", "mlp-deep"], [1, 8, 32, 128], [256, 1024, 4096])
        + _cases(["transformer"], [1, 8, 32, 128], [256, 512], [64, 128]))

# Quick: the corners that tell the story in under 3 minutes on 2 cores:
# dispatch-bound (b1, d256), BLAS-bound (b32/b128, d1024, the seed's headline
# shape), a deep stack, and the transformer at both batch ends.
QUICK = (_cases(["mlp"], [1, 32], [256, 1024]) + [Case("mlp", 128, 1024)]
         + [Case("mlp-deep", 8, 256)]
         + _cases(["transformer"], [1, 8], [256], [64]))

MATRICES = {"quick": QUICK, "full": FULL}
HEADLINE = Case("mlp", 128, 1024)   # the seed's model; its row is the summary's headline

"""The suite's matrices: which cases (``mlexec.case.Case``) each engine is measured on, read from
the table of benchmark models (``mlexec.case.FAMILIES``), and how a matrix is split into shards
that CI runners measure side by side."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import NamedTuple

from ..case import FAMILIES, Case


def file_case(path: str, batch: int) -> Case:
    """The case of a model file at one batch size, named by the file's stem."""
    return Case(Path(path).stem, batch, path=str(path))


class FileCases(NamedTuple):
    """The model files' cases, and a line for each file measured at other batches than asked."""
    cases: list[Case]
    notes: list[str]


def file_cases(paths, batches) -> FileCases:
    """Every model file at every batch, checked now: a file that does not import raises
    ValueError naming the file (one line). A file that fixes its batch at N is measured at N
    only, whatever ``batches`` says, and a note says so."""
    cases, notes = [], []
    batches = list(batches)
    for path in dict.fromkeys(paths):
        first = batches[0] if batches else 1
        try:
            model = file_case(path, first).build()
        except (OSError, ValueError, NotImplementedError) as exc:
            raise ValueError(f"--mlexec-model {path} at batch {first}: {exc}") from None
        sizes = batches
        if model.fixed_batch is not None:
            n = model.fixed_batch.size
            sizes = [n]
            if batches != sizes:
                notes.append(f"--mlexec-model {path}: measured at batch {n} only, not at "
                             f"{','.join(map(str, batches))}: {model.fixed_batch}")
        cases += [file_case(path, batch) for batch in sizes]
    ids = [c.id for c in cases]
    clash = sorted({i for i in ids if ids.count(i) > 1})
    if clash:
        raise ValueError(f"--mlexec-model: two files share the stem of {clash}; rename one")
    return FileCases(cases, notes)


def full_matrix() -> list[Case]:
    """Every benchmark model's whole grid (``mlexec.case.FAMILIES``), in the table's order."""
    return [case for family in FAMILIES.values() for case in family.grid()]


def quick_matrix() -> list[Case]:
    """Every benchmark model's ``quick`` points, in the table's order."""
    return [family.point(p) for family in FAMILIES.values() for p in family.quick]


# --mlexec-matrix NAME: the cases, read from the table when asked; "none": only --mlexec-model files.
MATRICES = {"quick": quick_matrix, "full": full_matrix, "none": list}
FULL, QUICK = full_matrix(), quick_matrix()     # as the table stood at import
HEADLINE = Case("mlp", 128, 1024)   # the seed's model; its row is the summary's headline


# --- shards: N runners measure disjoint parts of one matrix ----------------------------

# Estimated seconds one (engine, case) pair costs in a gated run: a fixed part (pytest-benchmark's
# calibration and max-time, the A/B measurements' minimum time, builds), and a part that grows
# with the work of a forward, about FORWARDS_PER_PAIR forwards at FLOPS_PER_SECOND.
FIXED_SECONDS = 2.0
FORWARDS_PER_PAIR = 60
FLOPS_PER_SECOND = 50e9
SLOW_BUILD_SECONDS = 30.0     # an engine that compiles per model (torch-compile)


def estimated_seconds(flops: int, slow_build: bool = False) -> float:
    return FIXED_SECONDS + FORWARDS_PER_PAIR * flops / FLOPS_PER_SECOND + (SLOW_BUILD_SECONDS if slow_build else 0.0)


# Seconds per (engine, case) measured by a whole run of the full matrix (``--mlexec-costs``, or
# ``ci merge``'s costs.json of a sharded one), committed; pairs it lacks are estimated.
COSTS_FILE = Path(__file__).with_name("costs.json")


def measured_costs(path: Path = COSTS_FILE) -> dict[tuple[str, str], float]:
    """(engine, case id) -> seconds from a costs file; {} when there is none."""
    if not path.is_file():
        return {}
    seconds = json.loads(path.read_text())["seconds"]
    return {tuple(pair.split(" ", 1)): s for pair, s in seconds.items()}


def pair_costs(pairs, measured: dict[tuple[str, str], float], estimate) -> dict[tuple[str, str], float]:
    """Each pair's measured seconds where known, else ``estimate(pair)`` scaled by the median ratio
    of measured to estimated over the pairs that have both (so the two kinds add up alike).
    ``estimate`` (which may build models) is called only when some pair was not measured."""
    if all(p in measured for p in pairs):
        return {p: measured[p] for p in pairs}
    estimates = {p: estimate(p) for p in pairs}
    both = [measured[p] / estimates[p] for p in pairs if p in measured and estimates[p] > 0]
    scale = statistics.median(both) if both else 1.0
    return {p: measured.get(p, scale * e) for p, e in estimates.items()}


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 1 <= K <= N; ValueError otherwise."""
    k, sep, n = text.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise ValueError(f"expected K/N such as 1/4, got {text!r}")
    k, n = int(k), int(n)
    if not 1 <= k <= n:
        raise ValueError(f"expected 1 <= K <= N in K/N, got {text!r}")
    return k, n


def assign_shards(costs: dict, n: int) -> dict:
    """Each unit -> a shard in 1..n, greedily balancing the summed cost (longest first onto the
    least loaded shard; ties by name). Depends only on ``costs`` and ``n``: every runner computes
    the same split, and every unit lands in exactly one shard."""
    loads = [0.0] * n
    shard = {}
    for unit in sorted(costs, key=lambda u: (-costs[u], u)):
        k = min(range(n), key=lambda i: (loads[i], i))
        loads[k] += costs[unit]
        shard[unit] = k + 1
    return shard

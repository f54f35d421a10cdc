"""Static memory planning: liveness, in-place aliasing, then offsets in one arena.

``plan_memory`` is a pure function from a schedule to a ``Plan``. It does, in order:

1. liveness: the first step that writes each tensor and the last step that reads it;
2. in place: a step's output takes over an input's storage when the op allows
   it, the input is read for the last time there and the sizes match (of two, the older
   storage);
3. placement: storages sorted by size, largest first, each put at the lowest
   offset gap that no storage with an overlapping lifetime occupies, the greedy
   by-size strategy of TFLite's arena planner; the same in order of first use
   where that packs tighter (an imported attention graph: 1.19x the lower bound against 1.44x),
   or longest lifetime first (DenseNet-121, whose concatenations keep many maps alive across
   long spans: 1.020x against 1.074x by size);
4. where none of those orders reaches the lower bound, up to ``SEARCH_TRIES`` (more for a
   small schedule: ``SEARCH_WORK``) seeded random
   perturbations of the size order, each followed by a seeded shuffle of all storages, stopping at
   the first that does (the plan stays a pure function of the schedule).

It also reports the two sizes the arena is judged against: the total with no
reuse at all, and the lower bound that any placement needs, the most bytes
live at one step.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Mapping, Sequence

from .memory import ALIGNMENT

# Orders tried when no fixed order reaches the lower bound. SqueezeNet and Inception v2 with
# their first convs and pools fused, at 1.0625x by every fixed order, reach it within 17 tries
# of the size order with each size scaled by a seeded random factor in [0.5, 1.5); DenseNet-121
# (1.020x) within 16. A try costs 0.1-5 ms on the nine light CNNs (docs/cnn.md). A perturbed size
# order never puts a small storage before a big one: GPT-2's exports, as aliased before the
# residual stream kept one storage (1.111x: a 4 KiB residual must go below the 12-16 KiB
# products), reach it only by a shuffle, the 20th. A try places each storage against those
# placed (n^2 pairs for n storages), so a small schedule gets more of them,
# as many as SEARCH_WORK pairs allow, up to MAX_SEARCH_TRIES: GPT-NeoX's export (57 storages,
# 0.25 ms a try) is at 1.125x after 64 tries and reaches the bound within 192.
SEARCH_TRIES = 64
MAX_SEARCH_TRIES = 256
SEARCH_WORK = SEARCH_TRIES * 120 ** 2


@dataclass(frozen=True)
class Step:
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    # (output, input) pairs: the output may reuse the input's storage
    inplace: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    offsets: dict[str, int]            # byte offset of every planned tensor
    arena_bytes: int
    no_reuse_bytes: int                # every tensor in its own buffer
    lower_bound_bytes: int             # max over steps of bytes live at that step
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)  # storage's [first, last] step
    aliases: dict[str, str] = field(default_factory=dict)  # tensor -> tensor whose storage it reuses


def align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def end_to_end(sizes: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """Byte offsets of regions laid one after another, each on a cache line, and their total."""
    ends = list(accumulate(align(n) for n in sizes.values()))
    return dict(zip(sizes, [0, *ends[:-1]])), (ends[-1] if ends else 0)


def plan_memory(sizes: Mapping[str, int], steps: Sequence[Step], keep: Sequence[str] = ()) -> Plan:
    """Plan every tensor in ``sizes``; names not in ``sizes`` (the caller's input) are ignored.

    ``keep`` lists tensors that must survive the last step (the model output).
    """
    first, last = _liveness(sizes, steps, keep)
    root = _in_place(sizes, steps, first, last)
    members: dict[str, list[str]] = {}
    for t in sizes:
        members.setdefault(root[t], []).append(t)
    span = {r: (min(first[t] for t in ts), max(last[t] for t in ts)) for r, ts in members.items()}
    size = {r: max(sizes[t] for t in ts) for r, ts in members.items()}
    # lower bound: the most bytes live at any one step
    lower = max((sum(size[r] for r, (a, b) in span.items() if a <= i <= b) for i in range(len(steps) + 1)),
                default=0)
    placed = _placement(size, span, lower)
    return Plan(
        offsets={t: placed[root[t]] for t in sizes},
        arena_bytes=_top(placed, size),
        no_reuse_bytes=sum(align(s) for s in sizes.values()),
        lower_bound_bytes=lower,
        lifetimes={t: span[root[t]] for t in sizes},
        aliases={t: root[t] for t in sizes if root[t] != t},
    )


def _liveness(sizes, steps, keep) -> tuple[dict[str, int], dict[str, int]]:
    """1. The first step that writes each tensor and the last step that reads it (``keep``: one
    past the last step)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for t in step.writes:
            if t in sizes:
                first.setdefault(t, i)
                last[t] = max(last.get(t, i), i)
        for t in step.reads:
            if t in sizes:
                if t not in first:
                    raise ValueError(f"step {i} reads {t!r} before any step writes it")
                last[t] = i
    for t in keep:
        last[t] = len(steps)
    unused = set(sizes) - set(first)
    if unused:
        raise ValueError(f"tensors never written: {sorted(unused)}")
    return first, last


def _in_place(sizes, steps, first, last) -> dict[str, str]:
    """2. tensor -> the tensor whose storage it takes: an output joins its input's storage where
    the step allows it, reads the input for the last time and the sizes match. Of two such inputs
    (a residual add) it joins the storage that began first, whichever operand that is, so that
    a residual stream keeps one storage through every block. Joining the other moved the stream
    into each block's last product: a staircase of overlapping storages that no order packed,
    ViT-B/16 at 1.097x its lower bound (docs/importing.md)."""
    root: dict[str, str] = {t: t for t in sizes}
    for i, step in enumerate(steps):
        joinable = [(out, src) for out, src in step.inplace if out in sizes and src in sizes
                    and last[src] == i and first[out] == i and sizes[out] == sizes[src]]
        for out, src in sorted(joinable, key=lambda pair: first[root[pair[1]]]):
            if root[out] == out:
                root[out] = root[src]
    return root


def _top(placed: dict[str, int], size: dict[str, int]) -> int:
    """The arena a placement needs."""
    return max((placed[r] + align(size[r]) for r in placed), default=0)


def _placement(size: dict[str, int], span: dict[str, tuple[int, int]], lower: int) -> dict[str, int]:
    """3. greedy placement, biggest first (TFLite's order) or, where that packs tighter, earliest
    first or longest-lived first; 4. none at the bound: seeded perturbations of the size order
    and seeded shuffles, until one is."""
    orders = [sorted(size, key=lambda r: (-size[r], span[r][0], r)),
              sorted(size, key=lambda r: (span[r][0], -size[r], r)),
              sorted(size, key=lambda r: (span[r][0] - span[r][1], -size[r], r))]
    placed = min((_place(order, size, span) for order in orders), key=lambda p: _top(p, size))
    rng, shuffles = random.Random(0), random.Random(1)
    for _ in range(min(MAX_SEARCH_TRIES, max(SEARCH_TRIES, SEARCH_WORK // max(1, len(size)) ** 2))):
        for order in (sorted(size, key=lambda r: (-size[r] * rng.uniform(0.5, 1.5), r)),
                      shuffles.sample(sorted(size), len(size))):
            if _top(placed, size) <= lower:
                return placed
            placed = min(placed, _place(order, size, span), key=lambda p: _top(p, size))
    return placed


def _place(order, size, span) -> dict[str, int]:
    """Each storage in turn at the lowest offset gap that no placed storage with an overlapping
    lifetime occupies."""
    placed: dict[str, int] = {}
    for r in order:
        a, b = span[r]
        busy = sorted((placed[o], placed[o] + align(size[o])) for o in placed
                      if span[o][0] <= b and a <= span[o][1])
        offset = 0
        for lo, hi in busy:
            if offset + size[r] <= lo:
                break
            offset = max(offset, hi)
        placed[r] = offset
    return placed

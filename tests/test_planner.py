"""The memory planner, tested by invariant on random schedules and on the model zoo."""
import pytest
from hypothesis import given, settings, strategies as st

from engines import ENGINES, MODELS
from engines.memory import ALIGNMENT
from engines.planner import Step, plan_memory


@st.composite
def schedules(draw):
    """A random straight-line program: each step reads earlier tensors and writes one new one."""
    n = draw(st.integers(1, 14))
    sizes, steps = {}, []
    for i in range(n):
        name = f"t{i}"
        reads = tuple(draw(st.lists(st.sampled_from(["input", *sizes]), min_size=1, max_size=3, unique=True)))
        sizes[name] = draw(st.sampled_from([4, 60, 64, 100, 256, 1000, 4096]))
        scratch = (f"s{i}",) if draw(st.booleans()) else ()
        if scratch:
            sizes[scratch[0]] = draw(st.sampled_from([8, 64, 512]))
        inplace = tuple((name, r) for r in reads if draw(st.booleans()))
        steps.append(Step(reads + scratch, (name, *scratch), inplace))
    keep = draw(st.lists(st.sampled_from(sorted(sizes)), max_size=2, unique=True))
    return sizes, steps, keep


def live_at(plan, name, step):
    a, b = plan.lifetimes[name]
    return a <= step <= b


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_no_two_live_tensors_overlap(schedule):
    sizes, steps, keep = schedule
    plan = plan_memory(sizes, steps, keep=keep)
    for i in range(len(steps) + 1):
        live = [t for t in sizes if live_at(plan, t, i)]
        for a in live:
            for b in live:
                if a < b and plan.aliases.get(a, a) != plan.aliases.get(b, b):
                    ra = range(plan.offsets[a], plan.offsets[a] + sizes[a])
                    rb = range(plan.offsets[b], plan.offsets[b] + sizes[b])
                    assert not set(ra) & set(rb), f"{a} and {b} overlap at step {i}"


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_arena_bounds_and_alignment(schedule):
    sizes, steps, keep = schedule
    plan = plan_memory(sizes, steps, keep=keep)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
    assert plan.no_reuse_bytes >= sum(sizes.values())
    for t, offset in plan.offsets.items():
        assert offset % ALIGNMENT == 0
        assert offset + sizes[t] <= plan.arena_bytes


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_in_place_only_where_allowed(schedule):
    sizes, steps, keep = schedule
    plan = plan_memory(sizes, steps, keep=keep)
    last_read = {t: i for i, s in enumerate(steps) for t in s.reads}
    for out in plan.aliases:
        step = next(i for i, s in enumerate(steps) if out in s.writes)
        # some in-place candidate of that step justifies the sharing
        assert any(src in sizes and sizes[src] == sizes[out] and last_read[src] == step
                   and src not in keep and plan.offsets[src] == plan.offsets[out]
                   for o, src in steps[step].inplace if o == out), out


def test_hand_built_chain_reuses_two_buffers():
    # a -> b -> c -> d, each read only by the next: two buffers ping-pong.
    sizes = dict(a=100, b=100, c=100, d=100)
    steps = [Step(("x",), ("a",)), Step(("a",), ("b",)), Step(("b",), ("c",)), Step(("c",), ("d",))]
    plan = plan_memory(sizes, steps, keep=["d"])
    assert plan.arena_bytes == 2 * 128 and plan.lower_bound_bytes == 2 * 100
    assert plan.no_reuse_bytes == 4 * 128
    inplace = [Step(s.reads, s.writes, ((s.writes[0], s.reads[0]),)) for s in steps]
    plan = plan_memory(sizes, inplace, keep=["d"])
    assert plan.arena_bytes == 128 and plan.aliases == {"b": "a", "c": "a", "d": "a"}


# GPT-2's storages after in-place aliasing (dynamo export, batch 1): (first step, last step, KiB),
# as aliased before the residual stream kept one storage (a fixed order reaches the bound now).
# The residual stream changes storage at step 13 and lives to the end; the bound is reached only
# with it below the attention's 12 KiB products, which no order by size (however perturbed) does.
GPT2_SPANS = [(0, 14, 4), (2, 2, 4), (2, 2, 0.0625), (2, 3, 4), (3, 7, 12), (4, 4, 4), (4, 7, 4), (6, 6, 4),
              (6, 6, 0.25), (7, 8, 4), (8, 9, 4), (10, 10, 4), (10, 10, 0.0625), (10, 11, 4), (11, 12, 16),
              (12, 13, 16), (13, 27, 4), (15, 15, 4), (15, 15, 0.0625), (15, 16, 4), (16, 20, 12), (17, 17, 4),
              (17, 20, 4), (19, 19, 4), (19, 19, 0.25), (20, 21, 4), (21, 22, 4), (23, 23, 4), (23, 23, 0.0625),
              (23, 24, 4), (24, 25, 16), (25, 26, 16), (26, 29, 4), (28, 28, 4), (28, 28, 0.0625)]


# GPT-NeoX's (dynamo export, batch 1; its parallel residual keeps the layer norm's output over
# the attention): 57 storages, at 1.125x the bound after the 64 tries of a large schedule.
NEOX_SPANS = [(0, 58, 4), (1, 1, 4), (1, 1, 0.0625), (1, 24, 4), (2, 3, 12), (3, 6, 12), (4, 8, 4), (5, 10, 4),
              (6, 21, 4), (7, 13, 1), (8, 13, 3), (9, 14, 1), (10, 14, 3), (11, 11, 1), (12, 12, 1), (13, 18, 4),
              (14, 15, 4), (15, 18, 4), (18, 21, 4), (20, 20, 4), (20, 20, 0.25), (21, 22, 4), (22, 23, 4),
              (23, 28, 4), (24, 25, 8), (25, 25, 8), (25, 26, 8), (26, 27, 4), (29, 29, 4), (29, 29, 0.0625),
              (29, 52, 4), (30, 31, 12), (31, 34, 12), (32, 36, 4), (33, 38, 4), (34, 49, 4), (35, 41, 1),
              (36, 41, 3), (37, 42, 1), (38, 42, 3), (39, 39, 1), (40, 40, 1), (41, 46, 4), (42, 43, 4),
              (43, 46, 4), (46, 49, 4), (48, 48, 4), (48, 48, 0.25), (49, 50, 4), (50, 51, 4), (51, 56, 4),
              (52, 53, 8), (53, 53, 8), (53, 54, 8), (54, 55, 4), (57, 57, 4), (57, 57, 0.0625)]


def spans_schedule(spans):
    """Storages t0, t1, ... of ``spans``: each written at its first step, read up to its last."""
    sizes = {f"t{i}": int(kib * 1024) for i, (_, _, kib) in enumerate(spans)}
    steps = [Step(tuple(f"t{i}" for i, (a, b, _) in enumerate(spans) if a < s <= b),
                  tuple(f"t{i}" for i, (a, _, _) in enumerate(spans) if a == s))
             for s in range(max(b for _, b, _ in spans) + 1)]
    return sizes, steps


def test_search_reaches_the_bound_where_small_storages_must_go_first():
    plan = plan_memory(*spans_schedule(GPT2_SPANS))
    assert plan.lower_bound_bytes == 36 * 1024
    assert plan.arena_bytes == plan.lower_bound_bytes       # 40 KiB by every order by size


def test_a_small_schedule_gets_the_tries_it_needs_to_reach_the_bound():
    plan = plan_memory(*spans_schedule(NEOX_SPANS))
    assert plan.lower_bound_bytes == 32 * 1024
    assert plan.arena_bytes == plan.lower_bound_bytes       # 36 KiB after 64 tries


def pre_norm_encoder(blocks: int):
    """ViT-B/16's blocks at batch 1 as the importer schedules them, scratch included: the residual
    stream is the second operand of the attention's add and the first of the MLP's."""
    d, qkv, scores, hidden = 197 * 768 * 4, 197 * 2304 * 4, 12 * 197 * 197 * 4, 197 * 3072 * 4
    sizes, steps, res = {"res": d}, [Step(("x",), ("res",))], "res"
    for j in range(blocks):
        def op(name, size, reads, scratch=(), inplace=()):
            out, temps = f"{name}{j}", [f"{name}{j}.scratch{i}" for i in range(len(scratch))]
            sizes.update({out: size, **dict(zip(temps, scratch))})
            steps.append(Step((*reads, *temps), (out, *temps), tuple((out, src) for src in inplace)))
            return out
        q = op("qkv", qkv, [op("ln", d, [res], (d, 788))])
        probs = op("softmax", scores, [op("scores", scores, [q], (d,))], (scores, 9456), inplace=[f"scores{j}"])
        proj = op("proj", d, [op("context", d, [probs, q])])
        mid = op("mid", d, [proj, res], inplace=[proj, res])
        up = op("fc1", hidden, [op("ln2", d, [mid], (d, 788))])
        down = op("fc2", d, [op("gelu", hidden, [up], (61440,))])
        res = op("out", d, [mid, down], inplace=[mid, down])
    return sizes, steps, [res]


def test_a_residual_stream_keeps_one_storage_and_the_arena_its_bound():
    # Each add joins the older of its two inputs' storages, whichever operand it is. Joining the
    # other moved the stream into every block's last product: 1.097x the bound from four blocks.
    sizes, steps, keep = pre_norm_encoder(4)
    plan = plan_memory(sizes, steps, keep=keep)
    assert {plan.aliases[f"{add}{j}"] for add in ("mid", "out") for j in range(4)} == {"res"}
    assert plan.arena_bytes <= plan.lower_bound_bytes + ALIGNMENT * len(sizes)


def test_reading_before_writing_is_an_error():
    with pytest.raises(ValueError, match="reads 'b' before"):
        plan_memory({"a": 4, "b": 4}, [Step(("b",), ("a",)), Step(("a",), ("b",))])


@pytest.mark.parametrize("name, kwargs", [
    ("mlp", dict(dim=1024)), ("mlp-deep", dict(dim=1024)), ("transformer", dict(dim=256, seq=64)),
])
def test_zoo_arena_against_lower_bound(name, kwargs):
    engine = ENGINES["arena"](MODELS[name](**kwargs), 32)
    r = engine.report()
    print(f"\n{name} {kwargs} b32: arena {r['arena_bytes']:,} B, no reuse {r['no_reuse_bytes']:,} B, "
          f"lower bound {r['lower_bound_bytes']:,} B ({r['arena_bytes'] / r['lower_bound_bytes']:.3f}x)")
    assert r["lower_bound_bytes"] <= r["arena_bytes"] < r["no_reuse_bytes"]
    # Greedy by size reaches the bound on these straight-line graphs; allow the alignment slack only.
    assert r["arena_bytes"] <= r["lower_bound_bytes"] + ALIGNMENT * len(engine.sizes)

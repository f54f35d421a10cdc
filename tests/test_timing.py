"""mlexec.timing, the one home of every timing loop: who is called in which order, how often, and
what each figure measures, on a fake clock (nothing here depends on the machine's speed)."""
import inspect

import pytest

from mlexec import timing



class Clock:
    """A perf_counter that moves only when a workload says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    return c


def workloads(clock, costs: dict[str, float], calls: list[str]):
    """Per name a callable ``fn(x)`` that records its call and takes ``costs[name]`` seconds."""
    def make(name):
        def fn(x):
            calls.append(name)
            clock.now += costs[name]
        return fn
    return {name: make(name) for name in costs}


def test_rounds_follow_the_williams_design_and_time_whole_blocks(clock):
    calls = []
    fns = workloads(clock, {"a": 1.0, "b": 2.0, "c": 4.0}, calls)
    times = timing.rounds(fns, None, count=3, calls=2, settle_seconds=0, first_round=1)
    assert {n: t.tolist() for n, t in times.items()} == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [4.0] * 3}
    blocks = [calls[i] for i in range(0, len(calls), 3)]          # one settling call, then a block of 2
    assert blocks == [["a", "b", "c"][i] for r in (1, 2, 3) for i in timing.round_order(3, r)]


def test_block_calls_fill_the_block_for_the_fastest(clock):
    fns = workloads(clock, {"slow": 0.01, "fast": 0.001}, [])
    assert timing.block_calls(fns.values(), None, block_seconds=0.03) == 30
    assert timing.block_calls(fns.values(), None, block_seconds=0.0001) == 1


def test_two_passes_time_single_calls_the_second_pass_reversed(clock):
    calls, passes = [], []
    fns = workloads(clock, {"a": 1.0, "b": 3.0}, calls)
    samples = timing.two_passes(fns, None, calls=3, settle_seconds=0, after_pass=passes.append)
    assert samples == {"a": [1.0, 1.0, 1.0], "b": [3.0, 3.0, 3.0]}
    # each engine's calls follow one settling call; 2 calls per engine in order, then 1 in reverse
    assert calls == ["a", "a", "a", "b", "b", "b", "b", "b", "a", "a"]
    assert passes == [2, 1]
    assert timing.two_passes({}, None, calls=1, after_pass=passes.append) == {} and passes[-2:] == [1, 0]


def test_step_times_time_each_step_and_leave_out_the_bookkeeping(clock):
    seen = []

    def run(mark):
        for name, cost in (("matmul", 5.0), ("relu", 1.0)):
            clock.now += cost
            mark(name)

    def each(name):
        seen.append(name)
        clock.now += 100.0          # not part of any step

    assert timing.step_times(run, runs=2, each=each) == [[5.0, 5.0], [1.0, 1.0]]
    assert seen == ["matmul", "relu"] * 2


def test_best_time_is_the_least_after_an_untimed_call(clock):
    costs = iter([50.0, 3.0, 1.0, 2.0])

    def fn():
        clock.now += next(costs)

    assert timing.best_time(fn, repeats=3) == 1.0


def test_no_other_module_times_in_a_loop_of_its_own():
    """The report, the analyzer and the roofs call mlexec.timing; none reads the clock itself."""
    from mlexec import analysis
    from mlexec.report import measuring
    from mlexec.suite import roofs
    for module in (analysis, measuring, roofs):
        assert "perf_counter" not in inspect.getsource(module), module.__name__

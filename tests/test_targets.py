"""The speed targets, judged on synthetic report rows: each one met, each one missed, and the deciding point named."""
from mlexec.case import Case
from mlexec.targets import SIGNIFICANCE, check, close_calls, sign_test


ROUND_NOISE = [-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0]     # 9 rounds, like the report


def row(engine, batch, dim, median_s, naive_s, ort_s=None, model="mlp", peak=0.0, bandwidth=0.0, spread=0.02,
        reverse=False):
    """A report row: 9 rounds spread +-spread around median_s, in step with naive's (or, with
    reverse, against them), and per-round ratios around the ratio of the given times."""
    def paired(ref_s):
        ratio = ref_s / median_s
        return ratio, [ratio * (1 - spread), ratio * (1 + spread)]
    noise = ROUND_NOISE[::-1] if reverse else ROUND_NOISE
    vs_naive, vs_naive_iqr = paired(naive_s)
    vs_ort, vs_ort_iqr = (None, None) if ort_s is None else paired(ort_s)
    return {"model": model, "case": Case(model, batch, dim).id, "batch": batch, "dim": dim, "engine": engine,
            "median_s": median_s, "rounds_s": [median_s * (1 + spread * u) for u in noise],
            "vs_naive": vs_naive, "vs_naive_iqr": vs_naive_iqr,
            "vs_onnxruntime": vs_ort, "vs_onnxruntime_iqr": vs_ort_iqr,
            "peak_fraction": peak, "bandwidth_fraction": bandwidth, "error": None}


def grid(fused_s, ort_s, naive_s=1.0, peak=0.8, bandwidth=0.9):
    """Three mlp points with naive, fused and onnxruntime; fused_s/ort_s per point."""
    rows = []
    for (batch, dim), f, o in zip([(1, 256), (128, 4096), (1, 4096)], fused_s, ort_s):
        rows += [row("naive", batch, dim, naive_s, naive_s, o),
                 row("fused", batch, dim, f, naive_s, o, peak=peak, bandwidth=bandwidth),
                 row("onnxruntime", batch, dim, o, naive_s, o)]
    return rows


def verdicts(rows):
    return {t.goal: t for t in check(rows)}


def test_all_met():
    got = verdicts(grid(fused_s=[0.5, 0.9, 0.9], ort_s=[0.6, 0.95, 1.0]))
    assert got and all(t.met for t in got.values()), got
    assert set(got) == {
        "fused >= naive at every point",
        "fused >= 1.3x naive at batch <= 8, dim <= 256",
        "best NumPy engine level with onnxruntime at every mlp point",
        "best NumPy engine ahead of onnxruntime at batch 1",
        "best NumPy engine >= 75% of the matmul peak at mlp-b128-d4096",
        "best NumPy engine >= 80% of the memory bandwidth at mlp-b1-d4096",
    }


def test_each_miss_names_its_point():
    got = verdicts(grid(fused_s=[0.8, 1.05, 0.9], ort_s=[0.6, 0.9, 1.0], peak=0.5, bandwidth=0.7))
    slower = got["fused >= naive at every point"]
    assert not slower.met and slower.value == "min 0.95x at mlp-b128-d4096; shown slower at mlp-b128-d4096 (9 of 9 rounds)"
    small = got["fused >= 1.3x naive at batch <= 8, dim <= 256"]
    assert not small.met and small.value == "min 1.25x at mlp-b1-d256, below 1.30x in 9 of 9 rounds"
    peer = got["best NumPy engine level with onnxruntime at every mlp point"]
    # at b1 d256 fused (0.8) is the best NumPy engine and onnxruntime takes 0.6: 0.75x
    assert not peer.met and peer.value == "worst 0.75x (fused) at mlp-b1-d256, below 1.00x in 9 of 9 rounds"
    assert not got["best NumPy engine ahead of onnxruntime at batch 1"].met
    assert not got["best NumPy engine >= 75% of the matmul peak at mlp-b128-d4096"].met
    assert not got["best NumPy engine >= 80% of the memory bandwidth at mlp-b1-d4096"].met


def test_best_numpy_engine_may_be_naive_and_peers_are_not_judged():
    rows = grid(fused_s=[0.5, 1.2, 0.9], ort_s=[0.6, 1.05, 1.0])
    rows.append(row("torch", 1, 256, 5.0, 1.0, 0.6))                  # a slow peer is not an optimized engine
    got = verdicts(rows)
    assert not any(goal.startswith("torch") for goal in got)
    # at b128 d4096 naive (1.0) beats fused (1.2); onnxruntime 1.05 -> 1.05x, level or ahead
    assert got["best NumPy engine level with onnxruntime at every mlp point"].met


def test_unmeasured_targets_are_left_out():
    rows = [row("naive", 32, 1024, 1.0, 1.0), row("static", 32, 1024, 0.9, 1.0)]
    assert [t.goal for t in check(rows)] == ["static >= naive at every point"]
    assert check([]) == []


def test_slower_within_the_noise_is_a_tie():
    """Same BLAS call, noisy rounds: a 0.97x median that still wins some rounds is not a miss."""
    rows = [row("naive", 32, 4096, 1.0, 1.0, spread=0.1), row("static", 32, 4096, 1.03, 1.0, spread=0.1, reverse=True),
            row("naive", 8, 4096, 1.0, 1.0), row("static", 8, 4096, 0.99, 1.0)]
    (target,) = check(rows)
    assert target.met and target.value == "min 0.97x at mlp-b32-d4096, slower in 5 of 9 rounds: not shown slower"
    rows[1] = row("static", 32, 4096, 1.03, 1.0, spread=0.1)                 # in step: slower in every round
    (target,) = check(rows)
    assert not target.met and target.value.endswith("shown slower at mlp-b32-d4096 (9 of 9 rounds)")


def test_a_verdict_near_its_bar_says_how_many_rounds_fell_below():
    """Met on the median (1.32x), but naive's and static's rounds moved apart: 4 of 9 below 1.3x."""
    rows = [row("naive", 8, 256, 1.0, 1.0, spread=0.1), row("static", 8, 256, 1 / 1.32, 1.0, spread=0.1, reverse=True)]
    small = verdicts(rows)["static >= 1.3x naive at batch <= 8, dim <= 256"]
    assert small.met and small.value == "min 1.32x at mlp-b8-d256, below 1.30x in 4 of 9 rounds"
    rows = [row("naive", 1, 1024, 1.0, 1.0, 1.0), row("static", 1, 1024, 0.99, 1.0, 1.0, spread=0.05, reverse=True),
            row("onnxruntime", 1, 1024, 1.0, 1.0, 1.0, spread=0.05)]
    ahead = verdicts(rows)["best NumPy engine ahead of onnxruntime at batch 1"]
    assert ahead.met and ahead.value == "worst 1.01x (static) at mlp-b1-d1024, below 1.00x in 4 of 9 rounds"


def test_sign_test():
    assert sign_test(9, 9) == 1 / 512 and sign_test(0, 9) == 1.0
    assert sign_test(8, 9) == 10 / 512 > SIGNIFICANCE > sign_test(9, 9)
    assert sign_test(23, 31) < SIGNIFICANCE < sign_test(22, 31)      # more rounds, a smaller share suffices


def test_close_calls_are_the_points_whose_deciding_figure_straddles_its_bar():
    # ratios 1.31x and 1.40x naive at two small points, +-2 % between quartiles: only 1.31x straddles 1.3x
    small = [row("naive", 1, 256, 1.0, 1.0), row("static", 1, 256, 1 / 1.31, 1.0),
             row("naive", 8, 256, 1.0, 1.0), row("static", 8, 256, 1 / 1.40, 1.0)]
    assert close_calls(small) == ["mlp-b1-d256"]
    # the same 1.31x where per-op overhead does not dominate decides nothing
    assert close_calls([row("naive", 32, 256, 1.0, 1.0), row("static", 32, 256, 1 / 1.31, 1.0)]) == []
    assert close_calls([{**r, "error": "wrong"} for r in small]) == []


def test_close_calls_against_the_peer_and_the_roofs_look_at_the_best_numpy_engine():
    # b8 d1024: naive is below 1.00x against onnxruntime, but static, the best, is clear at 1.2x
    clear = [row("naive", 8, 1024, 1.0, 1.0, 0.91), row("static", 8, 1024, 0.75, 1.0, 0.91)]
    assert close_calls(clear) == []
    # b8 d4096: the best is 0.92x onnxruntime, IQR 0.90-0.94, below the 1.00x bar
    near = [row("naive", 8, 4096, 2.0, 2.0, 0.92), row("static", 8, 4096, 1.0, 2.0, 0.92)]
    assert close_calls(near) == ["mlp-b8-d4096"]
    # batch 1: 1.01x onnxruntime straddles "ahead" and "level" (1.0)
    assert close_calls([row("static", 1, 1024, 1.0, 1.1, 1.01)]) == ["mlp-b1-d1024"]
    # the roofs, with times +-1 % between quartiles: 80.5 % of the bandwidth straddles 80 %, 82 % does not
    assert close_calls([row("static", 1, 4096, 1.0, 1.0, bandwidth=0.805)]) == ["mlp-b1-d4096"]
    assert close_calls([row("static", 1, 4096, 1.0, 1.0, bandwidth=0.82)]) == []
    assert close_calls([row("static", 128, 4096, 1.0, 1.0, peak=0.755)]) == ["mlp-b128-d4096"]
    # a peer's own figures decide nothing
    assert close_calls([row("onnxruntime", 1, 4096, 1.0, 1.0, bandwidth=0.805)]) == []


def test_a_median_below_its_bar_is_a_close_call_whatever_the_target():
    # far below 1.3x at a small point: the IQR does not straddle the bar, but more rounds decide it
    assert close_calls([row("naive", 8, 256, 1.0, 1.0), row("fused", 8, 256, 1.0, 1.0)]) == ["mlp-b8-d256"]
    # target 1 alone (not a small point, no peer): 0.78x naive in 8 of 9 rounds is measured again
    slow = [row("naive", 8, 4096, 1.0, 1.0, spread=0.1), row("packed", 8, 4096, 1 / 0.78, 1.0)]
    assert close_calls(slow) == ["mlp-b8-d4096"]
    # at or above 1.0x naive, target 1 asks for nothing more
    assert close_calls([row("naive", 8, 4096, 1.0, 1.0), row("packed", 8, 4096, 0.99, 1.0)]) == []


def test_not_shown_slower_is_judged_on_every_round():
    """27 of 36 rounds slower: shown slower (p < 0.01), where 8 of the first 9 was not."""
    def rounds(slower, total):
        naive = row("naive", 8, 4096, 1.0, 1.0)
        naive["rounds_s"] = [1.0] * total
        packed = row("packed", 8, 4096, 1.2, 1.0)
        packed["vs_naive"] = 0.83
        packed["rounds_s"] = [1.2] * slower + [0.9] * (total - slower)
        return [naive, packed]
    (first,) = check(rounds(8, 9))
    assert first.met and first.value.endswith("slower in 8 of 9 rounds: not shown slower")
    (again,) = check(rounds(27, 36))
    assert not again.met and again.value.endswith("shown slower at mlp-b8-d4096 (27 of 36 rounds)")

"""mlexec.suite.roofs: the matmul roof is the fastest library on this machine, and says which."""
from engines import kernels
from mlexec.suite import roofs


def test_the_matmul_roof_times_every_multi_thread_kernel_that_runs_here():
    timed = roofs._matmul_seconds(64, repeats=1)
    expected = {n for n, k in kernels.KERNELS.items()
                if not k.one_thread and not k.allocates and n not in kernels.unavailable()
                and k.offered_for(kernels.Gemm(64, 64, 64))}     # not oneDNN's matmul on AVX2 alone, nor numpy-nk
    assert set(timed) == expected and "numpy" in timed and all(t > 0 for t in timed.values())


def test_the_better_roof_keeps_the_name_of_its_kernel():
    slow, fast = roofs.Roofs(100.0, 50.0, "numpy"), roofs.Roofs(200.0, 40.0, "onednn-matmul")
    assert slow.best(fast) == fast.best(slow) == roofs.Roofs(200.0, 50.0, "onednn-matmul")


def test_calibrate_names_the_kernel_that_set_the_roof(monkeypatch):
    monkeypatch.setattr(roofs, "_matmul_seconds", lambda n, repeats: {"numpy": 2.0, "onednn-matmul": 1.0})
    r = roofs.calibrate(n=128, copy_mib=1, repeats=1)
    assert r.matmul_by == "onednn-matmul" and r.gflops == 2 * 128**3 / 1.0 / 1e9

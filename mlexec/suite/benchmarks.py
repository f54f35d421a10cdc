"""The suite's two benchmarks, run over every registered engine x case: latency, then peak memory.

Parametrized by the plugin (``mlexec.suite.plugin``: ids like
``test_forward[static-mlp-b32-d1024]``), so a new engine in ``engines.ENGINES``
is benchmarked without touching this file. A repository runs them by importing
them into one of its test modules, as ``benchmarks/test_engines.py`` does.
"""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from engines.ir.models import ABS_TOL, REL_TOL

from . import session
from .memory import BLAS_THREADS, MEMORY_CALLS, limit_bytes, warm_up


def test_forward(benchmark, bench, engine_name, case, roofs, request):
    engine = bench.engine(engine_name)          # built outside the timed call
    engine.forward(bench.x)                      # warm-up, also outside

    out = benchmark(engine.forward, bench.x)

    err = float(np.max(np.abs(out - bench.reference)))
    rel = float(np.linalg.norm(out - bench.reference) / np.linalg.norm(bench.reference))
    model = bench.model
    flops = model.flops(case.batch)
    report = getattr(engine, "report", dict)()
    info = dict(engine=engine_name, case=case.id, model=case.model, batch=case.batch, dim=case.dim,
                seq=case.seq, version=case.version, flops=flops,
                weight_bytes=engine.weight_bytes, activation_bytes=engine.activation_bytes,
                arena_bytes=report.get("arena_bytes", engine.activation_bytes),
                kernels=[f"{k['gemm']}: {k['kernel']}" for k in report.get("kernels", [])],
                max_abs_err=err, rel_err=rel, roof_gflops=roofs.gflops, roof_gbytes_per_s=roofs.gbytes_per_s,
                build_seconds=bench.build_seconds[engine_name])   # outside the timed call
    median = None
    if not benchmark.disabled:
        median = benchmark.stats.stats.median
        # Roofline: the weights must stream once, so time >= max(flops/peak, bytes/bandwidth).
        bound = max(flops / (roofs.gflops * 1e9), model.weight_bytes / (roofs.gbytes_per_s * 1e9))
        info.update(gflops=flops / median / 1e9, peak_fraction=roofs.fraction(flops, median),
                    roofline_fraction=bound / median)
    benchmark.extra_info.update(info)
    # the engine's bar on this model (int8's own, a quantized file's); a reference commit's engines may predate it
    abs_tol, rel_tol = getattr(engine, "tolerance", None) or (getattr(engine, "abs_tol", ABS_TOL),
                                                              getattr(engine, "rel_tol", REL_TOL))
    session.record(request.config, case.id, engine_name, median=median, err=err, tol=abs_tol,
                   held=engine.activation_bytes)
    assert err < abs_tol and rel < rel_tol, f"{engine_name} wrong on {case.id}: max abs {err:.2e}, rel {rel:.2e}"


@pytest.fixture
def pinned_engine(bench, engine_name, case, request):
    """Built and warmed up with BLAS pinned to one thread; the limit is set before the call."""
    engine = bench.engine(engine_name)
    with threadpool_limits(BLAS_THREADS):
        warm_up(engine, bench.x)
        limit = limit_bytes(engine, case.batch)
        # Engines that run on the caller's thread are judged on it alone: a framework's
        # pool left over from an earlier test (torch-compile) can malloc at any moment.
        request.node.add_marker(pytest.mark.limit_memory(f"{limit} B", current_thread_only=not engine.own_threads))
        session.record(request.config, case.id, engine_name, limit=limit)
        yield engine


def test_peak_memory(pinned_engine, bench):
    for _ in range(MEMORY_CALLS):
        pinned_engine.forward(bench.x)

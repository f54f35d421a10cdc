"""Per-test memray limits, derived from the engine and the model, never typed by hand.

limit = ``Engine.forward_peak_bytes(batch)``, the array bytes one warm forward
may allocate (0 for zero-allocation engines, the eager liveness bound for
naive, the no-reuse bound for peers whose allocator we don't control)
+ ``Engine.peak_slack_bytes``, what NumPy and Python (or a framework) allocate
around it.

The slack is measured, with BLAS pinned to one thread and after warm-up:
static and arena peak at 72-96 B on the MLPs and 824 B on the transformer
(the iterator state of the row-max reduction in softmax); naive peaks 1104 B
above its liveness bound. memray sees only malloc, and NumPy serves buffers
under 1 KiB from its own cache, so 1 KiB is the smallest temporary memray can
see: a slack of 1 KiB over zero (2 KiB over the eager bound) lets no visible
temporary through. Peers get 64 KiB for their allocators' bookkeeping
(torch at mlp-b1-d256 measured 5.2 KiB against a 3 KiB eager bound).
"""
from __future__ import annotations

import os
import platform
import tempfile

MEMORY_CALLS = 3         # forwards per measurement: the peak of one, with any growth between calls
BLAS_THREADS = 1         # BLAS pinned: a threaded sgemm allocates per call (about 512 KiB)


def limit_bytes(engine, batch: int) -> int:
    return engine.forward_peak_bytes(batch) + engine.peak_slack_bytes


def warm_up(engine, x, calls: int = 3) -> None:
    """Warm up under a throwaway memray tracker.

    The first forward that memray tracks in a process, on a given code path,
    sees a few hundred bytes of one-off interpreter growth (frame stacks,
    first-use caches); untracked warm-up calls don't retire it. Paying it
    here keeps it out of the measured test.
    """
    import memray

    with tempfile.TemporaryDirectory() as tmp:
        with memray.Tracker(os.path.join(tmp, "warm-up.bin")):
            for _ in range(calls):
                engine.forward(x)


def measure_peak(engine, x, calls: int = MEMORY_CALLS) -> int:
    """Peak heap bytes of ``calls`` warm forwards, counted as the memory pass counts them:
    memray's high-water mark, BLAS pinned, after a tracked warm-up; the caller's thread only
    unless the engine runs on a framework's own threads. Deterministic: one measurement is enough."""
    import memray
    from threadpoolctl import threadpool_limits

    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(BLAS_THREADS):
        warm_up(engine, x)
        path = os.path.join(tmp, "peak.bin")
        with memray.Tracker(path):
            for _ in range(calls):
                engine.forward(x)
        return high_watermark(path, main_thread_only=not engine.own_threads)


def high_watermark(capture: str, main_thread_only: bool) -> int:
    """Peak bytes of a memray capture, as pytest-memray's limit_memory counts them."""
    from memray import FileReader

    reader = FileReader(capture)
    main = reader.metadata.main_thread_id
    return sum(r.size for r in reader.get_high_watermark_allocation_records(merge_threads=not main_thread_only)
               if not main_thread_only or r.tid == main)


def allocation_environment() -> dict:
    """What decides the bytes a forward allocates: Python, NumPy, the BLAS libraries and the
    thread pinning of the memory pass. Not the CPU model: saved peaks match across CPUs."""
    import numpy

    # NumPy's own BLAS, as built; not whatever other BLAS an engine happened to load (MKL).
    blas = numpy.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return {"python": platform.python_version(), "numpy": numpy.__version__,
            "blas": f"{blas.get('name', '?')} {blas.get('version', '?')}", "blas_threads": BLAS_THREADS}

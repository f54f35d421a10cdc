"""kernels: each linear's GEMM chosen by measuring on the machine at hand, and remembered.

Why: no BLAS wins every product on every CPU. On an AMD EPYC host (AVX2),
NumPy's OpenBLAS took 28 us for 8 x 256 x 256 where oneDNN took 14, yet
oneDNN lost at 8 x 4096 x 4096; MKL's packed GEMM that wins on an Intel Xeon
ran at 0.46x naive there (docs/kernels.md). So an engine times the
candidates below for every GEMM-shaped step, at the rows it binds, and keeps
the fastest.

- **Candidates** (``KERNELS``, one entry per kernel): each computes
  ``y = x @ w + b (+ residual)`` into caller-owned memory as a list of bound
  calls ``(fn, args)``, allocating nothing per call. A BLAS gemm starts the
  output as the bias (``np.copyto``, no ufunc buffer) and accumulates with
  beta=1; NumPy's matmul writes ``out=`` and adds a pre-tiled bias. The
  ``-1t`` variants run the same call on one thread (the library's own
  set-threads call around it, ~0.1 us): at small products the pool's wake-up
  costs more than the second core gives. A candidate whose library is missing
  is left out, with the reason in ``unavailable()``.
- **Timing** (``measure``): after PARK_S idle (another engine's pool parks
  its workers; skipped right after a measurement of the same candidates)
  and a few untimed calls each, the candidates run on scratch arrays of the
  step's shape, in blocks of calls, interleaved in rotating
  order round after round as ``mlexec report`` interleaves engines, so a slow
  spell of the host falls on all of them; the median per candidate decides.
  A candidate whose fastest block is 2x slower than the best median after two
  rounds is dropped; past 0.6 s of timing the rounds stop at three.
- **Judged in the forward** (``Linears.rivals``/``judge``, ``BoundEngine.bind_judged``): a GEMM
  timed alone is not the GEMM in the forward, where its weights, its neighbours' data and pools
  share the cache and the cores. The kernels within 1.5x of the best alone (three at most) are
  timed again as the engine's whole warm forward at the batch it binds, one forward per rival,
  interleaved (``measure_forwards``), and the fastest there is kept (the choice alone unless
  another is 5 % faster) and cached under the same key; the packs of those that lost are dropped.
- **One pool per engine** (``candidates``): an engine is offered the kernels
  of one multi-thread pool (NumPy's OpenBLAS; OpenMP's, shared by MKL and oneDNN, for
  ``packed`` and ``onednn``: ``POOLS``) and
  any kernel on one thread, plus its own default, which it keeps unless
  another is KEEP_DEFAULT faster. Two pools alternating on two cores wait for
  each other's spinning workers: timed that way, two-thread kernels lost 2-10x
  and one-thread ones were chosen that lost in the forward (docs/kernels.md).
- **Cache**: the choices are kept per machine (CPU model and flags, library
  versions, thread count) in ``$MLEXEC_CACHE_DIR`` or
  ``$XDG_CACHE_HOME/mlexec`` (``~/.cache/mlexec``), one JSON file per machine,
  written atomically; a second build on the same machine measures nothing. Choices of what
  the table does not hold (the int8 engine's variants) go through the same cache
  (``cached_or_measured``).
  A measurement during which this process's threads waited for a core, or
  other processes used more than the cores its pool leaves spare
  (``BUSY_SHARE``), is used but not cached. So is one where no pool kernel gained over its own
  one-thread variant on a product where pools gain 1.5-2x (``choice.second_core_gain``): the
  pool's second core was gone while it was timed, and the fastest pool kernel runs.
- **Switch**: on by default. ``MLEXEC_TUNE=0`` measures nothing and uses each
  engine's fixed default (the choices made before tuning existed);
  ``MLEXEC_TUNE=again`` measures every GEMM afresh and overwrites the cache.
"""
from __future__ import annotations

from .cache import CACHE_ENV, cache_path, cpu_model, machine
from .choice import TUNE_ENV, Choice, Linears, cached_or_measured, choose, on_one_core, tuning_enabled
from .timing import measure, weight_copies
from .table import (KERNELS, PACK_ROWS, POOLS, Gemm, Kernel, bind, candidates, joined, on_one_thread, pool_threads,
                    unavailable)

__all__ = ["CACHE_ENV", "KERNELS", "PACK_ROWS", "POOLS", "TUNE_ENV", "Choice", "Gemm", "Kernel", "Linears", "bind",
           "cache_path", "cached_or_measured", "candidates", "choose", "cpu_model", "joined", "machine", "measure",
           "on_one_core", "on_one_thread", "pool_threads", "tuning_enabled", "unavailable", "weight_copies"]

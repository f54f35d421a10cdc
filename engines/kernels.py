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
  written atomically; a second build on the same machine measures nothing.
  A measurement during which this process's threads waited for a core
  (``BUSY_SHARE``: another process held one) is used but not cached.
- **Switch**: on by default. ``MLEXEC_TUNE=0`` measures nothing and uses each
  engine's fixed default (the choices made before tuning existed);
  ``MLEXEC_TUNE=again`` measures every GEMM afresh and overwrites the cache.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import platform
import re
import tempfile
import time
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

from .ops import aligned, tile, tiled_calls
from .threads import blas_threads

TUNE_ENV = "MLEXEC_TUNE"
# Settings that change which kernels a library runs on the same CPU, or how its pool waits between
# calls (passive OpenMP workers made two-thread kernels 10x slower at small products): part of the
# cache's key
KERNEL_ENV = ("OPENBLAS_CORETYPE", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
CACHE_ENV = "MLEXEC_CACHE_DIR"
CACHE_VERSION = 3           # bump when a kernel's calls change: older choices are then ignored
                            # (3: choices measured while the cores were busy are no longer cached)
BLOCK_SECONDS = 2e-4        # one timed block: long enough that perf_counter's cost is noise
ROUND_BUDGET_S = 0.12       # total timing per GEMM, spread over the rounds
MIN_ROUNDS, MAX_ROUNDS = 5, 41
CAP_S = 0.6                 # past this much timing per GEMM, stop after CAP_ROUNDS (large products)
CAP_ROUNDS = 3
PARK_S = 0.25               # idle before timing: longer than MKL's (200 ms) and OpenBLAS's (~0.1 s) spin
BACK_TO_BACK_S = 0.05       # no idle before a measurement of the same candidates that follows another
                            # this closely (one build's GEMMs): only their own pools can be spinning
SETTLE_CALLS, SETTLE_S = 2, 0.005   # untimed calls of each candidate after that (``_settle``)
DROP_AFTER, DROP_RATIO = 2, 2.0  # after this many rounds, drop candidates this much slower than the best
KEEP_DEFAULT = 0.05         # the engine's default stays unless another kernel is this much faster
# Weights from COLD_WEIGHT_BYTES up are timed cycling through copies making COLD_BYTES. With one
# 8 x 4096 x 4096 weight (64 MiB) reused, MKL's plain sgemm measured 3.0 ms against 3.4 for its
# packed GEMM and was chosen; in the forward, two such layers read from memory, it ran the MLP in
# 7.66 ms where the packed GEMM took 6.10 (Intel Xeon, docs/kernels.md).
COLD_WEIGHT_BYTES = 16 << 20
COLD_BYTES = 128 << 20
BUSY_SHARE = 0.25           # seconds per second this process's threads waited for a core while
                            # measuring, above which the choice is not cached (idle: 0.003; one
                            # busy process beside a two-thread matmul: 0.74, the matmul 3.6x slower)


def tuning_enabled() -> bool:
    """On unless ``MLEXEC_TUNE`` is 0 (off, false, no): each engine's fixed defaults then."""
    return os.environ.get(TUNE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@dataclass(frozen=True)
class Gemm:
    """One GEMM-shaped step: y (rows, n) = x (rows, k) @ w (k, n) + b (+ a residual of y's shape)."""
    rows: int
    k: int
    n: int
    transposed: bool = False     # w stored (n, k) and used through its transposed view
    residual: bool = False

    @property
    def key(self) -> str:
        return f"{self.rows}x{self.k}x{self.n}" + ("T" if self.transposed else "") + ("+res" if self.residual else "")


# ---------------------------------------------------------------- libraries, loaded once each

_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162   # CBLAS enums (mkl_cblas.h)
ONEDNN_PACKAGE = "onednn-cpu-gomp"       # oneDNN's CPU build on GNU OpenMP (the SYCL "onednn" wheel has no CPU engine)
_LIBS: dict[str, object] = {}
_WHY: dict[str, str] = {}


def _package_file(package: str, pattern: str) -> str | None:
    try:
        files = metadata.files(package) or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if re.fullmatch(pattern, f.name):
            return str(f.locate())
    return None


def _once(name: str, load: Callable[[], object]):
    """The library ``name`` loaded by ``load`` once per process; None (reason in _WHY) when it fails."""
    if name not in _LIBS and name not in _WHY:
        try:
            _LIBS[name] = load()
        except (OSError, AttributeError, ImportError, RuntimeError) as exc:
            _WHY[name] = str(exc)
    return _LIBS.get(name)


def _load_libdnnl() -> ctypes.CDLL:
    path = _package_file(ONEDNN_PACKAGE, r"libdnnl\.so\.\d+") or ctypes.util.find_library("dnnl")
    if path is None:
        raise ImportError("oneDNN is not installed (pip install -e .[onednn])")
    return ctypes.CDLL(path)


def onednn_library() -> ctypes.CDLL | None:
    """oneDNN's CPU library (GNU OpenMP build), loaded once per process; None without it."""
    return _once("libdnnl", _load_libdnnl)


def _load_onednn():
    lib = onednn_library()
    if lib is None:
        raise ImportError(_WHY["libdnnl"])
    fn = lib.dnnl_sgemm
    fn.restype = ctypes.c_int
    return fn


def _openblas_threads(package: str) -> tuple:
    """(set-threads, get-threads) of the OpenBLAS that ``package`` (numpy or scipy) loaded: the
    one in its wheel's ``<package>.libs`` folder, else the only OpenBLAS loaded."""
    from threadpoolctl import threadpool_info
    pools = [p for p in threadpool_info() if p.get("internal_api") == "openblas"]
    mine = [p for p in pools if f"{os.sep}{package}.libs{os.sep}" in p["filepath"]]
    for pool in mine or (pools if len(pools) == 1 else []):
        lib = ctypes.CDLL(pool["filepath"])
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_", "_64"):
                if hasattr(lib, f"{prefix}openblas_set_num_threads{suffix}"):
                    set_threads = lib[f"{prefix}openblas_set_num_threads{suffix}"]
                    set_threads.restype = None
                    return set_threads, lib[f"{prefix}openblas_get_num_threads{suffix}"]
    raise ImportError(f"cannot tell which OpenBLAS {package} uses")


def _one_thread(set_threads, get_threads, calls: tuple) -> None:
    """Run ``calls`` with a pool (OpenBLAS's, OpenMP's) on one thread, then give back the count
    found (which a caller's threadpoolctl limit may have set)."""
    before = get_threads()
    set_threads(1)
    for fn, args in calls:
        fn(*args)
    set_threads(before)


def _one_mkl_thread(set_local, calls: tuple) -> None:
    """Run ``calls`` with MKL on one thread (a setting of the calling thread only), then give back
    the setting found."""
    before = set_local(1)
    for fn, args in calls:
        fn(*args)
    set_local(before)


def _openmp_threads() -> tuple:
    """(set-threads, get-threads) over every OpenMP runtime oneDNN may be running on: the GNU
    OpenMP its library links, and any that a library loaded earlier put in the process's global
    scope, which oneDNN's calls then bind to instead (MKL's Intel OpenMP did, before MKL ran on
    GNU's; PyTorch's own copy of GNU OpenMP can)."""
    lib = onednn_library()
    if lib is None:
        raise ImportError(_WHY["libdnnl"])
    runtimes = []
    for handle in (lib, ctypes.CDLL(None)):
        try:
            fns = handle.omp_set_num_threads, handle.omp_get_max_threads
        except AttributeError:
            continue
        if all(ctypes.cast(fns[0], ctypes.c_void_p).value != ctypes.cast(r[0], ctypes.c_void_p).value
               for r in runtimes):
            fns[0].restype = None
            runtimes.append(fns)
    if len(runtimes) == 1:
        return runtimes[0]

    def set_threads(n: int) -> None:
        for set_one, _ in runtimes:
            set_one(n)
    return set_threads, runtimes[0][1]


def _load_mkl_rt():
    from .packed import _load_mkl     # MKL's runtime, typed for the packed GEMM, loaded once
    return _load_mkl()


def _scipy_blas():
    from scipy.linalg.blas import sgemm, sgemv
    return sgemm, sgemv


# ---------------------------------------------------------------- the candidates

class _Pointer(ctypes.c_void_p):
    """An array's address that keeps the array alive as long as the bound call holding it."""
    __slots__ = ("array",)


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    p = _Pointer(a.ctypes.data)
    p.array = a
    return p


def _bias_start(y2, b, residual) -> list:
    """The output started as bias (+ residual), for a gemm with beta=1 to accumulate onto."""
    calls = [(np.copyto, (y2, b))]                     # copyto: no ufunc buffer
    return calls + ([] if residual is None else [(np.add, (y2, residual, y2))])


def _numpy_calls(x2, y2, w, b, b_tiled, residual, _state) -> list:
    calls = [(np.matmul, (x2, w, y2))] + tiled_calls(np.add, y2, b_tiled)
    return calls + ([] if residual is None else [(np.add, (y2, residual, y2))])


def _scipy_calls(x2, y2, w, b, b_tiled, residual, _state) -> list:
    sgemm, sgemv = _LIBS["scipy"]
    calls = _bias_start(y2, b, residual)
    trans = 0 if w.flags.c_contiguous else 1          # w.T Fortran (n, k), or w itself Fortran (k, n)
    a = w.T if trans == 0 else w
    if y2.shape[0] == 1:                               # y += W.T @ x
        return calls + [(sgemv, (1.0, a, x2[0], 1.0, y2[0], 0, 1, 0, 1, trans, 1))]
    return calls + [(sgemm, (1.0, a, x2.T, 1.0, y2.T, trans, 0, 1))]   # y.T += W.T @ x.T, Fortran views


def _ld(a: np.ndarray) -> int:
    return a.strides[0] // a.itemsize


def _w_layout(w) -> tuple[int, int]:
    """(CBLAS transpose flag, leading dimension) of w (k, n) as a row-major B operand."""
    return (_NO_TRANS, _ld(w)) if w.flags.c_contiguous else (_TRANS, w.strides[1] // w.itemsize)


def _mkl_gemm_calls(x2, y2, w, b, b_tiled, residual, _state) -> list:
    rows, (k, n) = y2.shape[0], w.shape
    tb, ldb = _w_layout(w)
    return _bias_start(y2, b, residual) + [(_LIBS["mkl"].sgemm, (
        _ROW_MAJOR, _NO_TRANS, tb, rows, n, k, ctypes.c_float(1.0), _ptr(x2), _ld(x2), _ptr(w), ldb,
        ctypes.c_float(1.0), _ptr(y2), _ld(y2)))]


PACK_ROWS = 128   # MKL packs for a row count; packed for 128 it served 8-1024 rows as well as any (packed.py)


def _mkl_pack(w: np.ndarray) -> np.ndarray:
    from .ops import aligned_empty
    lib, (k, n) = _LIBS["mkl"], w.shape
    size = lib.cblas_sgemm_pack_get_size(_B_MATRIX, PACK_ROWS, n, k)
    dest = aligned_empty(size, np.uint8)
    tb, ldb = _w_layout(w)
    lib.cblas_sgemm_pack(_ROW_MAJOR, _B_MATRIX, tb, PACK_ROWS, n, k, 1.0, w.ctypes.data, ldb, dest.ctypes.data)
    return dest


def _mkl_packed_calls(x2, y2, w, b, b_tiled, residual, packed) -> list:
    rows, (k, n) = y2.shape[0], w.shape
    return _bias_start(y2, b, residual) + [(_LIBS["mkl"].sgemm_compute, (
        _ROW_MAJOR, _NO_TRANS, _PACKED, rows, n, k, _ptr(x2), _ld(x2), _ptr(packed), n,
        ctypes.c_float(1.0), _ptr(y2), _ld(y2)))]


def _onednn_calls(x2, y2, w, b, b_tiled, residual, _state) -> list:
    rows, (k, n), i64 = y2.shape[0], w.shape, ctypes.c_int64
    tb, ldb = _w_layout(w)
    return _bias_start(y2, b, residual) + [(_LIBS["onednn"], (
        ctypes.c_char(b"N"), ctypes.c_char(b"N" if tb == _NO_TRANS else b"T"), i64(rows), i64(n), i64(k),
        ctypes.c_float(1.0), _ptr(x2), i64(_ld(x2)), _ptr(w), i64(ldb), ctypes.c_float(1.0), _ptr(y2),
        i64(_ld(y2))))]


def _onednn(name: str) -> Callable:
    """``engines.onednn``'s function ``name``, imported on its first call (that module imports this one)."""
    def call(*args):
        from . import onednn
        return getattr(onednn, name)(*args)
    return call


@dataclass(frozen=True)
class Kernel:
    """One way to run a linear. ``calls(x2, y2, w, b, b_tiled, residual, state)`` returns the bound
    calls; ``prepare(w)`` makes ``state`` once per weight (MKL's packed form), or None."""
    library: str                                   # what must load for it (``available``)
    calls: Callable
    prepare: Callable | None = None
    one_thread: str | None = None                  # the pool to pin to one thread around the call
    # Allocates native memory on every call (oneDNN's sgemm: 74 KB at 64 x 256 x 256, 1-2 MB at
    # 128 x 1024 x 1024 under memray, pinned or not): not for engines that promise zero allocation
    allocates: bool = False
    # Whether it runs a Gemm allocating nothing per call on this CPU (None: everywhere); where it
    # does not, it is no candidate for that Gemm
    fits: Callable | None = None


_LOADERS: dict[str, Callable[[], object]] = {
    "numpy": lambda: np,
    "scipy": _scipy_blas,
    "mkl": _load_mkl_rt,
    "onednn": _load_onednn,
    "onednn-primitives": _onednn("library"),
    "numpy-threads": lambda: _openblas_threads("numpy"),
    "scipy-threads": lambda: _openblas_threads("scipy"),
    "openmp-threads": _openmp_threads,
}


def _load(library: str):
    return _once(library, _LOADERS[library])


KERNELS: dict[str, Kernel] = {
    "numpy": Kernel("numpy", _numpy_calls),
    "numpy-1t": Kernel("numpy", _numpy_calls, one_thread="numpy-threads"),
    "scipy": Kernel("scipy", _scipy_calls),
    "scipy-1t": Kernel("scipy", _scipy_calls, one_thread="scipy-threads"),
    "mkl-gemm": Kernel("mkl", _mkl_gemm_calls),
    "mkl-gemm-1t": Kernel("mkl", _mkl_gemm_calls, one_thread="mkl"),
    "mkl-packed": Kernel("mkl", _mkl_packed_calls, prepare=_mkl_pack),
    "mkl-packed-1t": Kernel("mkl", _mkl_packed_calls, prepare=_mkl_pack, one_thread="mkl"),
    "onednn": Kernel("onednn", _onednn_calls, allocates=True),
    "onednn-matmul": Kernel("onednn-primitives", _onednn("matmul_calls"), prepare=_onednn("matmul_weights"),
                            fits=_onednn("matmul_fits")),
    "onednn-matmul-1t": Kernel("onednn-primitives", _onednn("matmul_calls"), prepare=_onednn("matmul_weights"),
                               fits=_onednn("matmul_fits"), one_thread="openmp-threads"),
}


# The thread pool each library's multi-thread kernels run on. MKL runs on GNU OpenMP (``packed``
# sets its threading layer), the runtime oneDNN's CPU build links, so the two share one pool.
POOLS = {"numpy": "NumPy's OpenBLAS", "scipy": "SciPy's OpenBLAS", "mkl": "OpenMP", "onednn": "OpenMP",
         "onednn-primitives": "OpenMP"}


def candidates(*libraries: str, exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What an engine may choose: the multi-thread kernels of ``libraries``, which must share
    one thread pool, any library's on one thread, none that allocates per call. One multi-thread
    pool per engine: two pools called alternately on two cores wait for each other's spinning
    workers (NumPy's and SciPy's OpenBLAS ran 32 x 1024 x 1024 in 3.9 and 4.1 ms alternately
    against 0.44 ms alone, Intel Xeon), in the forward as in the timing that chooses."""
    if len({POOLS[lib] for lib in libraries}) != 1:
        raise ValueError(f"{', '.join(libraries)} do not share one thread pool")
    return tuple(n for n, k in KERNELS.items() if not k.allocates and k.library not in exclude
                 and (k.one_thread is not None or k.library in libraries))


def unavailable() -> dict[str, str]:
    """Kernel name -> why it cannot run here (its library is missing)."""
    out = {}
    for name, kernel in KERNELS.items():
        for lib in (kernel.library, kernel.one_thread):
            if lib is not None and _load(lib) is None:
                out[name] = _WHY.get(lib, f"{lib} did not load")
                break
    return out


def bind(name: str, x2, y2, w, b, b_tiled, residual, state=None) -> list:
    """The calls of kernel ``name`` for y2 = x2 @ w + b (+ residual)."""
    kernel = KERNELS[name]
    for library in (kernel.library, kernel.one_thread):
        if library is not None and _load(library) is None:
            raise RuntimeError(f"kernel {name!r} cannot run here: {_WHY.get(library)}")
    if kernel.one_thread is None:
        return kernel.calls(x2, y2, w, b, b_tiled, residual, state)
    # made on one thread too: oneDNN splits a primitive's work for the threads it sees when made
    made = []
    make = (lambda: made.extend(kernel.calls(x2, y2, w, b, b_tiled, residual, state)), ())
    _run(on_one_thread(kernel.one_thread, [make]))
    return on_one_thread(kernel.one_thread, made)


def on_one_thread(pool: str, calls: list) -> list:
    """``calls`` as one bound call that runs them with ``pool`` (a ``one_thread`` name: "mkl",
    "numpy-threads", "scipy-threads", "openmp-threads") at one thread, then gives its count back."""
    if _load(pool) is None:
        raise RuntimeError(f"cannot set {pool} to one thread here: {_WHY.get(pool)}")
    if pool == "mkl":
        return [(_one_mkl_thread, (_LIBS["mkl"].MKL_Set_Num_Threads_Local, tuple(calls)))]
    return [(_one_thread, (*_LIBS[pool], tuple(calls)))]


# ---------------------------------------------------------------- measuring

def _run(calls) -> None:
    for fn, args in calls:
        fn(*args)


def _settle(calls) -> None:
    """Untimed calls: SETTLE_CALLS, and for SETTLE_S at least."""
    end = time.perf_counter() + SETTLE_S
    for _ in range(SETTLE_CALLS):
        _run(calls)
    while time.perf_counter() < end:
        _run(calls)


def waiting_seconds() -> float | None:
    """Seconds this process's threads have been ready to run but waiting for a core (Linux's
    /proc/self/task/*/schedstat), or None where that cannot be read. Unlike the host's CPU
    counters it sees only contention for the cores this process runs on."""
    total, seen = 0, False
    for task in Path("/proc/self/task").glob("*/schedstat") if Path("/proc/self/task").is_dir() else ():
        try:
            total += int(task.read_text().split()[1])
            seen = True
        except (OSError, ValueError, IndexError):
            pass                                    # a thread that ended meanwhile
    return total / 1e9 if seen else None


def weight_copies(gemm: Gemm) -> int:
    """How many weight matrices a measurement cycles through: one, or from COLD_WEIGHT_BYTES up
    enough to make COLD_BYTES, so that each call reads its weights from memory as a forward
    over a large model's layers does, not from the cache the previous call warmed."""
    nbytes = 4 * gemm.k * gemm.n
    return 1 if nbytes < COLD_WEIGHT_BYTES else -(-COLD_BYTES // nbytes)


_last_measured: list = [None, 0.0]                  # [candidates, when] of this process's last measurement


def measure(gemm: Gemm, names: list[str], budget_s: float = ROUND_BUDGET_S) -> dict[str, float]:
    """Median seconds per call of each candidate on scratch arrays shaped like ``gemm`` (large
    weights cold: ``weight_copies``), timed in blocks interleaved in rotating order after PARK_S
    idle and each candidate's settling calls; a candidate far behind is dropped early (inf)."""
    rng = np.random.default_rng(0)
    def normal(*shape):
        return aligned(rng.standard_normal(shape, dtype=np.float32))
    x, b = normal(gemm.rows, gemm.k), normal(gemm.n)
    b_tiled = tile(b, gemm.rows)
    residual = normal(gemm.rows, gemm.n) if gemm.residual else None
    y = aligned(np.zeros((gemm.rows, gemm.n)))
    w = normal(gemm.n, gemm.k).T if gemm.transposed else normal(gemm.k, gemm.n)
    weights = [w] + [aligned(w.T).T if gemm.transposed else aligned(w) for _ in range(weight_copies(gemm) - 1)]
    # per prepare: one state per weight (MKL's packs), shared by a kernel and its one-thread
    # variant as Linears shares them
    states = {None: [None] * len(weights)}
    bound = {}                                      # name -> calls (their pointers hold the states)
    for name in names:
        kernel = KERNELS[name]
        if kernel.prepare not in states:
            states[kernel.prepare] = [kernel.prepare(m) for m in weights]
        bound[name] = [c for m, state in zip(weights, states[kernel.prepare])
                       for c in bind(name, x, y, m, b, b_tiled, residual, state)]
    one = {}
    for name, calls in bound.items():               # warm up, and size the blocks
        _run(calls)
        t0 = time.perf_counter()
        _run(calls)
        one[name] = max(time.perf_counter() - t0, 1e-7)
    per_call = max(one.values())
    reps = max(1, int(BLOCK_SECONDS / per_call))
    rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, budget_s / (reps * sum(one.values())))))
    times: dict[str, list[float]] = {name: [] for name in bound}
    alive = list(bound)
    if _last_measured[0] != alive or time.perf_counter() - _last_measured[1] > BACK_TO_BACK_S:
        time.sleep(PARK_S)                          # what ran before (another engine) parks its pool
    for calls in bound.values():
        _settle(calls)                              # then every candidate warm, the pool spinning again
    start = time.perf_counter()
    for r in range(rounds):
        if r >= CAP_ROUNDS and time.perf_counter() - start > CAP_S:
            break
        order = alive[r % len(alive):] + alive[:r % len(alive)]
        for name in (order if r % 2 == 0 else order[::-1]):
            calls = bound[name]
            t0 = time.perf_counter()
            for _ in range(reps):
                _run(calls)
            times[name].append((time.perf_counter() - t0) / reps)
        if r + 1 == DROP_AFTER and len(alive) > 2:
            # by its fastest block: one block that waited for a core (another process, say)
            # must not drop the candidate that wins everywhere else
            best = min(np.median(times[n]) for n in alive)
            alive = [n for n in alive if min(times[n]) <= DROP_RATIO * best]
    _last_measured[:] = [list(bound), time.perf_counter()]
    copies = len(weights)
    return {name: float(np.median(t)) / copies if name in alive else float("inf") for name, t in times.items()}


# ---------------------------------------------------------------- the cache

def machine() -> dict:
    """What a choice depends on: CPU model and flags, library versions, thread count, and the
    settings that cap a library's instruction set (``KERNEL_ENV``)."""
    cpu, flags = platform.processor() or platform.machine(), ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.*)$", text, re.M).group(1).strip()
        flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M).group(1).strip()
    except (OSError, AttributeError):
        pass
    versions = {}
    for package in ("numpy", "scipy", "mkl", ONEDNN_PACKAGE):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"cpu": cpu, "flags_sha1": hashlib.sha1(flags.encode()).hexdigest()[:12], "versions": versions,
            "threads": blas_threads(), "cache_version": CACHE_VERSION,
            "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}}


def cpu_model() -> str:
    return machine()["cpu"]


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlexec"


def cache_path() -> Path:
    digest = hashlib.sha1(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"kernels-{digest}.json"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data["choices"] if isinstance(data.get("choices"), dict) else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


def _write_cache(path: Path, choices: dict) -> None:
    """Merge ``choices`` into the file atomically (temp file + rename); a cache that cannot be
    written only costs the next build its measuring."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_read_cache(path), **choices}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"machine": machine(), "choices": merged}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


@dataclass
class Choice:
    kernel: str
    how: str                                        # "measured", "measured while busy ...", "cached",
                                                    # or "default (MLEXEC_TUNE off)"
    default: str                                    # what the engine runs untuned
    times_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0                            # spent measuring


_MEMO: dict[tuple, Choice] = {}                     # this process's choices: (gemm key, candidates)


def choose(gemm: Gemm, candidates: tuple[str, ...], default: str) -> Choice:
    """The fastest of ``candidates`` and ``default`` for ``gemm`` on this machine: from the cache,
    else measured (and cached). ``default`` unless another is KEEP_DEFAULT faster, and when
    tuning is off or nothing can run."""
    runnable = [c for c in dict.fromkeys((*candidates, default))
                if c not in unavailable() and (KERNELS[c].fits is None or KERNELS[c].fits(gemm))]
    if not tuning_enabled() or not runnable:
        return Choice(default, f"default ({TUNE_ENV} off)" if not tuning_enabled() else "default", default)
    entry = f"{gemm.key}|{','.join(runnable)}"
    memo_key = (str(cache_path()), entry)
    if memo_key in _MEMO:                           # measured by an earlier build: nothing spent now
        return replace(_MEMO[memo_key], seconds=0.0)
    path = cache_path()
    cached = None if os.environ.get(TUNE_ENV, "").strip().lower() == "again" else _read_cache(path).get(entry)
    if isinstance(cached, dict) and cached.get("kernel") in runnable:
        times = {n: float("inf") if t is None else float(t) for n, t in dict(cached.get("times_s", {})).items()}
        choice = Choice(cached["kernel"], "cached", default, times)
    else:
        t0, waited0 = time.perf_counter(), waiting_seconds()
        times = measure(gemm, runnable) if len(runnable) > 1 else {runnable[0]: float("nan")}
        seconds, waited1 = time.perf_counter() - t0, waiting_seconds()
        best = min(times, key=times.get)
        if default in times and times[default] <= (1 + KEEP_DEFAULT) * times[best]:    # ties included
            best = default
        # Measured while other work held the cores, a two-thread kernel waits for its second core
        # and a one-thread one wins: right for now, wrong for every later build on an idle
        # machine (a 512 x 256 x 1024 linear cached that way ran at half speed). Used, not cached.
        busy = None if None in (waited0, waited1) else (waited1 - waited0) / max(seconds, 1e-3)
        if busy is not None and busy > BUSY_SHARE:
            choice = Choice(best, f"measured while busy (threads waited {busy:.2f} s/s for a core), "
                            "not cached", default, times, seconds)
        else:
            choice = Choice(best, "measured", default, times, seconds)
            _write_cache(path, {entry: {"kernel": best, "times_s": {n: (t if np.isfinite(t) else None)
                                                                    for n, t in times.items()}}})
    _MEMO[memo_key] = choice
    return choice


class Linears:
    """The linears of one engine: each one's kernel chosen (``choose``), its calls bound, its
    per-weight state (MKL's packs) made once, and every choice kept for ``report``."""

    def __init__(self, candidates: tuple[str, ...], default: Callable[[Gemm], str]):
        self.candidates = candidates
        self.default = default
        self.states: dict[tuple[str, int], object] = {}     # (kernel, id(weight)) -> prepared state
        self.choices: dict[str, Choice] = {}                 # gemm key -> choice

    def calls(self, x2, y2, w, b, b_tiled, residual) -> list:
        gemm = Gemm(y2.shape[0], *w.shape, transposed=not w.flags.c_contiguous, residual=residual is not None)
        unit = x2.strides[1] == y2.strides[1] == x2.itemsize
        candidates = self.candidates if unit else ("numpy",)
        choice = choose(gemm, candidates, self.default(gemm) if unit else "numpy")
        self.choices.setdefault(gemm.key, choice)      # a second linear of that shape: the memo, 0 s
        kernel = KERNELS[choice.kernel]
        state = None
        if kernel.prepare is not None:
            key = (kernel.library, id(w))
            if key not in self.states:
                self.states[key] = kernel.prepare(w)
            state = self.states[key]
        return bind(choice.kernel, x2, y2, w, b, b_tiled, residual, state)

    @property
    def state_bytes(self) -> int:
        return sum(getattr(s, "nbytes", 0) for s in self.states.values())

    def report(self) -> list[dict]:
        """Per GEMM: the kernel chosen, how, and what every candidate measured (microseconds)."""
        return [{"gemm": key, "kernel": c.kernel, "how": c.how, "default": c.default, "tuning_s": round(c.seconds, 4),
                 "candidates_us": {n: (None if not np.isfinite(t) else round(1e6 * t, 2))
                                   for n, t in c.times_s.items()}}
                for key, c in self.choices.items()]

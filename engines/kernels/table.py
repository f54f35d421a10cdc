"""The candidate kernels: one ``Kernel`` entry per way to run a linear, the libraries each needs
(loaded once through ``engines.native``), the thread pools they run on, and their bound calls."""
from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir.calls import tiled_calls
from ..memory import aligned_empty
from ..native import mkl, onednn, openblas, openmp

@dataclass(frozen=True)
class Gemm:
    """One GEMM-shaped step: y (rows, n) = x (rows, k) @ w (k, n) + b (+ a residual of y's shape)."""
    rows: int
    k: int
    n: int
    transposed: bool = False     # w stored (n, k) and used through its transposed view
    residual: bool = False

    @property
    def work(self) -> int:
        """Its multiply-adds."""
        return self.rows * self.k * self.n

    @property
    def key(self) -> str:
        return f"{self.rows}x{self.k}x{self.n}" + ("T" if self.transposed else "") + ("+res" if self.residual else "")



# ---------------------------------------------------------------- libraries, loaded once each

_LIBS: dict[str, object] = {}
_WHY: dict[str, str] = {}


def _once(name: str, load: Callable[[], object]):
    """The library ``name`` loaded by ``load`` once per process; None (reason in _WHY) when it fails."""
    if name not in _LIBS and name not in _WHY:
        try:
            _LIBS[name] = load()
        except (OSError, AttributeError, ImportError, RuntimeError) as exc:
            _WHY[name] = str(exc)
    return _LIBS.get(name)


def _one_thread(set_threads, get_threads, calls: tuple) -> None:
    """Run ``calls`` with a pool (OpenBLAS's, OpenMP's) on one thread, then give back the count
    found (which a caller's threadpoolctl limit may have set)."""
    before = get_threads()
    if before != 1:
        set_threads(1)
    try:
        for fn, args in calls:
            fn(*args)
    finally:                              # a call that raises must not leave the pool at one thread
        if before != 1:
            set_threads(before)


def _one_mkl_thread(set_local, calls: tuple) -> None:
    """Run ``calls`` with MKL on one thread (a setting of the calling thread only), then give back
    the setting found."""
    before = set_local(1)
    try:
        for fn, args in calls:
            fn(*args)
    finally:
        set_local(before)



_ONE_THREAD_CALLS = (_one_thread, _one_mkl_thread)     # (fn, (*how to set the pool, calls))


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


def _held_nk(w: np.ndarray) -> np.ndarray:
    """w (k, n) held again as (n, k), C-contiguous: NumPy's one-row product on its transposed view
    is n dot products of contiguous rows, and its pool splits them into two contiguous halves
    (on (k, n) each thread reads every row's half: page-sized pieces at 2048 columns)."""
    return np.ascontiguousarray(w.T)


def _numpy_nk_calls(x2, y2, w, b, b_tiled, residual, w_nk) -> list:
    return _numpy_calls(x2, y2, w_nk.T, b, b_tiled, residual, None)


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
    return (mkl.NO_TRANS, _ld(w)) if w.flags.c_contiguous else (mkl.TRANS, w.strides[1] // w.itemsize)


def _mkl_gemm_calls(x2, y2, w, b, b_tiled, residual, _state) -> list:
    rows, (k, n) = y2.shape[0], w.shape
    tb, ldb = _w_layout(w)
    return _bias_start(y2, b, residual) + [(_LIBS["mkl"].sgemm, (
        mkl.ROW_MAJOR, mkl.NO_TRANS, tb, rows, n, k, ctypes.c_float(1.0), _ptr(x2), _ld(x2), _ptr(w), ldb,
        ctypes.c_float(1.0), _ptr(y2), _ld(y2)))]


PACK_ROWS = 128   # MKL packs for a row count; packed for 128 it served 8-1024 rows as well as any (packed.py)


def _mkl_pack(w: np.ndarray) -> np.ndarray:
    lib, (k, n) = _LIBS["mkl"], w.shape
    size = lib.cblas_sgemm_pack_get_size(mkl.B_MATRIX, PACK_ROWS, n, k)
    dest = aligned_empty(size, np.uint8)
    tb, ldb = _w_layout(w)
    lib.cblas_sgemm_pack(mkl.ROW_MAJOR, mkl.B_MATRIX, tb, PACK_ROWS, n, k, 1.0, w.ctypes.data, ldb, dest.ctypes.data)
    return dest


def _mkl_packed_calls(x2, y2, w, b, b_tiled, residual, packed) -> list:
    rows, (k, n) = y2.shape[0], w.shape
    return _bias_start(y2, b, residual) + [(_LIBS["mkl"].sgemm_compute, (
        mkl.ROW_MAJOR, mkl.NO_TRANS, mkl.PACKED, rows, n, k, _ptr(x2), _ld(x2), _ptr(packed), n,
        ctypes.c_float(1.0), _ptr(y2), _ld(y2)))]


def _onednn_calls(x2, y2, w, b, b_tiled, residual, _state) -> list:
    rows, (k, n), i64 = y2.shape[0], w.shape, ctypes.c_int64
    tb, ldb = _w_layout(w)
    return _bias_start(y2, b, residual) + [(_LIBS["onednn"], (
        ctypes.c_char(b"N"), ctypes.c_char(b"N" if tb == mkl.NO_TRANS else b"T"), i64(rows), i64(n), i64(k),
        ctypes.c_float(1.0), _ptr(x2), i64(_ld(x2)), _ptr(w), i64(ldb), ctypes.c_float(1.0), _ptr(y2),
        i64(_ld(y2))))]


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
    # The Gemms it is a candidate for at all (None: every one), where it can win and allocates
    # nothing: ``numpy-nk``'s one-row products on weights that may stay in cache
    only_for: Callable | None = None

    def offered_for(self, gemm: Gemm) -> bool:
        return (self.only_for is None or self.only_for(gemm)) and (self.fits is None or self.fits(gemm))


# ``numpy-nk``: a one-row linear's weights held again as (n, k), NumPy's GEMV on them. An mlp's two
# linears, two threads, AMD EPYC with AVX-512: 1.4x as fast as on (k, n) at 1 x 1024 (67 against
# 95 us) and, in some phases of the host, at 1 x 2048 (304-326 against 430-475 us; in others
# 0.85x: 32 MiB of weights in its 32 MiB L3); level at 1 x 4096 (from DRAM either way), 0.94x at
# 1 x 256, 0.73-0.75x at 8 rows (docs/kernels.md). Offered at one row (from two, NumPy's product
# on the transposed view allocates: 49 KiB at 8 x 1024 x 512) on weights of up to CACHED_BYTES:
# beyond, the copy doubles a large weight's memory for nothing.
CACHED_BYTES = 16 << 20     # a one-row product's weights up to this size may stay in cache (the AMD
                            # EPYC's L3 of 32 MiB holds two); beyond, they stream from memory


def streams(nbytes: int) -> bool:
    """Whether a weight of ``nbytes`` streams from memory in a forward (``CACHED_BYTES`` or more):
    the kernel timing reads it cold (``timing.weight_copies``), and an engine of OpenMP's pool
    puts an MLP of such one-row linears on OpenBLAS's (``FusedEngine.on_openblas``)."""
    return nbytes >= CACHED_BYTES


def _cached_gemv(gemm: Gemm) -> bool:
    return gemm.rows == 1 and 4 * gemm.k * gemm.n <= CACHED_BYTES


_LOADERS: dict[str, Callable[[], object]] = {
    "numpy": lambda: np,
    "scipy": _scipy_blas,
    "mkl": mkl.load,
    "onednn": onednn.sgemm,
    "onednn-primitives": onednn.library,
    "numpy-threads": lambda: openblas.threads("numpy"),
    "scipy-threads": lambda: openblas.threads("scipy"),
    "openmp-threads": lambda: openmp.threads(onednn.load()),
}


def _load(library: str):
    return _once(library, _LOADERS[library])


KERNELS: dict[str, Kernel] = {
    "numpy": Kernel("numpy", _numpy_calls),
    "numpy-1t": Kernel("numpy", _numpy_calls, one_thread="numpy-threads"),
    "numpy-nk": Kernel("numpy", _numpy_nk_calls, prepare=_held_nk, only_for=_cached_gemv),
    "numpy-nk-1t": Kernel("numpy", _numpy_nk_calls, prepare=_held_nk, only_for=_cached_gemv,
                          one_thread="numpy-threads"),
    "scipy": Kernel("scipy", _scipy_calls),
    "scipy-1t": Kernel("scipy", _scipy_calls, one_thread="scipy-threads"),
    "mkl-gemm": Kernel("mkl", _mkl_gemm_calls),
    "mkl-gemm-1t": Kernel("mkl", _mkl_gemm_calls, one_thread="mkl"),
    "mkl-packed": Kernel("mkl", _mkl_packed_calls, prepare=_mkl_pack),
    "mkl-packed-1t": Kernel("mkl", _mkl_packed_calls, prepare=_mkl_pack, one_thread="mkl"),
    "onednn": Kernel("onednn", _onednn_calls, allocates=True),
    "onednn-matmul": Kernel("onednn-primitives", onednn.matmul_calls, prepare=onednn.primitive_weights,
                            fits=onednn.matmul_fits),
    "onednn-matmul-1t": Kernel("onednn-primitives", onednn.matmul_calls, prepare=onednn.primitive_weights,
                               fits=onednn.matmul_fits, one_thread="openmp-threads"),
    "onednn-ip": Kernel("onednn-primitives", onednn.inner_product_calls, prepare=onednn.primitive_weights,
                        fits=onednn.inner_product_fits),
    "onednn-ip-1t": Kernel("onednn-primitives", onednn.inner_product_calls, prepare=onednn.primitive_weights,
                           fits=onednn.inner_product_fits, one_thread="openmp-threads"),
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
    run_calls(on_one_thread(kernel.one_thread, [make]))
    return on_one_thread(kernel.one_thread, made)


def on_one_thread(pool: str, calls: list) -> list:
    """``calls`` as one bound call that runs them with ``pool`` (a ``one_thread`` name: "mkl",
    "numpy-threads", "scipy-threads", "openmp-threads") at one thread, then gives its count back."""
    if _load(pool) is None:
        raise RuntimeError(f"cannot set {pool} to one thread here: {_WHY.get(pool)}")
    if pool == "mkl":
        return [(_one_mkl_thread, (_LIBS["mkl"].MKL_Set_Num_Threads_Local, tuple(calls)))]
    return [(_one_thread, (*_LIBS[pool], tuple(calls)))]


def joined(calls) -> tuple:
    """``calls`` with each run of adjacent one-thread calls of the same pool made one call: the
    pool set to one thread once for the run, not once per call. What runs, and in what order, is
    unchanged. An int8 linear's scale and quantize calls are two such calls (mlp b1 d1024, two
    linears: 30.7 -> 29.1 us a forward in one process, docs/int8.md)."""
    out: list = []
    for fn, args in calls:
        last = out[-1] if out else (None, ())
        if fn in _ONE_THREAD_CALLS and last[0] is fn and last[1][:-1] == args[:-1]:
            out[-1] = (fn, (*args[:-1], last[1][-1] + tuple(args[-1])))
        else:
            out.append((fn, args))
    return tuple(out)


@contextlib.contextmanager
def one_thread(pool: str):
    """``pool`` (as in ``on_one_thread``, not "mkl") at one thread inside the block, then its count
    back: for what reads the count when it is made (oneDNN sizes a primitive's work then)."""
    if pool == "mkl" or _load(pool) is None:
        raise RuntimeError(f"cannot set {pool} to one thread here: {_WHY.get(pool, 'a per-call setting')}")
    set_threads, get_threads = _LIBS[pool]
    before = get_threads()
    set_threads(1)
    try:
        yield
    finally:
        set_threads(before)


def pool_threads(pool: str) -> int:
    """The threads a ``one_thread`` pool other than "mkl" (see ``on_one_thread``) runs on now."""
    if pool == "mkl" or _load(pool) is None:
        raise RuntimeError(f"cannot read {pool}'s threads here: {_WHY.get(pool, 'a per-thread setting')}")
    return int(_LIBS[pool][1]())


def run_calls(calls) -> None:
    for fn, args in calls:
        fn(*args)


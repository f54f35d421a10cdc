"""How long GNU OpenMP's idle workers spin before they sleep, set before the runtime loads.

MKL (``packed``) and oneDNN (``onednn``, and ``onednn-matmul`` in any engine) run on GNU OpenMP.
Its workers spin 300,000 rounds after a parallel region before they sleep (``GOMP_SPINCOUNT``'s
default when ``OMP_WAIT_POLICY`` is unset): long enough that the code the process runs next, on two
cores, waits for a core. Too short a spin (or ``OMP_WAIT_POLICY=passive``) lets the workers sleep
between the regions of one forward, and the engine itself slows. ``SPINCOUNT`` lies between: the
code after the engine pays little, and the engine stays within its process-to-process spread.
``choose()`` sets it unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is already set (the switch:
set either to keep another behaviour); ``CHOICE`` says what was done.

Once MKL or oneDNN has loaded it, ``pin_workers`` binds each worker thread of the pool to one CPU,
leaving the calling thread free (as ONNX Runtime binds its pool's threads and not the caller's).
Unbound, after an idle pause of 100 ms or more a woken worker was placed on the caller's core,
where the caller spinning at the region's barrier held that core for a scheduler slice: the next
forward of a small transformer took 5-10 ms instead of 0.3 (docs/kernels.md, "After an idle pause").
A caller on a worker's CPU shares that core with the worker until the scheduler moves it, each
region waiting for a time slice (a fresh process timed the pool at 430-570 us a call where it
takes 13): ``step_aside`` moves it off, once the workers are bound and before every timing, and
``keep_aside`` at the start of each forward on the pool, where a worker's wake-up may have brought
it back (docs/kernels.md, "The caller on a worker's CPU"). The workers stay on the CPUs after the first:
bound away from the caller's CPU instead (the first, often), the slowest of 7 first forwards after
an idle pause reached 7-9 ms in 5 of 15 pause lengths, against 3 of 30 as bound here.

Measured: docs/kernels.md#openmp-spin
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
SPINCOUNT = "10000"         # the margin above 1,000 is for longer gaps between a forward's regions
CHOICE = "not chosen yet"
PIN_ENV = "MLEXEC_PIN_WORKERS"      # 0: leave OpenMP's workers unbound
BIND_ENV = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")   # the environment binds threads itself
PINNED = "workers not pinned (GNU OpenMP not loaded)"
_pin_lock, _pin_done = threading.Lock(), False
_worker_cpus: set[int] = set()      # the CPUs pin_workers bound workers to


def choose() -> str:
    """Set ``GOMP_SPINCOUNT`` unless the environment says how OpenMP should wait; returns ``CHOICE``.
    Too late once GNU OpenMP has loaded (it reads its settings then): call before MKL or oneDNN."""
    global CHOICE
    given = [f"{k}={os.environ[k]}" for k in (ENV, POLICY_ENV) if k in os.environ]
    if given:
        CHOICE = f"{' '.join(given)} (set in the environment)"
    else:
        os.environ[ENV] = SPINCOUNT
        CHOICE = f"{ENV}={SPINCOUNT} (idle workers spin briefly, then sleep)"
    return CHOICE


def threads(lib: ctypes.CDLL) -> tuple:
    """(set-threads, get-threads) over every OpenMP runtime oneDNN may be running on: the GNU
    OpenMP its library links, and any that a library loaded earlier put in the process's global
    scope, which oneDNN's calls then bind to instead (MKL's Intel OpenMP did, before MKL ran on
    GNU's; PyTorch's own copy of GNU OpenMP can). ``lib``: oneDNN's library handle."""
    runtimes = []
    for handle in (lib, _global_scope()):
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


def worker_cpus(environ, allowed, threads: int) -> dict[int, int]:
    """OpenMP thread number -> the CPU it is bound to: each worker (1 .. threads - 1) to one of the
    ``allowed`` CPUs after the first, the calling thread (0) to none. Nothing where ``PIN_ENV`` is
    0, where the environment binds OpenMP's threads itself, or with one thread or one CPU."""
    if environ.get(PIN_ENV, "1").strip() == "0" or any(k in environ for k in BIND_ENV) \
            or threads < 2 or len(allowed) < 2:
        return {}
    cpus = sorted(allowed)
    return {k: cpus[k % len(cpus)] for k in range(1, threads)}


@functools.lru_cache(maxsize=None)
def _global_scope() -> ctypes.CDLL:
    """The symbols in the process's global scope (libc's among them), one handle per process."""
    return ctypes.CDLL(None)


def _no_cpu() -> int:
    return -1


_sched_getcpu = getattr(_global_scope(), "sched_getcpu", _no_cpu)     # libc's; -1: unknown


def current_cpu() -> int | None:
    """The CPU the calling thread runs on (libc's ``sched_getcpu``), or None where unknown."""
    cpu = _sched_getcpu()
    return cpu if cpu >= 0 else None


def step_aside() -> bool:
    """Move the calling thread off the CPUs pin_workers bound the pool's workers to, if it runs on
    one and its affinity allows another; its affinity stays as it was. Returns whether it moved.
    Called once the workers are bound, and before each timing: there, a caller sharing a worker's
    core measured the pool 30x slow and the choice went to one thread (docs/kernels.md, "The
    caller on a worker's CPU")."""
    cpu = current_cpu()
    if cpu is None or cpu not in _worker_cpus:
        return False
    allowed = os.sched_getaffinity(0)
    elsewhere = allowed - _worker_cpus
    if not elsewhere:
        return False
    os.sched_setaffinity(0, elsewhere)          # the kernel migrates the thread now
    os.sched_setaffinity(0, allowed)            # and leaves it there
    return True


def keep_aside() -> None:
    """``step_aside`` as a forward's first call (``FusedEngine.openmp_pool``), 0.2 us where there
    is nothing to do. Moved aside once, the caller came back where another process held its own
    CPU: a worker waking it from a region's barrier may have it placed on that worker's CPU, and
    there it stays, each region then a time slice (beside a busy core, int8 mlp b8 d1024: half
    the blocks of forwards at 400-612 us a forward without it, all at 150-210 with; docs/kernels.md)."""
    if _worker_cpus and _sched_getcpu() in _worker_cpus:
        step_aside()


def pin_workers(lib: ctypes.CDLL | None = None) -> str:
    """Bind the GNU OpenMP pool's workers as ``worker_cpus`` says, once per process: one parallel
    region of the pool's size whose threads each set their own affinity (``lib``: a library
    linking GNU OpenMP; None: the process's ``libgomp.so.1``, if loaded). The pool is the calling
    thread's: a forward run from another thread has a team of its own, unbound. Returns and sets
    ``PINNED``."""
    global PINNED, _pin_done
    with _pin_lock:
        if _pin_done:
            return PINNED
        try:
            lib = lib or ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
            threads, parallel = lib.omp_get_max_threads(), lib.GOMP_parallel
        except (OSError, AttributeError):       # not loaded, or a build on another runtime: nothing bound
            return PINNED
        _pin_done = True
        plan = worker_cpus(os.environ, os.sched_getaffinity(0), threads)
        if not plan:
            PINNED = f"workers not pinned ({threads} thread(s); {PIN_ENV}, {', '.join(BIND_ENV)} as set)"
            return PINNED
        done: dict[int, int] = {}

        def bind(_data) -> None:
            k = lib.omp_get_thread_num()
            if k in plan:
                os.sched_setaffinity(0, {plan[k]})      # 0: this thread
                done[k] = plan[k]

        region = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(bind)
        parallel(region, None, threads, 0)
        _worker_cpus.update(done.values())
        step_aside()                            # the caller off them from the start
        PINNED = f"workers pinned to CPU {', '.join(str(done[k]) for k in sorted(done))}, the calling thread free"
        return PINNED

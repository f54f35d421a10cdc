"""How long GNU OpenMP's idle workers spin before they sleep, set before the runtime loads.

MKL (``packed``) and oneDNN (``onednn``, and ``onednn-matmul`` in any engine) run on GNU OpenMP.
Its workers spin 300,000 rounds after a parallel region before they sleep (``GOMP_SPINCOUNT``'s
default when ``OMP_WAIT_POLICY`` is unset): long enough that the code the process runs next, on two
cores, waits for a core. Too short a spin (or ``OMP_WAIT_POLICY=passive``) lets the workers sleep
between the regions of one forward, and the engine itself slows. ``SPINCOUNT`` lies between: the
code after the engine pays little, and the engine stays within its process-to-process spread.
``choose()`` sets it unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is already set (the switch:
set either to keep another behaviour); ``CHOICE`` says what was done.

Measured: docs/kernels.md#openmp-spin
"""
from __future__ import annotations

import ctypes
import os

ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
SPINCOUNT = "10000"         # the margin above 1,000 is for longer gaps between a forward's regions
CHOICE = "not chosen yet"


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


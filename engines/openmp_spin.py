"""How long GNU OpenMP's idle workers spin before they sleep, set before the runtime loads.

MKL (``packed``) and oneDNN (``onednn``, and ``onednn-matmul`` in any engine) run on GNU OpenMP.
Its workers spin 300,000 rounds after a parallel region before they sleep (``GOMP_SPINCOUNT``'s
default when ``OMP_WAIT_POLICY`` is unset): milliseconds during which the code that runs next in
the process, on two cores, waits for one. Measured on an idle AMD EPYC with
``scripts/neighbour_cost.py`` (naive at mlp b8 d256 on NumPy's OpenBLAS, its first 20 calls right
after a block of the ``onednn`` engine, against 20 calls after itself): 831 µs a call against 29.5
after onednn at mlp b8 d256, 645 against 38 after it at b32 d1024. With ``GOMP_SPINCOUNT=3000`` the
neighbour paid 1.30x, and the engine ran as fast as with the default (9.6 µs, 284 µs); at 100 its
workers slept between the two linears of one forward (91 µs); ``OMP_WAIT_POLICY=passive`` made
every region wake them (95 µs). docs/kernels.md has the tables. ``choose()`` sets
``SPINCOUNT`` unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is already set (the switch: set
either to keep another behaviour); ``CHOICE`` says what was done.
"""
from __future__ import annotations

import os

ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
SPINCOUNT = "3000"
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

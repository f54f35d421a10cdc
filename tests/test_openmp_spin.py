"""engines.openmp_spin: GNU OpenMP's idle spin bounded before MKL or oneDNN load it, never over the environment."""
import subprocess
import sys

import pytest

from engines import openmp_spin
from tests.conftest import ROOT, subprocess_env


def _spin(**env) -> tuple[str, str]:
    """(CHOICE, GOMP_SPINCOUNT) in a fresh process that imports engines with ``env`` set."""
    code = "import os, engines; from engines import openmp_spin; print(openmp_spin.CHOICE); print(os.environ.get('GOMP_SPINCOUNT'))"
    full = subprocess_env()
    for k in (openmp_spin.ENV, openmp_spin.POLICY_ENV):
        full.pop(k, None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**full, **env}, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return out[0], out[1]


def test_the_spin_is_bounded_unless_the_environment_says_how_to_wait():
    said, spin = _spin()
    assert spin == openmp_spin.SPINCOUNT and said.startswith(f"GOMP_SPINCOUNT={openmp_spin.SPINCOUNT}")
    said, spin = _spin(OMP_WAIT_POLICY="active")
    assert said == "OMP_WAIT_POLICY=active (set in the environment)" and spin == "None"
    said, spin = _spin(GOMP_SPINCOUNT="50000")
    assert said == "GOMP_SPINCOUNT=50000 (set in the environment)" and spin == "50000"


@pytest.mark.parametrize("env", [{}, {"GOMP_SPINCOUNT": "300000"}], ids=["project", "gnu_default"])
def test_gnu_openmp_reads_the_setting(env):
    """The setting reaches the runtime: GNU OpenMP reads it when oneDNN's library loads it, after
    ``engines`` set it (``OMP_DISPLAY_ENV=VERBOSE`` prints what the runtime took)."""
    from engines import kernels
    if kernels.onednn_library() is None:
        pytest.skip("needs oneDNN's library (the onednn extra), which loads GNU OpenMP")
    full = subprocess_env()
    for k in (openmp_spin.ENV, openmp_spin.POLICY_ENV):
        full.pop(k, None)
    out = subprocess.run([sys.executable, "-c", "import engines; from engines import kernels; kernels.onednn_library()"],
                         cwd=ROOT, env={**full, **env, "OMP_DISPLAY_ENV": "VERBOSE"}, capture_output=True, text=True,
                         check=True)
    assert f"GOMP_SPINCOUNT = '{env.get('GOMP_SPINCOUNT', openmp_spin.SPINCOUNT)}'" in out.stderr

"""engines.native.openmp: GNU OpenMP's idle spin bounded before MKL or oneDNN load it, never over the environment."""
import subprocess
import sys

import pytest

from engines import kernels
from engines.native import openmp
from tests.conftest import ROOT, subprocess_env


def _run(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh process whose environment says nothing of OpenMP's wait but ``env``."""
    full = {k: v for k, v in subprocess_env().items() if k not in (openmp.ENV, openmp.POLICY_ENV)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**full, **env}, capture_output=True,
                          text=True, check=True)


def _spin(**env) -> tuple[str, str]:
    """(CHOICE, GOMP_SPINCOUNT) once ``engines`` is imported."""
    out = _run("import os, engines; from engines.native import openmp; "
               "print(openmp.CHOICE); print(os.environ.get('GOMP_SPINCOUNT'))", **env)
    said, spin = out.stdout.splitlines()
    return said, spin


def test_the_spin_is_bounded_unless_the_environment_says_how_to_wait():
    said, spin = _spin()
    assert spin == openmp.SPINCOUNT and said.startswith(f"GOMP_SPINCOUNT={openmp.SPINCOUNT}")
    said, spin = _spin(OMP_WAIT_POLICY="active")
    assert said == "OMP_WAIT_POLICY=active (set in the environment)" and spin == "None"
    said, spin = _spin(GOMP_SPINCOUNT="50000")
    assert said == "GOMP_SPINCOUNT=50000 (set in the environment)" and spin == "50000"


@pytest.mark.parametrize("env", [{}, {"GOMP_SPINCOUNT": "300000"}], ids=["project", "gnu_default"])
def test_gnu_openmp_reads_the_setting(env):
    """The setting reaches the runtime: GNU OpenMP reads it when oneDNN's library loads it, after
    ``engines`` set it (``OMP_DISPLAY_ENV=VERBOSE`` prints what the runtime took)."""
    if kernels.unavailable().get("onednn"):
        pytest.skip("needs oneDNN's library (the onednn extra), which loads GNU OpenMP")
    out = _run("import engines; from engines.native import onednn; onednn.load()", OMP_DISPLAY_ENV="VERBOSE", **env)
    assert f"GOMP_SPINCOUNT = '{env.get('GOMP_SPINCOUNT', openmp.SPINCOUNT)}'" in out.stderr

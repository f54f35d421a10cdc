"""engines.native.openblas: OpenBLAS's kernels chosen for the CPU before NumPy loads them."""
import subprocess
import sys

from conftest import ROOT, subprocess_env
from engines.native import openblas
from engines.native.cpu import vendor_and_flags

ZEN4 = {"fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


def test_avx512_on_amd_asks_for_skylakex_and_nothing_else_does():
    assert openblas.decide("AuthenticAMD", ZEN4) == "SkylakeX"
    assert openblas.decide("AuthenticAMD", {"fma", "avx2"}) is None            # Zen 3 and older
    assert openblas.decide("AuthenticAMD", ZEN4 - {"avx512bw"}) is None        # a subset missing
    assert openblas.decide("GenuineIntel", ZEN4) is None       # OpenBLAS picks Intel's itself


def _choice(env_core: str | None, numpy_first: bool) -> tuple[str, str]:
    code = ("import sys, os\n" + ("import numpy\n" if numpy_first else "")
            + "from engines.native import openblas\n"
            + "openblas.vendor_and_flags = lambda: ('AuthenticAMD', %r)\n" % ZEN4
            + "os.environ.pop('OPENBLAS_CORETYPE', None) if %r is None else None\n" % env_core
            + "print(openblas.choose()); print(os.environ.get('OPENBLAS_CORETYPE'))")
    env = subprocess_env()
    env.pop("OPENBLAS_CORETYPE", None)
    if env_core:
        env["OPENBLAS_CORETYPE"] = env_core
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return out[0], out[1]


def test_choose_sets_the_core_only_before_numpy_and_never_over_the_environment():
    # engines' own import already ran choose() once; a second call shows what it does from each state
    said, env = _choice("Haswell", numpy_first=False)
    assert said == "OPENBLAS_CORETYPE=Haswell (set in the environment)" and env == "Haswell"
    said, env = _choice(None, numpy_first=True)
    assert "NumPy was imported before engines" in said and env == "None"


def test_importing_engines_first_loads_the_chosen_kernels():
    """On this machine's CPU, with the variable unset: what threadpoolctl sees NumPy's OpenBLAS run."""
    code = ("import engines\nfrom engines.native import openblas\nfrom threadpoolctl import threadpool_info\n"
            "print([i.get('architecture') for i in threadpool_info() if i['internal_api'] == 'openblas'][0])")
    env = subprocess_env()
    env.pop("OPENBLAS_CORETYPE", None)
    arch = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()
    wanted = openblas.decide(*vendor_and_flags())
    if wanted is not None:
        assert arch == wanted
    else:
        assert arch                      # OpenBLAS's own choice, whatever this CPU gets

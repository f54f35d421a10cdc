"""The kernel cache: choices kept per machine (CPU model and flags, library versions, threads,
the settings that change a library's kernels), one JSON file per machine, written atomically."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import tempfile
from importlib import metadata
from pathlib import Path

from ..native.onednn import PACKAGE as ONEDNN_PACKAGE
from ..native.openmp import BIND_ENV, PIN_ENV
from ..native.threads import blas_threads

# Settings that change which kernels a library runs on the same CPU, or how its pool waits between
# calls (passive OpenMP workers made two-thread kernels 10x slower at small products) or where its
# threads run: part of the cache's key
KERNEL_ENV = ("OPENBLAS_CORETYPE", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "GOMP_SPINCOUNT", "OMP_WAIT_POLICY", PIN_ENV, *BIND_ENV)
CACHE_ENV = "MLEXEC_CACHE_DIR"
CACHE_VERSION = 7           # bump when a kernel's calls or the judging change: older choices are then ignored
                            # (3: choices measured while the cores were busy are no longer cached;
                            # 4: nor those measured while other processes used the spare cores;
                            # 6: a pool kernel dropped alone is judged in the forward against one thread;
                            # 7: nor int8 variants timed without the pool's second core, which 6 cached)


def machine() -> dict:
    """What a choice depends on: CPU model and flags, library versions, thread count, and the
    settings that cap a library's instruction set (``KERNEL_ENV``)."""
    return {**_fixed(), "threads": blas_threads(), "cache_version": CACHE_VERSION,
            "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}}


@functools.lru_cache(maxsize=None)
def _fixed() -> dict:
    """The CPU and the library versions: read once per process (the versions from the packages'
    metadata took 10 ms a call, 0.6 s of a transformer's 60 choices)."""
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
    return {"cpu": cpu, "flags_sha1": hashlib.sha1(flags.encode()).hexdigest()[:12], "versions": versions}


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


def read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data["choices"] if isinstance(data.get("choices"), dict) else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}


def write(path: Path, choices: dict) -> None:
    """Merge ``choices`` into the file atomically (temp file + rename); a cache that cannot be
    written only costs the next build its measuring."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**read(path), **choices}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"machine": machine(), "choices": merged}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass



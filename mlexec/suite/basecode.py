"""The reference code for the latency gate: the ``engines`` package of another commit or tree,
imported beside the current one under a private name.

Engines use relative imports only, so a second copy loads cleanly as its own
package. A git ref is materialised with ``git archive`` into a temp folder.
"""
from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

_loaded: dict[str, ModuleType] = {}


class BaseCodeError(RuntimeError):
    """The reference code can't be had; the message says why."""


def resolve(source: str, repo: Path) -> tuple[str, Path]:
    """A directory holding ``engines/``, or a git ref: (label, directory)."""
    path = Path(source)
    if (path / "engines" / "__init__.py").is_file():
        return str(path), path
    try:
        commit = subprocess.run(["git", "rev-parse", "--verify", f"{source}^{{commit}}"], cwd=repo,
                                capture_output=True, text=True, check=True).stdout.strip()
        archive = subprocess.run(["git", "archive", "--format=tar", commit, "engines"], cwd=repo,
                                 capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        detail = detail.decode() if isinstance(detail, bytes) else str(detail)
        raise BaseCodeError(f"no engines/ at {source!r} in {repo}: {detail.strip()}") from None
    target = Path(tempfile.mkdtemp(prefix=f"mlexec-base-{commit[:12]}-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return commit[:12], target


def load(directory: Path) -> ModuleType:
    """Import ``directory/engines`` as a package of its own."""
    key = str(Path(directory).resolve())
    if key not in _loaded:
        name = f"_mlexec_base_engines_{len(_loaded)}"
        init = Path(directory) / "engines" / "__init__.py"
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise BaseCodeError(f"cannot import the reference engines from {directory}: {exc!r}") from None
        _loaded[key] = module
    return _loaded[key]

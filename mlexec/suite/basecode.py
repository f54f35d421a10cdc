"""The reference code for the gate: the ``engines`` package of another commit or tree,
imported beside the current one under a private name.

Engines use relative imports only, so a second copy loads cleanly as its own
package. A git ref is materialised with ``git archive`` into a temp folder.
``default_base`` picks the reference when none is named (``--mlexec-base auto``).
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


def _git(repo: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def default_branch(repo: Path) -> str | None:
    """``origin/HEAD``'s target (the remote's default branch), else ``main``, else None."""
    target = _git(repo, "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD")
    if target:
        return target.removeprefix("refs/remotes/")
    for ref in ("main", "origin/main"):
        if _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"):
            return ref
    return None


def default_base(repo: Path) -> tuple[str | None, str]:
    """The reference code when none is named: (git ref or None, why that one).

    - ``engines/`` has uncommitted changes: ``HEAD``, so the gate measures the change;
    - else the merge-base of ``HEAD`` with the default branch (what a pull request changes);
      on the default branch itself, where that is ``HEAD``, its parent;
    - None when git gives nothing (no repository, no default branch): the caller falls back.
    """
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return None, f"{repo} is not a git checkout"
    dirty = _git(repo, "status", "--porcelain", "--", "engines")
    if dirty:
        return head, "HEAD: engines/ has uncommitted changes"
    branch = default_branch(repo)
    if branch is None:
        return None, "no default branch (neither origin/HEAD nor main)"
    base = _git(repo, "merge-base", "HEAD", branch)
    if base is None:
        return None, f"HEAD has no merge-base with {branch}"
    if base == head:
        parent = _git(repo, "rev-parse", "--verify", "--quiet", "HEAD^")
        if parent is None:
            return None, f"HEAD is {branch}'s first commit"
        return parent, f"HEAD's parent: HEAD is on {branch}, engines/ clean"
    return base, f"merge-base of HEAD with {branch}"


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

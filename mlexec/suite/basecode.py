"""The reference code for the gate: the packages the engines live in, and the model files, as
another commit (or a folder) holds them, imported beside the current code under private names.

What is gated (``Source``): ``[tool.mlexec] packages`` in the repository's pyproject.toml, else
the top-level package (or module: a ``conftest.py``, a test module) of every engine that runs
and lives inside the repository. Engines installed from elsewhere are the same code on both
sides. A git ref is materialised with ``git archive`` into a temporary folder that ``close``
removes; ``default_base`` picks the ref when none is named (``--mlexec-base auto``).

The copy is imported under its own names while the current modules are set aside, so its
imports, relative or absolute, made at import time resolve to the copy; then its modules move to
private names (``_mlexec_ref0_mypkg.engine``) and the current ones come back. Registrations the
copy makes in ``engines.ENGINES`` while importing are kept as the reference's and undone in the
registry. An absolute import of the package made later, inside a function, finds the current code.
"""
from __future__ import annotations

import importlib
import inspect
import io
import itertools
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

_copies = itertools.count()


class BaseCodeError(RuntimeError):
    """The reference code can't be had; the message says why."""


def _git(repo: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def toplevel(path: Path) -> Path | None:
    """The git checkout holding ``path``, or None."""
    top = _git(path, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else None


# --- what is gated ------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """A top-level package or module of gated code: its import name, and its path relative to
    the repository's top (``engines``, ``src/mypkg``, ``conftest.py``)."""
    name: str
    path: str


def _source(name: str, file: str | None, repo: Path) -> Source | None:
    """The top-level unit of module ``name`` whose file is ``file``, when it lies inside ``repo``."""
    if file is None:
        return None
    where = Path(file).resolve()
    if where.name == "__init__.py":
        where = where.parent
    depth = name.count(".")
    top = where.parents[depth - 1] if depth else where
    try:
        return Source(name.split(".")[0], top.relative_to(repo).as_posix())
    except ValueError:
        return None


def source_of(cls: type, repo: Path) -> Source | None:
    """The gated unit holding engine ``cls``: its top-level package (or its module, when that is in
    no package: a ``conftest.py``), when its file lies inside ``repo``; None when it lies elsewhere.
    Found from the class's own file: a name such as ``conftest`` may name several modules."""
    try:
        return _source(cls.__module__, inspect.getfile(cls), repo)
    except (TypeError, OSError):
        return None


def _package_source(name: str, repo: Path) -> Source | None:
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    return _source(module.__name__, getattr(module, "__file__", None), repo)


def configured(rootpath: Path) -> list[str] | None:
    """``[tool.mlexec] packages`` from ``rootpath/pyproject.toml``: import names, or None."""
    project = Path(rootpath) / "pyproject.toml"
    if not project.is_file():
        return None
    try:
        table = tomllib.loads(project.read_text()).get("tool", {}).get("mlexec", {})
    except tomllib.TOMLDecodeError as exc:
        raise BaseCodeError(f"{project}: {exc}") from None
    packages = table.get("packages")
    if packages is not None and (not isinstance(packages, list) or not all(isinstance(p, str) for p in packages)):
        raise BaseCodeError(f"{project}: [tool.mlexec] packages must be a list of import names, got {packages!r}")
    return packages


def gated_sources(rootpath: Path, repo: Path, engines: list[type]) -> list[Source]:
    """What the gate measures at the reference: the configured packages, else those the engines
    live in inside ``repo`` (in the engines' order, each once)."""
    names = configured(rootpath)
    if names is not None:
        sources = [(n, _package_source(n, repo)) for n in names]
        outside = [n for n, s in sources if s is None]
        if outside:
            raise BaseCodeError(f"[tool.mlexec] packages {outside}: not importable from a folder inside {repo}")
        return [s for _, s in sources]
    found = (source_of(cls, repo) for cls in engines)
    return list(dict.fromkeys(s for s in found if s is not None))


# --- which commit --------------------------------------------------------------------------

def default_branch(repo: Path) -> str | None:
    """``origin/HEAD``'s target (the remote's default branch), else ``main``, else None."""
    target = _git(repo, "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD")
    if target:
        return target.removeprefix("refs/remotes/")
    for ref in ("main", "origin/main"):
        if _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"):
            return ref
    return None


def default_base(repo: Path, paths: list[str]) -> tuple[str | None, str]:
    """The reference commit when none is named: (git ref or None, why that one).

    - the gated ``paths`` (code and model files) have uncommitted changes: ``HEAD``, so the gate
      measures the change;
    - else the merge-base of ``HEAD`` with the default branch (what a pull request changes);
      on the default branch itself, where that is ``HEAD``, its parent;
    - None when git gives nothing (no repository, no default branch): the caller falls back.
    """
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return None, f"{repo} is not a git checkout"
    dirty = paths and _git(repo, "status", "--porcelain", "--", *paths)
    if dirty:
        return head, f"HEAD: {', '.join(paths)} has uncommitted changes"
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
        return parent, f"HEAD's parent: HEAD is on {branch}, {', '.join(paths) or 'the code'} clean"
    return base, f"merge-base of HEAD with {branch}"


# --- the copy --------------------------------------------------------------------------------

@dataclass
class Reference:
    """The reference code, imported: where it lies, its modules and its engines."""
    label: str                         # the commit (12 digits) or the folder
    directory: Path                    # laid out as the repository
    commit: str | None                 # None for a folder
    modules: dict[str, ModuleType]     # the copy's modules by their own (current) names
    registered: dict[str, type]        # engines the copy registered while importing, by name
    prefix: str                        # the private names' prefix: "_mlexec_ref0_"
    temporary: bool = False
    sources: list[Source] = field(default_factory=list)

    def engine_class(self, cls: type, name: str) -> type | None:
        """The reference's counterpart of engine ``cls`` (registered as ``name``): the class the
        copy's registry gives that name, else the same module and qualified name in the copy;
        None when the copy has neither."""
        registry = getattr(self.modules.get("engines"), "ENGINES", {})
        found = self.registered.get(name) or registry.get(name)
        if found is not None:
            return found
        target = self.modules.get(cls.__module__)
        for part in cls.__qualname__.split("."):
            target = getattr(target, part, None)
        return target if isinstance(target, type) else None

    def gates(self, cls: type) -> bool:
        """Whether ``cls`` lives in the gated code (else it is the same on both sides)."""
        return cls.__module__.split(".")[0] in {s.name for s in self.sources}

    def file(self, path: str) -> Path | None:
        """The reference's copy of a repository file (a model), or None when it has none."""
        found = self.directory / path
        return found if found.is_file() else None

    def close(self) -> None:
        """Forget the copy's private modules and remove a temporary folder."""
        for name in [n for n in sys.modules if n.startswith(self.prefix)]:
            del sys.modules[name]
        if self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


def materialise(ref: str, repo: Path, paths: list[str]) -> tuple[str, Path]:
    """``paths`` (those that exist) of commit ``ref`` in a new temporary folder: (commit, folder)."""
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit is None:
        raise BaseCodeError(f"{ref!r} is not a commit in {repo}")
    present = [p for p in paths if _git(repo, "cat-file", "-e", f"{commit}:{p}") is not None]
    target = Path(tempfile.mkdtemp(prefix=f"mlexec-base-{commit[:12]}-"))
    if present:
        archive = subprocess.run(["git", "archive", "--format=tar", commit, "--", *present], cwd=repo,
                                 capture_output=True)
        if archive.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise BaseCodeError(f"git archive {commit[:12]} failed: {archive.stderr.decode().strip()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(target, filter="data")
    return commit, target


def _owned(name: str, tops: set[str]) -> bool:
    return name.split(".")[0] in tops


def import_copy(directory: Path, sources: list[Source],
                modules: list[str]) -> tuple[str, dict[str, ModuleType], dict[str, type]]:
    """Import ``sources`` from ``directory``, and those of ``modules`` (the engines' modules) inside
    them, with the current modules set aside; return the private names' prefix, the copy's modules
    by their own names (moved to private names, the current ones restored) and the engines it
    registered. A module the copy lacks is left out (its engine has no counterpart there)."""
    from engines import ENGINES
    tops = {s.name for s in sources}
    current = {n: sys.modules.pop(n) for n in list(sys.modules) if _owned(n, tops)}
    registry = dict(ENGINES)
    roots = list(dict.fromkeys(str((directory / s.path).parent) for s in sources))
    sys.path[:0] = roots
    importlib.invalidate_caches()
    try:
        for source in sources:
            if (directory / source.path).exists():
                importlib.import_module(source.name)
        for name in modules:
            if _owned(name, tops) and name.split(".")[0] in sys.modules:
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError:
                    pass
    except Exception as exc:
        raise BaseCodeError(f"cannot import the reference code from {directory}: {exc!r}") from None
    finally:
        copy = {n: sys.modules.pop(n) for n in list(sys.modules) if _owned(n, tops)}
        for root in roots:
            sys.path.remove(root)
        sys.modules.update(current)
        registered = {k: v for k, v in ENGINES.items() if registry.get(k) is not v}
        ENGINES.clear()
        ENGINES.update(registry)
    prefix = f"_mlexec_ref{next(_copies)}_"
    for name, module in copy.items():
        _rename(module, prefix + name)
        sys.modules[prefix + name] = module
    return prefix, copy, registered


def _rename(module: ModuleType, private: str) -> None:
    """A relative import made later inside the copy resolves to the copy."""
    module.__name__ = private
    module.__package__ = private if hasattr(module, "__path__") else private.rpartition(".")[0]
    if module.__spec__ is not None:
        module.__spec__.name = private


def load(source: str, repo: Path, sources: list[Source], files: list[str], modules: list[str]) -> Reference:
    """The reference code named by ``source`` (a git ref, or a folder laid out as the repository),
    with the model ``files`` of that commit beside it; ``modules``: the engines' modules."""
    folder = Path(source)
    if folder.is_dir() and any((folder / s.path).exists() for s in sources):
        directory, commit, label, temporary = folder, None, str(folder), False
    else:
        commit, directory = materialise(source, repo, [s.path for s in sources] + files)
        label, temporary = commit[:12], True
    try:
        missing = [s.path for s in sources if not (directory / s.path).exists()]
        if len(missing) == len(sources):
            raise BaseCodeError(f"no {', '.join(missing)} at {label!r} in {repo}")
        prefix, copy, registered = import_copy(directory, sources, modules)
    except BaseException:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return Reference(label, directory, commit, copy, registered, prefix, temporary, sources)

"""Saved benchmark runs: load, validate, list and save pytest-benchmark JSON files.

The layout is pytest-benchmark's own storage: ``root/<machine-id>/NNNN_<name>.json``,
each file one run in pytest-benchmark's save format (``machine_info``,
``commit_info``, ``benchmarks``, ``datetime``, ``version``). Every problem
with a file raises ``BaselineError`` naming that file; ``iter_runs(...,
errors=list)`` skips bad files instead and lists their errors, for views that
should show the rest (history); without it a bad file stops the listing (the gate).

``save_run`` never overwrites and never reuses a number: it writes a temp file
``.tmp-<pid>-*.json.part`` in the same directory and fsyncs it; then, holding an
exclusive ``flock`` on the folder's ``.save.lock`` (so two savers cannot pick the
same ``NNNN`` for different names), hard-links it to the next free number. A
save killed mid-write leaves its temp file: the next save removes temp files of
processes no longer alive, and any older than ``STALE_TEMP_SECONDS``.
"""
from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

_TOP = {"machine_info": dict, "commit_info": dict, "benchmarks": list, "datetime": str, "version": str}
_STATS = ("min", "max", "mean", "stddev", "median", "iqr", "rounds")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_NUMBERED = re.compile(r"^(\d{4,})_")
_TEMP = re.compile(r"^\.tmp-(\d+)-.*\.json\.part$")
LOCK_NAME = ".save.lock"
STALE_TEMP_SECONDS = 3600    # a live save writes and links in well under a second


def machine_id() -> str:
    """pytest-benchmark's id (OS, Python, bits) plus what it leaves out: CPU model and count."""
    from pytest_benchmark.utils import get_machine_id
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1] for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    slug = re.sub(r"[^A-Za-z0-9]+", "-", cpu or "unknown-cpu").strip("-")
    return f"{get_machine_id()}-{slug}-{os.cpu_count()}cpu"


class BaselineError(ValueError):
    """A saved run is unreadable or malformed; the message names the file."""


def _check_run(run, where: str) -> dict:
    def fail(what: str):
        raise BaselineError(f"{where}: {what}")

    if not isinstance(run, dict):
        fail(f"expected a JSON object at the top level, got {type(run).__name__}")
    for key, kind in _TOP.items():
        if key not in run:
            fail(f"missing key {key!r} (expected pytest-benchmark's save format with {sorted(_TOP)})")
        if not isinstance(run[key], kind):
            fail(f"key {key!r} should be a {kind.__name__}, got {type(run[key]).__name__}")
    if "id" not in run["commit_info"]:
        fail("missing key 'commit_info.id'")
    for i, bench in enumerate(run["benchmarks"]):
        here = f"benchmarks[{i}]"
        if not isinstance(bench, dict):
            fail(f"{here} should be an object, got {type(bench).__name__}")
        for key in ("name", "fullname", "stats"):
            if key not in bench:
                fail(f"{here}: missing key {key!r}")
        if not isinstance(bench["name"], str):
            fail(f"{here}.name should be a string")
        if not isinstance(bench.get("extra_info", {}), dict):
            fail(f"{here}.extra_info should be an object")
        stats = bench["stats"]
        if not isinstance(stats, dict):
            fail(f"{here}.stats should be an object")
        for key in _STATS:
            value = stats.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(f"{here} ({bench['name']}): stats.{key} should be a number, got {value!r}")
    return run


def load_run(path) -> dict:
    """Read and validate one saved pytest-benchmark JSON file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read: {exc}") from None
    if not text.strip():
        raise BaselineError(f"{path}: empty file (truncated write?)")
    try:
        run = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise BaselineError(f"{path}: invalid JSON{hint}: {exc}") from None
    return _check_run(run, str(path))


def iter_runs(root, machine_id: str | None = None, errors: list | None = None) -> list[tuple[Path, dict]]:
    """Every saved run under ``root/<machine-id>/*.json``, per machine sorted by file name.

    A bad file raises its ``BaselineError``; when ``errors`` is a list, the file is
    skipped and its error (naming the file) appended there instead.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    machines = sorted(p for p in root.iterdir() if p.is_dir())
    if machine_id is not None:
        machines = [p for p in machines if p.name == machine_id]
    runs = []
    for path in (path for machine in machines for path in sorted(machine.glob("*.json"))):
        try:
            runs.append((path, load_run(path)))
        except BaselineError as exc:
            if errors is None:
                raise
            errors.append(exc)
    return runs


def _next_number(directory: Path) -> int:
    numbers = [int(m.group(1)) for p in directory.glob("*.json") if (m := _NUMBERED.match(p.name))]
    return max(numbers, default=0) + 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(directory, max_age: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Remove temp files left by killed saves: of a pid no longer alive, or older than ``max_age``
    seconds. Returns what was removed. A live save's temp file is young and its pid alive."""
    removed = []
    now = time.time()
    for path in Path(directory).glob(".tmp-*.json.part"):
        match = _TEMP.match(path.name)
        try:
            stale = now - path.stat().st_mtime > max_age or (match is not None and not _alive(int(match.group(1))))
            if stale:
                path.unlink()
                removed.append(path)
        except FileNotFoundError:
            pass       # its saver finished, or another cleaner got there first
    return removed


def save_run(run: dict, root, machine_id: str, name: str) -> Path:
    """Write ``run`` to ``root/<machine_id>/NNNN_<name>.json`` with the next free number; never overwrites."""
    for label, value in (("machine_id", machine_id), ("name", name)):
        if not isinstance(value, str) or not _NAME.match(value):
            raise BaselineError(f"{root}: {label} must match {_NAME.pattern} (no path separators), got {value!r}")
    directory = Path(root) / machine_id
    _check_run(run, f"{directory / ('NNNN_' + name + '.json')} (run to save)")
    directory.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(run, indent=4, sort_keys=True) + "\n").encode("utf-8")

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".tmp-{os.getpid()}-", suffix=".json.part")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with open(directory / LOCK_NAME, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)           # released when the file closes
            for _ in range(1000):    # a writer outside save_run (no lock) may take a number meanwhile
                target = directory / f"{_next_number(directory):04d}_{name}.json"
                try:
                    os.link(tmp, target)               # fails if target exists: never overwrites
                except FileExistsError:
                    continue
                break
            else:
                raise BaselineError(f"{directory}: could not find a free file number for {name!r}")
            remove_stale_temps(directory)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target

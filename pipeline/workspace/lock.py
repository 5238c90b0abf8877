"""One command that runs stages at a time per workspace.

Two runs on one workspace race on the same ONNX, engine and manifest files, and, worse, time
their engines on the same cores at the same time: both "succeed" with numbers that look valid and
are wrong. So every command that runs stages (`run`, `export`, `build`, `profile`, `toolchains
pull`) holds this lock for its whole duration; read-only commands (`compare`, `models`, `doctor`,
`trtexec parse`, `--dry-run`) never take it.

The lock is an advisory ``flock`` on ``manifests/.workspace.lock``: the kernel releases it when
its holder exits, however it exits, so a killed run never blocks the next one. The file also says
who holds it (pid, command, since), for the message a second run prints; a holder that releases
it normally empties the file, so text left in it when the lock is free means the last holder died
holding it, and the next run says so. A child process that writes to the workspace on the
command's behalf (the `--cluster` driver) inherits the locked descriptor (`inherited_lock`), so
the lock stays held while either lives.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import socket
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from pipeline.running.errors import PipelineError

LOCK_NAME = ".workspace.lock"
# The descriptor holding each workspace's lock in this process, by lock file.
_HELD: dict[Path, int] = {}


def lock_path(manifests_dir: Path) -> Path:
    return Path(manifests_dir) / LOCK_NAME


def _describe(holder: dict) -> str:
    since = holder.get("since", "?")
    with contextlib.suppress(ValueError, TypeError):
        since = datetime.fromisoformat(since).strftime("%Y-%m-%d %H:%M:%S")
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    return f"pid {holder.get('pid', '?')}{where}, `{holder.get('command', '?')}`, since {since}"


def _read(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {"command": "unknown (unreadable lock file)"}
    return holder if isinstance(holder, dict) else None


def _write(fd: int, holder: dict) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(holder).encode())
    os.fsync(fd)


@contextlib.contextmanager
def workspace_lock(manifests_dir: Path, reporter, wait: bool = False, argv: list[str] | None = None) -> Iterator[None]:
    """Hold the workspace for the duration of the block; fail at once, or wait, if another holds it."""
    path = lock_path(manifests_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise PipelineError(
            f"cannot lock the workspace: {path}: {exc.strerror or exc}.",
            hint="the workspace (the folder holding pipeline.toml) must be writable",
        ) from exc
    held = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd) or {}
            if not wait:
                raise PipelineError(
                    f"another pipeline run holds this workspace ({_describe(holder)}).",
                    hint="let it finish, or pass --wait to start as soon as it does; runs that overlap would "
                    "time their engines on the same machine at the same time",
                ) from None
            reporter.info(f"waiting for the run holding this workspace to finish ({_describe(holder)}) …")
            fcntl.flock(fd, fcntl.LOCK_EX)
        held = True
        left = _read(fd)
        if left is not None:
            reporter.warn(
                f"the previous run on this workspace ({_describe(left)}) stopped without releasing it (killed?); "
                "taking it over. Stages it had not finished left no results, and they run again"
            )
        command = shlex.join(["pipeline", *(sys.argv[1:] if argv is None else argv)])
        try:
            _write(
                fd,
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "command": command,
                    "since": datetime.now().astimezone().isoformat(timespec="seconds"),
                },
            )
        except OSError as exc:
            raise PipelineError(
                f"cannot take the workspace lock: writing {path} failed: {exc.strerror or exc}.",
                hint=f"free space on that disk ({_free_space(path.parent)} free now), or run in a workspace on another one",
            ) from exc
        removed = remove_leftovers(manifests_dir.parent)
        if removed:
            reporter.warn(f"removed {len(removed)} half-written file(s) a killed run left behind: {', '.join(removed[:3])}")
        _HELD[path] = fd
        yield
    finally:
        _HELD.pop(path, None)
        if held:
            os.ftruncate(fd, 0)  # released normally: nothing left to warn the next run about
        os.close(fd)  # closing the descriptor releases the flock


class InheritedLock:
    """The held lock, for a child process (pipeline/launchers/child.py): pickled into the child as
    a duplicate of the descriptor. An flock belongs to the open file, which the duplicate
    shares, so the child holds the lock for as long as it lives, even past this process's death
    (kill -9): the next run waits for the child, never races it."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from pipeline.launchers.child import inheritable

        return (_adopt, (inheritable(self.fd),))


def _adopt(duplicate) -> InheritedLock:
    return InheritedLock(duplicate.detach())


def inherited_lock(manifests_dir: Path) -> InheritedLock | None:
    """The workspace's lock as this process holds it, to pass to a child; None when not held here."""
    fd = _HELD.get(lock_path(manifests_dir))
    return InheritedLock(fd) if fd is not None else None


# What atomic_output (pipeline/workspace/artifacts.py) writes before the move that completes a file:
# ".<name>.<8 random characters>.tmp" beside it. Only a run that was killed leaves one.
_LEFTOVER = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
_OUTPUT_DIRS = ("models", "engines", "manifests", "reports")


def remove_leftovers(root: Path) -> list[str]:
    """Delete the half-written files killed runs left in the workspace's output folders; called
    with the lock held, so no live run is writing them. Returns their paths, relative to ``root``."""
    removed = []
    for directory in _OUTPUT_DIRS:
        for path in sorted((root / directory).rglob(".*.tmp")) if (root / directory).is_dir() else []:
            if _LEFTOVER.match(path.name) and path.is_file():
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed.append(str(path.relative_to(root)))
    return removed


def _free_space(directory: Path) -> str:
    from pipeline.workspace.artifacts import free_bytes

    free = free_bytes(directory)
    return "unknown" if free is None else f"{free / 2**20:,.0f} MiB"

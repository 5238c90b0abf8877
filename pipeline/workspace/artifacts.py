"""Writing and fingerprinting files so that nothing half-written ever looks valid.

Every artefact is written to a temporary name in its final directory and moved into place with
``os.replace`` only once it is complete, so a crash, a full disk or Ctrl-C leaves either the old
file or nothing. Hashes are cached by (size, mtime) like DVC's state database, so a warm rerun
does not re-read gigabytes of engines to learn that nothing changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from pipeline.running.errors import PipelineError

_CHUNK = 1 << 20


def write_failed(path: Path, exc: OSError) -> PipelineError:
    import errno

    if exc.errno == errno.EROFS:
        return PipelineError(
            f"could not write {path}: the folder {Path(path).parent} is on a read-only file system.",
            hint="mount it writable, or run in a workspace you can write to (--catalog names it); nothing was half-written",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PipelineError(
            f"could not write {path}: no permission to write in the folder {Path(path).parent}.",
            hint="give this user write access to it, or run in a workspace you can write to; nothing was half-written",
        )
    return PipelineError(
        f"could not write {path}: {exc.strerror or exc}.",
        hint="check free space and permissions of that directory, then run the same command again",
    )


def storage_shortfall(directory: Path, needed_bytes: int, what: str = "the file") -> str | None:
    """Why ``what``, of up to about ``needed_bytes``, cannot be written into ``directory`` — this process's
    file-size limit (`ulimit -f`) or the disk's free space — or None. A tool that writes its own
    output (ONNX Runtime, a compiler) reports such a failure in its own words ("Protobuf
    serialization failed"), which read as a fault of its input; this names the cause instead."""
    import resource

    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and limit < needed_bytes:
        return f"this process may write files of at most {_mib(limit)} (its file-size limit, `ulimit -f`), and {what} takes up to about {_mib(needed_bytes)}"
    free = free_bytes(directory)
    if free is not None and free < needed_bytes:
        return f"the disk holding {directory} has {_mib(free)} free, and {what} takes up to about {_mib(needed_bytes)}"
    return None


def free_bytes(directory: Path) -> int | None:
    """Free space on the disk holding ``directory``; None where it cannot be read."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path; on clean exit it replaces ``path``, on any error it is deleted.

    The temporary name is chosen before its file is made, so there is no moment when the file
    exists and the block that deletes it does not know it: Ctrl-C and SIGTERM raise wherever
    Python is (pipeline/running/signals.py), and with ``tempfile.mkstemp`` one landing between the file's
    making and the name's return left `.fp32.onnx.….tmp` behind. Blocking the signals around that
    call did not close it: a signal sent to the process is taken by any thread that does not
    block it, and Python then raises in the main thread anyway."""
    path = Path(path)
    tmp: Path | None = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
                try:
                    # Created with the permissions any other new file gets (mode 0666 less the umask).
                    os.close(_create_new(tmp))
                    break
                except FileExistsError:
                    continue
        except OSError as exc:
            raise write_failed(path, exc) from exc
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise write_failed(path, exc) from exc
    finally:
        if tmp is not None:
            # The error that got here is the one to report, never the clean-up's: a file the folder
            # refused to make (read-only, no permission) or one already gone is nothing to remove.
            with contextlib.suppress(OSError):
                tmp.unlink()


def final_path(tmp: Path) -> Path:
    """The path an ``atomic_output`` temporary name (``.<name>.<hex>.tmp``) becomes; ``tmp`` itself
    where it is no such name. For a file that names another beside it by its final name."""
    parts = tmp.name.split(".")
    if len(parts) < 4 or parts[0] or parts[-1] != "tmp":
        return tmp
    return tmp.with_name(".".join(parts[1:-2]))


def _create_new(path: Path) -> int:
    """An open descriptor of a new, empty file at ``path``; FileExistsError where one is there."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_output(path) as tmp:
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise write_failed(path, exc) from exc


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class HashCache:
    """sha256 of files, remembered by (path, size, mtime_ns) in one small JSON file."""

    def __init__(self, cache_file: Path):
        self.cache_file = cache_file
        self._entries: dict[str, list] | None = None
        self._dirty = False

    def _load(self) -> dict[str, list]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.cache_file.read_text())
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def sha256(self, path: Path) -> str:
        path = Path(path).resolve()
        stat = path.stat()
        entries = self._load()
        cached = entries.get(str(path))
        if cached and cached[0] == stat.st_size and cached[1] == stat.st_mtime_ns:
            return cached[2]
        digest = sha256_file(path)
        entries[str(path)] = [stat.st_size, stat.st_mtime_ns, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        if self._dirty and self._entries is not None:
            # The cache is an optimisation: failing to save it must never fail a stage.
            with contextlib.suppress(PipelineError, OSError):
                atomic_write_text(self.cache_file, json.dumps(self._entries))
            self._dirty = False

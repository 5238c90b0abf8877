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
import shutil
from pathlib import Path

from pipeline.running.errors import PipelineError
from pipeline.running.files import atomic_write_text

_CHUNK = 1 << 20


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
        # This process's digests by file (device, inode, size, mtime_ns): a file under a second
        # name (a link: torch toolchains of one engine share one file) is not read again.
        self._by_file: dict[tuple[int, int, int, int], str] = {}

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
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        digest = self._by_file.get(identity) or sha256_file(path)
        self._by_file[identity] = digest
        entries[str(path)] = [stat.st_size, stat.st_mtime_ns, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        if self._dirty and self._entries is not None:
            # The cache is an optimisation: failing to save it must never fail a stage.
            with contextlib.suppress(PipelineError, OSError):
                atomic_write_text(self.cache_file, json.dumps(self._entries))
            self._dirty = False

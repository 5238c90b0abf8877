"""Writing a file so that nothing half-written ever looks valid: to a temporary name in its final
folder, moved into place with ``os.replace`` only once it is complete, so that a crash, a full disk
or Ctrl-C leaves either the old file or nothing; and a write that failed said in words. The lowest
floor: the manifest, the workspace and every stage write through it."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from pipeline.running.errors import PipelineError


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

"""Moving artefacts between the driver's workspace and the nodes, without a shared filesystem.

Files travel through Ray's object store in chunks, named by their sha256: the driver puts a file
once per run however many tasks read it, and each node keeps what it received (or produced) in a
content-addressed cache, so a file already there is never fetched again. A task hands back only
the outputs whose content the driver does not already have.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.running.errors import PipelineError
from pipeline.running.files import atomic_output, write_failed

# Large files go as several objects, so neither side holds one huge buffer and Ray can stream them.
CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class FileRef:
    """A workspace file as a task receives it: where it goes, what it is, and where its bytes are."""

    path: str  # relative to the workspace root
    sha256: str
    size_bytes: int
    chunks: tuple = ()  # ObjectRefs, in order


@dataclass
class OutputFile:
    """A file a task wrote; ``chunks`` is None when the driver already holds that content."""

    path: str
    sha256: str
    size_bytes: int
    chunks: list[bytes] | None = None


class DriverBlobs:
    """The driver's side: each distinct file put into the object store once per run."""

    def __init__(self, root: Path):
        self.root = root
        self._refs: dict[str, tuple] = {}
        self.bytes_put = 0

    def file(self, path: str, sha256: str, size_bytes: int) -> FileRef:
        import ray

        if sha256 not in self._refs:
            refs = []
            with open(self.root / path, "rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    refs.append(ray.put(chunk))
            self._refs[sha256] = tuple(refs)
            self.bytes_put += size_bytes
        return FileRef(path, sha256, size_bytes, self._refs[sha256])


def node_cache_dir() -> Path:
    """This node's content-addressed cache ($PIPELINE_CACHE_DIR/cluster, else the user's cache)."""
    from pipeline.running.cache import cache_dir

    return cache_dir() / "cluster"


class NodeBlobs:
    """A node's side: files by sha256 under the node cache, linked into a task's scratch workspace."""

    def __init__(self, directory: Path | None = None):
        self.directory = (directory or node_cache_dir()) / "blobs"
        self.bytes_fetched = 0

    def _blob(self, sha256: str) -> Path:
        return self.directory / sha256[:2] / sha256

    def materialize(self, ref: FileRef, dest: Path) -> None:
        import ray

        blob = self._blob(ref.sha256)
        if not (blob.is_file() and blob.stat().st_size == ref.size_bytes):
            digest = hashlib.sha256()
            with atomic_output(blob) as tmp:
                try:
                    with open(tmp, "wb") as handle:
                        for chunk_ref in ref.chunks:
                            chunk = ray.get(chunk_ref)
                            digest.update(chunk)
                            handle.write(chunk)
                except OSError as exc:
                    raise write_failed(blob, exc) from exc
                if digest.hexdigest() != ref.sha256:
                    raise PipelineError(f"{ref.path} arrived corrupted (sha256 {digest.hexdigest()[:12]}…, expected {ref.sha256[:12]}…).")
            self.bytes_fetched += ref.size_bytes
        self._link(blob, dest)

    def keep(self, path: Path, sha256: str) -> None:
        """Remember a file this node produced, so a later task here need not fetch it."""
        blob = self._blob(sha256)
        if not blob.is_file():
            with contextlib.suppress(OSError, PipelineError):  # only an optimisation
                with atomic_output(blob) as tmp:
                    try:  # a second name for the file, not a second copy (the scratch one goes)
                        tmp.unlink()
                        os.link(path, tmp)
                    except OSError:
                        shutil.copyfile(path, tmp)

    @staticmethod
    def _link(blob: Path, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        try:
            os.link(blob, dest)  # stages replace files, never write into them, so sharing is safe
        except OSError:
            try:
                shutil.copyfile(blob, dest)
            except OSError as exc:
                raise write_failed(dest, exc) from exc


def read_chunks(path: Path) -> list[bytes]:
    chunks = []
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            chunks.append(chunk)
    return chunks


def write_result(workspace, result, known: dict[str, Path]) -> int:
    """A task's files into the driver's workspace, then its manifests, each atomically: a crash
    between leaves files a re-run finds unrecorded (and replaces), never a manifest naming files
    that are not there. A task that did not end (its worker lost) sends nothing, so no half set of
    rounds is kept. ``known``: contents already here, by sha256 (updated). The bytes received."""
    from pipeline.running.errors import PipelineError
    from pipeline.running.files import atomic_output, atomic_write_text, write_failed

    received = 0
    for output in result.outputs:
        target = workspace.root / output.path
        if output.chunks is None:
            if target.is_file() and workspace.hashes.sha256(target) == output.sha256:
                continue
            source = known.get(output.sha256)
            if source is None or not source.is_file():
                raise PipelineError(f"the node kept {output.path} back as known here, and no file here has its content.")
            chunks = [source.read_bytes()]
        else:
            chunks = output.chunks
        with atomic_output(target) as tmp:
            try:
                with open(tmp, "wb") as handle:
                    for chunk in chunks:
                        handle.write(chunk)
            except OSError as exc:
                raise write_failed(target, exc) from exc
        received += output.size_bytes if output.chunks is not None else 0
        known[output.sha256] = target
    for member in result.members:
        if member.manifest_text is not None:
            atomic_write_text(workspace.root / member.manifest_path, member.manifest_text)
    workspace.hashes.save()
    return received

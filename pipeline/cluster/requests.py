"""What the driver sends a node for a job: the stage's request, with the manifests the stage
reads and the files the earlier stages made (by content: a node fetches only what its cache lacks),
and which contents the driver already holds, so that a task sends back only what is new."""

from __future__ import annotations

import functools
from pathlib import Path

from pipeline.cluster.plan import Job, Member
from pipeline.cluster.transfer import DriverBlobs
from pipeline.cluster.worker import StageRequest
from pipeline.stages.base import RunContext


class JobRequests:
    def __init__(self, ctx: RunContext, blobs: DriverBlobs, verbose: bool):
        self.ctx, self.blobs, self.verbose = ctx, blobs, verbose

    def request(self, job: Job) -> StageRequest:
        files, manifests = {}, {}
        for member in job.members:
            self._send(job.stage, member, files, manifests)
        return StageRequest(
            stage=job.stage,
            members=list(job.members),
            placed_by=job.placed_by,
            catalog=self.ctx.catalog,
            files=list(files.values()),
            manifests=manifests,
            known=frozenset(self.known),
            force=self.ctx.force,
            verbose=self.verbose,
            exports_write_onnx=self.ctx.exports_write_onnx,
        )

    def _send(self, name: str, member: Member, files: dict, manifests: dict) -> None:
        """What a node needs of the workspace to run ``name`` for ``member``: the manifests it
        reads, without the stage being run and those after it (the node runs it afresh), and the
        files the earlier stages made."""
        from pipeline.manifest import read_manifest

        workspace = self.ctx.workspace
        if name == "export":
            # An export that faulted at a point goes on without it: the node reads which from its record.
            path = workspace.export_manifest_path(member.engine)
            record = read_manifest(path).export if path.is_file() else None
            if record is not None and record.status == "faulted":
                manifests[workspace.relative(path)] = path.read_text()
            return

        def send_manifest(path, keep: tuple[str, ...]):
            if not path.is_file():
                return None
            manifest = read_manifest(path)
            manifest = manifest.model_copy(update={stage: None for stage in ("build", "profile") if stage not in keep})
            manifests[workspace.relative(path)] = manifest.model_dump_json(indent=2)
            return manifest

        export = send_manifest(workspace.export_manifest_path(member.engine), keep=("export",))
        keep = ("export",) if name == "build" else ("export", "build")
        # The manifest holding the engine's build: its own, or a static engine's of its point.
        built_at = member.shape if self.ctx.catalog.model(member.engine.model).static else None
        own = send_manifest(workspace.manifest_path(member.toolchain, member.engine, member.gpu_type, built_at), keep=keep)
        records = [export.export if export else None] + ([own.build] if own is not None and name == "profile" else [])
        for record in records:
            for artifact in record.outputs if record is not None else []:
                if workspace.is_intact(artifact):
                    files[artifact.sha256 + artifact.path] = self.blobs.file(artifact.path, artifact.sha256, artifact.size_bytes)

    @functools.cached_property
    def known(self) -> dict[str, Path]:
        """Contents the driver already holds, by sha256 (the hash cache makes this cheap on a re-run);
        a task sends back only what is not here."""
        known: dict[str, Path] = {}
        for folder in (self.ctx.workspace.models_dir, self.ctx.workspace.engines_dir):
            for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
                if path.is_file() and not path.name.startswith("."):
                    known.setdefault(self.ctx.workspace.hashes.sha256(path), path)
        return known

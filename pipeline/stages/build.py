"""Build stage: exported ONNX → an engine for one toolchain, under engines/<toolchain>/."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.manifest import Artifact, BuildDetails, StageRecord, read_manifest
from pipeline.running.errors import PipelineError, RefusedByTool
from pipeline.running.files import atomic_output
from pipeline.runtimes import get_runtime
from pipeline.runtimes.base import checked_evidence
from pipeline.stages.base import Stage, StageOutcome
from pipeline.workspace.artifacts import storage_shortfall


class BuildStage(Stage):
    name = "build"

    def __init__(self, ctx, engine, toolchain: str, shape: str | None = None):
        super().__init__(ctx, engine, toolchain)
        self.runtime = get_runtime(ctx, toolchain)
        # The one shape point a static model's engine is built for (an engine per point); None
        # for an engine of the model's whole shape range (or of its one shape).
        self.shape = shape

    def model_source(self):
        source = super().model_source()
        if self.shape is not None:
            source.static_point = next(point for point in source.shape_points() if point.label == self.shape)
        return source

    def manifest_path(self) -> Path:
        return self.ctx.workspace.manifest_path(self.toolchain, self.engine, self.ctx.gpu_type, self.shape)

    def engine_path(self) -> Path:
        name = f"{self.engine.name}@{self.shape}" if self.shape else self.engine.name
        return self.ctx.workspace.engine_dir(self.toolchain, self.ctx.gpu_type) / f"{name}{self.runtime.engine_suffix}"

    def params(self) -> dict[str, Any]:
        params = {
            "toolchain": self.toolchain,
            "precision": self.variant_spec.precision,
            "sparsity": self.variant_spec.sparsity,
            # The catalog's settings of the toolchain (targets, backend, image…): a cluster run decides
            # what is up to date from params and inputs alone (pipeline/cluster/), so they belong here.
            "toolchain_settings": self.runtime.spec.model_dump(mode="json", exclude={"source"}),
        }
        source = self.model_source()
        files = source.input_files()
        if files and not self.runtime.reads_onnx:
            # The model is made again from these files (a python model's factory): a changed file
            # is a new engine even where the ONNX the export wrote is byte for byte the same.
            params["model_files"] = {self.ctx.workspace.relative(path): self.ctx.workspace.hashes.sha256(path) for path in files}
        shape_range = source.shape_range()
        if shape_range is not None:  # the optimization profile engines of several shapes are built for
            params["shape_range"] = dict(zip(("min", "opt", "max"), (point.label for point in shape_range)))
        return params

    def identity(self) -> dict[str, Any]:
        return self.runtime.identity()

    def unsupported(self) -> str | None:
        """Why this toolchain cannot build this variant of this model at all: known before any
        export, so a run records the skip without exporting first."""
        source = self.model_source()
        return (
            source.unsupported_variant(self.variant_spec)
            or self.runtime.unsupported_model(source)
            or self.runtime.unsupported_reason(self.variant_spec)
        )

    def skip_reason(self) -> str | None:
        # After the export: a toolchain that compiles the ONNX has nothing to build where the
        # exporter refused the model. Not part of `unsupported`: a run exports again first (the
        # module may have changed), and only then is the export's word current.
        return self.unsupported() or self.not_exported_reason() or self.no_onnx_reason()

    def not_exported_reason(self) -> str | None:
        """Why there is nothing to build where the export's own work did not fit in memory (a
        model of one shape whose reference does not fit, say): that result, said for this engine."""
        try:
            record = read_manifest(self.ctx.workspace.export_manifest_path(self.engine)).export
        except FileNotFoundError:
            return None
        return f"not exported: {record.reason}" if record is not None and record.status == "out_of_memory" else None

    def no_onnx_reason(self) -> str | None:
        refused = self.onnx_refused() if self.runtime.reads_onnx else None
        return f"the export wrote no ONNX ({refused})" if refused else None

    def onnx_refused(self) -> str | None:
        """The exporter's reason where the last export wrote no ONNX, else None."""
        try:
            record = read_manifest(self.ctx.workspace.export_manifest_path(self.engine)).export
        except FileNotFoundError:
            return None
        return record.details.onnx_refused if record is not None and record.status == "done" and record.details else None

    def export_record(self) -> StageRecord:
        path = self.ctx.workspace.export_manifest_path(self.engine)
        try:
            record = read_manifest(path).export
        except FileNotFoundError:
            record = None
        if record is None or record.status != "done":
            raise PipelineError(
                f"{self.engine.name} has not been exported yet.",
                hint=f"run `pipeline export --engine {self.engine.name}` (or `pipeline run`)",
            )
        return record

    def inputs(self) -> list[Artifact]:
        # The ONNX only (and its external data, read beside it): the export's reference batch is
        # what the profile checks engines against. A model the exporter refused has none; a
        # toolchain that builds from the PyTorch model then reads the export's reference files,
        # which stand for the model that made them.
        record = self.export_record()
        onnx = [artifact for artifact in record.outputs if artifact.role in ("onnx", "onnx_data")] or record.outputs
        for artifact in onnx:
            if not self.ctx.workspace.is_intact(artifact):
                raise PipelineError(
                    f"{artifact.path} changed since it was exported.",
                    hint=f"re-export it: `pipeline export --engine {self.engine.name} --force`",
                )
        return onnx

    def extra_manifest_fields(self) -> dict[str, Any]:
        # Each engine manifest carries its export record, so it is complete evidence on its own.
        fields: dict[str, Any] = {"shape": self.shape} if self.shape else {}
        try:
            fields["export"] = read_manifest(self.ctx.workspace.export_manifest_path(self.engine)).export
        except FileNotFoundError:
            pass
        return fields

    def run_impl(self, inputs: list[Artifact]) -> StageOutcome:
        onnx = next((a for a in inputs if a.role == "onnx"), None)
        onnx_path = self.ctx.workspace.root / onnx.path if onnx is not None else None
        engine_path = self.engine_path()
        early = _EarlyWork(self, engine_path)
        self.runtime.engine_written = early.hand_over
        self.runtime.leave_build_point_ahead = self.ctx.ahead is not None and self.ctx.ahead.prepares
        try:
            with atomic_output(engine_path) as tmp:
                result = self.runtime.build(onnx_path, tmp, self.variant_spec, self.model_source())
        except PipelineError as exc:
            early.abandon()
            # An engine is about the size of its ONNX or smaller; a tool that could not write it
            # says so in its own words, which read as a fault of the ONNX or of the compiler.
            expected = onnx_path.stat().st_size if onnx_path is not None else 0
            shortfall = storage_shortfall(engine_path.parent, expected, what="the engine")
            if shortfall is not None:
                raise PipelineError(
                    f"could not write the engine {engine_path.name}: {shortfall}. (What the tool said: {exc.message.rstrip('.')}.)",
                    hint="free space there, raise the limit, or keep the workspace on a larger disk; then run the same command again",
                ) from exc
            if not isinstance(exc, RefusedByTool):
                raise
            if exc.result is not None:
                # The compiler's reason and log are recorded, and an engine from an earlier build
                # goes: the manifest now says this configuration has none.
                engine_path.unlink(missing_ok=True)
                exc.outcome = self.outcome(exc.result, engine_path=None)
                if onnx_path is not None and self.runtime.reads_onnx and self.ctx.gpu_type is None:  # reduce reads local builds
                    reduce = f"`pipeline reduce --engine {self.engine.name} --toolchain {self.toolchain}` cuts the graph to the smallest that fails the same way"
                    exc.hint = f"{exc.hint}; {reduce}" if exc.hint else reduce
            raise
        except BaseException:  # interrupted: the work ahead of a build alone stops with it
            early.abandon()
            raise
        finally:
            self.runtime.engine_written = None
            self.runtime.leave_build_point_ahead = False
        if not early.tried:  # the runtime did not say when it wrote the engine: handed over now
            early.hand_over(engine_path)
        return early.finish(result)

    def record_ahead(self, evidence: dict) -> None:
        """Add what the work ahead of the profiles found to this engine's build manifest, written
        when the build ended (it does not change what the build made, nor its fingerprint)."""
        if (str(self.manifest_path()), self.name) not in self.ctx.done:
            return  # the build failed after it handed its work over: the record there is an earlier build's
        manifest = self.load_manifest()
        record = manifest.build if manifest is not None else None
        if record is None or record.details is None or record.status != "done":
            return  # the build was refused after it handed its work over
        details = record.details
        updates = {key: merge_evidence({key: getattr(details, key, None)}, {key: facts})[key] for key, facts in evidence.items()}
        details = BuildDetails.model_validate({**details.model_dump(mode="json"), **checked_evidence(self.runtime, updates, BuildDetails)})
        record = record.model_copy(update={"details": details})
        manifest.model_copy(update={"build": record}).write(self.manifest_path())

    def point_workloads(self) -> list:
        """The inputs each shape point's profile will feed this engine (the export's reference
        batches); none for an engine of one shape or one point."""
        from pipeline.measuring.accuracy import ReferenceBatch

        if self.shape is not None:
            return []
        details = self.export_record().details
        batches = (
            ReferenceBatch.from_export(details, self.ctx.workspace.root, point.label) for point in self.model_source().shape_points()
        )
        return [batch for batch in batches if batch is not None]

    def outcome(self, result, engine_path: Path | None) -> StageOutcome:
        outputs = [self.ctx.workspace.artifact("engine", engine_path)] if engine_path is not None else []
        outputs += [self.ctx.workspace.artifact(role, path) for role, path in result.sidecars.items() if path.exists()]
        details = BuildDetails(
            runtime=self.runtime.kind,
            runtime_version=self.runtime.version,
            settings=result.settings,
            notes=result.notes,
            **checked_evidence(self.runtime, result.evidence, BuildDetails),
        )
        return StageOutcome(outputs=outputs, details=details, command=result.command)


def merge_evidence(evidence: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``more`` added to ``evidence`` key by key, each key's facts beside those already there."""
    for key, facts in more.items():
        evidence[key] = {**(evidence.get(key) or {}), **facts}
    return evidence


class _EarlyWork:
    """A build's work ahead of its profiles, handed over as soon as the runtime has written the
    engine (runtime.engine_written), so that it goes on beside the rest of the build — a compiled
    engine's other points beside its own first point's compilation — not after it: into the run's
    pool (ctx.ahead), or for a build outside a run (a cluster's build task) into a pool of its
    own, waited for when the build ends. The work reads the engine under a second name, a link to
    the file being written, which stays whatever becomes of its temporary name and goes when the
    work is over. Where no link can be made, or the runtime does not say when it has written the
    engine, the work is handed over when the build ends."""

    def __init__(self, stage: BuildStage, engine_path: Path):
        self.stage, self.engine_path = stage, engine_path
        self.link = engine_path.with_name(f".{engine_path.name}.ahead")
        self.work = None
        self.own_pool = None
        self.tried = False  # handed over (or the pool that was to take it failed)
        self.started = False

    def hand_over(self, written: Path) -> None:
        """Hand the work over, for the engine at ``written``: its temporary name while the build
        goes on, or its own once the build has ended."""
        workloads = self.stage.point_workloads()
        work = self.stage.runtime.ahead_work(self.link, workloads)
        if work is None:
            return
        try:
            self.link.unlink(missing_ok=True)
            os.link(written, self.link)
        except OSError:
            if written != self.engine_path:
                return  # handed over when the build has ended
            work = self.stage.runtime.ahead_work(written, workloads)
        self.work, self.tried = work, True
        shared = self.stage.ctx.ahead
        if shared is not None:
            shared.discard_after(self.link)
            self.started = shared.submit(self.stage, work)
            return
        self.own_pool = work.pool()
        try:
            self.own_pool.expect(len(work.jobs))  # the only work it is handed
            self.started = self.own_pool.submit(work)
        except Exception as exc:  # only time is lost: each profile prepares its own point
            self.stage.ctx.reporter.warn(f"{self.stage.engine.name}: nothing done ahead of profiles: {type(exc).__name__}: {exc}")
            self.abandon()
            self.work = None

    def finish(self, result) -> StageOutcome:
        """The build's outcome: with the work's evidence (a build alone, waited for here), or
        saying it goes on in the background (the run's pool, recorded when the run waits for it)."""
        stage = self.stage
        if self.own_pool is None:
            outcome = stage.outcome(result, self.engine_path)
            if self.started:
                outcome.note = f" ({self.work.doing} goes on in the background)"
            return outcome
        try:
            evidence, _ = self.own_pool.finish(stage.ctx.reporter.progress)
            merge_evidence(result.evidence, evidence[0])
        except Exception as exc:  # only time is lost: each profile prepares its own point
            stage.ctx.reporter.warn(f"{stage.engine.name}: nothing done ahead of profiles: {type(exc).__name__}: {exc}")
        finally:
            self.abandon()
        return stage.outcome(result, self.engine_path)

    def abandon(self) -> None:
        """Stop the work of a build alone (the run's pool stops with the run) and drop the link."""
        if self.own_pool is not None:
            self.own_pool.close()
            self.own_pool = None
            self.link.unlink(missing_ok=True)

"""Profile stage: record what the measurement of an engine's shape point gave it (pipeline/stages/point.py)
— the per-iteration latencies summarised, the tool's evidence, the engine's accuracy."""

from __future__ import annotations

import functools
import statistics
from pathlib import Path
from typing import Any

from pipeline.machine.environment import cpu_name, machine_load, nvidia_gpus
from pipeline.manifest import Artifact, ProfileDetails, StageRecord, read_manifest
from pipeline.measuring.records import kept_take_medians
from pipeline.measuring.serving import served_figures
from pipeline.measuring.stats import LatencyStats
from pipeline.report.flags import watch_flags
from pipeline.running.errors import PipelineError, RefusedByTool
from pipeline.runtimes import get_runtime
from pipeline.runtimes.base import checked_evidence
from pipeline.stages.base import Stage, StageOutcome


class ProfileStage(Stage):
    """Time the engine, then check its own outputs on the reference batch (pipeline/measuring/accuracy.py)."""

    name = "profile"

    def __init__(self, ctx, engine, toolchain: str, shape: str | None = None):
        super().__init__(ctx, engine, toolchain)
        self.runtime = get_runtime(ctx, toolchain)
        self.settings = ctx.catalog.profile
        # The shape point measured ("2x512"), for models with several; its own manifest.
        self.shape = shape
        # Its engine prepared and checked while the run waited for its work ahead, for its point's
        # measurement to take: (engine, accuracy, costs) (pipeline/stages/point.py, prepare_points_ahead).
        self.ahead: tuple | None = None

    def manifest_path(self) -> Path:
        return self.ctx.workspace.manifest_path(self.toolchain, self.engine, self.ctx.gpu_type, self.shape)

    def engine_manifest_path(self) -> Path:
        """Where the engine's build is recorded: the same file for a model of one shape and for a
        static model's engine of this point, the engine's own for an engine of a shape range."""
        shape = self.shape if self.model_spec.static else None
        return self.ctx.workspace.manifest_path(self.toolchain, self.engine, self.ctx.gpu_type, shape)

    def params(self) -> dict[str, Any]:
        # An unset host_cpus, the median's ranking (by) and energy left unread are left out, so
        # measurements taken before these settings existed stay current.
        settings = self.settings.model_dump(exclude_none=True)
        if not self.settings.serves:  # likewise serving's settings where nothing is served
            del settings["streams"], settings["serve_s"], settings["serve_rounds"]
        elif not self.runtime.serves_in_rounds:  # one take a count whatever it says
            del settings["serve_rounds"]
        if settings.get("by") == "median":
            del settings["by"]
        if not settings.get("energy"):
            settings.pop("energy", None)
        if self.shape is None:
            return {"settings": settings, "batch_size": self.model_spec.batch_size}
        return {"settings": settings, "shape": self.shape}

    def identity(self) -> dict[str, Any]:
        # A measurement belongs to the machine it was taken on: a different CPU or GPU re-measures.
        machine = {"cpu": cpu_name(), "gpus": [gpu.name for gpu in nvidia_gpus()]}
        return {**self.runtime.identity(), "machine": machine}

    def build_record(self) -> StageRecord | None:
        try:
            return read_manifest(self.engine_manifest_path()).build
        except FileNotFoundError:
            return None

    def skip_reason(self) -> str | None:
        build = self.build_record()
        if build is not None and build.status in ("skipped", "failed", "out_of_memory", "faulted"):
            return f"not built: {build.reason}"
        if build is not None and build.details is not None:
            return self.runtime.cannot_profile_reason(build.details.settings)
        return None

    def inputs(self) -> list[Artifact]:
        build = self.build_record()
        if build is None:
            raise PipelineError(
                f"{self.engine.name} has no {self.toolchain} engine yet.",
                hint=f"run `pipeline build --engine {self.engine.name} --toolchain {self.toolchain}`",
            )
        built_with = build.details.runtime_version if build.details is not None else None
        if built_with is not None and built_with != self.runtime.version:
            raise PipelineError(
                f"{self.engine.name} was built by {build.details.runtime} {built_with}, but toolchain "
                f"{self.toolchain} is {self.runtime.version}; engines only load in the release that built them.",
                hint=f"rebuild it: `pipeline build --engine {self.engine.name} --toolchain {self.toolchain} --force`",
            )
        for artifact in build.outputs:
            if not self.ctx.workspace.is_intact(artifact):
                raise PipelineError(
                    f"{artifact.path} changed since it was built.",
                    hint=f"rebuild it: `pipeline build --engine {self.engine.name} --toolchain {self.toolchain} --force`",
                )
        engine = [a for a in build.outputs if a.role == "engine"]
        # The reference batch is an input too: a changed one re-checks the engine's accuracy.
        export = self.export_record
        references = [a for a in (export.outputs if export else []) if self._is_reference(a.role)]
        for artifact in references:
            if not self.ctx.workspace.is_intact(artifact):
                raise PipelineError(
                    f"{artifact.path} changed since it was exported.",
                    hint=f"re-export it: `pipeline export --engine {self.engine.name} --force`",
                )
        return engine + references

    def engine_file(self) -> Path:
        """The built engine this profile times."""
        build = self.build_record()
        engine = next((a for a in (build.outputs if build else []) if a.role == "engine"), None)
        if engine is None:
            raise PipelineError(
                f"{self.engine.name} has no {self.toolchain} engine yet.",
                hint=f"run `pipeline build --engine {self.engine.name} --toolchain {self.toolchain}`",
            )
        return self.ctx.workspace.root / engine.path

    def _is_reference(self, role: str) -> bool:
        """A reference file of this profile's shape point (``reference_input@2x512:input_ids``)."""
        if not role.startswith("reference_"):
            return False
        point = role.partition("@")[2].partition(":")[0] or None
        return point == self.shape

    def workload(self):
        """The inputs measured at this shape point (the reference batch there); None for a model of
        one shape, whose runtimes feed seeded inputs of the engine's own shape."""
        from pipeline.measuring.accuracy import ReferenceBatch

        if self.shape is None:
            return None
        export = self.export_record
        reference = ReferenceBatch.from_export(export.details, self.ctx.workspace.root, self.shape) if export else None
        if reference is None:
            raise PipelineError(
                f"the export of {self.engine.name} has no inputs at shape {self.shape}.",
                hint=f"re-export it: `pipeline export --engine {self.engine.name} --force`",
            )
        return reference

    @functools.cached_property
    def export_record(self) -> StageRecord | None:
        # The export manifest itself, not the copy in the engine manifest: an export that re-ran
        # with a new reference batch but the same ONNX leaves the engine (and that copy) as it was.
        try:
            return read_manifest(self.ctx.workspace.export_manifest_path(self.engine)).export
        except FileNotFoundError:
            return None

    def extra_manifest_fields(self) -> dict[str, Any]:
        # The engine manifest stays complete evidence: the export record its accuracy was checked against.
        export = self.export_record
        fields: dict[str, Any] = {"export": export} if export is not None else {}
        if self.shape is not None:
            fields.update(shape=self.shape, build=self.build_record())
        return fields

    def run_impl(self, inputs: list[Artifact], measured=None) -> StageOutcome:
        """Record ``measured``: what the measurement of this profile's shape point
        (pipeline/stages/point.py, Measured) gave its engine, or the error that left it without."""
        if measured is None:
            raise RuntimeError("a profile records the measurement of its shape point: run it through pipeline.stages.point.profile_point")
        try:
            if isinstance(measured, PipelineError):
                raise measured
            return self._record(measured)
        except RefusedByTool as exc:
            # Out of memory at this shape point, say: recorded in its manifest as failed, with the
            # reason, so the sweep's table shows it; the other points and engines still run.
            exc.outcome = StageOutcome(outputs=[])
            raise

    def _record(self, measured) -> StageOutcome:
        settings, results, rounds = self.settings, measured.results, measured.rounds
        workload = self.workload()
        medians = [round(LatencyStats.from_values(r.per_iteration_ms).median, 6) for r in results]
        repeat_cv = LatencyStats.from_values(medians).cv if len(medians) > 1 else None
        stable = repeat_cv is None or repeat_cv <= settings.max_repeat_cv
        # The row's figures pool every run of every measurement: the median of the pooled runs,
        # with the measurements' own medians and their CV beside it.
        pooled = [value for r in results for value in r.per_iteration_ms]
        stats = LatencyStats.from_values(pooled)
        own_qps = [r.throughput_qps for r in results if r.throughput_qps]
        qps = sum(own_qps) / len(own_qps) if len(own_qps) == len(results) else 1000.0 / stats.mean
        warnings = list(dict.fromkeys(w for r in results for w in r.warnings))
        self._warn(warnings, measured, repeat_cv, stable)
        batch = workload.inputs[0].shape[0] if workload else self.model_spec.batch_size
        unit, tokens_per_run = self.work_per_run(workload)
        tokens = qps * tokens_per_run if tokens_per_run else None
        details = ProfileDetails(
            settings=settings,
            batch_size=batch,
            device=results[-1].device,
            metric=results[-1].metric,
            iterations=stats.count,
            total_walltime_s=sum(r.total_walltime_s for r in results),
            latency_ms=stats,
            throughput_qps=qps,
            images_per_s=qps * batch,
            sample_unit=unit,
            input_shapes={name: list(shape) for name, shape in workload.shapes.items()} if workload else {},
            tokens_per_s=tokens,
            per_iteration_ms=[round(v, 6) for v in pooled],
            repeat_medians_ms=medians if len(medians) > 1 else [],
            repeat_cv=repeat_cv,
            repeats_pooled=len(results),
            retaken_medians_ms=measured.retaken,
            retaken_in_fresh_process=None if not measured.retaken else False,
            rounds=rounds,
            gpu_device=measured.gpu_device,
            preparation_s=measured.preparation_s,
            prepared_ahead=measured.prepared_ahead,
            stable=stable if len(medians) > 1 else None,
            # The machine's load around the measurement and what it did during each one, so a
            # number taken on a busy machine shows it.
            machine_load={"start": measured.load_at_start, "end": measured.load_at_end or machine_load(), "during": measured.watched},
            warnings=warnings,
            **checked_evidence(self.runtime, results[-1].evidence, ProfileDetails),
        )
        accuracy, accuracy_skipped, checked = measured.accuracy
        details.accuracy, details.accuracy_skipped = accuracy, accuracy_skipped
        details.streams = [served_figures(run, batch, tokens_per_run) for run in measured.served]
        sidecars = {**results[-1].sidecars, **(checked.sidecars if checked else {})}
        outputs = [self.ctx.workspace.artifact(role, path) for role, path in sidecars.items()]
        note = self._note(details, measured)
        return StageOutcome(outputs=outputs, details=details, command=results[-1].command, note=note, seconds=measured.seconds)

    def _warn(self, warnings: list[str], measured, repeat_cv: float | None, stable: bool) -> None:
        """What the tool, the machine and the measurements' agreement say against the figures."""
        for warning in warnings:
            if warning.startswith("* "):  # trtexec's own judgement of the measurement
                self.ctx.reporter.warn(f"{self.engine.name}: {warning[2:]}")
        for flag in watch_flags(measured.watched):
            self.ctx.reporter.warn(f"{self.engine.name}: {flag}")
        if not stable:
            after = f"after {len(measured.retaken)} retake(s) " if not measured.rounds else ""
            self.ctx.reporter.warn(
                f"{self.engine.name}: unstable: the measurements still disagree {after}"
                f"(CV {repeat_cv:.2%} > {self.settings.max_repeat_cv:.0%}); recorded as unstable"
            )

    @staticmethod
    def _note(details: ProfileDetails, measured) -> str:
        """The profile's line: "median 0.64 ms, 10,669 tokens/s over 90 runs in 17 rounds beside 3 other engines; …"."""
        stats, rounds, count = details.latency_ms, measured.rounds, details.repeats_pooled
        pooled_from = f" of {count} measurements pooled" if count > 1 else ""
        rate = f"{details.tokens_per_s:,.0f} tokens/s" if details.tokens_per_s else f"{details.images_per_s:.1f} {details.sample_unit}/s"
        kept = kept_take_medians(rounds or [])
        median = statistics.median(kept) if kept else stats.median  # as compare shows it
        note = f": median {median:.2f} ms, {rate} over {stats.count} runs{pooled_from}"
        if rounds:
            others = len(rounds[0].entrants) - 1
            left = rounds[0].raced_out.get(rounds[0].entrant)
            taken = f"{left} of {rounds[0].rounds} rounds (then out of the running)" if left is not None else f"{rounds[0].rounds} rounds"
            note = f" of rounds{note} in {taken}" + (f" beside {others} other engine{'s' if others > 1 else ''}" if others else "")
        accuracy = details.accuracy
        if accuracy:
            cosine = accuracy["cosine_similarity"]
            note += f"; vs FP32 cosine {'NaN/Inf' if cosine is None else f'{cosine:.5f}'}"
            if accuracy["top1_agreement"] is not None:
                note += f", top-1 {accuracy['top1_agreement']:.0%}"
            if accuracy.get("top1_accuracy") is not None:
                note += f", top-1 accuracy {accuracy['top1_accuracy']:.1%} on the labelled images"
        by_mode: dict[str, list] = {}
        for record in details.streams:
            if record.why_not is None:
                by_mode.setdefault(record.mode, []).append(record)
        if by_mode:  # "; served 1/2 streams by threads: 663/681 inf/s"
            note += "; served " + ", ".join(
                f"{'/'.join(str(r.streams) for r in runs)} streams by {mode}: {'/'.join(f'{r.inferences_per_s:,.0f}' for r in runs)} inf/s"
                for mode, runs in by_mode.items()
            )
        if details.repeat_cv is not None:
            medians, stable = details.repeat_medians_ms, details.stable
            note += f"; their medians {min(medians):.3f}–{max(medians):.3f} ms (CV {details.repeat_cv:.2%}{'' if stable else ', unstable'})"
        return note

    def work_per_run(self, workload) -> tuple[str, int | None]:
        """(what a sample is, tokens per run): "seq" and the size of the token ids where the model
        takes them (batch × sequence), "img" for images, else "sample" — from the inputs' kinds the
        export recorded."""
        export = self.export_record
        kinds = {entry["name"]: entry.get("kind") for entry in (export.details.inputs if export and export.details else [])}
        if workload is not None:
            for tensor in workload.inputs:
                if kinds.get(tensor.name) == "token_ids":
                    count = 1
                    for size in tensor.shape:
                        count *= size
                    return "seq", count
        if "image" in kinds.values() or not kinds:  # exports before inputs were recorded are timm's
            return "img", None
        return "sample", None

    def check_accuracy(self, engine_path: Path, workload=None):
        """(figures, why not checked, the reference run) for this engine on its reference batch
        (the workload's, at a shape point)."""
        from pipeline.measuring.accuracy import ReferenceBatch, compare_outputs

        self.ctx.reporter.step("checking its outputs on the reference batch")
        export = self.export_record
        reference = workload
        if reference is None:
            reference = ReferenceBatch.from_export(export.details, self.ctx.workspace.root) if export and export.details else None
        if reference is None:
            return None, "its export has no reference batch (exported by an earlier version): re-export with --force", None
        if reference.output is None:
            return None, reference.unchecked, None
        run = self.runtime.run_reference(engine_path, reference)
        if run is None:
            return None, f"the {self.runtime.kind} runtime does not run engines on given inputs", None
        if reference.output.name not in run.outputs:
            raise PipelineError(
                f"{engine_path.name} has outputs {sorted(run.outputs)}; the reference is for {reference.output.name!r}.",
                hint="the engine's output names differ from the ONNX's; rebuild it from this export (`--force`)",
            )
        figures = compare_outputs(
            reference.output.as_float32(),
            run.outputs[reference.output.name],
            precision=reference.precision,
            sparse=reference.sparse,
            description=reference.description,
            checked_by=run.checked_by,
            samples=reference.samples,
            labels=reference.labels,
        )
        verdict = run.tool.get(reference.output.name)
        if verdict is not None:
            figures.tool_loss, figures.tool_failed = verdict["loss"], verdict["failed"]
            if verdict["failed"] and figures.warning is None:
                figures.warning = f"trtexec's own check failed: cosine loss {verdict['loss']:g} >= threshold {verdict['threshold']:g}"
        if figures.warning:
            self.ctx.reporter.warn(f"{self.engine.name} on {self.toolchain}: {figures.warning}")
        return figures.model_dump(), None, run

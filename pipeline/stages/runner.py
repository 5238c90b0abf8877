"""Run stages for a selection of engines, upstream first, each skipped when unchanged."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from pipeline.catalog import EngineRef
from pipeline.running.errors import DeviceFault, EnvironmentMissing, PipelineError, UsageError
from pipeline.stages.base import STAGE_ORDER, RunContext, RunRequest
from pipeline.stages.serving import serving_words


@dataclass
class RunSummary:
    succeeded: list[str] = field(default_factory=list)
    # (engine, toolchain or None, the error): what failed, and on which toolchain.
    failed: list[tuple[str, str | None, PipelineError]] = field(default_factory=list)

    def fail(self, engine: str, toolchain: str | None, error: PipelineError) -> None:
        self.failed.append((engine, toolchain, error))
        if engine in self.succeeded:
            self.succeeded.remove(engine)

    def say(self, where: str, error: PipelineError) -> None:
        """The error, where it happened; its hint once a run (a model's bad setting fails each of
        its engines on each toolchain alike, and its hint may be long)."""
        from pipeline.running.reporting import print_error

        said = any(error.hint and error.hint == other.hint for *_, other in self.failed)
        print_error(f"{where}: {error.message}", None if said else error.hint)

    def raise_for_failures(self, requested: int, toolchains: list[str] | None = None) -> RunSummary:
        """One error naming every failed engine, or every toolchain with a failure when several
        ran (exit 3 when each failed for want of something)."""
        if self.failed:
            worst = PipelineError
            for kind in (EnvironmentMissing, UsageError):  # each failed for want of something, or by the user's input
                if all(isinstance(e, kind) for *_, e in self.failed):
                    worst = kind
            if toolchains and len(toolchains) > 1:
                failing = [t for t in toolchains if any(toolchain == t for _, toolchain, _ in self.failed)]
                raise worst(
                    f"{len(failing)} of {len(toolchains)} toolchains failed: {', '.join(failing)}.",
                    hint="the errors above say why; what the others measured is kept",
                )
            names = ", ".join(dict.fromkeys(name for name, *_ in self.failed))
            raise worst(
                f"{len(dict.fromkeys(name for name, *_ in self.failed))} of {requested} engines failed: {names}.",
                hint="the errors above say why; the other engines' results are kept",
            )
        return self


def stage_for(ctx: RunContext, name: str, engine: EngineRef, toolchain: str | None = None, shape: str | None = None):
    """The Stage object of one stage by name ("export", "build", "profile"), at a shape point
    (profiles of models with several; builds too, for static ones)."""
    if name == "export":
        from pipeline.stages.export import ExportStage

        return ExportStage(ctx, engine)
    if name == "build":
        from pipeline.stages.build import BuildStage

        return BuildStage(ctx, engine, toolchain, shape)
    from pipeline.stages.profile import ProfileStage

    return ProfileStage(ctx, engine, toolchain, shape)


def run_engine(ctx: RunContext, engine: EngineRef, toolchain: str | None, until: str, points: dict) -> None:
    """Run every stage up to ``until`` for one engine. Stages before it are skipped when unchanged.
    Its profiles are not run here but gathered in ``points`` by shape point, to be measured with
    the point's other engines (pipeline/stages/point.py)."""
    from pipeline.stages.build import BuildStage
    from pipeline.stages.export import ExportStage
    from pipeline.stages.profile import ProfileStage

    wanted = STAGE_ORDER[: STAGE_ORDER.index(until) + 1]
    if toolchain is None:
        ExportStage(ctx, engine).run()
        return
    builds = builds_of(ctx, engine)
    # A variant the toolchain cannot run is recorded as skipped without exporting it first:
    # exporting nvfp4 on a CPU-only machine would fail for a reason that does not matter here.
    if BuildStage(ctx, engine, toolchain, builds[0]).unsupported() is None:
        ExportStage(ctx, engine).run()

    def profile(shape: str | None) -> None:
        points.setdefault((engine.model, ctx.gpu_type, shape), []).append(ProfileStage(ctx, engine, toolchain, shape))

    if builds == [None]:  # one engine, profiled at every point
        if "build" in wanted:
            BuildStage(ctx, engine, toolchain).run()
        if "profile" in wanted:
            _each_point(ctx, engine, shapes_to_profile(ctx, engine), profile)
        return

    def build_and_profile(shape: str | None) -> None:  # a static model: an engine per point, each profiled at its own
        if "build" in wanted:
            BuildStage(ctx, engine, toolchain, shape).run()
        if "profile" in wanted:
            profile(shape)

    _each_point(ctx, engine, builds, build_and_profile)


def _each_point(ctx: RunContext, engine: EngineRef, points: list[str | None], work) -> None:
    """``work`` at every shape point; a point that fails (out of memory at the largest, say) is
    reported and recorded, and the others still run. One error afterwards names the failed ones."""
    from pipeline.running.reporting import print_error

    if points == [None]:
        work(None)
        return
    failed: list[tuple[str, PipelineError]] = []
    for shape in points:
        try:
            work(shape)
        except (EnvironmentMissing, DeviceFault):
            raise  # the machine lacks something: every point would fail the same way; or this process is poisoned
        except PipelineError as exc:
            print_error(f"{engine.name} at {shape}: {exc.message}", exc.hint)
            failed.append((shape, exc))
    if failed:
        raise PipelineError(
            f"{engine.name}: {len(failed)} of {len(points)} shape points failed ({', '.join(shape for shape, _ in failed)}); "
            "the errors above say why.",
            hint="each is recorded in its point's manifest; `pipeline compare` shows them beside the others",
        )


def shapes_to_profile(ctx: RunContext, engine: EngineRef) -> list[str | None]:
    """The shape points a profile of this engine measures ("2x512", …), or [None] for a model of one shape."""
    from pipeline.models import model_source

    points = model_source(engine.model, ctx.catalog.model(engine.model), ctx.workspace.root).shape_points()
    return [point.label for point in points] or [None]


def _failures(recorded: dict) -> list:
    """(profile, error) for each profile of a point that ended in an error."""
    return [(stage, outcome) for stage, outcome in recorded.items() if isinstance(outcome, PipelineError)]


def builds_of(ctx: RunContext, engine: EngineRef) -> list[str | None]:
    """The shape points built separately (a static model: an engine per point), or [None]: one engine."""
    return shapes_to_profile(ctx, engine) if ctx.catalog.model(engine.model).static else [None]


def onnx_read_by(ctx: RunContext, toolchains: list[str] | None) -> bool:
    """Whether any of a run's toolchains reads the ONNX its exports write (None: an export alone,
    which writes it for whatever comes next)."""
    from pipeline.runtimes import get_runtime

    return toolchains is None or any(get_runtime(ctx, toolchain).reads_onnx for toolchain in toolchains)


def jobs_ahead(ctx: RunContext, engines: list[EngineRef], toolchains: list[str | None]) -> int:
    """How many jobs the builds may hand over ahead of their profiles, at most: every shape point of
    every engine of one model (not an engine per point) on a toolchain that compiles each point
    (WorksAhead.builds_long). The compiling pool shares its CPUs out by it (pytorch/compile_sizing.py)."""
    from pipeline.runtimes import get_runtime

    compiling = [toolchain for toolchain in toolchains if toolchain is not None and get_runtime(ctx, toolchain).builds_long]
    points = 0
    for engine in engines if compiling else []:
        try:
            if not ctx.catalog.model(engine.model).static:
                points += sum(1 for shape in shapes_to_profile(ctx, engine) if shape is not None)
        except PipelineError:  # said where the engine is built
            pass
    return len(compiling) * points


def _expect_ahead_work(ctx: RunContext, engines: list[EngineRef], toolchains: list[str]) -> None:
    """Each runtime whose builds hand work ahead over told so first, before the toolchains are
    checked. The server the compiling processes fork from (pytorch/compile_process.py) imports
    torch, Dynamo, Inductor and transformers, 12-15 s on the lent H100's host; started after the
    checks had imported torch in this process (6 s), it forked its processes 5 s after the first
    points were handed over, the warm seed matrix's critical path before its first point
    (docs/results/sweeps.md). A toolchain the checks then find unusable started it for nothing."""
    from pipeline.runtimes import get_runtime

    with contextlib.suppress(PipelineError):  # a toolchain that cannot be made: the checks say so
        if not jobs_ahead(ctx, engines, list(toolchains)):
            return
    for toolchain in toolchains:  # each runtime knows whether its builds hand work ahead over
        with contextlib.suppress(PipelineError):
            get_runtime(ctx, toolchain).expect_ahead_work()


def build_order(ctx: RunContext, toolchains: list[str | None]) -> list[str | None]:
    """The order a run builds its toolchains' engines in: those whose builds go on working in the
    background (a compiled engine's other points) first, so that their work goes on beside every
    other build, not only those after it; the others as given."""
    from pipeline.runtimes import get_runtime

    return sorted(toolchains, key=lambda toolchain: not (toolchain is not None and get_runtime(ctx, toolchain).builds_long))


def run_engines(ctx: RunContext, engines: list[EngineRef], toolchains: list[str] | None, until: str) -> RunSummary:
    """Each engine on each toolchain (none: the export alone); a failure is reported and the rest
    still runs (like `make -k`). The profiles of the runtimes that time in this process are run
    last, a shape point at a time, every engine of the point in one set of rounds."""
    from pipeline.runtimes import get_runtime
    from pipeline.stages.point import prepare_points_ahead, profile_point
    from pipeline.stages.work_ahead import WorkAhead, room_on_the_gpu

    summary = RunSummary()
    requested = len(engines)
    _expect_ahead_work(ctx, engines, toolchains or [])
    usable: list[str | None] = [None] if not toolchains else []
    for toolchain in toolchains or []:
        try:
            get_runtime(ctx, toolchain).check_usable()  # an unusable toolchain fails once, up front
            usable.append(toolchain)
        except PipelineError as exc:
            if len(toolchains) == 1:
                raise
            summary.say(toolchain, exc)
            for engine in engines:
                summary.fail(engine.name, toolchain, exc)
    points: dict = {}
    single = len(engines) == 1 and len(usable) == 1
    jobs = jobs_ahead(ctx, engines, usable)
    ahead = ctx.ahead = WorkAhead(ctx.reporter, prepares=until == "profile", jobs=jobs)
    try:
        for toolchain in build_order(ctx, usable):
            for engine in engines:
                try:
                    run_engine(ctx, engine, toolchain, until, points)
                    summary.succeeded.append(engine.name)
                except DeviceFault:
                    raise  # recorded; the command goes on in a fresh process (pipeline/running/faults.py)
                except PipelineError as exc:
                    if single:
                        raise
                    summary.say(f"{engine.name}{f' on {toolchain}' if len(usable) > 1 else ''}", exc)
                    summary.fail(engine.name, toolchain, exc)
        ahead.finish(while_waiting=lambda: prepare_points_ahead(list(points.values()), room_on_the_gpu()))
        ctx.ahead = None  # the builds are over; what the work ahead serves stays until the profiles are
        for (_, _, shape), stages in points.items():
            for stage, exc in _failures(profile_point(stages)):
                where = f" at {shape}" if shape else ""
                on = f" on {stage.toolchain}" if len(usable) > 1 else ""
                if single and not shape:
                    raise exc
                summary.say(f"{stage.engine.name}{on}{where}", exc)
                summary.fail(stage.engine.name, stage.toolchain, exc)
    finally:
        ahead.close()
        ctx.ahead = None
    say_out_of_memory(ctx, until)
    return summary.raise_for_failures(requested, toolchains)


def say_out_of_memory(ctx: RunContext, until: str | None = None) -> None:
    """The run's results that did not fit in memory, summed up in one WARNING (each was said as it
    was found): they are results, and the run exits 0 for them — where something else of what
    was asked (``until``: its last stage) came to a result. A run of which nothing did (an export
    that did not fit, every point of a sweep out of memory) produced nothing and fails, as pytest
    exits 5 when no test ran: a script that checks the exit status must not take it for a run."""
    if ctx.out_of_memory:
        labels = list(dict.fromkeys(label for label, _ in ctx.out_of_memory))
        ctx.reporter.warn(
            f"{len(labels)} did not fit in memory, recorded as results (`pipeline compare` shows them; `--force` tries again): "
            + "; ".join(labels)
        )
        if until is not None and until not in ctx.produced:
            raise PipelineError(
                f"nothing to {until} fit in memory: no {_WHAT_A_STAGE_MAKES.get(until, until)} was written.",
                hint="smaller shape points or batch, or a machine with more memory; `--force` tries again",
            )


_WHAT_A_STAGE_MAKES = {"export": "model", "build": "engine", "profile": "measurement"}


def raise_if_nothing_exported(ctx: RunContext, engines: list[EngineRef]) -> None:
    """`pipeline export` is asked for ONNX models: one of which no engine selected has its ONNX (the
    exporter refused each model, say) produced nothing it was asked for and fails, as a run of which
    nothing fit in memory does; what it did write (the references the torch toolchains run from) is
    kept. An export the run did not record (none) is not judged here."""
    from pipeline.manifest import read_manifest
    from pipeline.runtimes import runtime_class

    why: dict[str, str] = {}
    refused = True
    for engine in engines:
        try:
            record = read_manifest(ctx.workspace.export_manifest_path(engine)).export
        except FileNotFoundError:
            record = None
        if record is None or any(artifact.role == "onnx" for artifact in record.outputs):
            return
        reason = record.details.onnx_refused if record.details else None
        refused = refused and reason is not None
        why[engine.name] = reason or record.reason or record.status
    if not why:
        return
    said = "; ".join(f"{name}: {reason}" for name, reason in why.items())
    # The catalog's first toolchain that starts from the PyTorch model rather than the ONNX.
    from_model = next((name for name, spec in ctx.catalog.toolchains.items() if not runtime_class(spec.kind).reads_onnx), None)
    command = f" (`pipeline run --toolchain {from_model}`)" if from_model else ""
    raise PipelineError(
        f"nothing was exported to ONNX: {'the exporter refused every model selected' if refused else 'no engine selected has one'} ({said}).",
        hint=f"the references are written, and the torch toolchains still run the model{command}; "
        "the ONNX toolchains need a model the exporter takes",
    )


class LocalLauncher:
    """Runs the stages in this process, every toolchain at once: the engines of a shape point are
    timed together. (The other launcher, on a Ray cluster: pipeline/cluster/supervisor.py.)"""

    def run(self, ctx: RunContext, request: RunRequest) -> RunSummary:
        return run_engines(ctx, request.engines, request.toolchains, request.until)


def describe(ctx: RunContext, engines: list[EngineRef], toolchain: str, until: str) -> list[str]:
    """What `--dry-run` prints: each engine's stages and the exact work they would do."""
    from pipeline.stages.build import BuildStage
    from pipeline.stages.export import ONNX_NOT_READ, ExportStage

    lines = []
    for engine in engines:
        variant = ctx.catalog.variant(engine.variant)
        first, export = BuildStage(ctx, engine, toolchain), ExportStage(ctx, engine)
        reason = first.unsupported()
        # The last export's word on the ONNX holds while the export is current (an unchanged module).
        refused = first.onnx_refused() if reason is None and export.is_current() else None
        if refused and first.runtime.reads_onnx:
            reason = first.no_onnx_reason()
        if reason:
            lines.append(f"{engine.name}: would be skipped: {reason}")
            continue
        # What the real run would refuse before any work (a point the model cannot take), refused here too.
        first.model_source().check_points()
        onnx = ctx.workspace.root / ctx.workspace.onnx_path(engine)
        if refused:
            lines.append(f"{engine.name}: export: unchanged, without ONNX (the exporter refused the model); built from PyTorch")
        elif not export.writes_onnx and not (onnx.is_file() and export.is_current()):  # else the ONNX there serves
            lines.append(f"{engine.name}: export → references only, no ONNX ({ONNX_NOT_READ}); built from PyTorch")
        else:
            lines.append(f"{engine.name}: export → {ctx.workspace.relative(onnx)}")
        for built in builds_of(ctx, engine):  # one engine; a static model's, one per shape point
            build = BuildStage(ctx, engine, toolchain, built)
            source, engine_file = build.model_source(), build.engine_path()
            lines.extend(f"{engine.name}: {line}" for line in build.runtime.describe_build(onnx, engine_file, variant, source))
            if until != "profile":
                continue
            points = [source.static_point] if source.static_point else source.shape_points() or [None]
            for point in points:
                workload = source.shapes_at(point) if point else None
                lines.extend(
                    f"{engine.name}: {line}" for line in build.runtime.describe_profile(engine_file, ctx.catalog.profile, workload)
                )
                if ctx.catalog.profile.serves:
                    lines.append(f"{engine.name}: {serving_words(build.runtime, ctx.catalog.profile)}")
    return lines

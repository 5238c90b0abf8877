"""Run stages for a selection of engines, upstream first, each skipped when unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.catalog import EngineRef
from pipeline.errors import EnvironmentMissing, PipelineError
from pipeline.stages.base import STAGE_ORDER, RunContext


@dataclass
class RunSummary:
    succeeded: list[str] = field(default_factory=list)
    failed: list[tuple[str, PipelineError]] = field(default_factory=list)

    def raise_for_failures(self, requested: int) -> RunSummary:
        """One error naming every failed engine (exit 3 when each failed for want of something)."""
        if self.failed:
            names = ", ".join(name for name, _ in self.failed)
            worst = EnvironmentMissing if all(isinstance(e, EnvironmentMissing) for _, e in self.failed) else PipelineError
            raise worst(
                f"{len(self.failed)} of {requested} engines failed: {names}.",
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


def run_engine(ctx: RunContext, engine: EngineRef, toolchain: str | None, until: str) -> None:
    """Run every stage up to ``until`` for one engine. Stages before it are skipped when unchanged."""
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
    if BuildStage(ctx, engine, toolchain, builds[0]).skip_reason() is None:
        ExportStage(ctx, engine).run()
    if builds == [None]:  # one engine, profiled at every point
        if "build" in wanted:
            BuildStage(ctx, engine, toolchain).run()
        if "profile" in wanted:
            points = shapes_to_profile(ctx, engine)
            _each_point(ctx, engine, points, lambda shape: ProfileStage(ctx, engine, toolchain, shape).run())
        return

    def build_and_profile(shape: str | None) -> None:  # a static model: an engine per point, each profiled at its own
        if "build" in wanted:
            BuildStage(ctx, engine, toolchain, shape).run()
        if "profile" in wanted:
            ProfileStage(ctx, engine, toolchain, shape).run()

    _each_point(ctx, engine, builds, build_and_profile)


def _each_point(ctx: RunContext, engine: EngineRef, points: list[str | None], work) -> None:
    """``work`` at every shape point; a point that fails (out of memory at the largest, say) is
    reported and recorded, and the others still run. One error afterwards names the failed ones."""
    from pipeline.reporting import print_error

    if points == [None]:
        work(None)
        return
    failed: list[tuple[str, PipelineError]] = []
    for shape in points:
        try:
            work(shape)
        except EnvironmentMissing:
            raise  # the machine lacks something: every point would fail the same way
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


def builds_of(ctx: RunContext, engine: EngineRef) -> list[str | None]:
    """The shape points built separately (a static model: an engine per point), or [None]: one engine."""
    return shapes_to_profile(ctx, engine) if ctx.catalog.model(engine.model).static else [None]


def run_engines(ctx: RunContext, engines: list[EngineRef], toolchain: str | None, until: str) -> RunSummary:
    """Run each engine; a failure is reported and the others still run (like `make -k`)."""
    from pipeline.reporting import print_error
    from pipeline.runtimes import get_runtime

    if toolchain is not None:
        get_runtime(ctx, toolchain).check_usable()  # an unusable toolchain fails once, up front
    summary = RunSummary()
    for engine in engines:
        try:
            run_engine(ctx, engine, toolchain, until)
            summary.succeeded.append(engine.name)
        except PipelineError as exc:
            if len(engines) == 1:
                raise
            print_error(f"{engine.name}: {exc.message}", exc.hint)
            summary.failed.append((engine.name, exc))
    return summary.raise_for_failures(len(engines))


class LocalLauncher:
    """Runs the stages in this process (the cluster's launcher, pipeline/cluster/, runs the same
    stages on Ray nodes); the command line chooses one, and a stage never knows which."""

    def run(self, ctx: RunContext, engines: list[EngineRef], toolchain: str | None, until: str) -> RunSummary:
        return run_engines(ctx, engines, toolchain, until)


def describe(ctx: RunContext, engines: list[EngineRef], toolchain: str, until: str) -> list[str]:
    """What `--dry-run` prints: each engine's stages and the exact work they would do."""
    from pipeline.stages.build import BuildStage

    lines = []
    for engine in engines:
        variant = ctx.catalog.variant(engine.variant)
        reason = BuildStage(ctx, engine, toolchain).skip_reason()
        if reason:
            lines.append(f"{engine.name}: would be skipped: {reason}")
            continue
        # What the real run would refuse before any work (a point the model cannot take), refused here too.
        BuildStage(ctx, engine, toolchain).model_source().check_points()
        onnx = ctx.workspace.root / ctx.workspace.onnx_path(engine)
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
    return lines

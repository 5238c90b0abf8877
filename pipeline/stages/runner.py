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


def stage_for(ctx: RunContext, name: str, engine: EngineRef, toolchain: str | None = None):
    """The Stage object of one stage by name ("export", "build", "profile")."""
    if name == "export":
        from pipeline.stages.export import ExportStage

        return ExportStage(ctx, engine)
    if name == "build":
        from pipeline.stages.build import BuildStage

        return BuildStage(ctx, engine, toolchain)
    from pipeline.stages.profile import ProfileStage

    return ProfileStage(ctx, engine, toolchain)


def run_engine(ctx: RunContext, engine: EngineRef, toolchain: str | None, until: str) -> None:
    """Run every stage up to ``until`` for one engine. Stages before it are skipped when unchanged."""
    from pipeline.stages.build import BuildStage
    from pipeline.stages.export import ExportStage
    from pipeline.stages.profile import ProfileStage

    wanted = STAGE_ORDER[: STAGE_ORDER.index(until) + 1]
    if toolchain is None:
        ExportStage(ctx, engine).run()
        return
    build = BuildStage(ctx, engine, toolchain)
    # A variant the toolchain cannot run is recorded as skipped without exporting it first:
    # exporting nvfp4 on a CPU-only machine would fail for a reason that does not matter here.
    if build.skip_reason() is None:
        ExportStage(ctx, engine).run()
    if "build" in wanted:
        build.run()
    if "profile" in wanted:
        for shape in shapes_to_profile(ctx, engine):
            ProfileStage(ctx, engine, toolchain, shape).run()


def shapes_to_profile(ctx: RunContext, engine: EngineRef) -> list[str | None]:
    """The shape points a profile of this engine measures ("2x512", …), or [None] for a model of one shape."""
    from pipeline.models import model_source

    points = model_source(engine.model, ctx.catalog.model(engine.model), ctx.workspace.root).shape_points()
    return [point.label for point in points] or [None]


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
    from pipeline.models import model_source
    from pipeline.runtimes import get_runtime

    runtime = get_runtime(ctx, toolchain)
    lines = []
    for engine in engines:
        variant = ctx.catalog.variant(engine.variant)
        source = model_source(engine.model, ctx.catalog.model(engine.model), ctx.workspace.root)
        reason = runtime.unsupported_reason(variant)
        if reason:
            lines.append(f"{engine.name}: would be skipped: {reason}")
            continue
        onnx = ctx.workspace.relative(ctx.workspace.onnx_path(engine))
        engine_file = ctx.workspace.relative(ctx.workspace.engine_dir(toolchain) / f"{engine.name}{runtime.engine_suffix}")
        lines.append(f"{engine.name}: export → {onnx}")
        lines.extend(
            f"{engine.name}: {line}"
            for line in runtime.describe_build(ctx.workspace.root / onnx, ctx.workspace.root / engine_file, variant, source)
        )
        if until == "profile":
            for point in source.shape_points() or [None]:
                workload = source.shapes_at(point) if point else None
                lines.extend(
                    f"{engine.name}: {line}"
                    for line in runtime.describe_profile(ctx.workspace.root / engine_file, ctx.catalog.profile, workload)
                )
    return lines

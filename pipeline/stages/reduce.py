"""`pipeline reduce`: the graph of an engine whose build failed, cut down to the smallest that
still fails the same way on the same toolchain, by Polygraphy's reducer with the toolchain's own
build as the check (pipeline/graph/reduce.py) — what TensorRT's maintainers ask for in a bug report.

The failure kept is the build's first: the node its ONNX parser refused (op, check, words), or the
compiler's own message with its numbers and names left out. The reduced graph goes to
models/<model>/<variant>.<toolchain>.reduced.onnx and the build manifest records it
(BuildDetails.reduced); nothing is written before the reduction ends, and the candidates go with
it whatever ends it.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.catalog import EngineRef
from pipeline.graph.failure import failure_signature
from pipeline.graph.reduce import Checks, CutNotBuilt, reduce_graph, scratch
from pipeline.manifest import read_manifest
from pipeline.models import model_source
from pipeline.running.errors import OutOfMemory, PipelineError, RefusedByTool, ToolCrashed, ToolStopped, UsageError
from pipeline.runtimes import get_runtime
from pipeline.workspace.artifacts import sha256_file


class _CutGraph:
    """The model as a build sees it for a cut of the graph: Polygraphy's cuts have static shapes,
    so there is no optimization profile to give."""

    @staticmethod
    def input_ranges() -> dict:
        return {}


def reduce_engine(ctx, engine: EngineRef, toolchain: str, shape: str | None = None) -> Path:
    """Reduce the graph of ``engine``'s failed build on ``toolchain``; the reduced graph's path."""
    workspace, reporter = ctx.workspace, ctx.reporter
    manifest_path = workspace.manifest_path(toolchain, engine)
    manifest = read_manifest(manifest_path) if manifest_path.is_file() else None
    build = manifest.build if manifest is not None else None
    again = f"pipeline build --engine {engine.name} --toolchain {toolchain}"
    if build is None:
        raise UsageError(f"{engine.name} has no build on {toolchain} yet: there is no failure to reduce.", hint=f"run `{again}` first")
    if build.status != "failed":
        said = "built" if build.status == "done" else f"{build.status.replace('_', ' ')}" + (f" ({build.reason})" if build.reason else "")
        raise UsageError(
            f"the build of {engine.name} on {toolchain} did not fail ({said}): reduce cuts down a graph the compiler refused.",
            hint="reduce an engine whose build failed; `pipeline compare` lists each build's status",
        )
    runtime = get_runtime(ctx, toolchain)
    runtime.check_usable()  # each cut is a build on it
    onnx = next((a for a in build.inputs if a.role == "onnx"), None)
    if not runtime.reads_onnx or onnx is None:
        raise UsageError(f"{toolchain} builds {engine.name} from the PyTorch model, not from a graph: there is no ONNX to reduce.")
    onnx_path = workspace.root / onnx.path
    read = [onnx, *(a for a in build.inputs if a.role == "onnx_data")]  # its external data too
    if any(not (workspace.root / a.path).is_file() or sha256_file(workspace.root / a.path) != a.sha256 for a in read):
        raise UsageError(
            f"{onnx.path} is not the graph the build of {engine.name} on {toolchain} refused (it changed or is gone).",
            hint=f"build it again (`{again} --force`), then reduce what fails now",
        )
    details = build.details
    signature = failure_signature(build.reason or "", getattr(details, "parser_failure", None), onnx_path)
    variant = ctx.catalog.variants[engine.variant]
    with scratch(workspace.engine_dir(toolchain) / f".reduce-{engine.name}") as workdir:

        def fails_the_same_way(candidate: Path, source=_CutGraph) -> tuple[bool, str]:
            try:
                runtime.build(candidate, workdir / "candidate.engine", variant, source)
            except OutOfMemory as exc:
                raise CutNotBuilt("ran out of memory") from exc
            except ToolStopped as exc:
                raise CutNotBuilt(exc.why) from exc
            except ToolCrashed as exc:
                if signature != failure_signature(exc.message, None, candidate):  # a crash of its own, not the one reduced
                    raise CutNotBuilt(f"crashed ({exc.signal})") from exc
                return True, "crashed the same way"
            except RefusedByTool as exc:
                evidence = exc.result.evidence if exc.result is not None else {}
                same = failure_signature(exc.message, evidence.get("parser_failure"), candidate) == signature
                return same, "fails otherwise: " + exc.message
            return False, "builds"

        reporter.line("reduce", engine.name, f"checking that {onnx.path} still fails on {toolchain} as its build did")
        source = model_source(engine.model, ctx.catalog.models[engine.model], workspace.root)
        try:
            same, words = fails_the_same_way(onnx_path, source)
        except CutNotBuilt as exc:
            same, words = False, f"its build {exc.why}"
        if not same:
            raise PipelineError(
                f"{onnx.path} no longer fails on {toolchain} as its build did ({words}): there is nothing to keep while cutting it.",
                hint=f"a failure that comes and goes (flaky) cannot be reduced; `{again} --force` records what happens now",
            )
        output = workspace.onnx_path(engine).with_name(f"{engine.variant}.{toolchain}.reduced.onnx")
        checks = Checks(fails_the_same_way, lambda line: reporter.line("reduce", engine.name, line))
        reduction = reduce_graph(onnx_path, output, checks, _shapes_reduced_at(ctx, engine, onnx_path, shape), workdir)
    failure = build.reason or "the build's failure"
    record = reduction.record(workspace.relative(output), failure)
    build = build.model_copy(update={"details": details.model_copy(update={"reduced": record})})
    manifest.model_copy(update={"build": build}).write(manifest_path)
    for assumed in reduction.assumed:
        reporter.warn(f"the reducer assumed {assumed}")
    reporter.line(
        "reduce",
        engine.name,
        f"{reduction.nodes_before} → {reduction.nodes_after} node(s) ({', '.join(reduction.ops)}) in {reduction.iterations} "
        f"builds{checks.skipped_words()}, {reduction.seconds:.1f} s: {workspace.relative(output)}",
    )
    return output


def _shapes_reduced_at(ctx, engine: EngineRef, onnx_path: Path, shape: str | None) -> dict[str, list[int]]:
    """The inputs' shapes the cuts are made at: the export's reference batch at the shape point
    ``shape`` (--shape), else its first (a graph with dynamic axes is cut at fixed shapes, as
    Polygraphy's reducer needs); said where the graph has dynamic inputs."""
    import onnx as onnx_module

    from pipeline.measuring.accuracy import ReferenceBatch

    export = read_manifest(ctx.workspace.export_manifest_path(engine)).export
    reference = (export.details.reference or {}) if export is not None and export.details is not None else {}
    points = list(reference.get("points") or {})
    if shape is not None and shape not in points:
        raise UsageError(
            f"--shape {shape}: {engine.name} was exported at {', '.join(points) or 'no shape point'}, not at {shape}.",
            hint="give one of the export's shape points (the model's `shapes` in pipeline.toml)",
        )
    point = shape or next(iter(points), None)
    batch = ReferenceBatch.from_export(export.details, ctx.workspace.root, point) if reference else None
    shapes = {name: list(dims) for name, dims in batch.shapes.items()} if batch is not None else {}
    graph = onnx_module.load(str(onnx_path), load_external_data=False).graph
    dynamic = [i.name for i in graph.input if any(not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)]
    if dynamic and shapes:
        fixed = ", ".join(f"{name} {'×'.join(map(str, shapes[name]))}" for name in dynamic if name in shapes)
        chosen = (
            "chosen by --shape" if shape else f"the first of {len(points)}; --shape picks another" if len(points) > 1 else "its only one"
        )
        ctx.reporter.line("reduce", engine.name, f"cutting at shape point {point} ({chosen}): {fixed}")
    return shapes

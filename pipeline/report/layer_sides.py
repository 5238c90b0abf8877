"""The two sides of `pipeline diff`: an engine of this workspace (its build's layer information and
its profile's per-layer times, from their manifests) or trtexec output a user brings (a log, its
``--export*`` JSON, or a folder of them), read into an EngineSide (pipeline/report/layer_diff.py)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.catalog.shape import written
from pipeline.report.layer_diff import EngineSide, TimedLayer, how_to_get_layers
from pipeline.running.errors import PipelineError, UsageError

_SIDE_HINT = (
    "name an engine as TOOLCHAIN/ENGINE (e.g. trt10.16/vit_fp16, trt-rtx1.7/vit_tiny_fp8@2x512), "
    "or give trtexec output: a log, its --export* JSON, or a folder holding them"
)


def load_side(spec: str, catalog_of: Callable[[], Any], product_of: Callable[[str], str] = str) -> EngineSide:
    """An engine of the workspace (``TOOLCHAIN/ENGINE[@SHAPE]``) or trtexec output on disk.
    ``catalog_of`` gives the catalog, read only for a side that names an engine; ``product_of``
    what its runtime is called, from the kind its build manifest records (the runtimes' registry
    knows: pipeline.runtimes.product_of)."""
    path = Path(spec).expanduser()
    if path.exists():
        return _from_files(path)
    toolchain, slash, engine = spec.partition("/")
    # What only a path looks like: an engine is one toolchain and one name.
    if path.is_absolute() or spec.startswith((".", "~")) or "\\" in spec or "/" in engine or not (slash and engine):
        raise UsageError(f"{spec} does not exist: no such file or folder.", hint=_SIDE_HINT)
    catalog = catalog_of()
    if toolchain not in catalog.toolchains:
        close = difflib.get_close_matches(toolchain, list(catalog.toolchains), n=1, cutoff=0.6)
        raise UsageError(
            f"{spec} is no file or folder here, and {toolchain!r} is no toolchain of the catalog, so it names no engine either.",
            hint=(f"did you mean {close[0]}/{engine}? " if close else "")
            + f"the catalog's toolchains: {', '.join(catalog.toolchains)}; or give the path of trtexec output that exists",
        )
    return _from_workspace(toolchain, engine, catalog, product_of)


def _from_workspace(toolchain: str, spec: str, catalog, product_of: Callable[[str], str]) -> EngineSide:
    from pipeline.manifest import read_manifest
    from pipeline.trtexec.exports import read_profile
    from pipeline.trtexec.layers import read_layer_info
    from pipeline.workspace import Workspace

    engine_name, _, shape = spec.partition("@")
    ref = catalog.engine(engine_name)
    catalog.toolchain(toolchain)  # an unknown toolchain is named with the known ones
    workspace = Workspace(catalog.root)
    built_path = workspace.manifest_path(toolchain, ref)
    if not built_path.exists():
        raise PipelineError(
            f"{toolchain}/{engine_name} has not been built: no {workspace.relative(built_path)}.",
            hint=f"pipeline build --engine {engine_name} --toolchain {toolchain}",
        )
    built = read_manifest(built_path)
    side = EngineSide(label=f"{toolchain}/{spec}", model=ref.model)
    details = built.build.details if built.build else None
    if details is not None:
        side.runtime, side.runtime_version = product_of(details.runtime), details.runtime_version
    layer_info = _artifact(built.build, "layer_info")
    if layer_info is not None:
        side.info = read_layer_info(workspace.root / layer_info)
    profiled = _profiled(workspace, toolchain, ref, built, shape, side, catalog.model(ref.model).shapes)
    layer_profile = _artifact(profiled.profile, "layer_profile") if profiled else None
    if layer_profile is not None:
        _take_profile(side, read_profile(workspace.root / layer_profile))
    elif _handed_over(profiled):
        # Any runtime that profiles layers hands its times over as the profile's core field.
        side.timed = [TimedLayer(layer.name, layer.average_ms, layer.percent) for layer in profiled.profile.details.layer_times]
    else:
        side.notes.append(
            f"no per-layer times: `pipeline profile --engine {engine_name} --toolchain {toolchain}` writes them "
            "(on a GPU that runs this engine); layer types and precisions are compared without them"
        )
    _check_build_match(side)
    return side


def _profiled(workspace, toolchain: str, ref, built, shape: str, side: EngineSide, points: tuple[str, ...]):
    """The manifest whose profile has the per-layer times: the engine's own (one shape), the named
    point's, or else the first point profiled (said in a note). ``points`` are the model's shape
    points in the catalog."""
    from pipeline.manifest import read_manifest
    from pipeline.report.rows import shape_order

    if not shape and built.profile:
        return built
    if shape:
        shape = written(shape)  # as the reports print it
        path = workspace.manifest_path(toolchain, ref, shape=shape)
        if path.exists():
            return read_manifest(path)
        if shape not in points:
            raise UsageError(
                f"{shape!r} is not a shape point of model {ref.model}: its points are {', '.join(points) or 'none (it has one shape)'}.",
                hint=f"name one of them as {toolchain}/{ref.name}@POINT" if points else f"leave out @{shape}",
            )
        raise PipelineError(
            f"{toolchain}/{ref.name} has not been profiled at {shape}.",
            hint=f"pipeline profile --engine {ref.name} --toolchain {toolchain}",
        )
    found = [read_manifest(path) for path in workspace.manifest_path(toolchain, ref).parent.glob(f"{ref.name}@*.json")]
    for point in sorted(found, key=lambda manifest: shape_order(manifest.shape)):
        side.notes.append(f"per-layer times at {point.shape} (the first shape point profiled; name another as @SHAPE)")
        return point
    return None


def _take_profile(side: EngineSide, profile, source: str | None = None) -> None:
    """Per-layer times from an --exportProfile (or TensorRT-RTX) file or a log's Profile table."""
    side.timed = [TimedLayer(layer.name, layer.average_ms, layer.percent) for layer in profile.layers]
    side.iterations = profile.iterations
    stopped = getattr(profile, "stopped_at", None)
    if stopped:
        side.notes.append(f"{source}: {stopped}" if source else stopped)


def _handed_over(manifest) -> bool:
    """Whether a profile recorded per-layer times in its core field (whichever runtime made them)."""
    record = manifest.profile if manifest is not None else None
    return record is not None and record.status == "done" and record.details is not None and bool(record.details.layer_times)


def _artifact(record, role: str) -> str | None:
    if record is None:
        return None
    return next((artifact.path for artifact in record.outputs if artifact.role == role), None)


def _from_files(path: Path) -> EngineSide:

    from pipeline.trtexec.exports import read_profile
    from pipeline.trtexec.layers import layer_info_from_document, layer_info_from_dump
    from pipeline.trtexec.log import parse_log
    from pipeline.trtexec.text import read_document

    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    side = EngineSide(label=path.name)
    for file in files:
        text, document = read_document(file)
        if isinstance(document, dict) and ("Layers" in document or "layer_names" in document):
            side.info = layer_info_from_document(document, str(file))
        elif _is_profile(text) and (document is not None or text.lstrip().startswith("[")):
            _take_profile(side, read_profile(file), file.name)  # a cut-off --exportProfile: what is complete
        elif document is None:
            try:
                log = parse_log(text)
            except PipelineError:
                continue  # not trtexec output: another file of the folder
            if log.trt_version and side.runtime_version is None:
                side.runtime, side.runtime_version = "TensorRT", log.trt_version
            if log.profile and log.profile.layers and side.timed is None:
                _take_profile(side, log.profile)
            dumped = layer_info_from_dump(text)
            if dumped is not None and side.info is None:
                side.info = dumped
    if side.timed is None and side.info is None:
        raise PipelineError(
            f"{path} holds neither per-layer times nor layer information.",
            hint=how_to_get_layers(),
        )
    _check_build_match(side)
    return side


def _is_profile(text: str) -> bool:
    head = text[:4096]
    return '"averageMs"' in head or '"average_ms"' in head or ('"count"' in head and '"name"' in head)


def _check_build_match(side: EngineSide) -> None:
    """Times and layer information of two different builds only partly describe each other: say so."""
    if not side.timed or side.info is None or not side.info.layers:
        return
    described = sum(1 for layer in side.timed if side.info.layer(layer.name) is not None)
    if described < len(side.timed):
        side.notes.append(
            f"the layer information describes {described} of the {len(side.timed)} profiled layers "
            "(the two files are of different builds?): precision and tactic are shown where the names agree"
        )

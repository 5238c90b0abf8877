"""The export of a model the user gives as an ONNX file: checked, copied into the workspace as it
is, and run in ONNX Runtime at each shape point for the reference every engine built from it is
checked against (there is no PyTorch model to compare it with)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.graph.external import data_path, has_external_data, load_whole
from pipeline.graph.external import save as save_graph
from pipeline.graph.lint import custom_nodes, lint
from pipeline.graph.sanitize import changed, folding_unchecked, sanitize
from pipeline.manifest import ExportDetails
from pipeline.running.errors import PipelineError
from pipeline.running.files import atomic_output
from pipeline.stages.base import StageOutcome
from pipeline.stages.export_references import ReferenceWriter, reference_files
from pipeline.stages.onnx_writing import onnx_audit, op_histogram
from pipeline.stages.parity import check_parity, run_onnx, worst


def take_onnx(stage, source, phase) -> StageOutcome:
    """A user's ONNX file: checked, copied in as it is, and run in ONNX Runtime at each shape
    point for the reference every engine built from it is checked against."""
    import torch

    path = source.path()
    with phase("onnx_checks"):
        graph = source.graph
        data = source.data_files()  # external data: checked beside the file before anything reads it
        lint(path, source.name)
        plugins = custom_nodes(graph)
        if plugins:
            stage.ctx.reporter.warn(
                f"model {source.name!r}: {len(plugins)} node(s) outside ONNX's standard domains, which TensorRT builds only "
                f"through a plugin of that name: {', '.join(node.words() for node in plugins[:3])}{' …' if len(plugins) > 3 else ''}"
            )
    points = source.check_points()
    model_inputs = source.inputs()
    references, fp32_outputs, unchecked, ran_here = {}, {}, {}, []
    # ONNX Runtime has no kernel for a custom op: the graph is built all the same (a TensorRT plugin
    # may implement it), its engines measured with their accuracy unchecked unless the user gives
    # the reference (`reference`).
    cannot_run = (
        f"ONNX Runtime cannot run {plugins[0].words()}, a custom op, for the FP32 reference; "
        "give the graph's outputs in `reference` (docs/models.md) to check its engines"
        if plugins
        else None
    )
    with phase("fp32_reference"):
        for point in points:
            given = source.user_reference(point)
            if given is not None:  # the user's own inputs and outputs
                references[point.label], fp32_outputs[point.label] = given
                continue
            references[point.label] = source.sample_inputs(None, point, stage.model_spec.seed + 1)
            if cannot_run:
                unchecked[point.label] = cannot_run
                continue
            output = run_onnx(path, [t.numpy() for t in references[point.label]])
            fp32_outputs[point.label] = torch.from_numpy(output.astype("float32"))
            ran_here.append(point.label)
    if unchecked:
        stage.ctx.reporter.warn(f"{stage.engine.name}: {cannot_run}")
    onnx_path = stage.ctx.workspace.onnx_path(stage.engine)
    try:
        with atomic_output(onnx_path) as tmp:
            checked = {label: (references[label], fp32_outputs[label]) for label in ran_here}
            sanitized, parity, written_data = _taken_in(stage, source, graph, (tmp, onnx_path), checked, phase)
    except BaseException:
        data_path(onnx_path).unlink(missing_ok=True)  # written for a graph that was not: no one's data
        raise
    # No point ONNX Runtime ran the file as given at: the folding is not checked (said, not silent).
    why = cannot_run or "ONNX Runtime did not run the file as given: the reference is the user's own (`reference`)"
    warning = folding_unchecked(sanitized, why.split(";")[0]) if not parity else None
    if warning:
        stage.ctx.reporter.warn(f"{stage.engine.name}: {warning}")
    facts = {"description": source.describe_reference(stage.model_spec.seed + 1)}
    writer = ReferenceWriter(stage.ctx.workspace, stage.engine, source.output_name())
    reference = writer.each_point(references, fp32_outputs, model_inputs, torch.float32, facts, missing=unchecked)
    floats = [i.dtype for i in model_inputs if not i.dtype.startswith(("int", "bool"))]
    first = references[points[0].label][0]
    details = ExportDetails(
        source=source.describe(),
        weights=f"as in {source.spec.onnx}" + (f" and its external data ({', '.join(p.name for p in data)})" if data else ""),
        input_shape=list(first.shape),
        input_dtype=floats[0] if floats else str(first.dtype).replace("torch.", ""),
        inputs=[i.describe() for i in model_inputs],
        output=source.output_name(),
        shape_points=[p.label for p in points],
        exporter=f"none: {source.spec.onnx} taken as it is",
        opset=next((entry.version for entry in graph.opset_import if entry.domain in ("", "ai.onnx")), 0),
        precision=stage.variant_spec.precision,
        parity=worst(parity),
        parity_by_shape=parity,
        parity_skipped=None if parity else "the reference is this ONNX file's own outputs (there is no PyTorch model to compare it with)",
        sanitized=sanitized,
        onnx_ops=op_histogram(graph),
        onnx_audit=onnx_audit(graph, sum(p.stat().st_size for p in (path, *data))),
        reference=reference,
        timings_s=phase.seconds,
    )
    outputs = [stage.ctx.workspace.artifact("onnx", onnx_path)]
    if written_data is not None:  # the graph's weights, which every build reads beside it
        outputs.append(stage.ctx.workspace.artifact("onnx_data", written_data))
    outputs += [stage.ctx.workspace.artifact(role, stage.ctx.workspace.root / p) for role, p in reference_files(reference)]
    return StageOutcome(outputs=outputs, details=details, note=f" ({_folding_words(sanitized)}; reference at {len(points)} shape point(s))")


def _taken_in(stage, source, graph, paths, checked: dict, phase) -> tuple[dict, dict, Path | None]:
    """The user's graph copied in at ``paths`` (the temporary name, the final one) with its
    constants folded (pipeline/graph/sanitize.py), checked against the file as given at each point
    ONNX Runtime ran it (``checked``: label → (inputs, outputs)): (the export's record of the
    folding, the parity by point, the data file written beside it). A graph with external data is
    read whole and written with its weights in one file beside the copy (pipeline/graph/external.py)."""
    tmp, final = paths
    external = has_external_data(graph)
    model = load_whole(source.path()) if external else graph
    with phase("sanitize"):
        folded, record = sanitize(model, asked=stage.ctx.catalog.sanitize)
        if folded is model and not external:
            shutil.copyfile(source.path(), tmp)  # the file as given, byte for byte
            data_path(final).unlink(missing_ok=True)
            return record, {}, None
        written = save_graph(folded, tmp, external, data=data_path(final))
    if folded is model:
        return record, {}, written  # the graph as given: nothing to check it against
    parity = {}
    with phase("parity"):
        for label, (feeds, outputs) in checked.items():
            check = check_parity(tmp, [t.numpy() for t in feeds], outputs.numpy(), "fp32")
            parity[label] = check.model_copy(update={"reference": f"{source.spec.onnx} as given, ONNX Runtime, same input"})
    failed = next((label for label, check in parity.items() if not check.passed), None)
    if failed is not None:
        check = parity[failed]
        raise PipelineError(
            f"{source.spec.onnx} with its constants folded does not compute what it did at {failed}: max |error| "
            f"{check.max_abs_error:.3g} (limit {check.max_abs_error_limit:.3g}), cosine {check.cosine_similarity:.6f}.",
            hint="export with --no-sanitize to build the graph as given, and report the graph to Polygraphy's maintainers",
        )
    return record, parity, written


def _folding_words(sanitized: dict) -> str:
    """What the export did to the user's graph, for its line: "constants folded: 371 → 194 nodes"."""
    if not changed(sanitized):
        return "taken as it is"
    return f"constants folded: {sanitized['nodes_before']} → {sanitized['nodes_after']} nodes"

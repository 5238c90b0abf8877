"""The export of a model the user gives as an ONNX file: checked, copied into the workspace as it
is, and run in ONNX Runtime at each shape point for the reference every engine built from it is
checked against (there is no PyTorch model to compare it with)."""

from __future__ import annotations

import shutil

from pipeline.manifest import ExportDetails
from pipeline.running.errors import PipelineError, UsageError
from pipeline.stages.base import StageOutcome
from pipeline.stages.export_references import ReferenceWriter, reference_files
from pipeline.stages.onnx_writing import onnx_audit, op_histogram
from pipeline.stages.parity import run_onnx
from pipeline.workspace.artifacts import atomic_output


def take_onnx(stage, source, phase) -> StageOutcome:
    """A user's ONNX file: checked, copied in as it is, and run in ONNX Runtime at each shape
    point for the reference every engine built from it is checked against."""
    import onnx
    import torch

    path = source.path()
    with phase("onnx_checks"):
        graph = source.graph
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer):
            raise PipelineError(
                f"{path} keeps its weights in external data files, which this pipeline does not copy yet.",
                hint="save the model with its weights inside the file (onnx.save(..., save_as_external_data=False), up to 2 GB)",
            )
        try:
            onnx.checker.check_model(str(path))
        except Exception as exc:  # onnx.checker.ValidationError and friends
            raise UsageError(
                f"model {source.name!r}: {path} is not a valid ONNX model: {str(exc).strip().splitlines()[0]}",
                hint="`python -c \"import onnx; onnx.checker.check_model('FILE', full_check=True)\"` says more; fix the graph or export it again",
            ) from exc
    points = source.check_points()
    model_inputs = source.inputs()
    references, fp32_outputs = {}, {}
    with phase("fp32_reference"):
        for point in points:
            given = source.user_reference(point)
            if given is not None:  # the user's own inputs and outputs
                references[point.label], fp32_outputs[point.label] = given
                continue
            references[point.label] = source.sample_inputs(None, point, stage.model_spec.seed + 1)
            output = run_onnx(path, [t.numpy() for t in references[point.label]])
            fp32_outputs[point.label] = torch.from_numpy(output.astype("float32"))
    onnx_path = stage.ctx.workspace.onnx_path(stage.engine)
    with atomic_output(onnx_path) as tmp:
        shutil.copyfile(path, tmp)
    facts = {"description": source.describe_reference(stage.model_spec.seed + 1)}
    writer = ReferenceWriter(stage.ctx.workspace, stage.engine, source.output_name())
    reference = writer.each_point(references, fp32_outputs, model_inputs, torch.float32, facts)
    floats = [i.dtype for i in model_inputs if not i.dtype.startswith(("int", "bool"))]
    first = references[points[0].label][0]
    details = ExportDetails(
        source=source.describe(),
        weights=f"as in {source.spec.onnx}",
        input_shape=list(first.shape),
        input_dtype=floats[0] if floats else str(first.dtype).replace("torch.", ""),
        inputs=[i.describe() for i in model_inputs],
        output=source.output_name(),
        shape_points=[p.label for p in points],
        exporter=f"none: {source.spec.onnx} taken as it is",
        opset=next((entry.version for entry in graph.opset_import if entry.domain in ("", "ai.onnx")), 0),
        precision=stage.variant_spec.precision,
        parity_skipped="the reference is this ONNX file's own outputs (there is no PyTorch model to compare it with)",
        onnx_ops=op_histogram(graph),
        onnx_audit=onnx_audit(graph, path.stat().st_size),
        reference=reference,
        timings_s=phase.seconds,
    )
    outputs = [stage.ctx.workspace.artifact("onnx", onnx_path)]
    outputs += [stage.ctx.workspace.artifact(role, stage.ctx.workspace.root / p) for role, p in reference_files(reference)]
    return StageOutcome(outputs=outputs, details=details, note=f" (taken as it is; reference at {len(points)} shape point(s))")

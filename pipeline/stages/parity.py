"""Does the exported ONNX compute what PyTorch did? ONNX Runtime's output against PyTorch's on the
same input, within a tolerance per precision (the export stage keeps no ONNX that fails it)."""

from __future__ import annotations

from pathlib import Path

from pipeline.manifest import ParityCheck
from pipeline.running.errors import PipelineError, tool_message
from pipeline.stages.quantize import PRESETS

# How far the ONNX Runtime output may drift from PyTorch's on the same input, per precision:
# (max |error| relative to the largest |reference| value (at least 1), cosine similarity floor).
# The reference is the PyTorch model of the same precision (fake-quantized for Q/DQ variants),
# so these bound export faithfulness, not quantization error (that is the accuracy proxy).
PARITY_TOLERANCE = {
    "fp32": (1e-3, 0.99999),
    "fp16": (2e-2, 0.999),
    "bf16": (1e-1, 0.995),
    "int8": (1.5e-1, 0.99),
    "fp8": (1.5e-1, 0.99),
    "mxfp8": (2.5e-1, 0.98),
    "nvfp4": (2.5e-1, 0.98),
}


def run_onnx(onnx_path: Path, feeds: list):
    """The graph's first output on ``feeds`` (in its input order) in ONNX Runtime on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
        return session.run(None, dict(zip((i.name for i in session.get_inputs()), feeds)))[0]
    except Exception as exc:
        raise PipelineError(
            f"ONNX Runtime could not run {onnx_path.name}: {tool_message(exc)}",
            hint="check the model's shape points and input values (`vocab_size`) in pipeline.toml; -v shows more",
        ) from exc


def worst(checks: dict[str, ParityCheck]) -> ParityCheck | None:
    """The check of several shape points that speaks for them all: the first that failed, else
    the lowest cosine; None where there are none."""
    return min(checks.values(), key=lambda check: (check.passed, check.cosine_similarity)) if checks else None


def check_parity(onnx_path: Path, feeds: list, reference, precision: str) -> ParityCheck:
    """ONNX Runtime's output of the graph on ``feeds`` (arrays in the graph's input order, as the
    names are given after this check; floating ones get the graph's floating type) against
    ``reference``, PyTorch's on the same inputs."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # The graph as exported, without ONNX Runtime's rewrites: those are not what is checked, and
    # for ViT-B they took longer than the run itself (docs/quantization.md, 'Export speed').
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # On the GPU where ONNX Runtime's CUDA build is installed (minutes faster for a large model's
    # largest point), with FP32 kept FP32: its CUDA provider computes FP32 matrix products in TF32
    # unless told not to (provider option use_tf32, default 1).
    providers: list = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"use_tf32": 0}))
    try:
        session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=providers)
        typed = {}
        for spec, value in zip(session.get_inputs(), feeds):
            if np.issubdtype(value.dtype, np.floating):
                value = value.astype(np.float16 if "float16" in spec.type else np.float32)
            typed[spec.name] = value
        output = session.run(None, typed)[0].astype(np.float64)
    except Exception as exc:
        raise PipelineError(
            f"ONNX Runtime could not run the exported model: {tool_message(exc)}",
            hint="the ONNX was not kept; run with -v for details",
        ) from exc
    if output.shape != reference.shape:
        raise PipelineError(
            f"the exported model's output has shape {list(output.shape)} where PyTorch's has {list(reference.shape)}",
            hint="the ONNX was not kept; run with -v and report the exporter's output",
        )
    reference = reference.astype(np.float64)
    max_abs = float(np.max(np.abs(output - reference)))
    denominator = float(np.linalg.norm(output) * np.linalg.norm(reference))
    # Two all-zero outputs are the same output (a quantization that wiped the signal exports faithfully).
    cosine = float(np.dot(output.ravel(), reference.ravel()) / denominator) if denominator else float(max_abs == 0.0)
    relative_limit, floor = PARITY_TOLERANCE[precision]
    limit = relative_limit * max(1.0, float(np.max(np.abs(reference))))
    return ParityCheck(
        reference=f"PyTorch {precision} model{' (fake-quantized)' if precision in PRESETS else ''}, same input",
        provider=session.get_providers()[0],
        samples=int(reference.shape[0]),
        max_abs_error=max_abs,
        cosine_similarity=cosine,
        max_abs_error_limit=limit,
        cosine_similarity_floor=floor,
        passed=bool(max_abs <= limit and cosine >= floor),
    )

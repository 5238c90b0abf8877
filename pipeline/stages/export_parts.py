"""What an export carries from one step to the next — the traced FP32 model, the reference batches
and their FP32 outputs, the variant's model — and the line it ends with (pipeline/stages/export.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.manifest import ExportDetails


@dataclass
class Traced:
    """The FP32 model on its device, what the exporter traces, and the model's inputs and points."""

    model: Any
    runnable: Any
    device: str
    points: list
    inputs: list
    sample: tuple


@dataclass
class References:
    """The batches every engine is checked on (by shape point; None: the one batch), what they are,
    and the FP32 model's outputs for them."""

    batches: dict
    facts: dict[str, Any]
    fp32_outputs: dict
    # The points without an FP32 output, and why (it did not fit, or faulted in an earlier process).
    missing: dict


@dataclass
class VariantModel:
    """The model of the variant, the dtype it runs in, and what sparsifying and quantizing it did."""

    runnable: Any
    dtype: Any
    sparsification: dict[str, Any] | None
    quantization: dict[str, Any] | None


def export_note(details: ExportDetails, points: int) -> str:
    """The export's line: " (parity at 2 shapes: cosine ≥ 1.000000), vs FP32: cosine 0.9987"."""
    parity = details.parity
    note = f" (parity: cosine {parity.cosine_similarity:.6f})" if parity else f" (parity not run: {details.parity_skipped})"
    if details.onnx_refused:
        note = " (no ONNX: the exporter refused the model; references written for the torch toolchains)"
    if details.parity_by_shape:
        checked = len(details.parity_by_shape)
        of = f" of {points}" if checked < points else ""
        plural = "s" if (points if of else checked) > 1 else ""
        note = f" (parity at {checked}{of} shape{plural}: cosine ≥ {parity.cosine_similarity:.6f})"
    if details.accuracy:
        note += f", vs FP32: cosine {details.accuracy['cosine_similarity']:.4f}"
    if details.sparsification:
        note += f", {details.sparsification['onnx']['weights_2_4']} weights 2:4-sparse"
    return note

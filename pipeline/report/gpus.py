"""Which GPU each row was measured on, and the GPU type a row is judged with: what the verdict and
the sweep say where a point's engines were measured on more than one GPU, and how a cluster's
point task judges an engine that needs no GPU beside the GPU type it was timed with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.report.rows import ComparisonRow


def measured_on(rows: list[ComparisonRow]) -> dict[str, tuple[dict[str, Any], list[ComparisonRow]]]:
    """The GPUs ``rows`` were measured on, by UUID, in nvidia-smi's order: (the device, its rows),
    where manifests say."""
    found: dict[str, tuple[dict[str, Any], list[ComparisonRow]]] = {}
    for row in rows:
        if row.gpu_device and row.gpu_device.get("uuid"):
            found.setdefault(row.gpu_device["uuid"], (row.gpu_device, []))[1].append(row)
    return dict(sorted(found.items(), key=lambda item: (item[1][0].get("index", 0), item[0])))


def gpu_type_judged_on(rows: list[ComparisonRow]) -> Callable[[ComparisonRow], str | None]:
    """The GPU type a row is judged with: its own; for an engine that needs no GPU (ONNX Runtime
    on the CPU) timed in one set of rounds beside a GPU type's engines (a cluster's point task),
    theirs — so a point's engines are judged together, as they were timed."""
    timed_on = {group: row.gpu_type for row in rows if row.gpu_type for group in row.round_medians}

    def judged_on(row: ComparisonRow) -> str | None:
        return row.gpu_type or next((timed_on[group] for group in row.round_medians if group in timed_on), None)

    return judged_on


def gpu_words(device: dict[str, Any]) -> str:
    """ "GPU 1 (GPU-bbbb2222…)": the index nvidia-smi gives it, and enough of its UUID to tell it."""
    return f"GPU {device.get('index', '?')} ({str(device.get('uuid', ''))[:12]}…)"

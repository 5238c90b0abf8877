"""Parse the JSON files trtexec writes: --exportTimes and --exportProfile (--exportLayerInfo: layers.py).

Per-iteration times from --exportTimes are summarised with the same function as every other
runtime (:meth:`LatencyStats.from_values`), so TensorRT and ONNX Runtime numbers compare.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.manifest import LayerTime
from pipeline.measuring.stats import LatencyStats
from pipeline.running.errors import PipelineError
from pipeline.trtexec.text import read_text


class IterationTimes(BaseModel):
    """--exportTimes: one record per inference."""

    count: int
    # The file was cut off; the complete records before the cut were read.
    truncated: bool = False
    compute_ms: list[float]
    latency_ms: list[float]
    h2d_ms: list[float] = []
    d2h_ms: list[float] = []
    enqueue_ms: list[float] = []
    gpu_compute: LatencyStats
    latency: LatencyStats
    enqueue: LatencyStats | None = None


class ExportedProfile(BaseModel):
    """--exportProfile: per-layer times over `iterations` runs."""

    iterations: int | None
    layers: list[LayerTime]
    # The file was cut off: the layers before the cut were read; the last one read is named.
    truncated: bool = False

    @property
    def stopped_at(self) -> str | None:
        if not self.truncated:
            return None
        last = f"after layer {len(self.layers)} ({self.layers[-1].name})" if self.layers else "before its first layer"
        return f"the file is cut off {last}"


def _load_json(path: Path) -> tuple[Any, bool]:
    """The parsed document and whether it had to be recovered from a cut-off file."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise PipelineError(f"cannot read {path}: {exc.strerror or exc}.") from exc
    try:
        return json.loads(text), False
    except ValueError:
        pass
    # trtexec writes one flat record per line; a killed run leaves the array unterminated.
    records = []
    for match in re.finditer(r"\{[^{}\[\]]*\}", text):
        try:
            records.append(json.loads(match.group(0)))
        except ValueError:
            continue
    if text.lstrip().startswith("[") and records:
        return records, True
    raise PipelineError(f"{path} is not valid JSON and holds no readable records.", hint="re-run trtexec to export it again")


def read_times(path: Path) -> IterationTimes:
    data, truncated = _load_json(path)
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        raise PipelineError(f"{path} is not a trtexec --exportTimes file (expected a list of records).")
    compute = [float(r["computeMs"]) for r in data if "computeMs" in r]
    if not compute:
        raise PipelineError(f"{path} has no computeMs values: not a trtexec --exportTimes file.")
    # "latencyMs" since TensorRT 8.4; older releases wrote "endToEndMs" for the host latency.
    latency = [float(r.get("latencyMs", r.get("endToEndMs", r["computeMs"]))) for r in data if "computeMs" in r]
    enqueue = [float(r["endEnqMs"]) - float(r["startEnqMs"]) for r in data if "endEnqMs" in r and "startEnqMs" in r]
    return IterationTimes(
        count=len(compute),
        truncated=truncated,
        compute_ms=compute,
        latency_ms=latency,
        h2d_ms=[float(r["h2dMs"]) for r in data if "h2dMs" in r],
        d2h_ms=[float(r["d2hMs"]) for r in data if "d2hMs" in r],
        enqueue_ms=enqueue,
        gpu_compute=LatencyStats.from_values(compute),
        latency=LatencyStats.from_values(latency),
        enqueue=LatencyStats.from_values(enqueue) if enqueue else None,
    )


def read_profile(path: Path) -> ExportedProfile:
    """--exportProfile's list, or the per-layer profile TensorRT-RTX's driver writes (same fields)."""
    data, truncated = _load_json(path)
    if isinstance(data, dict) and isinstance(data.get("layers"), list):
        return ExportedProfile.model_validate(data)
    if not isinstance(data, list):
        raise PipelineError(f"{path} is not a trtexec --exportProfile file (expected a list).")
    iterations = None
    layers = []
    for record in data:
        if not isinstance(record, dict):
            continue
        if "count" in record and "name" not in record:
            iterations = int(record["count"])
        elif "name" in record:
            layers.append(
                LayerTime(
                    name=str(record["name"]),
                    total_ms=float(record.get("timeMs", 0.0)),
                    average_ms=float(record.get("averageMs", 0.0)),
                    median_ms=float(record["medianMs"]) if "medianMs" in record else None,
                    percent=float(record.get("percentage", 0.0)),
                )
            )
    return ExportedProfile(iterations=iterations, layers=layers, truncated=truncated)

"""Parse the JSON files trtexec writes: --exportTimes, --exportProfile, --exportLayerInfo.

Per-iteration times from --exportTimes are summarised with the same function as every other
runtime (:meth:`LatencyStats.from_values`), so TensorRT and ONNX Runtime numbers compare.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.errors import PipelineError
from pipeline.stats import LatencyStats
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


class ProfiledLayer(BaseModel):
    name: str
    time_ms: float
    average_ms: float
    median_ms: float | None = None
    percent: float


class ExportedProfile(BaseModel):
    """--exportProfile: per-layer times over `iterations` runs."""

    iterations: int | None
    layers: list[ProfiledLayer]


class PrecisionAudit(BaseModel):
    """What precision the engine's layers actually run in, from --exportLayerInfo."""

    layers: int
    # Layers per data type of their first output ("fp16": 12, …); "unknown" without detail.
    output_types: dict[str, int]
    # Every data type seen on any layer input or output.
    types_seen: list[str]
    intended: str | None = None
    intended_found: bool | None = None
    warning: str | None = None


class LayerInfo(BaseModel):
    """--exportLayerInfo in either verbosity: names only, or detailed layer descriptions."""

    verbosity: str  # "detailed" or "layer_names_only"
    layer_names: list[str]
    layers: list[dict[str, Any]] = []
    bindings: list[Any] = []

    def audit(self, intended: str | None = None) -> PrecisionAudit:
        counts: Counter[str] = Counter()
        seen: set[str] = set()
        for layer in self.layers:
            outputs = layer.get("Outputs") or []
            first = normalise_dtype(outputs[0].get("Format/Datatype", "")) if outputs else "unknown"
            counts[first] += 1
            for tensor in (layer.get("Inputs") or []) + outputs:
                seen.add(normalise_dtype(tensor.get("Format/Datatype", "")))
        if not self.layers:
            counts["unknown"] = len(self.layer_names)
        audit = PrecisionAudit(layers=len(self.layer_names), output_types=dict(counts), types_seen=sorted(seen), intended=intended)
        wanted = INTENDED_DTYPE.get(intended or "")
        if wanted and self.layers:
            audit.intended_found = wanted in seen
            if not audit.intended_found:
                audit.warning = (
                    f"no layer runs in {wanted} although the variant is {intended}: TensorRT fell back to "
                    f"{', '.join(sorted(counts))} (a silent fallback)"
                )
        return audit


# The data type a variant's layers should show when TensorRT honoured its precision.
INTENDED_DTYPE = {"fp16": "fp16", "bf16": "bf16", "int8": "int8", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}

# TensorRT prints data types by name ("Half") or inside format descriptions
# ("Channel major FP16 format where channel % 8 == 0"). Checked in order: BFloat16 before Float.
_DTYPE_PATTERNS = (
    ("bf16", re.compile(r"BFloat16|BF16", re.I)),
    # "FP4E2M1" in TensorRT-RTX's layer dump: no word boundary after the 4.
    ("fp4", re.compile(r"\bFP4|\bFloat4|\bE2M1", re.I)),
    ("fp8", re.compile(r"\bFP8\b|\bFloat8|\bE4M3", re.I)),
    ("e8m0", re.compile(r"\bE8M0\b", re.I)),
    ("fp16", re.compile(r"\bHalf\b|\bFP16\b", re.I)),
    ("int4", re.compile(r"\bInt4\b", re.I)),
    ("int8", re.compile(r"\bInt8\b", re.I)),
    ("uint8", re.compile(r"\bUInt8\b", re.I)),
    ("int32", re.compile(r"\bInt32\b", re.I)),
    ("int64", re.compile(r"\bInt64\b", re.I)),
    ("bool", re.compile(r"\bBool\b", re.I)),
    ("fp32", re.compile(r"\bFloat\b|\bFP32\b", re.I)),
)


def normalise_dtype(text: str) -> str:
    for name, pattern in _DTYPE_PATTERNS:
        if pattern.search(text):
            return name
    return "unknown"


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
    data, _ = _load_json(path)
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
                ProfiledLayer(
                    name=str(record["name"]),
                    time_ms=float(record.get("timeMs", 0.0)),
                    average_ms=float(record.get("averageMs", 0.0)),
                    median_ms=float(record["medianMs"]) if "medianMs" in record else None,
                    percent=float(record.get("percentage", 0.0)),
                )
            )
    return ExportedProfile(iterations=iterations, layers=layers)


def read_layer_info(path: Path) -> LayerInfo:
    data, _ = _load_json(path)
    if not isinstance(data, dict) or "Layers" not in data:
        raise PipelineError(f'{path} is not a trtexec --exportLayerInfo file (no "Layers").')
    raw_layers = data.get("Layers") or []
    bindings = data.get("Bindings") or []
    if all(isinstance(layer, str) for layer in raw_layers):
        return LayerInfo(verbosity="layer_names_only", layer_names=list(raw_layers), bindings=bindings)
    layers = [layer for layer in raw_layers if isinstance(layer, dict)]
    return LayerInfo(
        verbosity="detailed",
        layer_names=[str(layer.get("Name", "")) for layer in layers],
        layers=layers,
        bindings=bindings,
    )


# One layer of the text dump TensorRT prints with detailed profiling verbosity (trtexec
# --dumpLayerInfo, the builder's verbose log): "Name: …, LayerType: …, Inputs: [ { … } ], …".
_DUMPED_LAYER = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>[^,]+),")
# A tensor's type: "Format/Datatype: Half" (trtexec) or "Datatype: FP8, Format: …" (TensorRT-RTX).
_DUMPED_DTYPE = re.compile(r"(?:Format/)?Datatype: ([^,}]+)")


def layer_info_from_dump(text: str) -> LayerInfo | None:
    """The layers of a text layer dump, in --exportLayerInfo's shape (None when there is none)."""
    layers = []
    for line in text.splitlines():
        match = _DUMPED_LAYER.match(line)
        if not match:
            continue
        layer: dict[str, Any] = {"Name": match["name"], "LayerType": match["type"].strip()}
        for field in ("Inputs", "Outputs"):
            tensors = _bracketed(line, f"{field}: [")
            layer[field] = [{"Format/Datatype": dtype.strip()} for dtype in _DUMPED_DTYPE.findall(tensors)]
        layers.append(layer)
    if not layers:
        return None
    return LayerInfo(verbosity="detailed", layer_names=[layer["Name"] for layer in layers], layers=layers)


def _bracketed(line: str, opener: str) -> str:
    """The text inside the bracket that ``opener`` ends with, nested brackets included."""
    start = line.find(opener)
    if start < 0:
        return ""
    depth, begin = 0, start + len(opener) - 1
    for index in range(begin, len(line)):
        if line[index] == "[":
            depth += 1
        elif line[index] == "]":
            depth -= 1
            if depth == 0:
                return line[begin + 1 : index]
    return line[begin + 1 :]  # a cut-off line: what is there

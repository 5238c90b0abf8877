"""One parsed view of a trtexec run: its log plus whatever JSON it exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.running.errors import PipelineError
from pipeline.trtexec.exports import ExportedProfile, IterationTimes, read_profile, read_times
from pipeline.trtexec.layers import LayerInfo, PrecisionAudit, read_layer_info
from pipeline.trtexec.log import TrtexecLog, read_log
from pipeline.trtexec.text import read_text


class TrtexecRun(BaseModel):
    log: TrtexecLog
    times: IterationTimes | None = None
    profile: ExportedProfile | None = None
    layer_info: LayerInfo | None = None
    precision_audit: PrecisionAudit | None = None


def classify_export(path: Path) -> str | None:
    """Which --export* flag wrote this file, judged by its content (names vary by user)."""
    try:
        head = read_text(path)[:4096]
    except OSError:
        return None
    if '"computeMs"' in head or '"startEnqMs"' in head:
        return "times"
    if '"Layers"' in head:
        return "layer_info"
    if '"averageMs"' in head or '"count"' in head:
        return "profile"
    return None


def parse_run(log_path: Path, exports: dict[str, Path] | None = None, intended_precision: str | None = None) -> TrtexecRun:
    run = TrtexecRun(log=read_log(log_path))
    for kind, path in (exports or {}).items():
        if kind == "times":
            run.times = read_times(path)
        elif kind == "profile":
            run.profile = read_profile(path)
        elif kind == "layer_info":
            run.layer_info = read_layer_info(path)
            run.precision_audit = run.layer_info.audit(intended_precision)
    return run


def find_exports(directory: Path) -> dict[str, Path]:
    if not Path(directory).is_dir():
        raise PipelineError(f"{directory} is not a directory.", hint="--exports takes the folder holding trtexec's JSON files")
    found: dict[str, Path] = {}
    for path in sorted(Path(directory).iterdir()):
        if path.is_file() and ".json" in path.name:
            kind = classify_export(path)
            if kind and kind not in found:
                found[kind] = path
    return found


def run_as_json(run: TrtexecRun) -> dict[str, Any]:
    """The documented JSON: the log's facts at the top level, exports summarised beside them."""
    data = json.loads(run.log.model_dump_json(exclude={"trace"}))
    data["trace_averages"] = len(run.log.trace)
    exports: dict[str, Any] = {}
    if run.times is not None:
        exports["times"] = json.loads(run.times.model_dump_json(include={"count", "truncated", "gpu_compute", "latency", "enqueue"}))
    if run.profile is not None:
        exports["profile"] = json.loads(run.profile.model_dump_json())
    if run.layer_info is not None:
        info = run.layer_info
        exports["layer_info"] = {
            "verbosity": info.verbosity,
            "format": info.source_format,
            "layers": len(info.layer_names),
            "io_tensors": [json.loads(tensor.model_dump_json()) for tensor in info.io_tensors],
            "unknown_keys": info.unknown_keys,
        }
    if run.precision_audit is not None:
        exports["precision_audit"] = json.loads(run.precision_audit.model_dump_json())
    data["exports"] = exports
    return data

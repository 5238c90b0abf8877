"""What the TensorRT-RTX compiler and its driver report, read back for the manifests: a compiler
message without its source locations and CUDA noise, and the driver's per-layer profile as the
core's layer times."""

from __future__ import annotations

import re
from typing import Any


def tidy(message: str) -> str:
    """A compiler message without the source locations and CUDA noise around the reason."""
    lines = [line for line in message.splitlines() if "catchCudaError" not in line and not line.startswith("Invalid Node")]
    text = " ".join(line.strip() for line in lines).strip() or message.strip()
    text = re.sub(r"\s*In \w+ at /_src/\S+\)?", "", text)
    text = re.sub(r"\[[\w.]+:\d+: \w+\] ", "", text)
    return text.rstrip(" )") + (")" if text.count("(") > text.count(")") else "")


def layer_times(layer_profile: dict | None) -> list[dict[str, Any]]:
    """The driver's per-layer profile (IProfiler's times over its runs) as the core's layer times."""
    return [
        {"name": layer["name"], "total_ms": layer["time_ms"], "average_ms": layer["average_ms"], "percent": layer["percent"]}
        for layer in (layer_profile or {}).get("layers", [])
    ]

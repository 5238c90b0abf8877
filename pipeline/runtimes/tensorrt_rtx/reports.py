"""What the TensorRT-RTX compiler and its driver report, read back for the manifests: a compiler
message without its source locations and CUDA noise, and the driver's per-layer profile as the
core's layer times; a refusal of the ONNX parser, as the driver recorded it."""

from __future__ import annotations

import re
from typing import Any

from pipeline.trtexec.onnx_parser import ParserFailure, check_words, parser_failure


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


def parser_failure_of(result: dict) -> ParserFailure | None:
    """The node the parser refused, as its log tells it, in the parser's own words where it
    has some (the log's check may only say "Invalid Node"), else its error code ("[8] false")."""
    if result.get("parsed", True):
        return None
    failure = parser_failure("\n".join(result.get("errors", [])))
    first = (result.get("parser_errors") or [{}])[0]
    if failure is None and first:  # a refusal the log does not word (none seen): the parser's record
        failure = ParserFailure(op_type=first.get("operator") or "?", node=first.get("node") or None)
    if failure is not None:
        failure.message = check_words(tidy(first.get("message") or "")) or failure.message or first.get("code")
    return failure

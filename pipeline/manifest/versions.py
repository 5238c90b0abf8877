"""Manifests of older schema versions, read as the current one says them (pipeline/manifest/schema.py reads
every version in its READS): what a version moved is lifted into its new place once, as the file is
read; the file itself is left as it was."""

from __future__ import annotations


def lift_version_1(raw: dict, version: int) -> dict:
    """A version-1 manifest as version 2 says it (labelled ``version``, the one read: 3 and 4 only add). Version 1 kept the GPU's name and memory and the
    per-layer times only inside the tools' own records, under keys it named (``trtexec``,
    ``execution``); they are lifted into the core fields once, here, and the records stay as they
    were, as the tools' own evidence."""
    raw = {**raw, "schema_version": version}
    record = raw.get("profile")
    details = record.get("details") if isinstance(record, dict) else None
    if isinstance(details, dict) and details.get("kind") == "profile":
        raw["profile"] = {**record, "details": _profile_facts_of_version_1(details)}
    return raw


def _profile_facts_of_version_1(details: dict) -> dict:
    trtexec, execution = details.get("trtexec") or {}, details.get("execution") or {}
    details = dict(details)
    if details.get("gpu") is None and (trtexec.get("device") or {}).get("name"):
        details["gpu"] = trtexec["device"]["name"]
    allocated = (execution.get("peak_memory_mib") or {}).get("allocated")
    context = (trtexec.get("facts") or {}).get("device_memory_size")
    if allocated is not None:
        details["gpu_memory_mib"], details["gpu_memory_counts"] = float(allocated), "peak allocated by PyTorch"
    elif context:
        number, _, unit = context.partition(" ")
        scale = {"MiB": 1.0, "KiB": 1 / 1024, "GiB": 1024.0, "B": 1 / 2**20}.get(unit.strip())
        if scale is not None:
            details["gpu_memory_mib"], details["gpu_memory_counts"] = float(number) * scale, "TensorRT execution context"
    layers = (trtexec.get("exported_profile") or {}).get("layers") or (trtexec.get("profile") or {}).get("layers") or []
    details["layer_times"] = [
        {
            "name": layer["name"],
            "total_ms": layer.get("total_ms", layer.get("time_ms", 0.0)),
            "average_ms": layer["average_ms"],
            "median_ms": layer.get("median_ms"),
            "percent": layer.get("percent", 0.0),
        }
        for layer in layers
    ]
    return details

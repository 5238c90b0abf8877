"""The one manifest schema every stage writes (schema.py), how a manifest is read and checked
(reading.py), and how older ones are read (versions.py: each schema version's lift to the current
one)."""

from pipeline.manifest.reading import parse_manifest, read_manifest
from pipeline.manifest.schema import (
    READS,
    SCHEMA_VERSION,
    Artifact,
    BuildDetails,
    ClusterNode,
    EngineManifest,
    Environment,
    ExportDetails,
    FaultFacts,
    GpuInfo,
    LayerTime,
    OutOfMemoryFacts,
    ParityCheck,
    ProfileDetails,
    StageRecord,
    know_tool_evidence,
)

__all__ = [
    "READS",
    "SCHEMA_VERSION",
    "Artifact",
    "BuildDetails",
    "ClusterNode",
    "EngineManifest",
    "Environment",
    "ExportDetails",
    "FaultFacts",
    "GpuInfo",
    "LayerTime",
    "OutOfMemoryFacts",
    "ParityCheck",
    "ProfileDetails",
    "StageRecord",
    "know_tool_evidence",
    "parse_manifest",
    "read_manifest",
]

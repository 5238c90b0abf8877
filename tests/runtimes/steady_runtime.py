"""A toolchain kind the product has never heard of, for tests/runtimes/test_plugged_runtime.py: an
engine that takes the same time at every run, with evidence of its own. It is written as a new kind
would be — one module, its settings, its evidence model — and plugs in through the registry alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pipeline.catalog import ProfileSettings, ToolchainSpec, VariantSpec
from pipeline.runtimes.base import BuildResult, InProcessRuntime, ToolchainStatus

# What every run of a steady engine takes.
RUN_MS = 0.25


class SteadySpec(ToolchainSpec):
    kind: Literal["steady"]


class SteadyEvidence(BaseModel):
    """The steady runtime's own record: what it built, and how its clock ran."""

    model_config = ConfigDict(extra="forbid")
    steady: dict[str, Any] | None = None


class SteadyEngine:
    timing = "host latency"

    def take(self, runs: int, min_ms: float) -> list[float]:
        return [RUN_MS] * max(runs, int(min_ms / RUN_MS))

    def evidence(self) -> dict[str, Any]:
        return {
            "device": "steady stand-in",
            "metric": self.timing,
            "evidence": {
                "gpu": "Steady GPU 1",
                "gpu_memory_mib": 42.0,
                "gpu_memory_counts": "all it ever needs",
                "layer_times": [{"name": "the only layer", "total_ms": RUN_MS * 10, "average_ms": RUN_MS, "percent": 100.0}],
                "steady": {"clock": "fixed", "run_ms": RUN_MS},
            },
        }


class SteadyRuntime(InProcessRuntime):
    kind = "steady"
    product = "Steady"
    Spec = SteadySpec
    Evidence = SteadyEvidence
    engine_suffix = ".steady"
    placement = "anywhere"

    @property
    def version(self) -> str:
        return "1.0"

    def identity(self) -> dict[str, Any]:
        return {"steady": self.version}

    def describe(self) -> str:
        return "a steady stand-in engine"

    def status(self) -> ToolchainStatus:
        return ToolchainStatus(present=True, usable=True, detail=self.describe())

    def build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source) -> BuildResult:
        engine_path.write_text(json.dumps({"from": onnx_path.name}))
        return BuildResult(engine_path=engine_path, settings={"steady": True}, evidence={"steady": {"built_from": onnx_path.name}})

    def describe_build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source) -> list[str]:
        return [f"build: steady {engine_path.name}"]

    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload=None) -> list[str]:
        return [f"profile: steady {engine_path.name}"]

    def prepare(self, engine_path: Path, workload=None) -> SteadyEngine:
        return SteadyEngine()

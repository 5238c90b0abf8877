"""The small interface every engine runtime implements: build an engine, then time it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.catalog import ProfileSettings, ToolchainSpec, VariantSpec
from pipeline.reporting import Reporter


@dataclass
class BuildResult:
    engine_path: Path
    settings: dict[str, Any] = field(default_factory=dict)
    command: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    # Other files written beside the engine (logs, layer info); recorded as artefacts.
    sidecars: dict[str, Path] = field(default_factory=dict)
    # Extra evidence for the manifest's BuildDetails (image, digest, parsed trtexec output).
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProfileResult:
    per_iteration_ms: list[float]
    total_walltime_s: float
    device: str
    command: list[str] | None = None
    sidecars: dict[str, Path] = field(default_factory=dict)
    metric: str = "host latency"
    # The runtime's own throughput figure when it has one (trtexec's qps), else 1000 / mean.
    throughput_qps: float | None = None
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)


class EngineRuntime(ABC):
    """One toolchain's way of turning ONNX into something that runs, and of timing it."""

    #: The catalog ``kind`` this class implements.
    kind: str
    #: File suffix of the engines it writes.
    engine_suffix: str

    def __init__(self, name: str, spec: ToolchainSpec, reporter: Reporter, workspace_root: Path, force: bool = False):
        self.name = name
        self.spec = spec
        self.reporter = reporter
        self.workspace_root = Path(workspace_root)
        # --force: try builds the preflight would refuse.
        self.force = force

    @property
    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Everything about the runtime that changes what a build produces."""

    def check_usable(self) -> None:
        """Raise EnvironmentMissing when this machine cannot use the toolchain at all."""

    def unsupported_reason(self, variant: VariantSpec) -> str | None:
        """Why this runtime cannot run ``variant`` here, or None."""
        return None

    @abstractmethod
    def build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec) -> BuildResult:
        """Write the engine to ``engine_path`` (the caller makes that write atomic)."""

    @abstractmethod
    def profile(self, engine_path: Path, settings: ProfileSettings) -> ProfileResult: ...

    @abstractmethod
    def describe_build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec) -> list[str]:
        """The exact work ``build`` would do, for --dry-run."""

    @abstractmethod
    def describe_profile(self, engine_path: Path, settings: ProfileSettings) -> list[str]:
        """The exact work ``profile`` would do, for --dry-run."""

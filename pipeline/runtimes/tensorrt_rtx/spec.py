"""A TensorRT-RTX toolchain as the catalog names it: the release, the architectures it compiles
for, and the GPUs its engines run on (pipeline/runtimes/tensorrt_rtx/runtime.py builds and times them)."""

from __future__ import annotations

import difflib
import re
from typing import Literal

from pydantic import Field

from pipeline.catalog import ToolchainSpec
from pipeline.running.errors import UsageError

# Architectures the compiler targets (its ComputeCapability enum: SM75 … SM121 in 1.4-1.7) and
# the compute capability each stands for.
ARCHS = {"sm75": "7.5", "sm80": "8.0", "sm86": "8.6", "sm89": "8.9", "sm120": "12.0", "sm121": "12.1"}
Arch = Literal["sm75", "sm80", "sm86", "sm89", "sm120", "sm121"]
# GPUs its engines run on. Sources: the TensorRT-RTX support matrix (docs.nvidia.com/deeplearning/
# tensorrt-rtx, "Supported Hardware": 7.5 Turing, 8.6 Ampere, 8.9 Ada, 12.0 Blackwell; 12.1 from
# 1.5), 8.0 from the list 1.7.1.116's runtime printed when it refused an engine on the lent H100
# ("Supported compute capabilities: 8.0 8.6 8.9 12.0 12.1"), and that refusal itself for 9.0
# ("TensorRT-RTX does not support this compute capability").
RUNS_ON = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")


class TensorRtRtxSpec(ToolchainSpec):
    """One TensorRT-RTX release, installed from the package index into its own environment."""

    kind: Literal["tensorrt-rtx"]
    # The wheels' version, all four parts (the package index has 1.4.0.76 … 1.7.1.116).
    release: str = Field(pattern=r"^\d+\.\d+\.\d+\.\d+$")
    # GPU architectures to compile for; empty: this machine's GPU when the compiler targets it,
    # else the compiler's own default (a portable engine). `--arch` overrides it for one run.
    archs: tuple[Arch, ...] = ()
    # Which CUDA build of the wheels: "auto" reads the driver (cu13 needs driver 580+; cu13 on a
    # machine without one, where builds need no CUDA at all).
    cuda: Literal["auto", "cu12", "cu13"] = "auto"
    # A build or profile run longer than this is killed.
    timeout_s: float = Field(default=3600.0, gt=0)
    builder_optimization_level: int | None = Field(default=None, ge=0, le=5)

    def with_targets(self, targets: tuple[str, ...]) -> TensorRtRtxSpec:
        return self.model_copy(update={"archs": tuple(normalise_arch(target) for target in targets)})

    def for_gpus(self, capabilities: tuple[str | None, ...]) -> TensorRtRtxSpec:
        # Without archs a build targets the GPU of the machine it runs on: on a cluster, whichever node
        # took the task (sm89 on one, portable on another), and the driver never finds either current.
        if self.archs:
            return self
        archs = tuple(arch for arch, capability in ARCHS.items() if capability in capabilities)
        return self.model_copy(update={"archs": archs}) if archs else self


def normalise_arch(name: str) -> str:
    """``SM120`` or ``sm120`` → ``sm120``; anything else is a usage error naming the choices."""
    arch = name.strip().lower()
    if arch not in ARCHS:
        close = sorted(difflib.get_close_matches(arch, list(ARCHS), n=2))
        if re.fullmatch(r"sm\d+", arch) or not close:
            # A real architecture (sm90 is Hopper) that is simply not an RTX target.
            hint = "TensorRT-RTX targets RTX-class GPUs (Turing to Blackwell RTX), not datacenter parts such as Hopper (sm90)"
        else:
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?"
        raise UsageError(f"TensorRT-RTX cannot compile for {name!r}: its targets are {', '.join(ARCHS)}.", hint=hint)
    return arch

"""A PyTorch toolchain as the catalog names it: eager, torch.compile (its mode, graph breaks,
dynamic shapes) or eager captured in a CUDA graph, the attention it runs and TF32
(pipeline/runtimes/pytorch/runtime.py prepares and times it)."""

from __future__ import annotations

import os
import shutil
import sysconfig
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from pydantic import model_serializer, model_validator

from pipeline.catalog import ToolchainSpec

Backend = Literal["eager", "compile", "cudagraphs"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
SdpaBackend = Literal["flash", "efficient", "cudnn", "math"]


class TorchSpec(ToolchainSpec):
    """PyTorch running the model itself: eager, torch.compile, or eager captured in a CUDA graph."""

    kind: Literal["torch"]
    backend: Backend = "eager"
    # torch.compile's mode (Inductor); only for backend = "compile". None: torch's "default".
    mode: CompileMode | None = None
    # Fail the build on any graph break instead of running the broken graph piecewise.
    fullgraph: bool = False
    # torch.compile's `dynamic`: False specialises the compiled graph to each shape point's shapes,
    # True compiles it for symbolic shapes. Either way every point is compiled (warmed) before it
    # is timed: a compilation is never inside a measurement.
    dynamic: bool = False
    # Replay torch.compile's graph (a mode that captures none) from one CUDA graph captured per shape
    # point (torch.cuda.graph): the launch overhead removed as mode "reduce-overhead" removes it,
    # with the same kernels as the same toolchain without `capture`, whose compilation it shares
    # (pipeline/runtimes/pytorch/compile_ahead.py). GPU only.
    capture: bool = False
    # The model's attention: "sdpa" (PyTorch's fused scaled-dot-product attention) or "eager" (the
    # model's own matmul-softmax-matmul); None keeps the model's (the catalog's model setting).
    attn_implementation: Literal["sdpa", "eager"] | None = None
    # Which of PyTorch's SDPA kernels may run (torch.nn.attention.sdpa_kernel); None lets PyTorch
    # choose per call. A kernel that cannot run this dtype or GPU is a refusal, with PyTorch's reason.
    sdpa_backend: SdpaBackend | None = None
    # FP32 matrix products on TF32 tensor cores. Off is PyTorch's default (real FP32); TensorRT
    # uses TF32 for FP32 by default, so turn it on for a like-for-like FP32 comparison.
    tf32: bool = False

    @model_serializer(mode="wrap")
    def _capture_only_where_set(self, handler):
        # A build's fingerprint holds these settings: unset, `capture` leaves every torch engine
        # built before it was added current.
        data = handler(self)
        if not self.capture:
            data.pop("capture", None)
        return data

    @model_validator(mode="after")
    def _sdpa_backend_needs_sdpa(self):
        if self.sdpa_backend is not None and self.attn_implementation == "eager":
            raise ValueError('sdpa_backend chooses among SDPA kernels: it needs attn_implementation = "sdpa" (or unset), not "eager"')
        return self

    @model_validator(mode="after")
    def _compile_options_need_compile(self):
        if self.backend != "compile" and (self.mode is not None or self.fullgraph or self.dynamic or self.capture):
            raise ValueError(
                f'mode, fullgraph, dynamic and capture are torch.compile settings: they need backend = "compile" (got backend = "{self.backend}")'
            )
        if self.capture and self.mode in ("reduce-overhead", "max-autotune"):
            raise ValueError(
                f'capture = true replays the compiled graph from a CUDA graph; mode "{self.mode}" captures its own: use one or the other'
            )
        return self

    def machine_problem(self, name: str, version: str, cuda: bool) -> tuple[str, str] | None:
        """(what is missing, how to get it) for these settings on a machine with or without a
        GPU torch can use, or None."""
        if needs_cuda_graphs(self) and not cuda:
            how = "captures" if self.backend == "cudagraphs" or self.capture else f"compiles with mode {self.mode}, which captures"
            return (
                f"toolchain {name} {how} CUDA graphs, which need an NVIDIA GPU; torch {version} sees none.",
                "here, use a torch toolchain whose backend is eager or compile (without CUDA graphs); or run on a GPU machine",
            )
        if self.backend != "compile":
            return None
        if cuda and find_spec("triton") is None:
            return (
                f"toolchain {name} compiles with Inductor, which needs Triton on GPUs; it is not installed.",
                "install the triton release your torch was built with (CUDA wheels of torch bring it)",
            )
        if not cuda and not any(shutil.which(cxx) for cxx in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if cxx):
            return (
                f"toolchain {name} compiles with Inductor, which needs a C++ compiler on the CPU; none is on PATH.",
                "install one (`apt-get install g++`) or set CXX",
            )
        if not cuda and not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
            # Inductor's CPU kernels are C++ that includes Python.h.
            return (
                f"toolchain {name} compiles with Inductor, which needs Python's C headers on the CPU; Python.h is not installed.",
                "install them (`apt-get install python3-dev`, matching this Python)",
            )
        return None


def needs_cuda_graphs(spec) -> bool:
    """Whether the toolchain runs from CUDA graphs (which need a GPU): captured eager, captured
    compiled (``capture``), or a mode of torch.compile that captures (reduce-overhead, max-autotune)."""
    return spec.backend == "cudagraphs" or spec.capture or spec.mode in ("reduce-overhead", "max-autotune")

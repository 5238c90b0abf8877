"""A PyTorch toolchain as the catalog names it: eager, torch.compile (its mode, graph breaks,
dynamic shapes) or eager captured in a CUDA graph, the attention it runs and TF32
(pipeline/runtimes/pytorch.py prepares and times it)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

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
    # The model's attention: "sdpa" (PyTorch's fused scaled-dot-product attention) or "eager" (the
    # model's own matmul-softmax-matmul); None keeps the model's (the catalog's model setting).
    attn_implementation: Literal["sdpa", "eager"] | None = None
    # Which of PyTorch's SDPA kernels may run (torch.nn.attention.sdpa_kernel); None lets PyTorch
    # choose per call. A kernel that cannot run this dtype or GPU is a refusal, with PyTorch's reason.
    sdpa_backend: SdpaBackend | None = None
    # FP32 matrix products on TF32 tensor cores. Off is PyTorch's default (real FP32); TensorRT
    # uses TF32 for FP32 by default, so turn it on for a like-for-like FP32 comparison.
    tf32: bool = False

    @model_validator(mode="after")
    def _sdpa_backend_needs_sdpa(self):
        if self.sdpa_backend is not None and self.attn_implementation == "eager":
            raise ValueError('sdpa_backend chooses among SDPA kernels: it needs attn_implementation = "sdpa" (or unset), not "eager"')
        return self

    @model_validator(mode="after")
    def _compile_options_need_compile(self):
        if self.backend != "compile" and (self.mode is not None or self.fullgraph or self.dynamic):
            raise ValueError(
                f'mode, fullgraph and dynamic are torch.compile settings: they need backend = "compile" (got backend = "{self.backend}")'
            )
        return self

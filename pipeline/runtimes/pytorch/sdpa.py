"""Which scaled-dot-product-attention kernels a prepared PyTorch model ran (the profile's
`execution.sdpa_kernels`, and the refusal of a toolchain whose `sdpa_backend` did not run): an
eager model's seen as the operators it dispatched, a compiled one's as the operators one call
recorded, neither under Kineto's profiler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.running.reporting import native_stderr_held

# The operator each SDPA kernel runs as (aten's names, torch/nn/attention), by the kernel's name
# in `sdpa_backend`.
SDPA_OPERATORS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}


# The operator aten's math SDPA kernel dispatches for its softmax, which gives 0 for a row that is
# all masked (aten/src/ATen/native/transformers/attention.cpp, _scaled_dot_product_attention_math).
# The math kernel is composite: a dispatch mode sees what it is made of, not it. A model that calls
# this softmax itself reads as having run the math kernel.
MATH_SDPA_OPERATOR = "aten::_safe_softmax"


def eager_sdpa_kernels(torch, run: Callable[[], Any]) -> list[str]:
    """Which SDPA kernels one eager call of ``run`` used, by their `sdpa_backend` names (empty for
    a model without scaled-dot-product attention), seen as the operators it dispatched: a fused
    kernel's own (SDPA_OPERATORS), the math kernel's softmax (MATH_SDPA_OPERATOR). A dispatch mode
    is Python's, gone when the call ends, and below the layer that chooses a module's fast path
    (a function mode is not: MultiheadAttention would take its slow path under one). No profiler is
    started, whose Kineto, once started in a process, may stay attached to it and time every later
    launch (pytorch/pytorch#144455). Eager only: torch.compile does not compile under a dispatch
    mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    kernels: set[str] = set()

    class Kernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            if name in SDPA_OPERATORS:
                kernels.add(SDPA_OPERATORS[name])
            elif name == MATH_SDPA_OPERATOR:
                kernels.add("math")
            return func(*args, **(kwargs or {}))

    with Kernels():
        run()
    return sorted(kernels)


def sdpa_kernels(torch, run: Callable[[], Any]) -> list[str]:
    """Which SDPA kernels one call of ``run`` used, by their `sdpa_backend` names (empty for a
    model without scaled-dot-product attention), seen as the operators it called: asked of a
    compiled model, which runs its own kernels only outside a dispatch mode (an eager one is asked
    by eager_sdpa_kernels). One call, outside every measurement, under the autograd profiler's
    legacy CPU mode: record-function callbacks on this thread for that call, and nothing else.
    Not Kineto's profiler: its CPU activities trace the CUDA runtime through CUPTI, which, once
    started in a process, may stay attached and time every later launch (pytorch/pytorch#144455),
    and a compiled engine is timed in the process that prepared it. Kineto's only where this
    PyTorch has no legacy mode."""
    names = _legacy_operator_names(run)
    if names is None:
        from torch.profiler import ProfilerActivity, profile

        # Kineto prints "profiler_start"/"profiler_stop" straight to the process's stderr.
        with native_stderr_held(), profile(activities=[ProfilerActivity.CPU]) as trace:
            run()
        names = _operator_names(trace)
    return sorted({SDPA_OPERATORS[name] for name in names if name in SDPA_OPERATORS})


def _legacy_operator_names(run: Callable[[], Any]) -> set[str] | None:
    """The names of the operators one call of ``run`` called, seen by the legacy profiler in its
    CPU mode (torch/autograd/profiler_legacy.py; no CUDA events, no Kineto); None, with ``run``
    not called, where this PyTorch has no such mode."""
    try:
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import ProfilerConfig, ProfilerState, _disable_profiler_legacy, _enable_profiler_legacy

        config = ProfilerConfig(ProfilerState.CPU, False, False, False, False, False, _ExperimentalConfig())
    except (ImportError, AttributeError, TypeError):
        return None
    _enable_profiler_legacy(config)
    try:
        run()
    finally:
        events = _disable_profiler_legacy()
    return {event.name() for thread in events for event in thread}


def _operator_names(trace) -> set[str]:
    """The names of the operators a profile saw, read off Kineto's raw events. The profiler's own
    ``events()`` builds a tree of every event, CPU parents and children, in Python: 0.4-0.6 s a
    call for one ModernBERT forward on the lent H100's host, 20 s of a seed matrix's 36 engines
    prepared ahead of their points (py-spy: docs/results/sweeps.md), where their names are all
    this reads. ``events()`` where the raw results are not there (another torch's profiler)."""
    raw = getattr(getattr(trace, "profiler", None), "kineto_results", None)
    if raw is not None and hasattr(raw, "events"):
        return {event.name() for event in raw.events()}
    return {event.name for event in trace.events()}

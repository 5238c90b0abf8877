"""Which SDPA kernel a prepared model ran, read off one profiled call (prepared.sdpa_kernels)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.runtimes.pytorch import prepared  # noqa: E402


def attention():
    query = torch.randn(1, 2, 8, 4)
    return torch.nn.functional.scaled_dot_product_attention(query, query, query)


def test_the_kernel_a_call_ran_is_named_and_a_call_without_attention_names_none():
    assert prepared.sdpa_kernels(torch, attention) == ["flash"]  # the CPU's flash kernel
    assert prepared.sdpa_kernels(torch, lambda: torch.relu(torch.randn(4))) == []


def test_the_raw_names_are_those_the_profilers_events_give():
    """The names are read off Kineto's raw results; the profiler's own events, its tree built,
    are where those are not there, and both name the same operators."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as trace:
        attention()
    raw = prepared._operator_names(trace)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in raw

    class EventsOnly:  # a profile whose raw results are not there
        def events(self):
            return trace.events()

    assert prepared._operator_names(EventsOnly()) == raw

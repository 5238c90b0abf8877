"""Which SDPA kernel a prepared model ran: an eager one's seen as the operators it dispatched
(sdpa.eager_sdpa_kernels), a compiled one's as the operators one call recorded, under the legacy
profiler's CPU mode (sdpa.sdpa_kernels); neither under Kineto's profiler."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.runtimes.pytorch import sdpa as prepared  # noqa: E402


def attention():
    query = torch.randn(1, 2, 8, 4)
    return torch.nn.functional.scaled_dot_product_attention(query, query, query)


def kineto_kernels(run) -> list[str]:
    """The kernels Kineto's profiler saw ``run`` call: the reading the product used before."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as trace:
        run()
    return sorted({prepared.SDPA_OPERATORS[name] for name in prepared._operator_names(trace) if name in prepared.SDPA_OPERATORS})


def refuse_kineto(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Kineto's profiler was started")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    monkeypatch.setattr(torch.autograd.profiler, "profile", refuse)


def test_the_kernel_a_call_ran_is_named_and_a_call_without_attention_names_none(monkeypatch):
    refuse_kineto(monkeypatch)
    assert prepared.sdpa_kernels(torch, attention) == ["flash"]  # the CPU's flash kernel
    assert prepared.sdpa_kernels(torch, lambda: torch.relu(torch.randn(4))) == []
    assert not torch.autograd._profiler_enabled()


def test_a_compiled_models_kernels_are_read_without_kineto_as_kineto_read_them(monkeypatch):
    """A compiled model's kernels (its own: torch.compile chooses them) are what Kineto's profiler
    saw it call; read without Kineto, whose CUPTI may stay attached to the process that then times
    the model; the profiler is off again after the call, and after a call that raised."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class Attention(torch.nn.Module):
        def forward(self, query):
            return torch.nn.functional.scaled_dot_product_attention(query, query, query) * 2

    query = torch.randn(1, 2, 8, 4)
    compiled = torch.compile(Attention())
    compiled(query)
    expected = kineto_kernels(lambda: compiled(query))
    assert expected == ["flash"]
    with sdpa_kernel([SDPBackend.MATH]):
        math = Attention()
        expected_math = kineto_kernels(lambda: math(query))
    refuse_kineto(monkeypatch)
    assert prepared.sdpa_kernels(torch, lambda: compiled(query)) == expected
    with sdpa_kernel([SDPBackend.MATH]):
        assert prepared.sdpa_kernels(torch, lambda: math(query)) == expected_math == ["math"]

    def raising():
        attention()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        prepared.sdpa_kernels(torch, raising)
    assert not torch.autograd._profiler_enabled()


def test_kinetos_reading_where_this_pytorch_has_no_legacy_profiler(monkeypatch):
    monkeypatch.delattr(torch.autograd, "_enable_profiler_legacy")
    ran = []
    assert prepared.sdpa_kernels(torch, lambda: ran.append(attention())) == ["flash"]
    assert len(ran) == 1  # one call, by Kineto's profiler alone


def test_an_eager_call_names_its_kernels_without_a_profiler(monkeypatch):
    """The fused kernels a call ran, and math where it ran that; nothing for a call without
    attention; and no profiler started, whose Kineto may stay attached to the process."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def refuse(*args, **kwargs):
        raise AssertionError("a profiler was started")

    refuse_kineto(monkeypatch)
    monkeypatch.setattr(torch.autograd, "_enable_profiler_legacy", refuse)
    assert prepared.eager_sdpa_kernels(torch, attention) == ["flash"]  # the CPU's flash kernel

    def math():
        with sdpa_kernel([SDPBackend.MATH]):
            return attention()

    assert prepared.eager_sdpa_kernels(torch, math) == ["math"]
    assert prepared.eager_sdpa_kernels(torch, lambda: (math(), attention())) == ["flash", "math"]
    assert prepared.eager_sdpa_kernels(torch, lambda: torch.relu(torch.randn(4))) == []
    query = torch.randn(1, 2, 8, 4)  # a fused kernel's operator called by the model itself
    direct = lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, query, query)  # noqa: E731
    assert prepared.eager_sdpa_kernels(torch, direct) == ["flash"]
    with sdpa_kernel([SDPBackend.MATH]):  # the math kernel's operator, called by the model itself
        assert prepared.eager_sdpa_kernels(torch, lambda: torch.ops.aten.scaled_dot_product_attention(query, query, query)) == ["math"]
    assert not torch.autograd._profiler_enabled()


def test_a_module_keeps_its_fast_path_and_its_outputs_while_its_kernels_are_seen():
    """A function mode would turn MultiheadAttention and the transformer encoder off their fast
    path (which runs no SDPA kernel on a CPU): what is seen is what the timed call runs, as the
    profiler saw it, and it computes what it computes unseen."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    attention_module = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    padded = torch.zeros(2, 8, dtype=torch.bool)
    padded[0, 5:] = True
    for call in (lambda: attention_module(x, x, x, need_weights=False)[0], lambda: encoder(x, src_key_padding_mask=padded)):
        with torch.no_grad():
            alone = call()
            outputs: list = []
            seen = prepared.eager_sdpa_kernels(torch, lambda call=call, outputs=outputs: outputs.append(call()))
            assert seen == prepared.sdpa_kernels(torch, call) == kineto_kernels(call)
        assert torch.equal(outputs[0], alone)


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


class _Attending(torch.nn.Module):
    """Attention whose mask, like transformers', reaches SDPA only where it masks anything."""

    def forward(self, query, mask=None):
        masks = mask is not None and not bool(mask.all())
        return torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=mask.bool() if masks else None)


def test_an_eager_module_is_asked_its_kernels_once_for_each_file_setting_and_input(monkeypatch):
    """The eager and CUDA-graph toolchains of one engine ask the same eager module at each point:
    one call seen for each engine file, attention setting and inputs; another file, setting,
    shape or input value (a mask that masks nothing, or one that does) is asked again."""
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import spec_class
    from pipeline.runtimes.pytorch import preparing

    asked = []
    real = preparing.eager_sdpa_kernels
    monkeypatch.setattr(preparing, "eager_sdpa_kernels", lambda torch_, run: asked.append(1) or real(torch_, run))

    query = torch.randn(1, 2, 8, 4)

    def prepare(engine_file, query=query, mask=None, **settings):
        spec = spec_class("torch").model_validate({"kind": "torch", **settings})
        examples = (query,) if mask is None else (query, mask)
        return preparing.TorchPreparation(spec, Reporter()).prepare(_Attending(), examples, torch.float32, "cpu", engine_file, "1x8")

    first = prepare((1, 2, 3))
    assert first.facts["sdpa_kernels"] == ["flash"] and len(asked) == 1
    assert prepare((1, 2, 3)).facts["sdpa_kernels"] == ["flash"] and len(asked) == 1  # the same module again
    prepare((1, 2, 3), query=torch.randn(1, 2, 16, 4))
    prepare((4, 5, 6))
    prepare((1, 2, 3), sdpa_backend="math")
    assert len(asked) == 4
    # Masks of one shape and type: with nothing masked none reaches SDPA, with a column padded
    # one does (on a GPU, where flash takes no mask, another kernel runs): each asked.
    prepare((1, 2, 3), mask=torch.ones(8, 8, dtype=torch.int64))
    padded = torch.ones(8, 8, dtype=torch.int64)
    padded[:, 6:] = 0
    prepare((1, 2, 3), mask=padded)
    prepare((1, 2, 3), mask=padded.clone())
    assert len(asked) == 6

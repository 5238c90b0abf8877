"""An eager engine's reference run on the very values it was prepared on is the preparing run
(pytorch/prepared.py, first_output): one run less for each engine a profile checks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.running.reporting import Reporter  # noqa: E402
from pipeline.runtimes import spec_class  # noqa: E402
from pipeline.runtimes.pytorch.preparing import TorchPreparation  # noqa: E402


class _Counted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


def _prepared(backend: str, model, examples):
    spec = spec_class("torch").model_validate({"kind": "torch", "backend": backend})
    return TorchPreparation(spec, Reporter()).prepare(model, examples, torch.float32, "cpu", (0, 0, 0), "2x8")


def test_the_reference_run_on_the_prepared_values_is_the_preparing_run_and_other_values_run_again():
    torch.manual_seed(0)
    model = _Counted().eval()
    examples = (torch.randn(2, 8, generator=torch.Generator().manual_seed(1)),)
    prepared = _prepared("eager", model, examples)
    calls = model.calls
    with torch.no_grad():
        expected = model.linear(examples[0]).numpy()
    same = prepared.infer((examples[0].numpy().copy(),))
    assert model.calls == calls, "no run: the preparing run's output"
    assert (same == expected).all()
    assert (prepared.infer((examples[0].numpy().copy(),)) == expected).all()
    assert model.calls == calls + 1, "read once: the next reference run runs"
    other = torch.randn(2, 8, generator=torch.Generator().manual_seed(2))
    again = _prepared("eager", model, (examples[0].clone(),))
    calls = model.calls
    with torch.no_grad():
        wanted = model.linear(other).numpy()
    assert (again.infer((other.numpy(),)) == wanted).all()
    assert model.calls == calls + 1, "other values: run on them"


def test_an_engine_warmed_for_its_rounds_lets_the_preparing_run_go():
    model = _Counted().eval()
    examples = (torch.randn(2, 8, generator=torch.Generator().manual_seed(1)),)
    prepared = _prepared("eager", model, examples)
    assert prepared.first_output is not None
    prepared.execution = {}
    prepared.warm()
    assert prepared.first_output is None
    calls = model.calls
    prepared.infer((examples[0].numpy(),))
    assert model.calls == calls + 1


def test_values_equal_as_numbers_but_not_bit_for_bit_run_again():
    """-0.0 equals 0.0 as a number, and a model may tell them apart (1 / x): run on them."""
    model = _Counted().eval()
    examples = (torch.zeros(2, 8),)
    prepared = _prepared("eager", model, examples)
    calls = model.calls
    prepared.infer((-torch.zeros(2, 8).numpy(),))
    assert model.calls == calls + 1


def test_an_output_too_large_to_hold_is_not_kept(monkeypatch):
    from pipeline.runtimes.pytorch import prepared as prepared_module

    examples = (torch.randn(2, 8, generator=torch.Generator().manual_seed(1)),)
    monkeypatch.setattr(prepared_module, "FIRST_OUTPUT_BYTES", 2 * 4 * 4 - 1)  # one byte under the output's
    assert _prepared("eager", _Counted().eval(), examples).first_output is None
    monkeypatch.setattr(prepared_module, "FIRST_OUTPUT_BYTES", 2 * 4 * 4)
    assert _prepared("eager", _Counted().eval(), examples).first_output is not None


def test_an_engine_served_lets_the_preparing_run_go():
    """Serving (streams) follows no reference run: the kept output is let go before it."""
    from types import SimpleNamespace

    from pipeline.runtimes.pytorch.runtime import TorchRuntime

    spec = spec_class("torch").model_validate({"kind": "torch", "backend": "eager"})
    prepared = _prepared("eager", _Counted().eval(), (torch.randn(2, 8),))
    assert prepared.first_output is not None
    served = TorchRuntime.serve(SimpleNamespace(spec=spec, reporter=Reporter()), prepared, 1, 0.05)
    assert served.completed > 0 and prepared.first_output is None

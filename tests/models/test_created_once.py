"""A model is created once in a run and copied for each stage after the first (pipeline/models/created.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.models import created, model_source  # noqa: E402
from pipeline.runtimes import load_catalog  # noqa: E402


@pytest.fixture(autouse=True)
def nothing_kept():
    created.forget()
    yield
    created.forget()


def _source(tiny_catalog):
    catalog = load_catalog(tiny_catalog)
    return model_source("tiny", catalog.model("tiny"), catalog.root)


def _counting(source, monkeypatch) -> list:
    calls = []
    real = type(source).create

    def create(self):
        calls.append(self.name)
        return real(self)

    monkeypatch.setattr(type(source), "create", create)
    return calls


def test_the_second_stage_gets_a_copy_of_the_same_weights_and_the_same_random_draws(tiny_catalog, monkeypatch):
    source = _source(tiny_catalog)
    calls = _counting(source, monkeypatch)
    first = source.created()
    after_first = torch.randn(4)
    second = source.created()
    after_second = torch.randn(4)
    assert calls == ["tiny"]  # created once
    assert second is not first
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(after_first, after_second)  # the generator as creating it would leave it
    # What a stage does to its copy (a cast) leaves the next stage's as created.
    first.to(torch.float16)
    third = source.created()
    assert all(p.dtype == torch.float32 for p in third.parameters())


def test_a_changed_file_or_a_forgotten_model_is_created_again(tiny_catalog, monkeypatch, tmp_path):
    source = _source(tiny_catalog)
    calls = _counting(source, monkeypatch)
    source.created()
    created.forget()
    source.created()
    assert len(calls) == 2
    watched = tmp_path / "weights.bin"
    watched.write_bytes(b"1")
    monkeypatch.setattr(type(source), "input_files", lambda self: [watched])
    source.created()
    source.created()
    assert len(calls) == 3
    watched.write_bytes(b"22")  # another size: another file
    source.created()
    assert len(calls) == 4


def test_a_model_larger_than_its_share_of_the_host_is_not_kept(tiny_catalog, monkeypatch):
    source = _source(tiny_catalog)
    calls = _counting(source, monkeypatch)
    monkeypatch.setattr("pipeline.machine.environment.host_memory_available", lambda: 1024)
    source.created()
    source.created()
    assert len(calls) == 2

"""A prepared engine's serving on a GPU issues each concurrent caller's requests on a CUDA stream of
its own, made at the engine's first serving and kept for every take after: PyTorch's caching
allocator keeps what a stream freed for that stream alone, so new streams every take would each
hold memory of their own (up to the 32 of PyTorch's pool). Run on the CPU with the CUDA streams
stood in for, which is all this needs of a GPU."""

from __future__ import annotations

import contextlib


def test_each_take_serves_on_the_streams_the_takes_before_made(monkeypatch):
    import torch

    from pipeline.runtimes.pytorch.prepared import Prepared
    from pipeline.runtimes.pytorch.spec import TorchSpec
    from pipeline.runtimes.pytorch.streams import serve_streams

    made, used = [], []

    class StandInStream:
        def __init__(self):
            made.append(self)

        def synchronize(self):
            used.append(self)

    monkeypatch.setattr(torch.cuda, "Stream", StandInStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    prepared = Prepared(engine_file=(0, 0, 0), run=lambda: None, examples=(torch.randn(2, 8),), device="cuda", shape=None)
    prepared.model = torch.nn.Linear(8, 4).eval()
    spec = TorchSpec(kind="torch", backend="eager")
    for count in (2, 1, 4, 2):
        served = serve_streams(spec, contextlib.nullcontext, prepared, count, 0.05, None)
        assert served.why_not is None and served.completed > 0 and served.streams == count
    assert len(made) == 4 and prepared.serving_streams == made  # as many as the largest count, once
    assert set(used) == set(made)

"""A torch.compile module serving streams on a CPU: its wrapper's truth is its len(), which it
refuses for a module that is no container, so the streams must pick the compiled module by
whether there is one, never by its truth."""

from __future__ import annotations

import contextlib

import pytest


def test_a_compiled_module_serves_its_streams():
    import torch

    from pipeline.runtimes.pytorch.prepared import Prepared
    from pipeline.runtimes.pytorch.spec import TorchSpec
    from pipeline.runtimes.pytorch.streams import serve_streams

    model = torch.nn.Linear(8, 4).eval()
    compiled = torch.compile(model, backend="eager")  # Dynamo's wrapper, without Inductor's compiler
    with pytest.raises(TypeError):
        bool(compiled)  # what `compiled or model` asked
    prepared = Prepared(engine_file=(0, 0, 0), run=lambda: None, examples=(torch.randn(2, 8),), device="cpu", shape=None)
    prepared.model, prepared.compiled = model, compiled
    spec = TorchSpec(kind="torch", backend="compile")
    served = serve_streams(spec, contextlib.nullcontext, prepared, 2, 0.2, None)
    assert served.why_not is None and served.completed > 0 and served.streams == 2
    assert served.how == "2 threads on one compile model, each its own inputs"

"""A torch build's model in its precision (TorchRuntime.build): made and cast once a process for
each set of weights and precision, and for the builds after the first, the same module made again
around the tensors of the first.

Every torch toolchain's build of one engine starts from the same weights in the same precision:
the seed matrix builds each of ModernBERT-base's two variants five times, one after another. Made
and cast anew, each build faulted in fresh host memory for 149 M FP32 weights and again for their
cast: 2.2 s a build on the lent H100's host, 26 s of the 41 s py-spy sampled in a warm run's
builds (docs/results/sweeps.md). A module made around the same tensors is the same model; nothing a build
does writes its weights in place (it writes them to a file, moves them to the GPU, which copies,
or runs them), so the builds may share them.
"""

from __future__ import annotations

from typing import Any

from pipeline.models.module_tensors import adopt, tensors_by_name

# The cast weights of the last model made, by (ModelSource.weights_key, dtype): each precision's
# of one set of weights at a time, at most KEPT_BYTES of them (host memory held for the process).
_last_cast: dict[tuple, dict[str, Any]] = {}
KEPT_BYTES = 2 << 30


def cast_model(source, dtype) -> tuple[Any, Any]:
    """(the model as ``source.create`` made it, the runnable model cast to ``dtype``): the tensors
    of the last ones made of the same weights in ``dtype`` where this process made them."""
    weights = source.weights_key()
    key = None if weights is None else (weights, str(dtype))
    kept = _last_cast.get(key) if key is not None else None
    if kept is not None:
        created = source.create_for_weights()  # allocated, not initialised: its tensors are replaced
        model = source.runnable(created)
        adopt(model, kept)
        return created, model
    created = source.create()
    model = source.cast(source.runnable(created), dtype)
    _in_memory_of_its_own(model, created)
    if key is not None:
        for other in [other for other in _last_cast if other[0] != weights]:
            del _last_cast[other]  # another model's weights: one set at a time
        tensors = tensors_by_name(model)
        held = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
        held += sum(t.numel() * t.element_size() for kept in _last_cast.values() for t in kept.values())
        if held <= KEPT_BYTES:
            _last_cast[key] = tensors
    return created, model


def _in_memory_of_its_own(model, created) -> None:
    """The tensors the cast left as they were (an FP32 engine's weights, the FP32 rotary buffers)
    copied into memory of the model's own: ``created``'s may be the pages of the weights cache's
    file (models/transformers_weights.py, seeded), which the kernel may drop under pressure and
    does not back with huge pages, and an engine timed on the CPU runs on its weights' memory."""
    theirs = {tensor.data_ptr() for tensor in tensors_by_name(created).values()}
    tensors = tensors_by_name(model)
    if any(tensor.data_ptr() in theirs for tensor in tensors.values()):
        adopt(model, {name: tensor.clone() if tensor.data_ptr() in theirs else tensor for name, tensor in tensors.items()})

"""The weights a transformer is made with: seeded (and the same tensors read back from the
workspace's cache of them, or copied in when this process made that model last), allocated but
not initialised (its engine's state dict replaces them), or read from a folder of weights."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path
from typing import Any

from pipeline.models.module_tensors import adopt, fits, tensors_by_name

# The seeded weights of the last model initialised in this process, by class, config and seed: a
# run creates its transformer once for each export and each torch build (twelve times in the seed
# matrix, one after another in one process), and initialising ModernBERT-base's weights is most
# of each creation. One model's at a time, and none over KEPT_WEIGHTS_BYTES (a copy in host memory).
_last_seeded: dict[tuple, dict] = {}
KEPT_WEIGHTS_BYTES = 2 << 30


# Where a workspace keeps the seeded weights its models were made with (``seeded``'s ``cache``),
# one file a model: making ModernBERT-base took 10.4 s of the lent H200's warm seed matrix before
# its first export (docs/results/sweeps.md), its weights' initialisation most of it (9.9 of 14.1 s
# on a 2-core VM, cProfile), in a re-run as in the first run, for the very tensors the seed makes
# again. Reading them back takes a fraction of a second.
WEIGHTS_FOLDER = Path(".cache") / "weights"
# What a file of it holds, checked on reading (anything else is made again).
_CACHED_FORMAT = "trt-pipeline seeded weights"


def seeded(cls, config, seed: int, cache: Path | None = None):
    """``cls(config)`` with the weights initialised after ``torch.manual_seed(seed)``: made here,
    or the same tensors read back when ``cache`` (a folder) holds them, or copied in when this
    process made them last. The same class, config, seed, torch and transformers make the same
    tensors (torch's CPU generator), and the file is named by all five; what this process makes
    is written there, beside the run, once it is made.

    A model read back from the file is made around its tensors as they lie in the file, mapped
    copy-on-write, a mapping of its own for each model: nothing is copied until it is read (cast,
    moved to the GPU), and a model that writes its weights in place (sparsified, quantized) writes
    its own pages, never the file's or another model's. The file is these models' memory, so it is
    only ever replaced (written beside and moved over it, _write_cached), never written in place:
    a file cut short under a live model would fault its next read. Copying them into a model's own
    memory took 0.7 s a model on the lent H100's host, four times before the warm seed matrix's
    first point (sampled: docs/results/sweeps.md)."""
    import torch

    key = seeded_key(cls, config, seed)
    if cache is not None and (mapped := _read_cached(cache, key)) is not None:
        model = allocated(cls, config)
        if fits(model, mapped):
            adopt(model, mapped)
            return model
    kept = _last_seeded.get(key)
    if kept is not None:
        model = allocated(cls, config)
        if fits(model, kept):
            with torch.no_grad():
                # Every parameter and every buffer, those left out of the state dict too: a class's
                # weight initialisation may also fill buffers it does not save (position ids).
                for name, tensor in tensors_by_name(model).items():
                    tensor.copy_(kept[name])
            return model
    model = cls(config)
    tensors = tensors_by_name(model)
    _last_seeded.clear()
    if sum(t.numel() * t.element_size() for t in tensors.values()) <= KEPT_WEIGHTS_BYTES:
        _last_seeded[key] = copies = {name: t.clone() for name, t in tensors.items()}
        if cache is not None:
            _write_cached(cache, key, copies)
    return model


def _cached_path(cache: Path, key: tuple) -> tuple[Path, str]:
    """The file of ``key``'s weights in ``cache``, and what names them in it: the key with the
    versions of torch and transformers, whose initialisation code makes them."""
    import torch
    import transformers

    named = repr((key, torch.__version__, transformers.__version__))
    return Path(cache) / f"{hashlib.sha256(named.encode()).hexdigest()[:24]}.pt", named


def _read_cached(cache: Path, key: tuple) -> dict[str, Any] | None:
    """The weights ``cache`` holds for ``key``; None where it holds none, or a file cut short or
    of another format or key (made again then; the tensors' bytes themselves carry no checksum)."""
    import torch

    path, named = _cached_path(cache, key)
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # cut short, another torch's format: made again
        return None
    if not isinstance(saved, dict) or saved.get("format") != _CACHED_FORMAT or saved.get("named") != named:
        return None
    return saved.get("tensors")


# The threads writing weights to a cache now (``finished_writing`` waits for them).
_writing: list[threading.Thread] = []


def finished_writing() -> None:
    """Wait for this process's writes to the weights cache: before its workspace is deleted (a
    cluster task's scratch workspace), which a write still going would make again."""
    while _writing:
        _writing.pop().join()


def _write_cached(cache: Path, key: tuple, tensors: dict[str, Any]) -> None:
    """``tensors`` written to ``cache`` for ``key``, on a thread of its own (a second or so for
    ModernBERT-base, off the run's way; a process ending normally waits for it, one killed leaves
    a hidden .tmp file); a failed write leaves nothing there."""
    from pipeline.running.files import atomic_output

    path, named = _cached_path(cache, key)

    def write() -> None:
        import torch

        with contextlib.suppress(Exception), atomic_output(path) as partial:  # a full disk: made again next time
            torch.save({"format": _CACHED_FORMAT, "named": named, "tensors": tensors}, partial)

    thread = threading.Thread(target=write, name="seeded-weights-cache")
    thread.start()
    _writing.append(thread)


def seeded_key(cls, config, seed: int) -> tuple:
    """What identifies the weights ``seeded`` makes: the same key, the same tensors."""
    return (cls.__module__, cls.__qualname__, config.to_json_string(use_diff=False), seed)


def allocated(cls, config):
    """``cls(config)`` with its weights allocated, not initialised, and tied as the class ties
    them (an output head that is the input embedding): transformers ties them in the
    initialisation that ``no_init_weights`` skips, and an untied copy of a tied model holds its
    embedding twice and writes one of them alone."""
    with no_init_weights():
        model = cls(config)
    if callable(getattr(model, "tie_weights", None)):
        model.tie_weights()
    return model


def no_init_weights():
    """transformers' context in which a model's weights are allocated but not initialised."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights()


def has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))

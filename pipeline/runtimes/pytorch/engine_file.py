"""The PyTorch toolchain's engine file (``engines/<toolchain>/<engine>.pt``): what makes the model
again — its family and catalog settings — its precision, the input shapes it was built at and its
weights, so that the file pins exactly what is timed; and the model read back from it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from pipeline.models import TORCH_DTYPES
from pipeline.running.errors import PipelineError
from pipeline.running.files import final_path
from pipeline.runtimes.pytorch.cast_weights import KEPT_BYTES
from pipeline.runtimes.pytorch.prepared import import_torch

# What the engine file holds; checked on load so a stray .pt is a clear error, not a crash.
ENGINE_FORMAT = "trt-pipeline torch model"
# 2: the model is described by its family and catalog settings (1: a timm architecture's name).
ENGINE_FORMAT_VERSION = 2


# The engine files this process last wrote, one for each header (each precision of one model's
# weights), at most KEPT_BYTES of weights together: what each holds (the header, and each weight's
# tensor, its memory and version) and the file's identity once written (_Written).
_written: list[_Written] = []


def write_engine(path: Path, source, precision: str, examples: tuple, model) -> None:
    """The engine file for ``model`` (``source``'s, cast to ``precision``), built at ``examples``' shapes.

    ``path`` is a build's temporary name (running/files.py, atomic_output). Where this process
    wrote the same header and the very same weight tensors, unchanged since, to a file still as it
    was written, ``path`` becomes a second name of that file instead: every torch toolchain of one
    engine writes the same file (the toolchain is not in it), and each of the seed matrix's ten
    builds wrote and then hashed 300 MB again (8.5 s of its builds on the lent H100, py-spy:
    docs/results/sweeps.md). One file is kept for each header, not only the last: the builds take
    the toolchains in turn and each toolchain's variants in turn (bf16, fp16, bf16, ...), so with
    only the last one kept every build wrote its file anew (sampled on the lent H100: half of the
    warm run's eight eager builds' time). The workspace hashes a file once under all its names
    (workspace/artifacts.py); a later build writes a new file and moves it over its own name,
    leaving the other name's as it was."""
    header = {
        "format": ENGINE_FORMAT,
        "format_version": ENGINE_FORMAT_VERSION,
        # What makes the model again: its family and catalog settings (weights below).
        "source": {"name": source.name, "family": source.family, "spec": source.spec.model_dump(mode="json")},
        "precision": precision,
        "input_shapes": [list(t.shape) for t in examples],
    }
    state = model.state_dict()
    if any(written.holds(header, state) and _link(written, path) for written in _written):
        return
    # The superseded file of this header and those of another model's weights are let go before
    # this file's tensors are held (cast_weights keeps one model's weights at a time, too).
    _written[:] = [written for written in _written if written.header != header and written.header["source"] == header["source"]]
    import_torch().save({**header, "state_dict": state}, path)
    size = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    if size + sum(written.size for written in _written) > KEPT_BYTES:
        _written.clear()  # the newest kept, where it fits alone
    if size <= KEPT_BYTES:
        _written.append(_Written(header, state, final_path(path), file_identity(path), size))


class _Written:
    """An engine file as this process wrote it: its header, its weights — the tensors themselves,
    held so that their memory is no other tensor's while this is kept, and each one's in-place
    version when written (a weight written in place since is another weight) — and where the
    file is, with what identity."""

    def __init__(self, header: dict, state: dict, path: Path, identity: tuple, size: int):
        self.header, self.state, self.path, self.identity, self.size = header, dict(state), path, identity, size
        self.versions = {name: tensor._version for name, tensor in state.items()}

    def holds(self, header: dict, state: dict) -> bool:
        if header != self.header or state.keys() != self.state.keys():
            return False
        return all(_same(state[name], self.state[name]) and state[name]._version == self.versions[name] for name in state)


def _same(a, b) -> bool:
    """The same memory read the same way (state_dict's tensors are views made anew each time)."""
    return (a.data_ptr(), a.dtype, a.shape, a.stride(), a.device) == (b.data_ptr(), b.dtype, b.shape, b.stride(), b.device)


def _link(written: _Written, path: Path) -> bool:
    """``path`` made a second name of ``written``'s file, where that is still the file written
    (False, and nothing changed, where it is not, or where the disk makes no links)."""
    spare = path.with_name(path.name + ".linking")
    try:
        if file_identity(written.path) != written.identity:
            return False
        os.link(written.path, spare)
        os.replace(spare, path)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):  # gone already where the link took its place
            spare.unlink()
    return True


def read_engine(path: Path) -> dict[str, Any]:
    """What an engine file holds, checked to be one this toolchain wrote."""
    torch = import_torch()
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise PipelineError(f"{path} is not a readable PyTorch file: {exc}", hint="rebuild it with --force") from exc
    if not isinstance(saved, dict) or saved.get("format") != ENGINE_FORMAT or saved.get("format_version") != ENGINE_FORMAT_VERSION:
        raise PipelineError(f"{path} was not written by this pipeline's torch toolchain.", hint="rebuild it with --force")
    return saved


def model_from(saved: dict[str, Any], workspace_root: Path, attn_implementation: str | None):
    """The model an engine file describes, with its weights, in its precision, in eval mode, with
    the toolchain's attention implementation."""
    from pipeline.models import model_source, source_class

    torch = import_torch()
    described = saved["source"]
    spec = source_class(described["family"]).Spec.model_validate(described["spec"])
    source = model_source(described["name"], spec, workspace_root)
    dtype = getattr(torch, TORCH_DTYPES[saved["precision"]])
    model = source.cast(source.runnable(source.create_for_weights()), dtype)
    model.load_state_dict(saved["state_dict"])  # every weight: strict
    if attn_implementation:
        source.use_attention(model, attn_implementation)
    return model.eval()


def file_identity(path: Path) -> tuple[int, int, int]:
    """Which engine file this is: (inode, size, mtime), kept by the move a build's write ends with
    (and by the second name its work ahead reads it by), so a profile tells its own build's file
    without hashing hundreds of MB again."""
    stat = Path(path).stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns

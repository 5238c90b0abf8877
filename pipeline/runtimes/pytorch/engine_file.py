"""The PyTorch toolchain's engine file (``engines/<toolchain>/<engine>.pt``): what makes the model
again — its family and catalog settings — its precision, the input shapes it was built at and its
weights, so that the file pins exactly what is timed; and the model read back from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.models import TORCH_DTYPES
from pipeline.running.errors import PipelineError
from pipeline.runtimes.pytorch.prepared import import_torch

# What the engine file holds; checked on load so a stray .pt is a clear error, not a crash.
ENGINE_FORMAT = "trt-pipeline torch model"
# 2: the model is described by its family and catalog settings (1: a timm architecture's name).
ENGINE_FORMAT_VERSION = 2


def write_engine(path: Path, source, precision: str, examples: tuple, model) -> None:
    """The engine file for ``model`` (``source``'s, cast to ``precision``), built at ``examples``' shapes."""
    import_torch().save(
        {
            "format": ENGINE_FORMAT,
            "format_version": ENGINE_FORMAT_VERSION,
            # What makes the model again: its family and catalog settings (weights below).
            "source": {"name": source.name, "family": source.family, "spec": source.spec.model_dump(mode="json")},
            "precision": precision,
            "input_shapes": [list(t.shape) for t in examples],
            "state_dict": model.state_dict(),
        },
        path,
    )


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

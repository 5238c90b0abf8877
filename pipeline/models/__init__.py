"""Where the PyTorch models engines come from: one module per model family, each a
:class:`~pipeline.models.base.ModelSource`, registered here and nowhere else."""

from __future__ import annotations

import importlib
from pathlib import Path

from pipeline.catalog import ModelSpec
from pipeline.models.base import TORCH_DTYPES, ModelSource

# family → "module:class". Modules are imported when a catalog model needs them.
FAMILIES = {
    "timm": "pipeline.models.timm:TimmModel",
}


def family_of(spec: ModelSpec) -> str:
    """The family a catalog model belongs to (the catalog's `timm = "…"` key names a timm model)."""
    return "timm"


def model_source(name: str, spec: ModelSpec, workspace_root: Path) -> ModelSource:
    """The catalog model ``name`` as its family's ModelSource."""
    module, _, cls = FAMILIES[family_of(spec)].partition(":")
    return getattr(importlib.import_module(module), cls)(name, spec, workspace_root)


__all__ = ["FAMILIES", "TORCH_DTYPES", "ModelSource", "family_of", "model_source"]

"""Where the models engines come from: one module per model family, each a
:class:`~pipeline.models.base.ModelSource` with its catalog settings, registered here and nowhere
else. A catalog table names its family by the key that names the model (``timm = "…"``)."""

from __future__ import annotations

import difflib
import functools
import importlib
import sys
from pathlib import Path
from typing import Any

from pipeline.catalog import ModelSpec
from pipeline.models.base import TORCH_DTYPES, ModelInput, ModelSource, PointShapes, ShapePoint

# family → "module:class". Modules are imported when a catalog model needs them.
FAMILIES = {
    "timm": "pipeline.models.timm:TimmModel",
    "transformers": "pipeline.models.transformers:TransformersModel",
    "onnx": "pipeline.models.onnx_file:OnnxModel",
    "python": "pipeline.models.python_module:PythonModel",
}


def finished_writing() -> None:
    """Wait for what the model families imported in this process still write in the background
    (a family module's ``finished_writing``: a transformer's seeded weights, kept in the
    workspace), before the workspace goes (a cluster task's scratch workspace)."""
    for target in FAMILIES.values():
        module = sys.modules.get(target.partition(":")[0])
        if module is not None and hasattr(module, "finished_writing"):
            module.finished_writing()


@functools.cache
def source_class(family: str) -> type[ModelSource]:
    module, _, cls = FAMILIES[family].partition(":")
    return getattr(importlib.import_module(module), cls)


def spec_class(table: Any) -> type[ModelSpec]:
    """The settings class of the family a catalog model table belongs to (LookupError when it
    names no family, or several)."""
    keys = [family for family in FAMILIES if isinstance(table, dict) and family in table]
    if len(keys) == 1:
        return source_class(keys[0]).Spec
    if keys:
        raise LookupError(f"names its model by {' and '.join(keys)}; give one")
    fields = sorted(table) if isinstance(table, dict) else []
    close = [match for key in fields for match in difflib.get_close_matches(key, list(FAMILIES), n=1, cutoff=0.6)]
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    raise LookupError(
        f'names no model: {suggestion}give one of {", ".join(repr(f) for f in FAMILIES)} (e.g. timm = "vit_tiny_patch16_224")'
    )


def model_source(name: str, spec: ModelSpec, workspace_root: Path) -> ModelSource:
    """The catalog model ``name`` as its family's ModelSource."""
    return source_class(spec.family())(name, spec, workspace_root)


__all__ = ["FAMILIES", "TORCH_DTYPES", "ModelInput", "ModelSource", "PointShapes", "ShapePoint", "model_source", "spec_class"]

"""What the stages and runtimes ask of a model, whatever family it comes from.

A family (timm today) is one module in this package with one class behind :class:`ModelSource`,
registered in ``pipeline/models/__init__.py``. Export, build and profile hold a ModelSource and
never check which family it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from pipeline.catalog import ModelSpec
from pipeline.errors import PipelineError

# torch dtype name of each precision a PyTorch model runs natively; quantized precisions are
# fake-quantized graphs in PyTorch and have no entry.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class ModelSource(ABC):
    """One catalog model: how to create it (never a download) and what it is fed."""

    family: ClassVar[str]

    def __init__(self, name: str, spec: ModelSpec, workspace_root: Path):
        self.name = name
        self.spec = spec
        self.workspace_root = workspace_root

    @abstractmethod
    def describe(self) -> str:
        """What the model is, for logs and dry runs (e.g. a timm architecture name)."""

    @abstractmethod
    def create(self) -> Any:
        """The model in eval mode on the CPU, in FP32, with the catalog's weights."""

    @abstractmethod
    def input_shape(self, model) -> tuple[int, ...]:
        """The shape of the batch every stage feeds the model."""

    @abstractmethod
    def sample_input(self, shape):
        """The fixed, seeded batch of that shape that export traces and checks parity with."""

    def checkpoint_path(self) -> Path | None:
        """The catalog's local weights file (relative paths from the workspace), or None for seeded random weights."""
        if self.spec.checkpoint is None:
            return None
        path = Path(self.spec.checkpoint).expanduser()
        if not path.is_absolute():
            path = self.workspace_root / path
        if not path.is_file():
            raise PipelineError(
                f"checkpoint {path} for model {self.name!r} does not exist.",
                hint="fix `checkpoint` in pipeline.toml, or remove it to export with random weights",
            )
        return path

"""The PyTorch models engines come from: a timm architecture with seeded random weights, or a
local checkpoint. Weights are never downloaded (offline machines).

The export stage traces these models to ONNX; runtimes that run PyTorch itself (the ``torch``
toolchains) start from the same model, so both describe the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.catalog import ModelSpec
from pipeline.errors import PipelineError

# torch dtype name of each precision a PyTorch model runs natively; quantized precisions are
# fake-quantized graphs in PyTorch and have no entry.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ModelSource:
    """One catalog model, with its checkpoint (if any) resolved against the workspace."""

    name: str
    spec: ModelSpec
    workspace_root: Path

    def checkpoint_path(self) -> Path | None:
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

    def create(self):
        """The model in eval mode on the CPU, in FP32, with the catalog's weights."""
        from pipeline.models.torch_import import import_timm

        timm = import_timm()
        import torch

        torch.manual_seed(self.spec.seed)
        kwargs: dict[str, Any] = {}
        checkpoint = self.checkpoint_path()
        if checkpoint is not None:
            kwargs["checkpoint_path"] = str(checkpoint)
        try:
            model = timm.create_model(self.spec.timm, pretrained=False, **kwargs)
        except Exception as exc:  # timm raises RuntimeError/KeyError/… for unknown names and bad weights
            raise PipelineError(
                f"timm could not create {self.spec.timm!r}: {exc}",
                hint="check the model name with timm.list_models() and the checkpoint file",
            ) from exc
        return model.eval()

    def input_shape(self, model) -> tuple[int, int, int, int]:
        """(batch, channels, height, width): the catalog's batch and image size, else the model's own."""
        channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
        if self.spec.image_size:
            height = width = self.spec.image_size
        return (self.spec.batch_size, channels, height, width)

    def sample_input(self, shape):
        """The fixed random batch every stage feeds this model (seeded from the model's seed)."""
        import torch

        generator = torch.Generator().manual_seed(self.spec.seed + 1)
        return torch.randn(*shape, generator=generator)

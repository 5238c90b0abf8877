"""timm image classifiers: an architecture by name with seeded random weights, or a local
checkpoint. Weights are never downloaded (offline machines).

The export stage traces these models to ONNX; runtimes that run PyTorch itself (the ``torch``
toolchains) start from the same model, so both describe the same weights.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import PipelineError
from pipeline.models.base import ModelSource


class TimmModel(ModelSource):
    """A timm architecture fed one NCHW image batch."""

    family = "timm"

    def describe(self) -> str:
        return self.spec.timm

    def create(self):
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
        """Seeded from the model's seed, so every stage and every run feeds the same batch."""
        import torch

        generator = torch.Generator().manual_seed(self.spec.seed + 1)
        return torch.randn(*shape, generator=generator)

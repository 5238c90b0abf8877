"""timm image classifiers: an architecture by name with seeded random weights, or a local
checkpoint. Weights are never downloaded (offline machines).

The export stage traces these models to ONNX; runtimes that run PyTorch itself (the ``torch``
toolchains) start from the same model, so both describe the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pipeline.catalog import ModelSpec
from pipeline.models.base import MODEL_FLOAT, ModelInput, ModelSource, ShapePoint
from pipeline.running.errors import PipelineError


class TimmSpec(ModelSpec):
    """A timm model and how to feed it: one image batch of a fixed size."""

    timm: str = Field(description="timm model name, e.g. vit_base_patch16_224")
    batch_size: int = Field(gt=0, le=4096)
    # None: the model's own pretrained_cfg input size.
    image_size: int | None = Field(default=None, gt=0)
    # None: the architecture's own (1000 for ImageNet-1k). A checkpoint trained on other classes
    # needs its count, and an evaluation folder's class folders are its labels in sorted order.
    num_classes: int | None = Field(default=None, gt=0)

    @field_validator("shapes")
    @classmethod
    def _one_shape(cls, shapes: tuple[str, ...]) -> tuple[str, ...]:
        if shapes:
            raise ValueError("timm models have one shape: set batch_size (and image_size) instead of shapes")
        return shapes

    def family(self) -> str:
        return "timm"


class TimmModel(ModelSource):
    """A timm architecture fed one NCHW image batch."""

    family = "timm"
    Spec = TimmSpec

    def describe(self) -> str:
        return self.spec.timm

    def import_libraries(self) -> None:
        from pipeline.models.torch_import import import_timm

        import_timm()

    def create(self):
        from pipeline.models.torch_import import import_timm

        timm = import_timm()
        import torch

        torch.manual_seed(self.spec.seed)
        kwargs: dict[str, Any] = {}
        checkpoint = self.checkpoint_path()
        if checkpoint is not None:
            kwargs["checkpoint_path"] = str(checkpoint)
        if self.spec.num_classes is not None:
            kwargs["num_classes"] = self.spec.num_classes
        try:
            model = timm.create_model(self.spec.timm, pretrained=False, **kwargs)
        except Exception as exc:  # timm raises RuntimeError/KeyError/… for unknown names and bad weights
            raise PipelineError(
                f"timm could not create {self.spec.timm!r}: {exc}",
                hint="check the model name with timm.list_models() and the checkpoint file",
            ) from exc
        return model.eval()

    def facts(self) -> dict[str, Any]:
        facts = {"timm_model": self.spec.timm, "batch_size": self.spec.batch_size, "image_size": self.spec.image_size}
        if self.spec.num_classes is not None:  # only where set: the fingerprints of existing exports stay as they were
            facts["num_classes"] = self.spec.num_classes
        return facts

    def shapes_summary(self) -> str:
        size = f", {self.spec.image_size}px" if self.spec.image_size else ""
        return f"batch {self.spec.batch_size}{size}"

    def use_attention(self, model, implementation: str) -> None:
        # timm's attention blocks choose per module: `fused_attn` calls F.scaled_dot_product_attention,
        # otherwise they compute q·kᵀ, softmax and ·v themselves (timm/layers/attention.py).
        blocks = [module for module in model.modules() if hasattr(module, "fused_attn")]
        if not blocks:
            super().use_attention(model, implementation)
        for module in blocks:
            module.fused_attn = implementation == "sdpa"

    def inputs(self, model) -> list[ModelInput]:
        return [ModelInput("input", self.input_shape(model), MODEL_FLOAT, kind="image")]

    def input_shape(self, model) -> tuple[int, int, int, int]:
        """(batch, channels, height, width): the catalog's batch and image size, else the model's own."""
        channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
        if self.spec.image_size:
            height = width = self.spec.image_size
        return (self.spec.batch_size, channels, height, width)

    def sample_inputs(self, model, point: ShapePoint | None, seed: int) -> tuple:
        """A standard normal batch seeded from ``seed``, so every stage and every run feeds the same one."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(*self.input_shape(model), generator=generator),)

    def describe_calibration(self, directory: Path | None, samples: int, batch_size: int) -> dict[str, Any]:
        from pipeline.models.images import describe_source

        return describe_source(directory, samples, batch_size, seed=self.spec.seed + 2)

    def describe_evaluation(self, directory: Path) -> dict[str, Any]:
        from pipeline.models.images import describe_source

        batch = self.spec.batch_size
        # The export's reference batch draws its images with the model's seed + 1 (pipeline/stages/export.py).
        return describe_source(directory, batch, batch, "evaluation", "--eval-dir", seed=self.spec.seed + 1)

    def evaluation_batches(self, model, directory: Path, files: list[Path], batch_size: int) -> list[tuple]:
        from pipeline.models.images import load_images

        _, channels, height, width = self.input_shape(model)
        images = load_images(model, files, (channels, height, width), "evaluation")
        return [(images[start : start + batch_size],) for start in range(0, len(images), batch_size)]

    def calibration_batches(self, model, directory: Path | None, samples: int, batch_size: int) -> list[tuple]:
        """Images from ``directory`` through timm's transforms, else standard normal batches."""
        from pipeline.models.images import calibration_batches

        _, channels, height, width = self.input_shape(model)
        batches = calibration_batches(model, directory, samples, batch_size, (channels, height, width), self.spec.seed + 2)
        return [(batch,) for batch in batches]

"""How close a quantized variant stays to the FP32 model, and the floor it must keep.

A variant is measured against the FP32 model's outputs on the same samples: cosine, the worst
sample's cosine, the relative error, and where the output is class scores the agreement of the
predicted classes (top-1). Where the samples are the user's labelled images, also the top-1
accuracy against their labels, beside the FP32 model's own on the same images.

The floor (pipeline/catalog/floor.py's AccuracyFloor, the one a report's answer keeps too) is
absolute (``--floor cos=0.99``), or a largest drop against the FP32 model on the same
samples (``--max-drop top1=1%``), or both: what quantization judged on the user's data, as NNCF's
accuracy control does (a validation set, a metric, a maximum drop).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.catalog import Catalog, EngineRef
from pipeline.catalog.floor import AccuracyFloor, AccuracyThreshold, PerSampleThreshold, accuracy_floor
from pipeline.measuring import accuracy as formulas


@dataclass(frozen=True)
class Figures:
    """The variant's outputs against the FP32 model's over evaluation batches."""

    cosine: float
    min_sample_cosine: float
    relative_error: float  # ‖out − ref‖ / ‖ref‖ over every value
    top1: float | None  # agreement of the predicted classes, where the output is class scores
    # Against the images' labels, where the samples are labelled images: this variant's top-1
    # accuracy and the FP32 model's on the same images.
    top1_accuracy: float | None = None
    fp32_top1_accuracy: float | None = None
    # The user's metric hook (pipeline/precision/hooks.py), on this variant and on the FP32 model.
    metric: float | None = None
    fp32_metric: float | None = None
    # Each sample's own cosine (``sample_cosines``), for a floor each input must keep; the output
    # keeps how many fall below it (the bounds' count), not the values.
    sample_cosines: tuple[float, ...] | None = field(default=None, repr=False, compare=False)

    def value(self, metric: str) -> float | None:
        return {"cos": self.cosine, "top1": self.top1, "metric": self.metric}[metric]

    def below(self, metric: str, threshold: float) -> int | None:
        """How many samples fall below ``threshold`` each (a NaN is below); None where not measured."""
        if metric != "cos" or self.sample_cosines is None:
            return None
        return sum(not value >= threshold - 1e-12 for value in self.sample_cosines)  # within float rounding, as the floor

    def kept_share(self, metric: str, threshold: float) -> float | None:
        """The share of samples that keep ``threshold`` each; None where not measured."""
        below = self.below(metric, threshold)
        return None if below is None or not self.sample_cosines else 1.0 - below / len(self.sample_cosines)

    def drop(self, metric: str) -> float | None:
        """How far below the FP32 model on the same samples: for ``cos``, 1 − cosine; for
        ``top1``, the FP32 model's top-1 accuracy less this one's against the labels, else the
        share of samples whose predicted class changed (1 − agreement). None where not measured."""
        if metric == "cos":
            return None if self.cosine != self.cosine else 1.0 - self.cosine  # NaN: outputs not finite
        if metric == "metric":
            return None if self.metric is None or self.fp32_metric is None else self.fp32_metric - self.metric
        if self.top1_accuracy is not None and self.fp32_top1_accuracy is not None:
            return self.fp32_top1_accuracy - self.top1_accuracy
        return None if self.top1 is None else 1.0 - self.top1

    def as_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key != "sample_cosines"}

    def said(self) -> str:
        """ "cosine 0.9316, top-1 38%, top-1 accuracy 71.9% (FP32 75.0%)", as the terminal says it."""
        text = f"cosine {cosine_text(self.cosine)}" + (f", top-1 {self.top1:.0%}" if self.top1 is not None else "")
        if self.top1_accuracy is not None and self.fp32_top1_accuracy is not None:
            text += f", top-1 accuracy {self.top1_accuracy:.1%} (FP32 {self.fp32_top1_accuracy:.1%})"
        if self.metric is not None and self.fp32_metric is not None:
            text += f", metric {self.metric:.4g} (FP32 {self.fp32_metric:.4g})"
        return text


def cosine_text(value: float) -> str:
    """Four decimals, six where they would all read 1.0000 (ModernBERT's NVFP4 is 0.999893)."""
    return f"{value:.6f}" if value > 0.9999 else f"{value:.4f}"


def change_text(value: float) -> str:
    """A change of cosine: four decimals, or two significant digits where it is smaller than that."""
    return f"{value:+.4f}" if not abs(value) < 1e-4 or value == 0 else f"{value:+.1e}"


def floor_for(
    catalog: Catalog,
    ref: EngineRef,
    given: tuple[AccuracyThreshold, ...] = (),
    given_by: str = "--floor",
    drops: tuple[AccuracyThreshold, ...] = (),
    per_sample: tuple[PerSampleThreshold, ...] = (),
) -> AccuracyFloor:
    """The floor: the one given (thresholds, largest drops, a per-sample floor, or any of them
    together), else the model's (or the catalog's) accuracy_floor, else the precision's own check."""
    if given or drops or per_sample:
        source = " and ".join(option for option, used in ((given_by, given or per_sample), ("--max-drop", drops)) if used)
        return AccuracyFloor(given, source, drops, per_sample)
    configured = catalog.accuracy_floor_for(ref.model)
    if configured.thresholds:
        return configured
    variant = catalog.variant(ref.variant)
    return AccuracyFloor(
        (("cos", accuracy_floor(variant.precision, bool(variant.sparsity))),),
        f"the {variant.precision} check of pipeline/catalog/floor.py",
    )


def figures(references: list, outputs: list, labels: list[int] | None = None) -> Figures:
    """The outputs against the FP32 references, batch by batch; with the samples' labels (in the
    batches' order), the top-1 accuracy of both. The formulas are measuring's
    (pipeline/measuring/accuracy.py), in float64."""
    import numpy as np

    reference, output = _rows(references), _rows(outputs)
    classes = references[0].dim() == 2
    each = sample_cosines(*per_sample_sums(references, outputs))
    accuracy = fp32_accuracy = None
    if classes and labels is not None:
        accuracy = formulas.labels_accuracy(np.nan_to_num(output, nan=-np.inf), labels)
        fp32_accuracy = formulas.labels_accuracy(reference, labels)
    return Figures(
        cosine=cosine_of(reference.ravel(), output.ravel()),
        min_sample_cosine=float(np.min(each)),
        relative_error=relative_error_of(reference.ravel(), output.ravel()),
        # A NaN output counts as its sample's predicted class here, as in the bounds' own count
        # (pipeline/precision/bounds.py's sample_stats).
        top1=formulas.top1_agreement(reference, output) if classes else None,
        top1_accuracy=accuracy,
        fp32_top1_accuracy=fp32_accuracy,
        sample_cosines=tuple(float(value) for value in each),
    )


def per_sample_sums(references: list, outputs: list):
    """Σ ref·out, Σ ref² and Σ out² of each sample (numpy, float64), from the FP32 and the variant's
    outputs batch by batch: what the bounds keep (pipeline/precision/bounds.py's SampleStats) and
    the figures' per-sample cosines alike, in one computation, so that both count the same samples."""
    import torch

    ref = torch.cat([r.flatten(1) for r in references]).double()
    out = torch.cat([o.flatten(1) for o in outputs]).double()
    return (ref * out).sum(1).numpy(), (ref * ref).sum(1).numpy(), (out * out).sum(1).numpy()


# Each sample's cosine from its three sums: measuring's formula, for the bounds and the scripts too.
sample_cosines = formulas.cosines_of_sums


def _rows(batches: list):
    """Torch tensors, batch by batch, as one float64 numpy array of a row a sample."""
    import torch

    return torch.cat([batch.detach().flatten(1) for batch in batches]).double().cpu().numpy()


def _flat(values):
    """A torch tensor or a numpy array, as a flat float64 numpy array."""
    import numpy as np

    if not isinstance(values, np.ndarray):
        values = values.detach().double().cpu().numpy()
    return np.asarray(values, dtype=np.float64).ravel()


def cosine_of(a, b) -> float:
    """Cosine similarity; NaN where ``b`` is not finite (a NaN says so, where 0 would not)."""
    import numpy as np

    a, b = _flat(a), _flat(b)
    return formulas.cosine_of(a, b) if np.isfinite(b).all() else float("nan")


def relative_error_of(a, b) -> float:
    return formulas.relative_error_of(_flat(a), _flat(b))

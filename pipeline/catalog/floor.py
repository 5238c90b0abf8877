"""The accuracy an engine must keep: each precision's own cosine check, and the floor a report's
answer must meet (the catalog's `fail_accuracy_below`, `--fail-accuracy-below`). It lives with the
catalog, which sets it; measuring and reporting read it."""

from __future__ import annotations

from dataclasses import dataclass

# Cosine similarity to FP32 below which a precision is reported as drifting. Tighter for formats
# that keep 16 bits of mantissa-and-exponent, looser for block formats (as measured on ViT-B).
ACCURACY_FLOOR = {"fp32": 0.9999, "fp16": 0.999, "bf16": 0.995, "int8": 0.99, "fp8": 0.99, "mxfp8": 0.98, "nvfp4": 0.95}
SPARSE_ACCURACY_FLOOR = 0.9


def accuracy_floor(precision: str, sparse: bool) -> float:
    return min(ACCURACY_FLOOR.get(precision, 0.99), SPARSE_ACCURACY_FLOOR if sparse else 1.0)


# --- the floor a report's answer must meet ------------------------------------------------------

# (metric, threshold): "cos" (cosine similarity to the FP32 model's outputs) or "top1" (agreement
# of the predicted classes).
AccuracyThreshold = tuple[str, float]
THRESHOLD_FORMS = "a cosine similarity or a top-1 agreement between 0 and 1: 0.99, cos=0.99 or top1=0.95"


def parse_accuracy_threshold(text: str) -> AccuracyThreshold:
    """ "0.99" or "cos=0.99" (cosine), "top1=0.95" (top-1 agreement) → (metric, threshold).
    ValueError naming what is allowed otherwise."""
    metric, _, value = str(text).rpartition("=")
    metric = {"": "cos", "cos": "cos", "cosine": "cos", "top1": "top1", "top-1": "top1"}.get(metric.strip().lower())
    try:
        threshold = float(value)
    except ValueError:
        threshold = None
    if metric is None or threshold is None or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"not an accuracy threshold: give {THRESHOLD_FORMS}")
    return metric, threshold


@dataclass(frozen=True)
class AccuracyFloor:
    """The accuracy an engine must keep to be a report's answer, and who set it. No thresholds:
    each precision's own check (ACCURACY_FLOOR) decides."""

    thresholds: tuple[AccuracyThreshold, ...] = ()
    # Where it was set, as the user would look for it: "--fail-accuracy-below", "pipeline.toml".
    source: str = ""

    def __str__(self) -> str:
        if not self.thresholds:
            return "each precision's own check"
        wanted = ", ".join(f"cosine ≥ {t:g}" if metric == "cos" else f"top-1 ≥ {t:g}" for metric, t in self.thresholds)
        return f"{wanted} ({self.source})" if self.source else wanted

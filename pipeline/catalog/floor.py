"""The accuracy an engine must keep: each precision's own cosine check, and the floor a report's
answer must meet (the catalog's `fail_accuracy_below`, `--fail-accuracy-below`) or a quantized
variant's plan must keep (`--floor`, its per-sample form, and `--max-drop`). It lives with the
catalog, which sets it; measuring, reporting and the precision tools read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Cosine similarity to FP32 below which a precision is reported as drifting. Tighter for formats
# that keep 16 bits of mantissa-and-exponent, looser for block formats (as measured on ViT-B).
ACCURACY_FLOOR = {"fp32": 0.9999, "fp16": 0.999, "bf16": 0.995, "int8": 0.99, "fp8": 0.99, "mxfp8": 0.98, "nvfp4": 0.95}
SPARSE_ACCURACY_FLOOR = 0.9


def accuracy_floor(precision: str, sparse: bool) -> float:
    return min(ACCURACY_FLOOR.get(precision, 0.99), SPARSE_ACCURACY_FLOOR if sparse else 1.0)


# --- the floor an answer or a plan must meet ---------------------------------------------------

# (metric, threshold): "cos" (cosine similarity to the FP32 model's outputs) or "top1" (agreement
# of the predicted classes); a plan's floor also "metric" (the user's --metric hook's figure).
AccuracyThreshold = tuple[str, float]
# The names a user may give those metrics (--fail-accuracy-below, the catalog's accuracy_floor,
# --floor, --max-drop), by the name the pipeline keeps.
METRIC_ALIASES = {"cos": "cos", "cosine": "cos", "top1": "top1", "top-1": "top1"}
THRESHOLD_FORMS = "a cosine similarity or a top-1 agreement between 0 and 1: 0.99, cos=0.99 or top1=0.95"


def parse_accuracy_threshold(text: str) -> AccuracyThreshold:
    """ "0.99" or "cos=0.99" (cosine), "top1=0.95" (top-1 agreement) → (metric, threshold).
    ValueError naming what is allowed otherwise."""
    metric, _, value = str(text).rpartition("=")
    metric = {"": "cos", **METRIC_ALIASES}.get(metric.strip().lower())  # a bare number is a cosine
    try:
        threshold = float(value)
    except ValueError:
        threshold = None
    if metric is None or threshold is None or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"not an accuracy threshold: give {THRESHOLD_FORMS}")
    return metric, threshold


# "--max-drop" forms: a metric and how far below the FP32 model it may fall, as a fraction or a percentage.
DROP_FORMS = (
    "top1=1% (top-1 accuracy against the labels, else predictions changed), cos=0.005 (cosine below 1) "
    "or metric=0.005 (the --metric hook's figure)"
)


def parse_drop(text: str) -> AccuracyThreshold:
    """ "top1=1%", "top1=0.01", "cos=0.005" → (metric, drop as a fraction). ValueError otherwise."""
    metric, _, value = str(text).partition("=")
    metric = {**METRIC_ALIASES, "metric": "metric"}.get(metric.strip().lower())
    value = value.strip()
    try:
        drop = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        drop = None
    # The user's metric has its own scale (a loss-like score, a BLEU): any drop of zero or more.
    if metric is None or drop is None or not 0.0 <= drop <= (float("inf") if metric == "metric" else 1.0) or drop != drop:
        raise ValueError(f"not a largest drop: give {DROP_FORMS}")
    return metric, drop


# A floor each input must keep, on a share of the inputs: "sample-cos=0.99@99%" asks that at least
# 99 % of inputs keep a cosine of 0.99 to FP32's output each, (metric, per-input threshold, share).
# A floor on the mean lets a few inputs carry errors tens of times the rest's unseen; one on each
# input counts them, and a count has an exact bound (pipeline/precision/bounds.py).
PerSampleThreshold = tuple[str, float, float]
PER_SAMPLE_ALIASES = {"sample-cos": "cos", "sample-cosine": "cos"}
PER_SAMPLE_FORMS = "sample-cos=0.99@99% (at least 99% of inputs each keep a cosine of 0.99 to FP32's output)"


def parse_per_sample(text: str) -> PerSampleThreshold | None:
    """ "sample-cos=0.99@99%" or "sample-cos=0.99@0.99" → ("cos", 0.99, 0.99); None where ``text``
    names no per-sample metric (another form of threshold); ValueError where it does but is not
    of this form."""
    name, _, rest = str(text).partition("=")
    metric = PER_SAMPLE_ALIASES.get(name.strip().lower())
    if metric is None:
        return None
    value, at, share_text = rest.partition("@")
    share_text = share_text.strip()
    try:
        threshold = float(value)
        share = float(share_text[:-1]) / 100 if share_text.endswith("%") else float(share_text)
    except ValueError:
        threshold = share = None
    # Every input (a share of 1) is a limit no count of samples can show: allowed, and said so.
    if not at or threshold is None or share is None or not 0.0 <= threshold <= 1.0 or not 0.0 < share <= 1.0:
        raise ValueError(f"not a per-sample floor: give {PER_SAMPLE_FORMS}")
    return metric, threshold, share


def _drop_text(metric: str, drop: float) -> str:
    if metric == "cos":
        return f"cosine at most {drop:g} below 1"
    if metric == "metric":
        return f"the metric at most {drop:g} below FP32's"
    return f"top-1 at most {100 * drop:.4g}% below FP32's"


@dataclass(frozen=True)
class AccuracyFloor:
    """The accuracy an engine must keep, and who set it: thresholds (a report's answer, the
    catalog's `accuracy_floor`) and, for a quantized variant's plan, largest drops against the FP32
    model on the same samples (``--max-drop``). Neither: each precision's own check (ACCURACY_FLOOR)
    decides."""

    thresholds: tuple[AccuracyThreshold, ...] = ()
    # Where it was set, as the user would look for it: "--fail-accuracy-below", "pipeline.toml".
    source: str = ""
    # (metric, how far below the FP32 model it may fall, as a fraction); "metric" is the user's hook.
    drops: tuple[AccuracyThreshold, ...] = ()
    # (metric, the figure each input must keep, the share of inputs that must keep it): a plan's only.
    per_sample: tuple[PerSampleThreshold, ...] = ()

    def met_by(self, figures) -> bool:
        """Whether ``figures`` (pipeline/precision/figures.py's: a ``value`` and a ``drop`` by metric)
        keep the floor at their point estimates (how sure that is: pipeline/precision/bounds.py)."""
        # Within float rounding: FP32 against itself is a cosine of 1 give or take 1e-16.
        kept = all((value := figures.value(metric)) is not None and value >= threshold - 1e-12 for metric, threshold in self.thresholds)
        kept = kept and all((fell := figures.drop(metric)) is not None and fell <= drop + 1e-12 for metric, drop in self.drops)
        return kept and all(
            (share_kept := figures.kept_share(metric, threshold)) is not None and share_kept >= share - 1e-12
            for metric, threshold, share in self.per_sample
        )

    def wanted(self) -> str:
        """What it asks, without who set it: "cosine ≥ 0.99, top-1 at most 1% below FP32's"."""
        parts = [f"cosine ≥ {t:g}" if metric == "cos" else f"top-1 ≥ {t:g}" for metric, t in self.thresholds if metric != "metric"]
        parts += [f"metric ≥ {value:g}" for metric, value in self.thresholds if metric == "metric"]
        parts += [per_sample_text(threshold, share) for _, threshold, share in self.per_sample]
        return ", ".join(parts + [_drop_text(metric, drop) for metric, drop in self.drops])

    def __str__(self) -> str:
        if not self.thresholds and not self.drops and not self.per_sample:
            return "each precision's own check"
        wanted = self.wanted()
        return f"{wanted} ({self.source})" if self.source else wanted

    def as_dict(self) -> dict[str, Any]:
        return {
            "thresholds": [{"metric": m, "value": t} for m, t in self.thresholds],
            "max_drop": [{"metric": m, "value": d} for m, d in self.drops],
            "per_sample": [{"metric": m, "value": v, "share": s} for m, v, s in self.per_sample],
            "source": self.source,
        }


def per_sample_text(threshold: float, share: float) -> str:
    """ "per-sample cosine ≥ 0.99 on at least 99% of inputs"."""
    return f"per-sample cosine ≥ {threshold:g} on at least {100 * share:.4g}% of inputs"

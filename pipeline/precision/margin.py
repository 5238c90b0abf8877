"""How sure a figure measured on the search's samples is: a margin from the search's own spread.

A plan that stops exactly at its floor on the search samples is a coin toss on the confirmation
(one stopped 4·10⁻⁶ above its cosine floor and missed it there by as much). So the search asks
that the floor hold with a margin: each floor metric at the 5th percentile (each drop at the
95th) of a bootstrap over the search's samples — resampled with replacement, BOOTSTRAP_RESAMPLES
times, seeded — not at its point estimate. Resampling needs no forward pass: a variant's figures
are kept per sample (cosine as per-sample dot products and norms, whose sums give the cosine over
every value exactly; top-1 as per-sample hits; the metric hook per batch, resampled by batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BOOTSTRAP_RESAMPLES = 400
BOOTSTRAP_SEED = 4
# The one-sided confidence the floor holds with: the figures' 5th percentile (a drop's 95th).
CONFIDENCE = 0.95


@dataclass(frozen=True)
class SampleStats:
    """A variant's figures sample by sample (numpy arrays, one entry a sample; the metric's one a batch)."""

    dot: Any  # Σ ref·out of each sample
    ref_sq: Any  # Σ ref² of each sample
    out_sq: Any  # Σ out² of each sample
    agree: Any | None  # the predicted class is FP32's, where the output is class scores
    correct: Any | None  # against the labels, where there are labels; and FP32's
    fp32_correct: Any | None
    metric: Any | None = None  # the metric hook, per batch, and FP32's; the batches' sizes
    fp32_metric: Any | None = None
    batch_sizes: Any | None = None


def sample_stats(references: list, outputs: list, labels=None) -> SampleStats:
    """From the FP32 and the variant's outputs, batch by batch (a batch's first axis its samples)."""
    import torch

    classes = references[0].dim() == 2  # class scores
    reference, output = torch.cat([r.flatten(1) for r in references]), torch.cat([o.flatten(1) for o in outputs])
    ref, out = reference.double(), output.double()
    agree = (reference.argmax(dim=1) == output.argmax(dim=1)).numpy() if classes else None
    correct = fp32_correct = None
    if classes and labels is not None:
        truth = torch.tensor(labels)
        correct = (torch.nan_to_num(output, nan=-torch.inf).argmax(dim=1) == truth).numpy()
        fp32_correct = (reference.argmax(dim=1) == truth).numpy()
    return SampleStats(
        dot=(ref * out).sum(1).numpy(), ref_sq=(ref * ref).sum(1).numpy(), out_sq=(out * out).sum(1).numpy(),
        agree=agree, correct=correct, fp32_correct=fp32_correct,
    )  # fmt: skip


@dataclass(frozen=True)
class Margins:
    """How far each floor metric's figure may be off on the search samples: ``below[m]`` for a
    threshold (the figure less its 5th percentile), ``above[m]`` for a drop (its 95th percentile
    less the drop). 0 where a metric has no spread (one batch of the metric's, say)."""

    below: dict[str, float]
    above: dict[str, float]
    resamples: int
    samples: int

    def said(self, metrics: list[str]) -> str:
        """ "cosine ±0.00041, top-1 accuracy drop +3.1%" for the floor's metrics."""
        words = {"cos": "cosine", "top1": "top-1", "metric": "metric"}
        parts = []
        for metric in metrics:
            if metric in self.below:
                value = self.below[metric]
                parts.append(f"{words[metric]} −{value:.2g}" if metric != "top1" else f"top-1 −{value:.1%}")
            if metric in self.above:
                value = self.above[metric]
                parts.append(f"{words[metric]} drop +{value:.2g}" if metric != "top1" else f"top-1 drop +{value:.1%}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": "bootstrap over the search samples",
            "resamples": self.resamples,
            "samples": self.samples,
            "confidence": CONFIDENCE,
            "below": self.below,
            "above": self.above,
        }


def margins(stats: SampleStats, thresholds: list[str], drops: list[str]) -> Margins:
    """The floor's metrics' margins from a bootstrap of ``stats`` (seeded: the same search samples
    give the same margins)."""
    import numpy as np

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    n = len(stats.dot)
    picks = rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    low_q, high_q = 100 * (1 - CONFIDENCE), 100 * CONFIDENCE

    def resampled(metric: str, drop: bool):
        """Each resample's figure (or drop), and the figure on every sample."""
        if metric == "cos":

            def cosine(idx):
                return stats.dot[idx].sum(-1) / np.sqrt(stats.ref_sq[idx].sum(-1) * stats.out_sq[idx].sum(-1))

            values, point = cosine(picks), cosine(np.arange(n))
            return (1 - values, 1 - point) if drop else (values, point)
        if metric == "top1":
            if drop and stats.correct is not None:
                values = stats.fp32_correct[picks].mean(-1) - stats.correct[picks].mean(-1)
                return values, stats.fp32_correct.mean() - stats.correct.mean()
            values, point = stats.agree[picks].mean(-1), stats.agree.mean()
            return (1 - values, 1 - point) if drop else (values, point)
        sizes = stats.batch_sizes
        batches = rng.integers(0, len(sizes), size=(BOOTSTRAP_RESAMPLES, len(sizes)))

        def weighted(values, idx):
            return (values[idx] * sizes[idx]).sum(-1) / sizes[idx].sum(-1)

        every = np.arange(len(sizes))
        if drop:
            return weighted(stats.fp32_metric, batches) - weighted(stats.metric, batches), weighted(stats.fp32_metric, every) - weighted(
                stats.metric, every
            )
        return weighted(stats.metric, batches), weighted(stats.metric, every)

    def usable(metric: str) -> bool:
        return (metric != "top1" or stats.agree is not None) and (metric != "metric" or stats.metric is not None)

    below = {}
    for metric in dict.fromkeys(thresholds):
        if usable(metric):
            values, point = resampled(metric, drop=False)
            below[metric] = max(0.0, float(point - np.percentile(values, low_q)))
    above = {}
    for metric in dict.fromkeys(drops):
        if usable(metric):
            values, point = resampled(metric, drop=True)
            above[metric] = max(0.0, float(np.percentile(values, high_q) - point))
    return Margins(below, above, BOOTSTRAP_RESAMPLES, n)

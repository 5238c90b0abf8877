"""How sure a figure measured on n samples is: a one-sided 95 % bound on each floor metric, for the
search and, alike, for the confirmation.

- **Proportions** — top-1 agreement with FP32, the share of predictions changed, the share of samples
  the FP32 model gets right and the variant gets wrong ("lost"): exact binomial bounds
  (Clopper–Pearson, one-sided). A bootstrap of a proportion has no spread at 0 or n: 0 changed
  predictions of 32 would get a margin of 0, where the true share could be 8.9 % (the exact bound).
- **Cosine and the user's metric**: the percentile bootstrap over the samples (over batches for
  the metric, which is given per batch), ``BOOTSTRAP_RESAMPLES`` resamples, seeded. Resampling needs
  no forward pass: a variant's figures are kept per sample (cosine as per-sample dot products and
  norms, whose sums give the cosine over every value exactly).

A top-1 drop against labels is the lost share less the gained share (samples the variant fixes),
so the exact upper bound of the lost share bounds the drop; it is conservative where the variant
also fixes some.

**Resolution.** n samples can show a proportion's floor only if their best outcome — no sample
changed or lost — bounds it: a largest drop d needs 1 − 0.05^(1/n) ≤ d, that is
n ≥ ln 0.05 / ln(1 − d) (299 samples for 1 %, 59 for 5 %); an agreement threshold t needs
0.05^(1/n) ≥ t. Below that no outcome shows the floor at 95 %, and the floor asks instead for
what the samples can say: no sample changed (or lost). The plan says so, and which ``--samples``
would resolve it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.precision.hooks import weighted_mean

CONFIDENCE = 0.95  # one-sided: a threshold's figure at its lower bound, a drop at its upper
BOOTSTRAP_RESAMPLES = 400
BOOTSTRAP_SEED = 4
EXACT = "exact binomial (Clopper-Pearson)"
BOOTSTRAP = f"bootstrap, {BOOTSTRAP_RESAMPLES} resamples"


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
        dot=(ref * out).sum(1).numpy(),
        ref_sq=(ref * ref).sum(1).numpy(),
        out_sq=(out * out).sum(1).numpy(),
        agree=agree,
        correct=correct,
        fp32_correct=fp32_correct,
    )


@dataclass(frozen=True)
class Bound:
    """One floor metric on one set of samples: its figure, its one-sided bound, and whether the
    floor holds by it."""

    metric: str  # "cos", "top1", "metric"
    side: str  # "lower": a threshold the figure must reach; "upper": a drop it may not pass
    limit: float  # the floor's threshold or largest drop
    estimate: float  # the figure (a drop for "upper") on these samples
    bound: float  # its one-sided CONFIDENCE bound
    method: str
    samples: int
    # Proportions: the samples counted against the floor, and what they are ("changed": the
    # predicted class is not FP32's; "lost": FP32's is right against the label, the variant's is
    # not); whether ``samples`` can show the limit at all (module docstring).
    counted: int | None = None
    counting: str | None = None
    resolvable: bool = True
    samples_needed: int | None = None  # the fewest that can; None: no count can, or not a proportion

    @property
    def held(self) -> bool:
        """By the bound; where the samples cannot resolve the limit, by no sample counted against it."""
        if not self.resolvable:
            return self.counted == 0
        if self.side == "lower":
            return self.bound >= self.limit - 1e-12  # within float rounding: FP32 against itself
        return self.bound <= self.limit + 1e-12

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "held": self.held}

    def said(self) -> str:
        """ "top-1 drop ≤ 8.9% (0 of 32 lost, exact)", "cosine ≥ 0.99912 (bootstrap)"."""
        name = {"cos": "cosine", "top1": "top-1", "metric": "metric"}[self.metric]
        what = f"{name} drop ≤" if self.side == "upper" else f"{name} ≥"
        value = f"{self.bound:.1%}" if self.metric == "top1" else f"{self.bound:.5g}"
        counted = f"{self.counted} of {self.samples} {self.counting}, " if self.counted is not None else ""
        return f"{what} {value} ({counted}{'exact' if self.method == EXACT else 'bootstrap'})"

    def unresolved_said(self) -> str:
        """Why the samples cannot show this limit, what is asked instead, and what would resolve it."""
        name = "a top-1 drop" if self.side == "upper" else "top-1 agreement"
        limit = f"of at most {self.limit:.2%}" if self.side == "upper" else f"of at least {self.limit:.2%}"
        best = exact_upper(0, self.samples) if self.side == "upper" else 1 - exact_upper(0, self.samples)
        resolve = (
            f"--samples {self.samples_needed} would resolve it"
            if self.samples_needed is not None
            else "no number of samples resolves a limit of exactly no change"
        )
        return (
            f"{self.samples} samples cannot show {name} {limit} at {CONFIDENCE:.0%} confidence: even none changed bounds it at "
            f"{best:.1%}; the floor asks instead that none be {self.counting}; {resolve}"
        )


def exact_upper(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided exact (Clopper–Pearson) upper bound of a proportion seen k times in n: the p
    at which k or fewer happen with probability 1 − confidence."""
    if k >= n:
        return 1.0
    alpha = 1.0 - confidence
    if k == 0:
        return 1.0 - alpha ** (1.0 / n)
    low, high = k / n, 1.0
    for _ in range(100):  # the tail falls as p grows: bisect to double precision
        middle = (low + high) / 2
        if binomial_cdf(k, n, middle) > alpha:
            low = middle
        else:
            high = middle
    return high


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p), summed in logs over the shorter tail."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)

    def term(i: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)

    if k < n / 2:
        return min(1.0, math.fsum(term(i) for i in range(k + 1)))
    return max(0.0, 1.0 - math.fsum(term(i) for i in range(k + 1, n + 1)))


def samples_to_resolve(side: str, limit: float, confidence: float = CONFIDENCE) -> int | None:
    """The fewest samples whose best outcome (none changed) shows ``limit``: None where none do."""
    alpha = 1.0 - confidence
    share = limit if side == "upper" else 1.0 - limit  # the changed share the limit allows
    if share >= 1.0:
        return 1
    if share <= 0.0:
        return None
    return math.ceil(math.log(alpha) / math.log1p(-share) - 1e-9)


def bounds(stats: SampleStats, floor) -> list[Bound]:
    """Each of ``floor``'s metrics on these samples, with its bound (module docstring). A metric
    these samples do not measure (top-1 of an output that is not class scores) is left out: the
    floor's check of the figures themselves fails it."""
    import numpy as np

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    n = len(stats.dot)
    picks = rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    result = []
    for metric, limit in floor.thresholds:
        if (found := _bound(stats, metric, "lower", limit, picks, rng)) is not None:
            result.append(found)
    for metric, limit in floor.drops:
        if (found := _bound(stats, metric, "upper", limit, picks, rng)) is not None:
            result.append(found)
    return result


def _bound(stats: SampleStats, metric: str, side: str, limit: float, picks, rng) -> Bound | None:
    import numpy as np

    n = len(stats.dot)
    if metric == "top1":
        if stats.agree is None:
            return None
        if side == "upper" and stats.correct is not None:
            counted = int(np.sum(stats.fp32_correct & ~stats.correct))
            estimate = float(stats.fp32_correct.mean() - stats.correct.mean())
            kind = "lost"
        else:
            counted = int(np.sum(~stats.agree))
            estimate = counted / n if side == "upper" else 1.0 - counted / n
            kind = "changed"
        needed = samples_to_resolve(side, limit)
        upper = exact_upper(counted, n)
        bound = upper if side == "upper" else 1.0 - upper
        return Bound(metric, side, limit, estimate, bound, EXACT, n, counted, kind, needed is not None and n >= needed, needed)
    if metric == "cos":

        def cosine(idx):
            return stats.dot[idx].sum(-1) / np.sqrt(stats.ref_sq[idx].sum(-1) * stats.out_sq[idx].sum(-1))

        values, point = cosine(picks), float(cosine(np.arange(n)))
        if side == "upper":
            return Bound(
                metric, side, limit, 1.0 - point, max(1.0 - point, float(np.percentile(1.0 - values, 100 * CONFIDENCE))), BOOTSTRAP, n
            )
        return Bound(metric, side, limit, point, min(point, float(np.percentile(values, 100 * (1 - CONFIDENCE)))), BOOTSTRAP, n)
    if stats.metric is None:
        return None
    sizes = stats.batch_sizes
    batches = rng.integers(0, len(sizes), size=(BOOTSTRAP_RESAMPLES, len(sizes)))

    def weighted(values, idx):
        return weighted_mean(values[idx], sizes[idx])

    every = np.arange(len(sizes))
    if side == "upper":
        drops = weighted(stats.fp32_metric, batches) - weighted(stats.metric, batches)
        point = float(weighted(stats.fp32_metric, every) - weighted(stats.metric, every))
        return Bound(metric, side, limit, point, max(point, float(np.percentile(drops, 100 * CONFIDENCE))), BOOTSTRAP, n)
    point = float(weighted(stats.metric, every))
    return Bound(
        metric, side, limit, point, min(point, float(np.percentile(weighted(stats.metric, batches), 100 * (1 - CONFIDENCE)))), BOOTSTRAP, n
    )

"""How sure a figure measured on n samples is: a one-sided 95 % bound on each floor metric, for the
search and, alike, for the confirmation; its status against the floor's limit; and about how many
samples would show the limit with an 80 % chance at the rates seen here. docs/bounds.md has the
methods, what they guarantee and the coverage CI measures (scripts/coverage_of_bounds.py).

- **Top-1 changed** (no labels) and **agreement**: the exact binomial bound (Clopper–Pearson) on the
  samples whose predicted class is not FP32's. A bootstrap of a proportion has no spread at 0 or n.
- **Top-1 against labels**: the net drop, (lost − gained)/n, paired. Given d discordant samples
  (lost or gained), lost ~ Binomial(d, p) exactly (conditional on d, whatever d is), and the net
  drop is π_lost·(2 − 1/p) with π_lost the lost share: its bound is π_lost's exact bound (upper, or
  lower where 2 − 1/p_upper < 0) times 2 − 1/p_upper, at 96 % and 99 % (``one_sided.PAIRED_CONFIDENCE``,
  Bonferroni: both hold together at 95 %). Bounding π_lost rather than π_d counts d's own
  uncertainty without paying for the gained samples twice.
- **Cosine** (the global cosine over every value): with a sample's error energy q = ‖out − ref‖², the
  population's 1 − cos² = min_β E‖out − β·ref‖²/E‖out‖² ≤ E[q]/E‖out‖²,
  so cos ≥ √(1 − U(q)/L(‖out‖²)) with an upper bound of the mean residual energy (heavy-tailed:
  pipeline/precision/one_sided.py) and a lower one of the mean output energy (``COSINE_CONFIDENCE``).
  Where one sample carries most of the error energy (over ``MOST_OF_THE_ERROR``: ``ONE_SAMPLE``),
  the mean is set by a value seen once, and how often such values come no count of one can say
  (Bahadur and Savage 1956): the cosine gets no bound, and its status is unresolved, with the
  samples that would show it.
- **A floor each input must keep** (a per-sample cosine on a share of the inputs): the samples
  below it counted, the kept share bounded by the exact binomial bound (Clopper–Pearson) of the
  share below — exact whatever the size of the errors, where a bound of a mean is not: a few
  inputs carrying most of the error are a share, counted as one, never a mean they hide in.
- **The user's metric**, per batch weighted by its samples: the same bound of a mean over the
  batches' drops (FP32's figure less the variant's); a threshold is FP32's lower bound less the
  drop's upper one. A metric over one batch has no bound (``NO_BOUND``): nothing says how it varies.

**Status.** ``held``: the bound is on the right side of the limit; ``failed``: the figure itself is
past it; ``unresolved``: the figure is within it but its bound is not, or there is no bound.

**Samples for power.** The fewest samples at which the bound, with the figures at the rates seen
here coming out at their 80 % quantile against it, shows the limit (``one_sided.smallest_n``); never
fewer than the best-outcome floor ``samples_to_resolve`` (a top-1 limit d needs
n ≥ ln 0.05 / ln(1 − d) even with nothing changed: 299 samples for 1 %, 59 for 5 %). None where no
number can: the figure is past the limit, or the limit allows no change at all. The old reading of
an unresolvable top-1 limit — held where no sample is counted against it — is ``held``'s still.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from statistics import NormalDist
from typing import Any

from pipeline.precision.figures import per_sample_sums, sample_cosines
from pipeline.precision.floor_bound import (
    ALPHA,
    CONFIDENCE,
    EXACT,
    HEAVY_TAILED,
    NO_BOUND,
    ONE_SAMPLE,
    PAIRED,
    POWER,
    Bound,
    samples_to_resolve,
)
from pipeline.precision.hooks import weighted_mean
from pipeline.precision.one_sided import (
    RESAMPLE_SEED,
    RESAMPLES,
    approximate_upper,
    mean_lower,
    mean_upper,
    net_drop_upper,
    resampled_power,
    smallest_n,
)
from pipeline.precision.one_sided import binomial_cdf as binomial_cdf
from pipeline.precision.one_sided import exact_upper as exact_upper

COSINE_CONFIDENCE = (0.96, 0.99)  # the mean error energy's upper bound, the output energy's lower: Bonferroni
# The share of the error energy one sample may carry for the samples to bound its mean. Measured
# (scripts/coverage_of_bounds.py, docs/bounds.md): at 0.7 every cell of the coverage table holds,
# the 32-sample outlier draws among them; at 0.5 the cosine of a toy INT8 model whose fault was
# excluded (tests/precision/test_precision.py) already lost its bound at 32 samples, at 0.7 it keeps it.
MOST_OF_THE_ERROR = 0.7


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
    agree = (reference.argmax(dim=1) == output.argmax(dim=1)).numpy() if classes else None
    correct = fp32_correct = None
    if classes and labels is not None:
        truth = torch.tensor(labels)
        correct = (torch.nan_to_num(output, nan=-torch.inf).argmax(dim=1) == truth).numpy()
        fp32_correct = (reference.argmax(dim=1) == truth).numpy()
    dot, ref_sq, out_sq = per_sample_sums(references, outputs)
    return SampleStats(
        dot=dot,
        ref_sq=ref_sq,
        out_sq=out_sq,
        agree=agree,
        correct=correct,
        fp32_correct=fp32_correct,
    )


def bounds(stats: SampleStats, floor) -> list[Bound]:
    """Each of ``floor``'s metrics on these samples, with its bound (module docstring). A metric
    these samples do not measure (top-1 of an output that is not class scores) is left out: the
    floor's check of the figures themselves fails it."""
    result = []
    for side, pairs in (("lower", floor.thresholds), ("upper", floor.drops)):
        for metric, limit in pairs:
            found = (
                _top1(stats, side, limit)
                if metric == "top1"
                else _cosine(stats, side, limit)
                if metric == "cos"
                else _metric(stats, side, limit)
            )
            if found is not None:
                result.append(found)
    result += [_per_sample(stats, metric, threshold, share) for metric, threshold, share in floor.per_sample]
    return result


def _top1(stats: SampleStats, side: str, limit: float) -> Bound | None:
    import numpy as np

    if stats.agree is None:
        return None
    n, needed = len(stats.agree), samples_to_resolve(side, limit)
    resolvable = needed is not None and n >= needed
    if side == "upper" and stats.correct is not None:
        lost, gained = int(np.sum(stats.fp32_correct & ~stats.correct)), int(np.sum(~stats.fp32_correct & stats.correct))
        estimate = (lost - gained) / n

        def shows(size: int) -> bool:  # in POWER of RESAMPLES draws of size samples at the rates seen here
            rng = np.random.default_rng((RESAMPLE_SEED, size))
            draws = rng.multinomial(size, [lost / n, gained / n, 1 - (lost + gained) / n], RESAMPLES)
            shown = sum(net_drop_upper(int(worse), int(better), size, approximate=True) <= limit for worse, better, _ in draws)
            return shown >= POWER * RESAMPLES

        search = partial(smallest_n, shows, needed) if needed is not None and estimate < limit else None
        bound = net_drop_upper(lost, gained, n)
        return Bound("top1", side, limit, estimate, bound, PAIRED, n, lost, "lost", resolvable, needed, gained, search)
    changed = int(np.sum(~stats.agree))
    rate, allowed = changed / n, limit if side == "upper" else 1.0 - limit  # the changed share the limit allows
    search = _proportion_search(rate, allowed, needed)
    upper = exact_upper(changed, n)
    estimate, bound = (rate, upper) if side == "upper" else (1.0 - rate, 1.0 - upper)
    return Bound("top1", side, limit, estimate, bound, EXACT, n, changed, "changed", resolvable, needed, power_search=search)


def _proportion_search(rate: float, allowed: float, needed: int | None):
    """The samples for power of a share counted against the floor (``rate`` seen, ``allowed`` by
    the limit): the fewest whose count at its 80 % quantile has its exact bound within the limit;
    None where no number can (module docstring)."""
    quantile = NormalDist().inv_cdf(POWER)

    def shows(size: int) -> bool:
        count = round(size * rate + quantile * math.sqrt(size * rate * (1 - rate)))
        return approximate_upper(min(count, size), size) <= allowed

    return partial(smallest_n, shows, needed) if needed is not None and rate < allowed else None


def _per_sample(stats: SampleStats, metric: str, threshold: float, share: float) -> Bound:
    """A floor each input must keep, on ``share`` of the inputs: the samples below ``threshold``
    counted, and the share that keeps it bounded below by the exact binomial bound of the share
    that does not — whatever size their errors are, so that a few inputs carrying most of the error
    count as what they are, a share of the inputs (module docstring)."""
    import numpy as np

    cosines = sample_cosines(stats.dot, stats.ref_sq, stats.out_sq)
    n, below = len(cosines), int(np.sum(~(cosines >= threshold - 1e-12)))  # a NaN is below
    needed = samples_to_resolve("lower", share)
    search = _proportion_search(below / n, 1.0 - share, needed)
    bound = 1.0 - exact_upper(below, n)
    resolvable = needed is not None and n >= needed
    return Bound(
        "sample_cos",
        "lower",
        share,
        1.0 - below / n,
        bound,
        EXACT,
        n,
        below,
        "below",
        resolvable,
        needed,
        power_search=search,
        threshold=threshold,
    )


def cosine_lower(dot, ref_sq, out_sq) -> float:
    """The lower bound of the global cosine of these samples (module docstring)."""
    point = float(dot.sum() / math.sqrt(ref_sq.sum() * out_sq.sum()))
    residual = error_energy(dot, ref_sq, out_sq)
    if one_sample_sets(residual):  # no bound: it cannot show any limit
        return -1.0
    residual_confidence, energy_confidence = COSINE_CONFIDENCE
    residual_upper, energy_lower = mean_upper(residual, residual_confidence), mean_lower(out_sq, energy_confidence)
    if point <= 0 or energy_lower <= 0 or residual_upper >= energy_lower:
        return -1.0
    return min(point, math.sqrt(1.0 - residual_upper / energy_lower))


def error_energy(dot, ref_sq, out_sq):
    """Each sample's error energy ‖out − ref‖² (β = 1: exact, fitted from nothing); zero within
    rounding where the variant leaves the sample as FP32 does."""
    residual = (out_sq - 2 * dot + ref_sq).clip(min=0.0)
    residual[residual <= 1e-12 * (out_sq + ref_sq)] = 0.0
    return residual


def one_sample_sets(residual) -> bool:
    """Whether one sample carries more than ``MOST_OF_THE_ERROR`` of the error energy (module docstring)."""
    total = float(residual.sum())
    return total > 0 and float(residual.max()) > MOST_OF_THE_ERROR * total


def _cosine(stats: SampleStats, side: str, limit: float) -> Bound:
    import numpy as np

    dot, ref_sq, out_sq = (np.asarray(values, dtype=float) for values in (stats.dot, stats.ref_sq, stats.out_sq))
    n = len(dot)
    point = float(dot.sum() / math.sqrt(ref_sq.sum() * out_sq.sum()))
    estimate = 1.0 - point if side == "upper" else point
    if n < 2:
        return Bound("cos", side, limit, estimate, None, NO_BOUND, n)
    cosine = cosine_lower(dot, ref_sq, out_sq)
    target = limit if side == "lower" else 1.0 - limit  # the cosine the limit asks for

    def shows(picks) -> bool:
        return cosine_lower(dot[picks], ref_sq[picks], out_sq[picks]) >= target

    search = partial(resampled_power, n, shows, 2, POWER) if target < 1.0 and point > target else None
    if one_sample_sets(error_energy(dot, ref_sq, out_sq)):
        return Bound("cos", side, limit, estimate, None, ONE_SAMPLE, n, power_search=search)
    bound = 1.0 - cosine if side == "upper" else cosine
    return Bound("cos", side, limit, estimate, bound, HEAVY_TAILED, n, power_search=search)


def metric_bound(fp32, mine, sizes, side: str) -> float:
    """The bound of the metric's drop (upper) or of the variant's metric (lower), over batches of
    ``sizes`` samples (module docstring)."""
    # The weighted mean over batches is the plain mean of each batch's figure times its share of
    # a mean batch: the bound of a mean then bounds the metric.
    weights = sizes / sizes.mean()
    drops = (fp32 - mine) * weights
    if side == "upper":
        return max(float(drops.mean()), mean_upper(drops, CONFIDENCE))
    half = 1.0 - ALPHA / 2  # FP32's figure and the drop: Bonferroni
    return min(float((mine * weights).mean()), mean_lower(fp32 * weights, half) - mean_upper(drops, half))


def _metric(stats: SampleStats, side: str, limit: float) -> Bound | None:
    import numpy as np

    if stats.metric is None:
        return None
    sizes = np.asarray(stats.batch_sizes, dtype=float)
    mine, fp32 = np.asarray(stats.metric, dtype=float), np.asarray(stats.fp32_metric, dtype=float)
    drop, figure = float(weighted_mean(fp32, sizes) - weighted_mean(mine, sizes)), float(weighted_mean(mine, sizes))
    estimate, samples = drop if side == "upper" else figure, int(sizes.sum())
    if len(sizes) < 2:
        return Bound("metric", side, limit, estimate, None, NO_BOUND, samples)
    bound = metric_bound(fp32, mine, sizes, side)

    def shows(picks) -> bool:
        found = metric_bound(fp32[picks], mine[picks], sizes[picks], side)
        return found <= limit if side == "upper" else found >= limit

    def search() -> int | None:
        batches = resampled_power(len(sizes), shows, 2, POWER)
        return None if batches is None else math.ceil(batches * sizes.mean())

    within = estimate < limit if side == "upper" else estimate > limit
    return Bound("metric", side, limit, estimate, bound, HEAVY_TAILED, samples, power_search=search if within and drop != 0 else None)

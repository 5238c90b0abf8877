"""One-sided confidence bounds, the statistics under pipeline/precision/bounds.py.

- **Proportions**: the exact binomial bound (Clopper–Pearson), and a closed-form approximation of it
  for sample-size searches, where the exact one would be summed thousands of times; the paired
  bound of a net top-1 drop (lost less gained) built on them (``net_drop_upper``).
- **The mean of a heavy-tailed figure** (a sample's error energy, a batch's metric drop): the larger
  of two bounds, each valid where the other is not.
  * Hall's skewness-corrected t (Hall 1992, "On the removal of skewness by transformation", JRSS B
    54:221-228): the studentized mean through ``g(T) = T + aT² + a²T³/3 + a/2``, ``a = γ/(3√n)``,
    whose inverse is closed, with Student's t quantile. It covers light tails and errors a share of
    the samples carry (outliers seen in the sample), where a log-normal fit does not.
  * The generalized confidence bound of a log-normal mean (Krishnamoorthy & Mathew 2003, "Inferences
    on the means of lognormal distributions using generalized p-values and generalized confidence
    intervals", J. Stat. Plan. Inference 115:103-121): the quantile of
    ``ȳ − Z·S/√(n·V) + S²/(2V)``, ``Z ~ N(0,1)``, ``V ~ χ²(n−1)/(n−1)``, drawn once per n and seeded.
    Its coverage is exact for log-normal data, whose mean most samples never see (at σ = 3 on the
    log scale the largest of 32 samples is typically below the tail that carries the mean); where a
    sample's value is zero or negative, the positive part is bounded so (its share by the exact
    binomial) and the negative part's lower bound taken off.
  The larger of two bounds is as sure as the surer of them, and costs no confidence.

A bound's sample size for power: ``resampled_power`` searches the fewest samples at which the bound,
on draws of that many from the samples seen (the rates seen here), shows a limit often enough.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from statistics import NormalDist

GENERALIZED_DRAWS = 8192  # the pivot's quantile to a few parts in a thousand of its spread
GENERALIZED_SEED = 20030101
RESAMPLES = 64  # draws a size in the power search: the share shown to about ±5 %
RESAMPLE_SEED = 80
MOST_SAMPLES = 100_000
PAIRED_CONFIDENCE = (0.96, 0.99)  # the lost share's, lost's share of the discordant: Bonferroni


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


@lru_cache(maxsize=8192)
def exact_upper(k: int, n: int, confidence: float = 0.95) -> float:
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


def exact_lower(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided exact lower bound of a proportion seen k times in n."""
    return 1.0 - exact_upper(n - k, n, confidence) if n else 0.0


def approximate_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """Clopper–Pearson's upper bound in closed form, for searches over n: exact where n ≤ 400, else
    through its F form with n − k large, p ≈ χ²/(2(n − k) + χ²), χ² on 2(k + 1) degrees of freedom
    by Wilson–Hilferty's cube root (within a few per cent of the exact bound below a share of 0.3)."""
    if n <= 400 or k >= n:
        return exact_upper(k, n, confidence)
    dof = 2.0 * (k + 1)
    chi2 = dof * (1.0 - 2.0 / (9.0 * dof) + NormalDist().inv_cdf(confidence) * math.sqrt(2.0 / (9.0 * dof))) ** 3
    return min(1.0, chi2 / (2.0 * (n - k) + chi2))


def t_quantile(q: float, dof: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else Cornish–Fisher's expansion
    (Abramowitz & Stegun 26.7.5; within 0.005 at 3 degrees of freedom, 0.0002 at 10)."""
    if dof == 1:
        return math.tan(math.pi * (q - 0.5))
    if dof == 2:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    z = NormalDist().inv_cdf(q)
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
    )


def hall_upper(mean: float, sd: float, skew: float, n: int, confidence: float) -> float:
    """Hall's skewness-corrected upper bound of a mean, from the sample's mean, standard deviation
    (n − 1) and skewness: the μ at which g(T) reaches its lower quantile (module docstring)."""
    if sd <= 0.0:
        return mean
    quantile = -t_quantile(confidence, n - 1)
    a = skew / (3.0 * math.sqrt(n))
    if abs(a) < 1e-12:
        t = quantile
    else:  # g(t) = ((1 + at)³ − 1)/(3a) + a/2, increasing in t: solved for g(t) = quantile
        inner = 3 * a * (quantile - a / 2) + 1
        t = (math.copysign(abs(inner) ** (1 / 3), inner) - 1) / a
    return mean - sd / math.sqrt(n) * t


def moments(values) -> tuple[float, float, float]:
    """The mean, the standard deviation (n − 1) and the skewness of a sample."""
    import numpy as np

    mean = float(values.mean())
    centred = values - mean
    sd = float(np.sqrt((centred**2).sum() / (len(values) - 1)))
    return mean, sd, float((centred**3).mean() / sd**3) if sd > 0 else 0.0


@lru_cache(maxsize=256)
def _pivot_draws(n: int):
    import numpy as np

    rng = np.random.default_rng((GENERALIZED_SEED, n))
    return rng.standard_normal(GENERALIZED_DRAWS), rng.chisquare(n - 1, GENERALIZED_DRAWS) / (n - 1)


def lognormal_upper(positive, confidence: float) -> float:
    """The generalized upper bound of the mean of log-normal values (module docstring)."""
    import numpy as np

    logs = np.log(positive)
    n = len(logs)
    mean, var = float(logs.mean()), float(logs.var(ddof=1))
    z, v = _pivot_draws(n)
    pivot = mean - z * np.sqrt(var / (n * v)) + var / (2 * v)
    rank = min(GENERALIZED_DRAWS - 1, math.ceil(confidence * GENERALIZED_DRAWS) - 1)
    return math.exp(min(700.0, float(np.partition(pivot, rank)[rank])))  # past float64: no bound worth the name


def mean_upper(values, confidence: float) -> float:
    """The upper bound of the mean of ``values`` (numpy, one a sample): the larger of Hall's and the
    log-normal bound of the positive part less the negative part's lower bound (module docstring)."""
    import numpy as np

    n = len(values)
    hall = hall_upper(*moments(values), n, confidence)
    positive, negative = values[values > 0], np.maximum(-values, 0.0)
    if len(positive) < 2 or float(positive.min()) == float(positive.max()):
        return hall
    if len(positive) == n:
        return max(hall, lognormal_upper(positive, confidence))
    parts = 3 if negative.any() else 2  # Bonferroni: the share, the positive mean, the negative mean
    alpha = (1.0 - confidence) / parts
    positive_mean = exact_upper(len(positive), n, 1 - alpha) * lognormal_upper(positive, 1 - alpha)
    taken_off = max(0.0, -hall_upper(*moments(-negative), n, 1 - alpha)) if parts == 3 else 0.0
    return max(hall, positive_mean - taken_off)


def mean_lower(values, confidence: float) -> float:
    """The lower bound of the mean of ``values``: ``mean_upper`` of their negatives."""
    return -mean_upper(-values, confidence)


def resampled_power(
    count: int, shows: Callable, start: int, power: float, resamples: int = RESAMPLES, most: int = MOST_SAMPLES
) -> int | None:
    """The fewest samples at which ``shows(picks)`` — the bound on the samples ``picks`` (indices
    into the ``count`` seen) shows the limit — in at least ``power`` of ``resamples`` draws of that
    many, with replacement: the figures at the rates seen here. Seeded by size; None where even
    ``most`` do not."""
    import numpy as np

    def enough(n: int) -> bool:
        rng = np.random.default_rng((RESAMPLE_SEED, n))
        needed = math.ceil(power * resamples)
        shown = 0
        for done in range(resamples):
            shown += bool(shows(rng.integers(0, count, n)))
            if shown >= needed or shown + resamples - done - 1 < needed:  # decided
                break
        return shown >= needed

    return smallest_n(enough, start, most)


def smallest_n(shows: Callable[[int], bool], start: int, most: int = 10**7) -> int | None:
    """The fewest samples from ``start`` at which ``shows(n)`` (true from some n on), by doubling
    and bisection; None where even ``most`` do not."""
    low, high = max(1, start - 1), max(2, start)  # low: not shown, or below start
    while not shows(high):
        if high >= most:
            return None
        low, high = high, min(most, high * 2)
    while high - low > 1:
        middle = (low + high) // 2
        if shows(middle):
            high = middle
        else:
            low = middle
    return high


def net_drop_upper(lost: int, gained: int, n: int, approximate: bool = False) -> float:
    """The paired upper bound of the net top-1 drop (lost − gained)/n (pipeline/precision/bounds.py's
    docstring says why it holds)."""
    upper = approximate_upper if approximate else exact_upper
    share_confidence, lost_confidence = PAIRED_CONFIDENCE
    # The net drop π_lost − π_gained is π_lost·(2 − 1/p), p lost's share of the discordant: it
    # grows with p, so p's upper bound bounds it; with nothing discordant p is unknown (1).
    p = upper(lost, lost + gained, lost_confidence) if lost + gained else 1.0
    factor = 2.0 - 1.0 / p if p > 0 else -math.inf
    if factor >= 0:
        return upper(lost, n, share_confidence) * factor
    return exact_lower(lost, n, share_confidence) * factor if lost else 0.0

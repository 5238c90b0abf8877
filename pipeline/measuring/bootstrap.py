"""Bootstrap intervals of medians and of the difference of two medians, for many series at once:
the rows' own intervals and the changes against a reference toolchain or a baseline (the
regression gate). Seeded, so the same numbers every time."""

from __future__ import annotations

import functools
from collections.abc import Sequence


def bootstrap_median_ci(values_ms: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Confidence interval of the median by resampling the per-iteration times: the percentiles of
    the medians of ``resamples`` draws `rng.choice(values, len(values))` from a generator seeded
    with ``seed``."""
    return bootstrap_median_cis([values_ms], confidence, resamples, seed)[0]


def median_difference_ci(
    new_ms: Sequence[float], old_ms: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Confidence interval of median(new) - median(old); excluding 0 means the change is real. The
    new series is resampled first, the old one next, from one generator seeded with ``seed``."""
    return median_difference_cis([(new_ms, old_ms)], confidence, resamples, seed)[0]


# --- the same intervals for many series at once -------------------------------------------------
#
# A report with thousands of rows needs thousands of the intervals above. Each is exactly what
# resampling each series on its own gives — same seed, same draws, same arithmetic (the tests hold
# it to that textbook computation) — computed from two facts.
# The draws depend only on the series' lengths, never on their values, so every series of one
# length shares one set of resample indices, kept as counts (how often each position was drawn in
# each resample). And a resample's median is an order statistic: with a series sorted once, it is
# the value at which those counts, accumulated in rank order, pass the middle.


# Few lengths recur in one report; a long trtexec run's counts are tens of MB, so keep only a few.
@functools.lru_cache(maxsize=16)
def _draw_counts(lengths: tuple[int, ...], resamples: int, seed: int):
    """The counts of the last of consecutive draws `rng.choice(series, (resamples, n))` for the
    series lengths in order, from a fresh generator seeded with ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for n in lengths:
        # Generator.choice with replacement draws exactly these indices (checked by the tests).
        indices = rng.integers(0, n, size=(resamples, n))
    cells = indices + np.arange(resamples)[:, None] * n
    counts = np.bincount(cells.ravel(), minlength=resamples * n).reshape(resamples, n)
    return counts.astype(np.int16 if n < 2**15 else np.int32)


def _medians_of_resamples(series: list[Sequence[float]], counts):
    """(len(series), resamples): each series' resample medians, for series of counts.shape[1] values."""
    import numpy as np

    resamples, n = counts.shape
    raw = np.asarray(series, dtype=np.float64)
    order = np.argsort(raw, axis=1, kind="stable")
    values = np.take_along_axis(raw, order, axis=1)
    kind = counts.dtype
    by_position = np.ascontiguousarray(counts.T)  # (n, resamples)
    middle = [(n + 1) // 2] if n % 2 else [n // 2, n // 2 + 1]  # 1-based ranks of the middle value(s)
    drawn = np.zeros((len(series), resamples), dtype=kind)  # values drawn so far, in rank order
    below = [np.zeros((len(series), resamples), dtype=kind) for _ in middle]  # ranks that fall short of each middle
    for rank in range(n):
        drawn += by_position[order[:, rank]]
        for short, wanted in zip(below, middle):
            short += drawn < wanted
    picked = [np.take_along_axis(values, short.astype(np.intp), axis=1) for short in below]
    return picked[0] if len(picked) == 1 else (picked[0] + picked[1]) / 2


def _intervals(samples, confidence: float) -> list[tuple[float, float]]:
    import numpy as np

    tail = (1.0 - confidence) / 2 * 100
    bounds = np.percentile(samples, [tail, 100 - tail], axis=1)
    return [(float(low), float(high)) for low, high in zip(bounds[0], bounds[1])]


def bootstrap_median_cis(
    series: Sequence[Sequence[float]], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> list[tuple[float, float]]:
    """bootstrap_median_ci of each series, computed together."""
    result: list[tuple[float, float]] = [(0.0, 0.0)] * len(series)
    by_length: dict[int, list[int]] = {}
    for position, values in enumerate(series):
        by_length.setdefault(len(values), []).append(position)
    for n, positions in by_length.items():
        medians = _medians_of_resamples([series[p] for p in positions], _draw_counts((n,), resamples, seed))
        for position, interval in zip(positions, _intervals(medians, confidence)):
            result[position] = interval
    return result


def median_difference_cis(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> list[tuple[float, float]]:
    """median_difference_ci(new, old) of each (new, old) pair, computed together; a series that
    stands in several pairs is resampled once per length of the series drawn before it, and a pair
    that recurs (copies of one manifest against one reference) is bounded once."""
    result: list[tuple[float, float]] = [(0.0, 0.0)] * len(pairs)
    groups: dict[tuple[int, int], list[int]] = {}
    for position, (new, old) in enumerate(pairs):
        groups.setdefault((len(new), len(old)), []).append(position)
    for (n_new, n_old), positions in groups.items():
        news = _unique([pairs[p][0] for p in positions])
        olds = _unique([pairs[p][1] for p in positions])
        new_medians = _medians_of_resamples(news.series, _draw_counts((n_new,), resamples, seed))
        old_medians = _medians_of_resamples(olds.series, _draw_counts((n_new, n_old), resamples, seed))
        both = _unique(list(zip(news.index, olds.index)))
        differences = new_medians[[new for new, _ in both.series]] - old_medians[[old for _, old in both.series]]
        intervals = _intervals(differences, confidence)
        for position, pair in zip(positions, both.index):
            result[position] = intervals[pair]
    return result


class _unique:
    """The distinct series of a list (by content) and, for each item, the index of its one copy."""

    def __init__(self, items: list[Sequence[float]]):
        seen: dict[tuple[float, ...], int] = {}
        self.series: list[Sequence[float]] = []
        self.index: list[int] = []
        for values in items:
            key = tuple(values)
            if key not in seen:
                seen[key] = len(self.series)
                self.series.append(values)
            self.index.append(seen[key])

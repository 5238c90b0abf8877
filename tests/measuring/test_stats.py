import math

import numpy as np
import pytest

from pipeline.measuring.stats import LatencyStats, ratio_of_rounds


def test_statistics_of_a_known_series():
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    stats = LatencyStats.from_values(values)
    assert stats.count == 100
    assert (stats.min, stats.max) == (1.0, 100.0)
    assert stats.mean == pytest.approx(50.5)
    assert stats.median == pytest.approx(50.5)
    # Linear interpolation between order statistics (numpy's default).
    assert stats.p90 == pytest.approx(90.1)
    assert stats.p95 == pytest.approx(95.05)
    assert stats.p99 == pytest.approx(99.01)
    assert stats.stdev == pytest.approx(np.std(values, ddof=1))
    assert stats.cv == pytest.approx(stats.stdev / 50.5)


def test_a_single_timing_has_no_spread():
    stats = LatencyStats.from_values([2.5])
    assert stats.stdev == 0.0 and stats.cv == 0.0
    assert stats.median == stats.p99 == 2.5


def test_percentiles_are_ordered_on_skewed_data():
    rng = np.random.default_rng(1)
    stats = LatencyStats.from_values(rng.lognormal(0.0, 0.5, 1000))
    assert stats.min <= stats.median <= stats.p90 <= stats.p95 <= stats.p99 <= stats.max


def test_the_quartile_spread_ignores_a_few_stalls_that_the_cv_does_not():
    steady = [10.0 + 0.01 * (i % 11) for i in range(200)]
    stalled = LatencyStats.from_values(steady[:190] + [30.0] * 10)  # 5% of the runs at 3x
    assert stalled.cv > 0.3 and stalled.iqr_cv < 0.01
    assert stalled.median == pytest.approx(LatencyStats.from_values(steady).median, rel=1e-3)


def test_the_quartile_spread_of_normal_runs_is_their_cv():
    runs = LatencyStats.from_values(np.random.default_rng(0).normal(10.0, 0.5, 20000))
    assert runs.iqr_cv == pytest.approx(runs.cv, rel=0.03)


def test_empty_series_is_refused():
    with pytest.raises(ValueError, match="empty"):
        LatencyStats.from_values([])


def test_zero_mean_gives_undefined_cv_rather_than_a_crash():
    assert math.isnan(LatencyStats.from_values([0.0, 0.0]).cv)


def test_bootstrap_interval_of_the_median_contains_it():
    from pipeline.measuring.bootstrap import bootstrap_median_ci

    rng = np.random.default_rng(3)
    values = rng.normal(10.0, 1.0, 500)
    low, high = bootstrap_median_ci(values)
    assert low < float(np.median(values)) < high
    assert high - low < 0.5


def test_difference_of_medians_is_significant_only_beyond_the_noise():
    from pipeline.measuring.bootstrap import median_difference_ci

    rng = np.random.default_rng(4)
    a = rng.normal(10.0, 1.0, 400)
    low, high = median_difference_ci(a * 1.10, a)
    assert low > 0  # 10% slower: real
    low, high = median_difference_ci(rng.normal(10.0, 1.0, 400), a)
    assert low <= 0 <= high  # two samples of the same distribution: within noise


def test_the_batched_intervals_are_exactly_the_one_by_one_ones():
    """A report computes its intervals together (pipeline/measuring/stats.py); each must be bit for bit what
    resampling each series on its own gives, whatever the lengths (odd, even, one value), ties and repeats."""
    from pipeline.measuring.bootstrap import bootstrap_median_cis, median_difference_cis

    def resampled_medians(values, rng):  # the textbook bootstrap, one series at a time
        values = np.asarray(values, dtype=np.float64)
        return np.median(rng.choice(values, size=(2000, values.size), replace=True), axis=1)

    def interval(samples):
        tail = (1.0 - 0.95) / 2 * 100  # as the report computes it: 2.5000000000000022
        low, high = np.percentile(samples, [tail, 100 - tail])
        return float(low), float(high)

    def one_median_ci(values):
        return interval(resampled_medians(values, np.random.default_rng(0)))

    def one_difference_ci(new, old):
        rng = np.random.default_rng(0)
        return interval(resampled_medians(new, rng) - resampled_medians(old, rng))

    rng = np.random.default_rng(7)
    series = [list(rng.lognormal(3.0, 0.2, n)) for n in (1, 2, 3, 14, 15, 15, 16, 40, 7, 300)]
    series += [list(series[3]), [5.0] * 15, [1.0, 2.0, 2.0, 2.0, 3.0, 3.0]]
    assert bootstrap_median_cis(series) == [one_median_ci(values) for values in series]
    pairs = [(new, old) for new in series for old in series]
    assert median_difference_cis(pairs) == [one_difference_ci(new, old) for new, old in pairs]
    assert median_difference_cis([]) == [] and bootstrap_median_cis([]) == []


def test_a_paired_ratio_inverts_exactly_whichever_engine_is_named_first():
    """An even count of rounds: the verdict inverts A over B where the crossovers read B over A,
    and the two must print one speedup (the arithmetic mean of the middle two would give 110.0×
    and 109.77×)."""
    ratios = [100.0, 105.0, 115.0, 130.0]
    forward, backward = ratio_of_rounds(ratios, 0.03), ratio_of_rounds([1 / r for r in ratios], 0.03)
    assert forward.ratio == pytest.approx(math.sqrt(105.0 * 115.0), rel=1e-12)
    assert backward.inverse().ratio == pytest.approx(forward.ratio, rel=1e-12)
    assert ratio_of_rounds([1.0, 2.0, 4.0], 0.03).ratio == 2.0  # an odd count: the middle one

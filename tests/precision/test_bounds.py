"""How sure a plan's figures are (pipeline/precision/bounds.py): exact binomial bounds for
proportions, checked against independent references; a paired bound on the net top-1 drop whose
coverage is enumerated exactly; heavy-tailed bounds for cosine and the metric; a metric over one
batch that has no bound and says so; each bound's status; and sample sizes from power that a
simulation at the rates seen shows about 80 % of the time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.catalog.floor import AccuracyFloor
from pipeline.precision.bounds import (
    EXACT,
    HEAVY_TAILED,
    NO_BOUND,
    ONE_SAMPLE,
    PAIRED,
    SampleStats,
    binomial_cdf,
    bounds,
    exact_upper,
    net_drop_upper,
    sample_stats,
    samples_to_resolve,
)
from pipeline.precision.figures import figures

torch = pytest.importorskip("torch")


def outputs(noise: float, seed: int = 0, samples: int = 32, classes: int = 10):
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(samples, classes, generator=generator)
    return [reference], [reference + noise * torch.randn(samples, classes, generator=generator)]


def drawn(samples: int, sigma: float, seed: int, batch: int = 8) -> SampleStats:
    """Ten scores a sample, the variant's off by s·N(0, 1) with s log-normal (σ on the log scale; 0: even),
    and a metric, per batch, that falls by the error's size."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((samples, 10))
    scale = 0.05 * np.exp(sigma * rng.standard_normal(samples))
    out = ref + scale[:, None] * rng.standard_normal((samples, 10))
    fp32 = 0.8 + 0.1 * rng.standard_normal(samples)
    mine = fp32 - np.sqrt(((out - ref) ** 2).mean(1))
    batches = np.arange(samples) // batch
    sizes = np.bincount(batches).astype(float)
    return SampleStats(
        dot=(ref * out).sum(1),
        ref_sq=(ref * ref).sum(1),
        out_sq=(out * out).sum(1),
        agree=ref.argmax(1) == out.argmax(1),
        correct=None,
        fp32_correct=None,
        metric=np.bincount(batches, mine) / sizes,
        fp32_metric=np.bincount(batches, fp32) / sizes,
        batch_sizes=sizes,
    )


@pytest.mark.parametrize("k, n", [(0, 32), (1, 32), (5, 32), (31, 32), (3, 1000), (990, 1000)])
def test_the_exact_upper_bound_is_where_k_or_fewer_happen_one_time_in_twenty(k, n):
    upper = exact_upper(k, n)
    assert k / n < upper < 1 and binomial_cdf(k, n, upper) == pytest.approx(0.05, abs=1e-9)
    assert binomial_cdf(k, n, upper * 0.999) > 0.05  # below it, k or fewer are likelier


@pytest.mark.parametrize("k, n", [(0, 7), (1, 32), (4, 32), (17, 60), (59, 60), (2, 150), (70, 150)])
def test_clopper_pearson_agrees_with_a_binomial_tail_summed_in_exact_integers(k, n):
    """Independent of binomial_cdf's logs: P(X ≤ k) as an exact sum of integer binomial
    coefficients at p = upper, and the same tail at the bound computed to 1e-12 below it."""
    from fractions import Fraction

    upper = exact_upper(k, n)
    p = Fraction(upper)
    tail = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
    assert float(tail) == pytest.approx(0.05, abs=1e-9)
    assert exact_upper(k, n, 0.99) > upper > exact_upper(k, n, 0.8)


def test_clopper_pearson_is_the_beta_quantile():
    """The identity upper = Beta⁻¹(0.95; k + 1, n − k), by scipy's Beta quantile."""
    stats = pytest.importorskip("scipy.stats")
    for k, n in [(0, 32), (1, 32), (3, 64), (10, 256), (40, 2048), (500, 1000), (2047, 2048)]:
        assert exact_upper(k, n) == pytest.approx(stats.beta.ppf(0.95, k + 1, n - k), rel=1e-9, abs=1e-12)


def test_none_changed_of_32_bounds_the_share_at_8_9_percent_not_at_0_and_what_resolves_1_percent():
    assert exact_upper(0, 32) == pytest.approx(1 - 0.05 ** (1 / 32)) == pytest.approx(0.0894, abs=1e-4)
    assert exact_upper(32, 32) == 1.0
    # 1 − 0.05^(1/n) ≤ 1 % first at n = 299; 5 % at 59; agreement ≥ 99 % likewise at 299.
    assert samples_to_resolve("upper", 0.01) == 299 and exact_upper(0, 299) <= 0.01 < exact_upper(0, 298)
    assert samples_to_resolve("upper", 0.05) == 59 and samples_to_resolve("lower", 0.99) == 299
    assert samples_to_resolve("upper", 0.0) is None and samples_to_resolve("lower", 1.0) is None


def test_a_top1_drop_with_nothing_changed_is_unresolved_at_1_percent_and_asks_for_299_samples():
    refs, _ = outputs(0.0)
    stats = sample_stats(refs, refs)
    (drop,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", 0.01),)))
    assert (drop.method, drop.counted, drop.counting, drop.estimate) == (EXACT, 0, "changed", 0.0)
    assert drop.bound == pytest.approx(0.0894, abs=1e-4) and not drop.resolvable and drop.samples_needed == 299
    assert drop.held and drop.status == "unresolved"  # held as before (nothing changed); not shown
    assert drop.samples_for_power == 299  # at a rate of nothing changed, the best-outcome floor
    assert "pass --samples 299 to resolve it" in drop.unresolved_said() and "8.9%" in drop.unresolved_said()
    message, tip = drop.warning()
    assert "32 samples do not show a top-1 drop of at most 1.00%" in message and "--samples 299" in tip
    (ten,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", 0.10),)))
    assert ten.resolvable and ten.held and ten.status == "held" and ten.warning() is None  # 8.9 % ≤ 10 %
    (none,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", 0.0),)))
    assert none.samples_for_power is None and none.as_dict()["samples_for_power"] is None


def test_one_changed_prediction_fails_an_unresolvable_drop_and_a_resolvable_one_by_its_bound():
    refs, _ = outputs(0.0, samples=64)
    changed = refs[0].clone()
    changed[0] = -changed[0]  # the first sample's prediction changes
    stats = sample_stats(refs, [changed])
    (tight,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", 0.01),)))
    assert tight.counted == 1 and not tight.resolvable and not tight.held and tight.status == "failed"  # 1.6 % > 1 %
    (loose,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", 0.10),)))
    assert loose.resolvable and loose.held and loose.bound == pytest.approx(exact_upper(1, 64))
    (agreement,) = bounds(stats, AccuracyFloor((("top1", 0.9),), "--floor"))
    assert agreement.side == "lower" and agreement.estimate == pytest.approx(63 / 64)
    assert agreement.bound == pytest.approx(1 - exact_upper(1, 64)) and agreement.status == "held"


def _contradicts(text: str) -> bool:
    """Whether a text both asks for a number of samples and says that no number would do."""
    return "--samples" in text and "no number of samples" in text


@pytest.mark.parametrize("changed, samples, limit", [(0, 32, 0.01), (1, 32, 0.01), (1, 64, 0.01), (5, 400, 0.02), (0, 32, 0.0)])
def test_every_tip_gives_one_advice_that_the_lines_beside_it_do_not_contradict(changed, samples, limit):
    """One changed of 32 against a 1 % drop is past the limit at its figure: more samples would
    not show it at that rate, and no TIP may ask for them while the line beside it says so (it
    said "pass --samples 299: … at the rates seen here no number of samples resolves it")."""
    from pipeline.precision.floor_bound import one_advice

    refs, _ = outputs(0.0, samples=samples)
    flipped = refs[0].clone()
    flipped[:changed] = -flipped[:changed]
    (drop,) = bounds(sample_stats(refs, [flipped]), AccuracyFloor((), "--max-drop", (("top1", limit),)))
    tip = one_advice([drop])
    assert tip == drop.advice() and not _contradicts(tip)
    said = [tip, *(drop.warning() or ()), drop.unresolved_said() if not drop.resolvable else ""]
    assert not any(_contradicts(text) for text in said), said
    if drop.samples_for_power is not None:
        assert tip.startswith(f"pass --samples {drop.samples_for_power} ") and drop.status != "failed"
    elif drop.status == "failed":  # past the limit at the rate seen: a looser limit, not more samples
        assert "more samples would not show it; loosen the top-1 limit" in tip and "pass --samples" not in tip
    else:
        assert "no number of samples shows a limit of exactly no change" in tip


def test_labels_bound_the_net_drop_lost_less_gained_paired():
    refs, _ = outputs(0.0, samples=64)
    labels = refs[0].argmax(dim=1).tolist()
    labels[1] = (labels[1] + 1) % 10  # FP32 wrong on sample 1
    out = refs[0].clone()
    out[0] = -out[0]  # sample 0 lost
    out[1, labels[1]] = 100.0  # sample 1 fixed
    stats = sample_stats(refs, [out], labels)
    (drop,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", 0.1),)))
    assert (drop.method, drop.counting, drop.counted, drop.gained, drop.estimate) == (PAIRED, "lost", 1, 1, 0.0)
    assert drop.bound == pytest.approx(net_drop_upper(1, 1, 64)) and "1 of 64 lost, 1 gained" in drop.said()


def _paired_coverage(n: int, lost: float, gained: float, bound) -> float:
    """P(bound(L, G, n) ≥ lost − gained) summed exactly over the trinomial's outcomes."""
    rest, covered = 1 - lost - gained, 0.0
    for worse in range(n + 1):
        for better in range(n + 1 - worse):
            chance = math.comb(n, worse) * math.comb(n - worse, better) * lost**worse * gained**better * rest ** (n - worse - better)
            covered += chance * (bound(worse, better, n) >= lost - gained - 1e-12)
    return covered


def test_the_paired_bound_covers_the_net_drop_exactly_enumerated_where_its_plug_in_would_not():
    rates = [(0.02, 0.0), (0.05, 0.02), (0.1, 0.08), (0.2, 0.05), (0.3, 0.25), (0.01, 0.1)]
    worst = min(_paired_coverage(40, lost, gained, net_drop_upper) for lost, gained in rates)
    assert worst >= 0.95

    def plug_in(worse: int, better: int, n: int) -> float:  # the conditional bound alone, the discordant share as seen
        return (worse + better) / n * (2 * exact_upper(worse, worse + better) - 1) if worse + better else 0.0

    assert min(_paired_coverage(40, lost, gained, plug_in) for lost, gained in rates) < 0.9  # the uncertainty in d matters


def test_the_paired_samples_for_power_show_the_limit_about_four_times_in_five_at_the_rates_seen():
    n, lost, gained, limit = 2000, 40, 20, 0.015  # a true net drop of 1 %
    stats = SampleStats(
        dot=np.ones(n),
        ref_sq=np.ones(n),
        out_sq=np.ones(n),
        agree=np.arange(n) >= lost + gained,
        correct=(np.arange(n) >= lost) & (np.arange(n) < 1800),
        fp32_correct=(np.arange(n) >= lost + gained) & (np.arange(n) < 1800) | (np.arange(n) < lost),
    )
    (drop,) = bounds(stats, AccuracyFloor((), "--max-drop", (("top1", limit),)))
    assert (drop.counted, drop.gained) == (lost, gained) and drop.status == "unresolved"
    size = drop.samples_for_power
    assert size >= drop.samples_needed
    rng = np.random.default_rng(1)
    draws = rng.multinomial(size, [lost / n, gained / n, 1 - (lost + gained) / n], 400)
    shown = np.mean([net_drop_upper(int(w), int(b), size) <= limit for w, b, _ in draws])
    assert 0.78 <= shown <= 0.97


def test_the_cosine_bound_is_the_cosine_over_every_value_and_widens_with_the_spread():
    refs, outs = outputs(0.3)
    stats = sample_stats(refs, outs)
    whole = stats.dot.sum() / (stats.ref_sq.sum() * stats.out_sq.sum()) ** 0.5
    assert whole == pytest.approx(figures(refs, outs).cosine, abs=1e-12)  # per-sample sums are exact
    floor = AccuracyFloor((("cos", 0.5),), "--floor", (("cos", 0.5),))
    small, large = (bounds(sample_stats(*outputs(noise)), floor) for noise in (0.1, 0.6))
    assert all(bound.method == HEAVY_TAILED for bound in small)
    assert 0 < small[0].estimate - small[0].bound < large[0].estimate - large[0].bound  # a threshold's lower bound
    assert 0 < small[1].bound - small[1].estimate < large[1].bound - large[1].estimate  # a drop's upper bound
    assert small[0].bound == pytest.approx(1 - small[1].bound)
    assert bounds(sample_stats(*outputs(0.6)), floor) == bounds(sample_stats(*outputs(0.6)), floor)  # seeded
    refs, _ = outputs(0.0)
    (itself,) = bounds(sample_stats(refs, refs), AccuracyFloor((("cos", 0.9999),), "--floor"))
    assert itself.bound == pytest.approx(1.0) and itself.status == "held"


def test_a_cosine_floor_met_at_its_figure_is_not_held_by_its_bound():
    refs, outs = outputs(0.3)
    measured = figures(refs, outs)
    at_the_figure = AccuracyFloor((("cos", measured.cosine),), "--floor")
    (bound,) = bounds(sample_stats(refs, outs), at_the_figure)
    assert at_the_figure.met_by(measured) and not bound.held and math.isclose(bound.estimate, measured.cosine)
    assert bound.status == "unresolved" and bound.warning() is not None
    (below,) = bounds(sample_stats(refs, outs), AccuracyFloor((("cos", bound.bound),), "--floor"))
    assert below.held and below.status == "held"
    (above,) = bounds(sample_stats(refs, outs), AccuracyFloor((("cos", 0.9999),), "--floor"))
    assert above.status == "failed" and above.samples_for_power is None  # past the limit at its figure


def test_a_cosine_one_sample_sets_has_no_bound_and_asks_for_the_samples_that_would_spread_it():
    """One of 32 samples carries most of the error energy: the mean is that one value's, and no
    bound from these samples says how often such values come."""
    generator = torch.Generator().manual_seed(3)
    refs = torch.randn(32, 10, generator=generator)
    outs = refs + 0.02 * torch.randn(32, 10, generator=generator)
    outs[5] = refs[5] + 0.5 * torch.randn(10, generator=generator)  # its error energy ~600x the others'
    floor = AccuracyFloor((("cos", 0.99),), "--floor")
    (cosine,) = bounds(sample_stats([refs], [outs]), floor)
    assert (cosine.bound, cosine.method) == (None, ONE_SAMPLE) and cosine.estimate > 0.99
    assert cosine.status == "unresolved" and cosine.held  # by its figure; not confirmed by a bound
    message, tip = cosine.warning()
    assert message.startswith("one of the 32 samples carries most of the cosine's error: they cannot bound it at 95%")
    assert tip.startswith(f"evaluate on about {cosine.samples_for_power} samples") and cosine.samples_for_power > 32
    assert cosine.said().endswith("(no bound: one sample carries most of the error)")
    # Spread over the others (no one sample with most of the energy), it is bounded as before.
    outs[5] = refs[5] + 0.05 * torch.randn(10, generator=generator)
    (spread,) = bounds(sample_stats([refs], [outs]), floor)
    assert spread.method == HEAVY_TAILED and spread.bound is not None and spread.status == "held"


def test_a_metric_over_one_batch_has_no_bound_and_says_so():
    stats = SampleStats(
        dot=np.ones(32),
        ref_sq=np.ones(32),
        out_sq=np.ones(32),
        agree=None,
        correct=None,
        fp32_correct=None,
        metric=np.array([0.70]),
        fp32_metric=np.array([0.71]),
        batch_sizes=np.array([32.0]),
    )
    (drop,) = bounds(stats, AccuracyFloor((), "--max-drop", (("metric", 0.02),)))
    assert (drop.bound, drop.method, drop.samples) == (None, NO_BOUND, 32) and drop.estimate == pytest.approx(0.01)
    assert drop.status == "unresolved" and drop.held  # held reads the figure, as before; the status does not
    message, tip = drop.warning()
    assert "one batch" in message and "no 95% bound" in message and "several batches" in tip
    assert drop.said() == "metric drop 0.01 (no bound: one batch)"
    assert drop.as_dict()["status"] == "unresolved" and drop.as_dict()["bound"] is None


def test_a_metric_over_batches_is_bounded_on_both_sides_and_its_samples_for_power_show_it():
    stats = drawn(256, 0.0, seed=3)
    (loose,) = bounds(stats, AccuracyFloor((), "--max-drop", (("metric", 1.0),)))
    assert loose.method == HEAVY_TAILED and loose.bound > loose.estimate > 0.04 and loose.status == "held"
    floor = AccuracyFloor((), "--max-drop", (("metric", (loose.estimate + loose.bound) / 2),))  # within the bound's margin
    (drop,) = bounds(stats, floor)
    (figure,) = bounds(stats, AccuracyFloor((("metric", 0.5),), "--floor"))
    assert drop.status == "unresolved" and figure.bound < figure.estimate and figure.status == "held"
    size = drop.samples_for_power
    assert size is not None and size > 256 and size % 8 == 0  # whole batches of 8
    # Drawn at the rates seen here: the same errors, fresh samples.
    shown = np.mean([bounds(drawn(size, 0.0, seed=100 + trial), floor)[0].status == "held" for trial in range(60)])
    assert 0.7 <= shown <= 0.98


@pytest.mark.parametrize("sigma, room", [(0.0, 1.3), (1.0, 2.5)])
def test_the_cosines_samples_for_power_show_the_limit_about_four_times_in_five(sigma, room):
    stats = drawn(1024, sigma, seed=4)
    limit = 1 - (1 - stats.dot.sum() / np.sqrt(stats.ref_sq.sum() * stats.out_sq.sum())) * room  # the drop room times inside
    (bound,) = bounds(stats, AccuracyFloor((("cos", limit),), "--floor"))
    size = bound.samples_for_power
    assert bound.status in ("held", "unresolved") and size is not None
    # Drawn at the rates seen here: from the samples seen, with replacement.
    rng, shown = np.random.default_rng(9), []
    for _ in range(100):
        picks = rng.integers(0, 1024, size)
        picked = SampleStats(stats.dot[picks], stats.ref_sq[picks], stats.out_sq[picks], None, None, None)
        shown.append(bounds(picked, AccuracyFloor((("cos", limit),), "--floor"))[0].status == "held")
    assert 0.7 <= np.mean(shown) <= 0.95

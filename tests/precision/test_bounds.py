"""How sure a plan's figures are (pipeline/precision/bounds.py): exact binomial bounds for
proportions, which do not collapse at 0 or n as a bootstrap does; a bootstrap for cosine, from
per-sample figures; and what the samples can resolve at all."""

from __future__ import annotations

import math

import pytest

from pipeline.precision.bounds import BOOTSTRAP, EXACT, binomial_cdf, bounds, exact_upper, sample_stats, samples_to_resolve
from pipeline.precision.figures import Floor, figures

torch = pytest.importorskip("torch")


def outputs(noise: float, seed: int = 0, samples: int = 32, classes: int = 10):
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(samples, classes, generator=generator)
    return [reference], [reference + noise * torch.randn(samples, classes, generator=generator)]


@pytest.mark.parametrize("k, n", [(0, 32), (1, 32), (5, 32), (31, 32), (3, 1000), (990, 1000)])
def test_the_exact_upper_bound_is_where_k_or_fewer_happen_one_time_in_twenty(k, n):
    upper = exact_upper(k, n)
    assert k / n < upper < 1 and binomial_cdf(k, n, upper) == pytest.approx(0.05, abs=1e-9)
    assert binomial_cdf(k, n, upper * 0.999) > 0.05  # below it, k or fewer are likelier


def test_none_changed_of_32_bounds_the_share_at_8_9_percent_not_at_0_and_what_resolves_1_percent():
    assert exact_upper(0, 32) == pytest.approx(1 - 0.05 ** (1 / 32)) == pytest.approx(0.0894, abs=1e-4)
    assert exact_upper(32, 32) == 1.0
    # 1 − 0.05^(1/n) ≤ 1 % first at n = 299; 5 % at 59; agreement ≥ 99 % likewise at 299.
    assert samples_to_resolve("upper", 0.01) == 299 and exact_upper(0, 299) <= 0.01 < exact_upper(0, 298)
    assert samples_to_resolve("upper", 0.05) == 59 and samples_to_resolve("lower", 0.99) == 299
    assert samples_to_resolve("upper", 0.0) is None and samples_to_resolve("lower", 1.0) is None


def test_a_top1_drop_with_nothing_changed_is_bounded_by_the_exact_bound_and_unresolvable_at_1_percent():
    refs, _ = outputs(0.0)
    stats = sample_stats(refs, refs)
    (drop,) = bounds(stats, Floor((), "--max-drop", (("top1", 0.01),)))
    assert (drop.method, drop.counted, drop.counting, drop.estimate) == (EXACT, 0, "changed", 0.0)
    assert drop.bound == pytest.approx(0.0894, abs=1e-4) and not drop.resolvable and drop.samples_needed == 299
    assert drop.held  # no sample changed: what 32 samples can say
    assert "--samples 299 would resolve it" in drop.unresolved_said() and "8.9%" in drop.unresolved_said()
    (five,) = bounds(stats, Floor((), "--max-drop", (("top1", 0.10),)))
    assert five.resolvable and five.held  # 8.9 % ≤ 10 %


def test_one_changed_prediction_fails_an_unresolvable_drop_and_a_resolvable_one_by_its_bound():
    refs, _ = outputs(0.0, samples=64)
    changed = refs[0].clone()
    changed[0] = -changed[0]  # the first sample's prediction changes
    stats = sample_stats(refs, [changed])
    (tight,) = bounds(stats, Floor((), "--max-drop", (("top1", 0.01),)))
    assert tight.counted == 1 and not tight.resolvable and not tight.held
    (loose,) = bounds(stats, Floor((), "--max-drop", (("top1", 0.10),)))
    assert loose.resolvable and loose.held and loose.bound == pytest.approx(exact_upper(1, 64))
    (agreement,) = bounds(stats, Floor((("top1", 0.9),), "--floor"))
    assert (
        agreement.side == "lower"
        and agreement.estimate == pytest.approx(63 / 64)
        and agreement.bound == pytest.approx(1 - exact_upper(1, 64))
    )


def test_labels_count_the_lost_samples_not_those_the_variant_fixes():
    refs, _ = outputs(0.0, samples=64)
    labels = refs[0].argmax(dim=1).tolist()
    labels[1] = (labels[1] + 1) % 10  # FP32 wrong on sample 1
    out = refs[0].clone()
    out[0] = -out[0]  # sample 0 lost
    out[1, labels[1]] = 100.0  # sample 1 fixed
    stats = sample_stats(refs, [out], labels)
    (drop,) = bounds(stats, Floor((), "--max-drop", (("top1", 0.1),)))
    assert drop.counting == "lost" and drop.counted == 1 and drop.estimate == 0.0  # one lost, one gained
    assert drop.bound == pytest.approx(exact_upper(1, 64))


def test_the_bootstraps_cosine_is_the_cosine_over_every_value_and_its_bound_widens_with_the_spread():
    refs, outs = outputs(0.3)
    stats = sample_stats(refs, outs)
    whole = stats.dot.sum() / (stats.ref_sq.sum() * stats.out_sq.sum()) ** 0.5
    assert whole == pytest.approx(figures(refs, outs).cosine, abs=1e-12)  # per-sample sums are exact
    floor = Floor((("cos", 0.5),), "--floor", (("cos", 0.5),))
    small, large = (bounds(sample_stats(*outputs(noise)), floor) for noise in (0.1, 0.6))
    assert all(bound.method == BOOTSTRAP for bound in small)
    assert 0 < small[0].estimate - small[0].bound < large[0].estimate - large[0].bound  # a threshold's lower bound
    assert 0 < small[1].bound - small[1].estimate < large[1].bound - large[1].estimate  # a drop's upper bound
    assert bounds(sample_stats(*outputs(0.6)), floor) == bounds(sample_stats(*outputs(0.6)), floor)  # seeded


def test_a_cosine_floor_met_at_its_figure_is_not_held_by_its_bound():
    refs, outs = outputs(0.3)
    measured = figures(refs, outs)
    at_the_figure = Floor((("cos", measured.cosine),), "--floor")
    (bound,) = bounds(sample_stats(refs, outs), at_the_figure)
    assert at_the_figure.met_by(measured) and not bound.held and math.isclose(bound.estimate, measured.cosine)
    (below,) = bounds(sample_stats(refs, outs), Floor((("cos", bound.bound),), "--floor"))
    assert below.held

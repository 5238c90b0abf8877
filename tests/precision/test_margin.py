"""The margin a plan's search keeps above its floor (pipeline/precision/margin.py): a bootstrap
over the search's samples, computed from per-sample figures without running the model again."""

from __future__ import annotations

import pytest

from pipeline.precision.figures import Figures, Floor, figures
from pipeline.precision.margin import margins, sample_stats

torch = pytest.importorskip("torch")


def outputs(noise: float, seed: int = 0, samples: int = 32, classes: int = 10):
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(samples, classes, generator=generator)
    return [reference], [reference + noise * torch.randn(samples, classes, generator=generator)]


def test_the_bootstraps_cosine_is_the_cosine_over_every_value_and_its_margin_grows_with_the_spread():
    refs, outs = outputs(0.3)
    stats = sample_stats(refs, outs)
    whole = stats.dot.sum() / (stats.ref_sq.sum() * stats.out_sq.sum()) ** 0.5
    assert whole == pytest.approx(figures(refs, outs).cosine, abs=1e-12)  # per-sample sums are exact

    same = margins(sample_stats(refs, refs), ["cos", "top1"], ["cos", "top1"])
    assert same.below == {"cos": 0.0, "top1": 0.0} and same.above == {"cos": 0.0, "top1": 0.0}
    small, large = (margins(sample_stats(*outputs(noise)), ["cos"], ["cos"]) for noise in (0.1, 0.6))
    assert 0 < small.below["cos"] < large.below["cos"] and 0 < small.above["cos"] < large.above["cos"]
    assert margins(sample_stats(*outputs(0.6)), ["cos"], []) == margins(sample_stats(*outputs(0.6)), ["cos"], [])  # seeded


def test_a_floor_met_at_its_point_estimate_is_not_met_with_the_margin():
    refs, outs = outputs(0.3)
    measured = figures(refs, outs)
    margin = margins(sample_stats(refs, outs), ["cos"], [])
    at_the_figure = Floor((("cos", measured.cosine),), "--floor")
    assert at_the_figure.met_by(measured) and not at_the_figure.met_by(measured, margin)
    below = Floor((("cos", measured.cosine - 2 * margin.below["cos"]),), "--floor")
    assert below.met_by(measured, margin)


def test_labels_give_a_paired_margin_of_the_accuracy_drop_and_said_in_words():
    refs, outs = outputs(0.8, samples=64)
    labels = refs[0].argmax(dim=1).tolist()  # the FP32 model right on every sample
    stats = sample_stats(refs, outs, labels)
    margin = margins(stats, [], ["top1"])
    measured: Figures = figures(refs, outs, labels)
    assert measured.fp32_top1_accuracy == 1.0 and 0 < margin.above["top1"] < 0.25
    assert margin.said(["top1"]).startswith("top-1 drop +")

"""How often the plan's 95 % bounds (pipeline/precision/bounds.py) hold the truth, measured by
drawing samples of known truth and asking the product's own ``bounds()``.

Each sample is a classifier's ten scores: FP32's ``ref ~ N(0, I)`` and the variant's
``out = ref + s·ε``, ``ε ~ N(0, I)``, with the sample's error scale ``s``:

* **even**: ``s = s0`` on every sample;
* **log-normal σ 1** and **σ 1.5**: ``s = s0·exp(σZ)``, so the error energy ``s²‖ε‖²`` is log-normal
  with σ 2 and 3 on the log scale — at σ 3 the samples above the 97th percentile carry 86 % of the
  mean, beyond what 32 samples usually see;
* **outliers**: ``s = s0``, and on one sample in ten (drawn independently) ``s0`` times 10–30 (uniform);
* **rare**: the same with a few samples in a hundred, tens of times the rest's error — 3 in 100 at
  20–60×, 1 in 100 at 30–100× — which carry 98 % of the error energy, and which most draws of 32
  hold none of (0.97³² = 38 %, 0.99³² = 72 %): what the samples cannot see.

``s0`` is set per scenario so the mean error energy ``E[s²]`` is 0.02 a value (cosine ≈ 0.990). Four
figures are bounded, each from the same samples:

* **cosine** (the global cosine over every value), its lower bound; truth ``1/√(1 + E[s²])``, analytic
  (``E[ref·out] = E‖ref‖²``, ``E‖out‖² = E‖ref‖²(1 + E[s²])``);
* **the user's metric**, batches of ``BATCH`` samples: a sample's FP32 score ``0.8 + 0.1·N(0,1)``, the
  variant's that less its drop ``s²‖ε‖²/10 + E[s²]·N(0,1)/2`` (its error, and noise of either sign);
  the drop's upper bound; truth ``E[s²]``, analytic;
* **top-1 against labels**, the net drop (lost − gained)/n's upper bound: a sample's label is FP32's
  class, or on one sample in five another class (uniform); truth from an independent draw of
  ``TRUTH_SAMPLES`` samples (its standard error, about 1e-4, is a twentieth of the bound's margin at
  n = 2048);
* **the floor each input must keep**, the share of samples whose own cosine is at least
  ``SAMPLE_COSINE`` (0.98), its lower bound (the exact binomial bound of the share below); truth from
  the same independent draw (11 % below under even errors, 3–9 % under the others, the rare samples
  alone under rare ones).
  The count below is binomial whatever the errors' shape, so its coverage is summed over every
  count (``exact_coverage``), and the draws' share is printed beside it: 1500 draws of a coverage of
  95.3 % show 94.7 % one time in fifty, which says nothing of the bound.

A cell's coverage is the share of its trials that make no false claim — the bound holds the truth,
or no bound is stated (one sample carries most of the cosine's error: the figure is unresolved, and
the table says how often) — printed with its exact one-sided 95 % lower bound over the trials
(Clopper–Pearson); CI asserts each is at least 94 %, but for the bounds of a mean (the cosine, the
metric) under rare errors, whose rows say how often the bound is false: they are what a mean's
bound cannot cover, and the floor each input must keep is what does.
Everything is seeded and computed in float64, so every machine prints the same table.

    python scripts/coverage_of_bounds.py               # the table docs/bounds.md shows
    python scripts/coverage_of_bounds.py --trials 300  # quicker, coarser
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from pipeline.catalog.floor import AccuracyFloor
from pipeline.precision.bounds import SampleStats, bounds
from pipeline.precision.figures import sample_cosines
from pipeline.precision.one_sided import binomial_cdf, exact_lower

SIZES = (32, 128, 512, 2048)
TRIALS = 1500  # a cell covering 96 % has an exact lower bound of about 95 %
CLASSES = 10
BATCH = 8
MEAN_SQUARE = 0.02  # E[s²]: the mean error energy a value
TRUTH_SAMPLES = 1 << 21
SEED = 75
SAMPLE_COSINE = 0.98  # the per-sample floor's threshold: 1 % to 11 % of samples below it, by the errors
FIGURES = ("cosine", "metric", "top-1 net drop", "per-sample cosine")
FLOORS = {  # limits far from the figures: what is scored is the bound against the truth
    "cosine": AccuracyFloor((("cos", 0.5),), "coverage"),
    "metric": AccuracyFloor((), "coverage", (("metric", 1.0),)),
    "top-1 net drop": AccuracyFloor((), "coverage", (("top1", 0.5),)),
    "per-sample cosine": AccuracyFloor((), "coverage", (), (("cos", SAMPLE_COSINE, 0.5),)),
}
MEANS = ("cosine", "metric")  # bounds of a mean: what rare errors can hide from


@dataclass(frozen=True)
class Errors:
    """A scenario of per-sample error scales: ``kind`` and its log-normal ``sigma``."""

    name: str
    kind: str
    sigma: float = 0.0
    share: float = 0.0  # outliers: the chance a sample is one
    times: tuple[float, float] = (10.0, 30.0)  # outliers: their error scale over the rest's, uniform between
    rare: bool = False  # a few in a hundred: rows that say how often a mean's bound is false

    def base(self) -> float:
        """``s0``: the scale that makes E[s²] = MEAN_SQUARE."""
        if self.kind == "log-normal":
            return math.sqrt(MEAN_SQUARE / math.exp(2 * self.sigma**2))
        if self.kind == "outliers":  # E[U²] for U uniform on a–b is (b³ − a³)/(3(b − a))
            low, high = self.times
            return math.sqrt(MEAN_SQUARE / (1 - self.share + self.share * (high**3 - low**3) / (3 * (high - low))))
        return math.sqrt(MEAN_SQUARE)

    def mean_size(self) -> float:
        """E‖out − ref‖/√10: E[s] times the mean of a χ on 10 degrees of freedom over √10."""
        factor = {"log-normal": math.exp(self.sigma**2 / 2), "outliers": 1 - self.share + self.share * sum(self.times) / 2}.get(
            self.kind, 1.0
        )
        return self.base() * factor * math.sqrt(2 / CLASSES) * math.exp(math.lgamma((CLASSES + 1) / 2) - math.lgamma(CLASSES / 2))

    def scales(self, rng, n: int):
        if self.kind == "log-normal":
            return self.base() * np.exp(self.sigma * rng.standard_normal(n))
        if self.kind == "outliers":
            factor = np.where(rng.random(n) < self.share, rng.uniform(*self.times, n), 1.0)
            return self.base() * factor
        return np.full(n, self.base())


ERRORS = (
    Errors("even", "even"),
    Errors("log-normal σ 1", "log-normal", 1.0),
    Errors("log-normal σ 1.5", "log-normal", 1.5),
    Errors("outliers (1 in 10, 10-30x)", "outliers", share=0.1),
    Errors("rare (3 in 100, 20-60x)", "outliers", share=0.03, times=(20.0, 60.0), rare=True),
    Errors("rare (1 in 100, 30-100x)", "outliers", share=0.01, times=(30.0, 100.0), rare=True),
)


def draw(errors: Errors, n: int, rng) -> SampleStats:
    """n samples of a scenario, as the product keeps them (pipeline/precision/bounds.py's SampleStats)."""
    ref = rng.standard_normal((n, CLASSES))
    scale = errors.scales(rng, n)
    out = ref + scale[:, None] * rng.standard_normal((n, CLASSES))
    labels = np.where(rng.random(n) < 0.2, rng.integers(0, CLASSES, n), ref.argmax(1))
    size = np.sqrt(((out - ref) ** 2).sum(1) / CLASSES)
    fp32 = 0.8 + 0.1 * rng.standard_normal(n)
    mine = fp32 - size - errors.mean_size() / 2 * rng.standard_normal(n)
    batches = np.arange(n) // BATCH
    sizes = np.bincount(batches).astype(float)
    return SampleStats(
        dot=(ref * out).sum(1),
        ref_sq=(ref * ref).sum(1),
        out_sq=(out * out).sum(1),
        agree=ref.argmax(1) == out.argmax(1),
        correct=out.argmax(1) == labels,
        fp32_correct=ref.argmax(1) == labels,
        metric=np.bincount(batches, mine) / sizes,
        fp32_metric=np.bincount(batches, fp32) / sizes,
        batch_sizes=sizes,
    )


def truths(errors: Errors, seed: int) -> dict[str, float]:
    """Each figure's truth: analytic for cosine and the metric; the net drop from an independent draw."""
    rng = np.random.default_rng((seed, 1))
    lost = gained = below = 0
    for _ in range(TRUTH_SAMPLES // (1 << 18)):
        stats = draw(errors, 1 << 18, rng)
        lost += int(np.sum(stats.fp32_correct & ~stats.correct))
        gained += int(np.sum(~stats.fp32_correct & stats.correct))
        below += int(np.sum(~(sample_cosines(stats.dot, stats.ref_sq, stats.out_sq) >= SAMPLE_COSINE)))
    truth = {"cosine": 1 / math.sqrt(1 + MEAN_SQUARE), "metric": errors.mean_size()}
    return {**truth, "top-1 net drop": (lost - gained) / TRUTH_SAMPLES, "per-sample cosine": 1 - below / TRUTH_SAMPLES}


def coverage(errors: Errors, n: int, trials: int, truth: dict[str, float], seed: int, unbounded: dict | None = None) -> dict[str, int]:
    """Of ``trials`` draws of n samples, how many make no false claim, figure by figure: the bound
    holds the truth, or no bound is stated (one sample carries most of the cosine's error: the
    figure is then unresolved, a plan on it not confirmed). ``unbounded`` counts the latter."""
    rng = np.random.default_rng((seed, n))
    held = dict.fromkeys(FIGURES, 0)
    for _ in range(trials):
        stats = draw(errors, n, rng)
        for figure in FIGURES:
            (bound,) = bounds(stats, FLOORS[figure])
            if bound.bound is None:
                held[figure] += 1
                if unbounded is not None:
                    unbounded[figure] = unbounded.get(figure, 0) + 1
                continue
            held[figure] += bound.bound <= truth[figure] if bound.side == "lower" else bound.bound >= truth[figure]
    return held


def exact_coverage(n: int, kept: float) -> float:
    """The per-sample floor's coverage over every outcome of n samples, of which a share 1 − ``kept``
    falls below its threshold. The count below is Binomial(n, 1 − kept) whatever the errors' shape,
    and the bound falls as the count grows: it holds the truth from the least count at which the
    product's own ``bounds()`` says so (found by bisection), and the chance of that count or more
    is the coverage — no draw's noise in it."""

    def holds(below: int) -> bool:
        ones = np.ones(n)
        cosines = np.where(np.arange(n) < below, 0.0, 1.0)  # unit outputs: a sample's cosine is its dot
        (bound,) = bounds(SampleStats(cosines, ones, ones, None, None, None), FLOORS["per-sample cosine"])
        return bound.bound <= kept

    low, high = -1, n  # not holding at low (none), holding at high (every sample below: a bound of 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle, high)
    return 1.0 - binomial_cdf(high - 1, n, 1.0 - kept) if high > 0 else 1.0


def table(trials: int = TRIALS, sizes=SIZES) -> list[tuple[str, str, int, int, int, int, float | None]]:
    """(figure, errors, n, trials, held, unbounded, exact) for every cell; ``exact`` the per-sample
    floor's coverage over every outcome (``exact_coverage``), None for the others."""
    rows = []
    for index, errors in enumerate(ERRORS):
        truth = truths(errors, SEED + index)
        for n in sizes:
            unbounded: dict[str, int] = {}
            held = coverage(errors, n, trials, truth, SEED + index, unbounded)
            exact = {"per-sample cosine": exact_coverage(n, truth["per-sample cosine"])}
            rows += [(figure, errors.name, n, trials, held[figure], unbounded.get(figure, 0), exact.get(figure)) for figure in FIGURES]
    return rows


def markdown(rows) -> str:
    """One line per figure and errors, a column per n: coverage (its exact 95 % lower bound over the
    draws; under rare errors, the share of draws whose bound is false; the share of draws with no
    bound stated, where there were any). The per-sample floor's: its coverage over every outcome,
    then the draws' share that held."""
    sizes = sorted({row[2] for row in rows})
    lines = ["| figure | errors | " + " | ".join(f"n = {n}" for n in sizes) + " |", "|---|---|" + "---|" * len(sizes)]
    for figure in FIGURES:
        for errors in ERRORS:
            cells = {n: row[3:] for row in rows if row[:2] == (figure, errors.name) for n in (row[2],)}
            text = []
            for trials, held, none, exact in (cells[n] for n in sizes):
                notes = [f"{exact_lower(held, trials):.1%}"] if exact is None else [f"drawn {held / trials:.1%}"]
                notes += [f"false {(trials - held) / trials:.1%}"] if errors.rare else []
                notes += [f"no bound {none / trials:.1%}"] if none else []
                text.append(f"{held / trials if exact is None else exact:.1%}{' exact' if exact is not None else ''} ({'; '.join(notes)})")
            lines.append(f"| {figure} | {errors.name} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=TRIALS, help=f"draws a cell (default {TRIALS})")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = table(args.trials)
    print(markdown(rows))
    print(f"\n{len(rows)} cells, {args.trials} trials each, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

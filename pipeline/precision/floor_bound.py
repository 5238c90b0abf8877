"""One floor metric's bound on one set of samples (``Bound``): its figure, its one-sided 95 %
bound, its status against the floor's limit, how many samples would show the limit, and what it
tells the user. How each bound is computed: pipeline/precision/bounds.py; what the methods
guarantee: docs/bounds.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from pipeline.precision.one_sided import MOST_SAMPLES, exact_upper, net_drop_upper

CONFIDENCE = 0.95  # one-sided: a threshold's figure at its lower bound, a drop at its upper
POWER = 0.80  # the chance that the samples a bound asks for show its limit
ALPHA = 1.0 - CONFIDENCE
EXACT = "exact binomial (Clopper-Pearson)"
PAIRED = "paired exact binomial (discordant samples, Clopper-Pearson)"
HEAVY_TAILED = "skew-corrected t or log-normal (the larger)"
NO_BOUND = "none: one batch"
ONE_SAMPLE = "none: one sample carries most of the error"
SHORT = {
    EXACT: "exact",
    PAIRED: "paired exact",
    HEAVY_TAILED: "heavy-tailed",
    NO_BOUND: "no bound: one batch",
    ONE_SAMPLE: "no bound: one sample carries most of the error",
}
# A limit's metric, as "loosen the cosine limit" says it, and as a sentence names it.
NAMES = {"cos": "cosine", "top1": "top-1", "metric": "metric", "sample_cos": "per-sample cosine"}
SAID = {**NAMES, "metric": "the metric"}


@dataclass(frozen=True)
class Bound:
    """One floor metric on one set of samples: its figure, its one-sided bound, whether the floor
    holds by it, and about how many samples would show the limit."""

    metric: str  # "cos", "top1", "metric"; "sample_cos": the share of inputs keeping a per-sample cosine
    side: str  # "lower": a threshold the figure must reach; "upper": a drop it may not pass
    limit: float  # the floor's threshold or largest drop; for a per-sample floor, the share of inputs
    estimate: float  # the figure (a drop for "upper") on these samples
    bound: float | None  # its one-sided CONFIDENCE bound; None where nothing bounds it (NO_BOUND)
    method: str
    samples: int
    # Proportions: the samples counted against the floor, and what they are ("changed": the
    # predicted class is not FP32's; "lost": FP32's is right against the label, the variant's is
    # not; "below": below a per-sample floor's threshold); whether ``samples`` can show the limit
    # at all (module docstring).
    counted: int | None = None
    counting: str | None = None
    resolvable: bool = True
    samples_needed: int | None = None  # the best-outcome floor on samples; None: no count can, or not a proportion
    gained: int | None = None  # top-1 against labels: FP32's is wrong, the variant's right
    # Searched only when asked (``samples_for_power``): the search asks for bounds hundreds of times.
    power_search: Callable[[], int | None] | None = field(default=None, compare=False, repr=False)
    threshold: float | None = None  # a per-sample floor's: the figure each input must keep

    @cached_property
    def samples_for_power(self) -> int | None:
        """About how many samples would show the limit with a POWER chance at the rates seen here,
        never fewer than ``samples_needed``; None where no number can (module docstring)."""
        return None if self.power_search is None else self.power_search()

    @property
    def held(self) -> bool:
        """By the bound (the figure where there is none); where the samples cannot resolve the
        limit, by no sample counted against it."""
        if not self.resolvable:
            return self.counted == 0
        return self._within(self.estimate if self.bound is None else self.bound)

    @property
    def status(self) -> str:
        """ "held": the bound is on the right side of the limit; "failed": the figure itself is
        past it; "unresolved": the figure is within it, its bound is not (or there is none)."""
        if not self._within(self.estimate):
            return "failed"
        return "held" if self.bound is not None and self._within(self.bound) else "unresolved"

    def _within(self, value: float) -> bool:
        if self.side == "lower":
            return value >= self.limit - 1e-12  # within float rounding: FP32 against itself
        return value <= self.limit + 1e-12

    def as_dict(self) -> dict[str, Any]:
        kept = {name: getattr(self, name) for name in (f.name for f in fields(self)) if name not in ("power_search", "gained")}
        return {**kept, "samples_for_power": self.samples_for_power, "held": self.held, "status": self.status}

    def said(self) -> str:
        """ "top-1 drop ≤ 8.9% (0 of 32 lost, 0 gained, paired exact)", "cosine ≥ 0.99912 (heavy-tailed)",
        "per-sample cosine below 0.99 on ≤ 8.9% of inputs (0 of 32 below, exact)"."""
        if self.metric == "sample_cos":  # said as the share below, which is what is counted
            counted = f"{self.counted} of {self.samples} below, {SHORT.get(self.method, self.method)}"
            return f"per-sample cosine below {self.threshold:g} on ≤ {1 - self.bound:.1%} of inputs ({counted})"
        name = {"cos": "cosine", "top1": "top-1", "metric": "metric"}[self.metric]
        what = f"{name} drop" if self.side == "upper" else name
        if self.bound is None:
            figure = f"{self.estimate:.1%}" if self.metric == "top1" else f"{self.estimate:.5g}"
            return f"{what} {figure} ({SHORT[self.method]})"
        value = f"{self.bound:.1%}" if self.metric == "top1" else f"{self.bound:.5g}"
        counted = f"{self.counted} of {self.samples} {self.counting}, " if self.counted is not None else ""
        counted += f"{self.gained} gained, " if self.gained is not None else ""
        return f"{what} {'≤' if self.side == 'upper' else '≥'} {value} ({counted}{SHORT.get(self.method, self.method)})"

    def unresolved_said(self) -> str:
        """Why the samples cannot show this limit, what is asked instead, and the one thing to try."""
        return f"{self.why_unresolvable()}; {self.advice()}"

    def why_unresolvable(self) -> str:
        """ "32 samples cannot show a top-1 drop of at most 1.00% at 95% confidence: even none lost
        bounds it at 9.6%; the floor asks instead that none be lost"."""
        none = net_drop_upper(0, 0, self.samples) if self.method == PAIRED else exact_upper(0, self.samples)
        best = none if self.side == "upper" else 1 - none
        return (
            f"{self.samples} samples cannot show {self._limit_said()} at {CONFIDENCE:.0%} confidence: even none {self.counting} "
            f"bounds it at {best:.1%}; the floor asks instead that none be {self.counting}"
        )

    def advice(self) -> str:
        """The one thing to try where this limit is not shown: the samples that would show it at
        the rates seen here, or why no number of them would and what to change instead. Every TIP
        and every line that says what would resolve a limit says this, so that none contradicts another."""
        name = NAMES[self.metric]
        if self.method == ONE_SAMPLE:
            more = (
                f"about {self.samples_for_power} samples (--samples {self.samples_for_power})" if self.samples_for_power else "more samples"
            )
            return f"evaluate on {more}, so that no one sample sets the figure"
        if self.method == NO_BOUND:
            return "give the data hook several batches (a smaller batch size): the metric's bound is over the batches"
        if self.samples_for_power is not None:  # at the rates seen; the best-outcome floor below it
            advice = f"pass --samples {self.samples_for_power} to resolve it with an {POWER:.0%} chance at the rates seen here"
            needed = self.samples_needed
            return advice + (f" (no fewer than {needed} could)" if needed is not None and self.samples_for_power > needed else "")
        if self.metric == "sample_cos" and self.samples_needed is None:
            return "no number of samples shows that every input keeps it: ask it of a share of them (sample-cos=0.99@99%)"
        if (self.counted is not None and self.samples_needed is None) or self._exactly_no_change():
            return f"no number of samples shows a limit of exactly no change: loosen the {name} limit"
        if self.status == "failed":
            seen = (
                f"at the rate seen here ({self.counted} of {self.samples} {self.counting}) the figure" if self.counted is not None else ""
            )
            seen = seen or f"the figure seen here ({name}{' drop' if self.side == 'upper' else ''} {self.estimate:.5g})"
            return f"{seen} is past the limit: more samples would not show it; loosen the {name} limit"
        return f"at the rates seen here no number of samples up to {MOST_SAMPLES} shows it: loosen the {name} limit"

    def _exactly_no_change(self) -> bool:
        return (self.side == "upper" and self.limit <= 0) or (self.side == "lower" and self.limit >= 1 and self.metric != "metric")

    def warning(self) -> tuple[str, str] | None:
        """What to tell the user where the limit is not shown, and what to try (a WARNING and its
        TIP, ``advice``); None where the metric held or failed by its figure."""
        if self.status != "unresolved":
            return None
        name = SAID[self.metric]
        if self.bound is None and self.method == ONE_SAMPLE:
            return (
                f"one of the {self.samples} samples carries most of the {name}'s error: they cannot bound it at "
                f"{CONFIDENCE:.0%}, and its limit is not shown, only its figure",
                self.advice(),
            )
        if self.bound is None:
            return (
                f"{name} is measured over one batch: it has no {CONFIDENCE:.0%} bound, and its limit is not shown, only its figure",
                self.advice(),
            )
        return f"{self.samples} samples do not show {self._limit_said()} at {CONFIDENCE:.0%}: {self.said()}", self.advice()

    def _limit_said(self) -> str:
        if self.metric == "sample_cos":
            return f"per-sample cosine ≥ {self.threshold:g} on at least {self.limit:.2%} of inputs"
        name = SAID[self.metric]
        value = f"{self.limit:.2%}" if self.metric == "top1" else f"{self.limit:.5g}"
        return f"a {name} drop of at most {value}" if self.side == "upper" else f"{name} of at least {value}"


def one_advice(bounds: list[Bound]) -> str | None:
    """One thing to try for every limit of ``bounds`` not shown (None where each is): where more
    samples cannot show one of them, that one's advice — more samples would not help; else the
    largest count any of them asks for, which shows the others too at the rates seen here."""
    open_ = [bound for bound in bounds if bound.status != "held"]
    stuck = [bound for bound in open_ if bound.samples_for_power is None]
    if stuck:
        return stuck[0].advice()
    return max(open_, key=lambda bound: bound.samples_for_power).advice() if open_ else None


def samples_to_resolve(side: str, limit: float, confidence: float = CONFIDENCE) -> int | None:
    """The fewest samples whose best outcome (none changed) shows ``limit``: None where none do."""
    alpha = 1.0 - confidence
    share = limit if side == "upper" else 1.0 - limit  # the changed share the limit allows
    if share >= 1.0:
        return 1
    if share <= 0.0:
        return None
    return math.ceil(math.log(alpha) / math.log1p(-share) - 1e-9)

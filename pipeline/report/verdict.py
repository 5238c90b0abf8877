"""The answer first: what every report opens with.

**The verdict**, per model and shape point (and GPU type): the engine whose own accuracy meets the
floor and that is faster than every other such engine *with confidence*
(pipeline/report/confidence.py: paired round by round where they were timed together); where the
data cannot tell two apart it says they tie (within the tie width) or are undecided, and names
both. Its speedup over the catalog's baseline toolchain comes with its interval and rounds; every
engine left out is named with why — too inaccurate, refused or failed (out of memory at that
point), a measurement on a busy or throttled machine, repeats that disagree. A noisy engine is not
left out: when it is faster with confidence, it is the answer.

Built from comparison rows only (pipeline/report/rows.py), so every format says the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog.floor import AccuracyFloor, AccuracyThreshold
from pipeline.catalog.shape import shown
from pipeline.measuring.pace import HOST_SWING
from pipeline.measuring.ranking import MEDIAN, Ranking
from pipeline.measuring.stats import RatioEstimate
from pipeline.report import pairs
from pipeline.report.confidence import interval_words, time_ratio
from pipeline.report.flags import LAUNCH_BOUND, UNTRUSTED, launch_bound
from pipeline.report.gates import accuracy_shortfalls
from pipeline.report.gpus import gpu_type_judged_on, gpu_words, measured_on
from pipeline.report.ranked_decision import decide_by_percentile, reading_for
from pipeline.report.reasons import grouped_reasons
from pipeline.report.rows import ComparisonRow, shape_order

# The tie width when the catalog gives none ([profile] tie).
TIE = 0.03
# The flag of an engine that failed its precision's own accuracy check (the flags that make a
# row's number untrustworthy are flags.UNTRUSTED).
INACCURATE = "inaccurate"


def times(shape: str | None) -> str:
    return shown(shape)


def line_label(row: ComparisonRow) -> str:
    return f"{row.variant} on {row.target}"


def exclusion(row: ComparisonRow, thresholds: tuple[AccuracyThreshold, ...]) -> str | None:
    """Why the verdict leaves this row out, or None when it is a candidate."""
    if row.median_ms is None:
        return row.status
    # Accuracy first: an engine below the floor is no answer even when every measurement is
    # untrustworthy (the verdict then falls back on the rows left out for their measurement alone).
    # A floor given replaces each precision's own check (its "inaccurate" flag).
    if thresholds:
        shortfalls = accuracy_shortfalls(row, thresholds) if row.accuracy_source == "measured" else []
        if shortfalls:
            return "below the accuracy floor: " + ", ".join(shortfalls)
    else:
        inaccurate = [flag for flag in row.flags if flag.startswith(INACCURATE)]
        if inaccurate:
            return inaccurate[0]
    if row.status.startswith("unstable"):
        return row.status.split(":", 1)[0] + ": its measurements disagree"
    for flag in row.flags:
        if flag.startswith(UNTRUSTED):
            return flag
    return None


@dataclass
class Verdict:
    """The answer for one model at one shape point (None: a model of one shape) and GPU type."""

    model: str
    shape: str | None
    gpu_type: str | None
    fastest: ComparisonRow | None
    # The catalog's baseline toolchain's row it is measured against (same variant where there is one).
    baseline: ComparisonRow | None
    excluded: list[tuple[ComparisonRow, str]] = field(default_factory=list)
    # Rows skipped outright (a toolchain that cannot run a variant): counted, not listed.
    skipped: list[ComparisonRow] = field(default_factory=list)
    # Rows whose work did not fit in memory at this point: a result, named apart from the others.
    did_not_fit: list[ComparisonRow] = field(default_factory=list)
    # When every accurate measurement was untrustworthy (a busy machine): the fastest of them, said
    # with that caveat instead of no answer at all.
    untrusted: bool = False
    # The accuracy the answer had to keep (--fail-accuracy-below, the catalog's, or each precision's own check).
    floor: AccuracyFloor = AccuracyFloor()
    # The candidates no other one is faster than with confidence, beside the fastest: the data
    # cannot tell them from it (a tie within ±tie, or undecided).
    tied: list[ComparisonRow] = field(default_factory=list)
    # The engines the answer was chosen among (accurate, measured on a quiet machine).
    candidates: list[ComparisonRow] = field(default_factory=list)
    # The candidates out by the rule that took them out of their rounds, grossly slower than the
    # least median (pairs.grossly_beaten): compared with nothing.
    grossly_slower: list[ComparisonRow] = field(default_factory=list)
    # The comparisons the answer rests on (A's time over B's): the least median against every other
    # candidate, every two of those it cannot be told from, and the baseline's against each of the
    # fastest and the tied (_decide says why these are enough).
    comparisons: list[tuple[ComparisonRow, ComparisonRow, RatioEstimate | None]] = field(default_factory=list)
    tie: float = TIE
    # Whether two engines of the answer and its tied ones are not the same, as _decide found it
    # (None: found from the comparisons).
    undecided_among: bool | None = None
    # What it ranked by: the median (None), or a percentile's reading of the candidates
    # (pipeline/report/ranked_decision.py, ``--by p99``).
    reading: Any = None
    # Ranked by a figure the baseline toolchain's engine lacks (no energy reading): why there is no
    # baseline to set the answer against.
    baseline_unranked: bool = False
    # The comparisons by the two rows' ids, kept in step with the list by ratio().
    _by_pair: dict[tuple[int, int], RatioEstimate | None] = field(default_factory=dict, repr=False)

    def _pairs(self) -> dict[tuple[int, int], RatioEstimate | None]:
        """The comparisons by the two rows' ids, brought up to date with the list."""
        if len(self._by_pair) != len(self.comparisons):
            self._by_pair = {(id(first), id(second)): estimate for first, second, estimate in self.comparisons}
        return self._by_pair

    def ratio(self, a: ComparisonRow, b: ComparisonRow) -> RatioEstimate | None:
        """A's time over B's, from the comparisons made (None: not compared, or no interval)."""
        by_pair = self._pairs()
        if (id(a), id(b)) in by_pair:
            return by_pair[(id(a), id(b))]
        estimate = by_pair.get((id(b), id(a)))
        return estimate.inverse() if estimate is not None else None

    def compared(self, a: ComparisonRow, b: ComparisonRow) -> bool:
        by_pair = self._pairs()
        return (id(a), id(b)) in by_pair or (id(b), id(a)) in by_pair

    @property
    def speedup_estimate(self) -> RatioEstimate | None:
        """The baseline's time over the answer's, with its interval."""
        if self.fastest is None or self.baseline is None or self.baseline is self.fastest:
            return None
        return self.ratio(self.baseline, self.fastest)

    @property
    def speedup(self) -> float | None:
        if self.fastest is None or self.baseline is None:
            return None
        if self.baseline is not self.fastest and self._unbounded([self.baseline, self.fastest, *self.tied]):
            return None  # a ratio of percentiles their takes cannot bound is no evidence, as the words say (_speedups)
        estimate = self.speedup_estimate
        if estimate is not None and estimate.bounded:
            return estimate.ratio
        # Unpaired, or too few rounds for an interval: the medians, as the answer's words give it.
        return self.figure(self.baseline) / self.figure(self.fastest)

    def _unbounded(self, rows: list[ComparisonRow]) -> bool:
        """Whether any of ``rows`` lacks the figure the verdict ranks by, or has one its takes cannot
        bound (a percentile: ranked_decision.py)."""
        return self.reading is not None and any(self.reading.short_of_takes(row) for row in rows)

    @property
    def ranked_by(self) -> str:
        return "median" if self.reading is None else self.reading.by.name

    def figure(self, row: ComparisonRow) -> float:
        """The row's figure it was ranked by: its median, its percentile, or its joules per inference."""
        return row.median_ms if self.reading is None else self.reading.figure(row)

    def figure_words(self, row: ComparisonRow) -> str:
        """ "12.412 ms" (the median), "p99 12.412 ms [11.9–13.1]" (a percentile)."""
        return f"{row.median_ms:.3f} ms" if self.reading is None else self.reading.words(row)

    @property
    def unranked(self) -> bool:
        """Whether the answer is a lone candidate without the figure it is ranked by (no energy
        reading): named by nothing, so no answer."""
        return self.reading is not None and self.fastest is not None and not self.tied and self.reading.figure(self.fastest) is None

    @property
    def undecided(self) -> bool:
        """Whether some engine the data cannot tell from the answer is undecided, not a tie (or
        the answer is unranked)."""
        if self.unranked:
            return True
        if self.undecided_among is not None:
            return self.undecided_among
        group = [self.fastest, *self.tied]
        return any(
            (estimate := self.ratio(a, b)) is None or estimate.outcome != "same" for i, a in enumerate(group) for b in group[i + 1 :]
        )

    @property
    def where(self) -> str:
        parts = [self.model]
        if self.shape:
            parts.append(f"at {times(self.shape)}")
        if self.gpu_type:
            parts.append(f"on {self.gpu_type}")
        return " ".join(parts)

    def sentences(self) -> list[str]:
        """The verdict in words: the answer (or the engines the data cannot tell apart), the
        speedup over the baseline with its interval, then what was left out and why."""
        meeting = f" meeting {self.floor}" if self.floor.thresholds else ""
        out = []
        if self.fastest is None:
            out.append(f"{self.where}: no engine was measured and met the accuracy floor{f', {self.floor}' if meeting else ''}.")
        elif self.tied:
            group = [self.fastest, *self.tied]
            names = ", ".join(line_label(r) for r in group[:-1]) + f" and {line_label(group[-1])}"
            times_ms = " and ".join(f"{r.median_ms:.3f}" for r in group) + " ms"
            by = "" if self.reading is None else f" by {self.ranked_by}"
            if self.reading is not None:
                times_ms = "; ".join(words for r in group if (words := self.figure_words(r)))
            shown = f" ({times_ms})" if times_ms else ""
            if self.undecided:
                rounds = max((r.rounds or 0) for r in group)
                after = f"after {rounds} rounds" if rounds else "by their own intervals"
                short = [r for r in group if self.reading is not None and self.reading.short_of_takes(r)]
                if short:  # no interval to tell them apart by: say once what would give one
                    reasons = [(line_label(r), self.reading.needs(r)) for r in short]
                    alike = len(short) == len(group) and len({why for _, why in reasons}) == 1
                    after = f"({reasons[0][1]})" if alike else f"({'; '.join(grouped_reasons(reasons))})"
                # A longer budget could decide them, or bound their percentiles; not give a figure
                # none was read for (no energy counter: said above).
                readings = all(self.figure(r) is not None for r in group)
                budget = " (the point's budget_s ran out)" if readings and any(r.rounds_stop == "budget" for r in group) else ""
                answer = f"{self.where}: undecided{by}{meeting}: {names}{shown} cannot be told apart {after}{budget}"
                answer += self._apart_from_the_host(group)
            else:
                answer = f"{self.where}: {names} tie within ±{self.tie:.0%}{by}{meeting}{shown}"
            answer += self._speedups(group) + "."
            out.append(answer)
        else:
            row = self.fastest
            rate = f", {row.tokens_per_s:,.0f} tokens/s" if row.tokens_per_s else ""
            best = "fastest" if self.reading is None else self.reading.by.best
            fastest = f"no measurement can be trusted (below); the {best} of them" if self.untrusted else best
            by = "" if self.reading is None or best != "fastest" else f" by {self.ranked_by}"
            if self.unranked:
                answer = (
                    f"{self.where}: undecided by {self.ranked_by}{meeting}: {line_label(row)} cannot be ranked ({self.reading.needs(row)})"
                )
            else:
                answer = f"{self.where}: {fastest}{by}{meeting} is {line_label(row)}, {self.figure_words(row)}{rate}{self._sureness()}"
            out.append(answer + self._speedups([row]) + ".")
        gpus = measured_on([*self.candidates, *(row for row, _ in self.excluded)])
        if len(gpus) > 1:
            where = "; ".join(f"{gpu_words(device)}: {', '.join(line_label(r) for r in rows)}" for device, rows in gpus.values())
            out.append(
                f"Its engines were measured on {len(gpus)} GPUs ({where}), not in one set of rounds: "
                "they are compared by their own intervals, unpaired."
            )
        if self.fastest is not None and self.fastest.accuracy_unchecked:
            out.append(f"Its accuracy here is unchecked: {self.fastest.accuracy_unchecked.rstrip('.')}.")
        if self.did_not_fit:
            out.append("Did not fit: " + "; ".join(f"{line_label(row)} ({row.status.rstrip('.')})" for row in self.did_not_fit) + ".")
        if self.excluded:
            out.append("Left out: " + "; ".join(grouped_reasons([(line_label(row), why) for row, why in self.excluded])) + ".")
        if self.skipped:
            out.append(f"{len(self.skipped)} not run (the table says why).")
        return out

    def _apart_from_the_host(self, group: list[ComparisonRow]) -> str:
        """Why the group's pairs timed apart that follow the host are read so wide (by the median:
        confidence.apart_ratio), naming those that follow it; nothing where there are none."""
        followers = pairs.followers_timed_apart(group) if self.reading is None else []
        if not followers:
            return ""
        if len(followers) == len(group):  # the sentence has just named them all
            who = "each follows the host's speed, timed apart from another"
        else:
            names = ", ".join(line_label(row) for row in followers)
            who = f"{names} {'follows' if len(followers) == 1 else 'follow'} the host's speed, timed apart from the rest"
        return (
            f" ({who}: the host may have run up to {HOST_SWING:g}x slower in one run than in another, so the ratio is read "
            "that much wider; profile them in one run to compare them closer)"
        )

    def _sureness(self) -> str:
        """How the answer beat the other candidates: ", faster than the 2 others with 95%
        confidence (paired over 6 rounds)"; nothing when it had none to beat. Only a comparison the
        answer won by its interval counts: one with an engine the least median beat (where the
        answer is another) may decide nothing, and one that left its rounds grossly slower was
        compared with nothing (pairs.grossly_beaten) — each is out by another's comparison."""
        others = [row for row in self.candidates if row is not self.fastest]
        against = [
            estimate for row in others if (estimate := self.ratio(self.fastest, row)) is not None and pairs.outcome(estimate) == "faster"
        ]
        if not against:
            return ""
        paired = sorted(e.rounds for e in against if e.paired)
        how = "by their own intervals"
        if paired:
            how = f"paired over {paired[0]} rounds" if paired[0] == paired[-1] else f"paired over {paired[0]}–{paired[-1]} rounds"
            how += ", the rest by their own intervals" if len(paired) < len(against) else ""
        gross = len(self.grossly_slower)
        compared = len(others) - gross
        count = "the other" if compared == 1 else f"the {compared} others"
        if len(against) < compared:
            count = f"{len(against)} of the {compared} others"
        dropped = f"; {gross} more left {'its' if gross == 1 else 'their'} rounds grossly slower" if gross else ""
        beats = "faster than" if self.reading is None else self.reading.by.beats
        return f", {beats} {count} with 95% confidence ({how}){dropped}"

    def _speedups(self, group: list[ComparisonRow]) -> str:
        if self.baseline is None and self.baseline_unranked:
            return f" — the baseline toolchain's engine has no {self.ranked_by} reading either"
        if self.baseline is None:
            return " — no baseline-toolchain row to compare with"
        if len(group) == 1 and group[0] is self.baseline:
            return " — the baseline toolchain itself"
        # The baseline's own 1.00× is no speedup: a group it belongs to is set against it by its others.
        others = [row for row in group if row is not self.baseline]
        # Too few rounds for an interval: the rounds' range is no speedup's bounds (the medians say it).
        estimates = [e if e is None or e.bounded else None for e in (self.ratio(self.baseline, row) for row in others)]
        whose = "" if len(others) == len(group) else ("the other " if len(others) == 1 else "the others ")
        base = f"{line_label(self.baseline)} ({self.figure_words(self.baseline)})"
        if launch_bound(self.baseline.flags):
            # Its time is the host's speed (pipeline/report/rows.py): another run's speedup may differ.
            base += f", {LAUNCH_BOUND}: the speedup follows the host's speed"
        if any(e is None for e in estimates) or not estimates:
            if self.figure(self.baseline) is None or any(self.figure(row) is None for row in others):
                return ""  # no figure to set against the baseline's (no energy reading): said above
            if self._unbounded([self.baseline, *others]):
                return f" — no speedup over the baseline ({line_label(self.baseline)}) is claimed while a {self.ranked_by} is unbounded"
            ratios = [self.figure(self.baseline) / self.figure(row) for row in others]
            return f" — {whose}{min(ratios):.2f}×" + (f"–{max(ratios):.2f}×" if len(ratios) > 1 else "") + f" {base}"
        if len(estimates) == 1:
            return f" — {whose}{estimates[0].ratio:.2f}× {base}, {interval_words(estimates[0])}"
        low, high = min(e.low for e in estimates), max(e.high for e in estimates)
        return f" — {whose or ('both ' if len(estimates) == 2 else 'all ')}{low:.2f}–{high:.2f}× {base}"

    def public(self) -> dict[str, Any]:
        from pipeline.report.verdict_json import verdict_document

        return verdict_document(self)


def verdicts(
    rows: list[ComparisonRow],
    baseline_toolchain: str | None,
    floors: dict[str, AccuracyFloor] | None = None,
    tie: float = TIE,
    by: Ranking = MEDIAN,
    samples=None,
) -> list[Verdict]:
    """One verdict per model, shape point and GPU type, in the rows' order; each model's engines
    held to its floor in ``floors`` (none there: each precision's own check), two engines whose
    time ratio lies within 1 ± ``tie`` called the same, ranked ``by`` their median or a percentile
    (``samples``: a row's per-iteration times, where a cached row lacks them)."""
    groups: dict[tuple[str, str | None, str | None], list[ComparisonRow]] = {}
    judged_on = gpu_type_judged_on(rows)
    for row in rows:
        groups.setdefault((row.model, judged_on(row), row.shape), []).append(row)
    # An engine refused or skipped before any point (its build) belongs to each point of a model
    # measured at several: said there, not as an answer of its own that no engine was measured.
    for model, gpu_type, shape in list(groups):
        points = [key for key in groups if key[:2] == (model, gpu_type) and key[2] is not None]
        if shape is None and points:
            for key in points:
                groups[key].extend(groups[(model, gpu_type, None)])
            del groups[(model, gpu_type, None)]
    model_order = {model: index for index, model in enumerate(dict.fromkeys(r.model for r in rows))}
    keys = sorted(groups, key=lambda k: (model_order[k[0]], k[1] or "", shape_order(k[2])))
    out = []
    for model, gpu_type, shape in keys:
        group = groups[(model, gpu_type, shape)]
        verdict = Verdict(model, shape, gpu_type, None, None, floor=(floors or {}).get(model, AccuracyFloor()), tie=tie)
        candidates = []
        for row in group:
            why = exclusion(row, verdict.floor.thresholds)
            if why is None:
                candidates.append(row)
            elif row.outcome == "out_of_memory":
                verdict.did_not_fit.append(row)
            elif row.status.startswith("skipped"):
                verdict.skipped.append(row)
            else:
                verdict.excluded.append((row, why))
        if not candidates:
            # Nothing clean: the accurate rows that only the measurement's conditions excluded.
            candidates = [row for row, why in verdict.excluded if why.startswith(UNTRUSTED) or row.status.startswith("unstable")]
            verdict.untrusted = bool(candidates)
        # The median has a path of its own (rows measured apart compared by their intervals, the
        # grossly slower); any other ranking is read by its reading (ranked_decision.py).
        if candidates and by == MEDIAN:
            _decide(verdict, candidates, group, baseline_toolchain)
        elif candidates:
            verdict.reading = reading_for(by, candidates, samples)
            decide_by_percentile(verdict, candidates, group, baseline_toolchain, verdict.reading)
        out.append(verdict)
    return out


def _decide(verdict: Verdict, candidates: list[ComparisonRow], group: list[ComparisonRow], baseline_toolchain: str | None) -> None:
    """The answer among the candidates: those no other candidate is faster than with confidence,
    the fastest of them first and the rest tied with it; a slower engine is never named over one
    that is faster with confidence.

    It makes the comparisons that answer needs, not every pair, which made a compare of thousands
    of engines at one point take minutes (scripts/benchmark_compare.py): the candidate of least
    median against each other one — those it beats are out whatever else they meet — then, among
    the rest ("close"), whether another beats each one: paired, pair by pair, where they were timed
    together, and by their intervals where they were not (pairs.beaten_apart, a sweep). The comparisons
    kept for the report are the ones made pair by pair: the least against every candidate, every
    two close ones, the answer against every candidate (but those the least dropped grossly slower,
    out by that rule alone) and the baseline against the answer's group (compare schema 9; up to
    8, every pair of a point timed in one set of rounds)."""
    verdict.candidates = candidates
    compare = pairs.EachPairOnce(candidates, lambda a, b: time_ratio(a, b, verdict.tie))  # A's time over B's

    least = min(candidates, key=lambda r: r.median_ms)
    # Out by the rule that took them out of the rounds, compared with nothing (pairs.grossly_beaten).
    verdict.grossly_slower = [row for row in candidates if row is not least and pairs.grossly_beaten(least, row)]
    dropped = {id(row) for row in verdict.grossly_slower}
    close = [row for row in candidates if row is least or (id(row) not in dropped and pairs.outcome(compare(least, row)) != "faster")]
    beaten = pairs.beaten_apart(close, verdict.tie)
    # The close ones timed in one set of rounds are compared pair by pair. Pairs of which one is
    # beaten by the least are not compared: their outcome decides nothing, and every comparison
    # made is a claim the point's confidence must cover (scripts/simulate_confidence.py counts
    # each; with all 45 pairs of ten engines a tie width apart, 8 % of points claimed a
    # difference inside the tie band).
    together: dict[str, list[ComparisonRow]] = {}
    for row in close:
        for set_of_rounds in row.round_medians:
            together.setdefault(set_of_rounds, []).append(row)
    for members in together.values():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                outcome = pairs.outcome(compare(a, b))
                if outcome == "faster":
                    beaten.add(id(b))
                elif outcome == "slower":
                    beaten.add(id(a))
    front = [row for row in close if id(row) not in beaten] or close
    verdict.fastest = min(front, key=lambda r: r.median_ms)
    verdict.tied = sorted((row for row in front if row is not verdict.fastest), key=lambda r: r.median_ms)
    if verdict.fastest is not least:  # the answer's sureness is said against every other candidate
        for row in candidates:
            if row is not verdict.fastest and id(row) not in dropped:
                compare(verdict.fastest, row)
    verdict.undecided_among = pairs.undecided([verdict.fastest, *verdict.tied], compare, verdict.tie)
    bases = [r for r in group if r.toolchain == baseline_toolchain and r.median_ms is not None]
    same = [r for r in bases if r.variant == verdict.fastest.variant]
    verdict.baseline = (same or sorted(bases, key=lambda r: r.median_ms) or [None])[0]
    verdict.comparisons = compare.made()
    if verdict.baseline is not None:  # the baseline itself may be no candidate (another variant, noisy)
        for row in [verdict.fastest, *verdict.tied]:
            if row is not verdict.baseline and not verdict.compared(verdict.baseline, row):
                verdict.comparisons.append((verdict.baseline, row, time_ratio(verdict.baseline, row, verdict.tie)))

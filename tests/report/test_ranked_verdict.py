"""The verdict ranked by a percentile (`pipeline compare --by p99`, pipeline/report/ranked_decision.py):
the answer by each engine's p99 bounded by its takes, at the level that holds the point's engines
together; "undecided" saying how many takes a p99 needs where they are too few; the median's
verdict as before; and the JSON saying what it ranked by."""

from __future__ import annotations

import numpy as np

from pipeline.measuring.ranking import MEDIAN, RANKINGS
from pipeline.report.row_times import tail_bounds, take_rounds
from pipeline.report.rows import ComparisonRow
from pipeline.report.verdict import verdicts
from tests.measuring.test_ranking import SPIKY, STEADY, Tailed, rounds


def rows_of(outcome, rounds_kept: int | None = None) -> list[ComparisonRow]:
    """The rows compare reads of the point's manifests (its first ``rounds_kept`` rounds)."""
    rows = []
    for entrant in outcome.entrants:
        record = outcome.record(entrant)
        if rounds_kept is not None:
            record = record.model_copy(update={"takes": [t for t in record.takes if t.round < rounds_kept], "rounds": rounds_kept})
        row = ComparisonRow(model="m", variant="fp16", toolchain=entrant, status="measured (GPU time)", outcome="measured")
        row.samples_ms = [run for take in record.takes for run in outcome.engines_runs[entrant][take.round]]
        row.median_ms = float(np.median(row.samples_ms))
        row.p90_ms, row.p99_ms = (float(value) for value in np.percentile(row.samples_ms, [90, 99]))
        take_rounds(row, [record])
        tail_bounds(row, [record])
        rows.append(row)
    return rows


def measured(rounds_kept: int | None = None, by: str = "p99") -> list[ComparisonRow]:
    outcome = rounds({"torch-eager": Tailed(SPIKY), "steady": Tailed(STEADY)}, by)
    outcome.engines_runs = {"torch-eager": [SPIKY] * outcome.rounds, "steady": [STEADY] * outcome.rounds}
    return rows_of(outcome, rounds_kept)


def test_by_p99_the_steadier_engine_is_the_answer_with_its_interval():
    rows = measured()
    (by_median,) = verdicts(rows, "torch-eager")
    (by_p99,) = verdicts(rows, "torch-eager", by=RANKINGS["p99"])
    assert by_median.fastest.toolchain == "torch-eager" and by_median.ranked_by == "median"
    assert by_p99.fastest.toolchain == "steady" and not by_p99.tied
    (sentence, *_) = by_p99.sentences()
    assert sentence == (
        "m: fastest by p99 is fp16 on steady, p99 1.200 ms [1.200–1.200], faster than the other with 95% confidence "
        "(by their own intervals) — 1.67× fp16 on torch-eager (p99 2.000 ms [2.000–2.000]), [1.67–1.67], unpaired."
    )
    (pair,) = by_p99.comparisons
    assert pair[2].outcome in ("faster", "slower") and pair[2].confidence == 0.95  # both engines' intervals, each at 97.5 %
    document = by_p99.public()
    assert document["ranked_by"] == "p99" and document["fastest"]["ranked_ms"] == 1.2
    assert document["fastest"]["ranked_interval_ms"] == [1.2, 1.2] and document["fastest"]["ranked_takes_needed"] is None


def test_the_medians_verdict_says_what_it_said_and_what_it_ranked_by():
    (verdict,) = verdicts(measured(), "torch-eager", by=MEDIAN)
    (sentence, *_) = verdict.sentences()
    assert sentence.startswith("m: fastest is fp16 on torch-eager, 1.000 ms, faster than the other with 95% confidence (paired over")
    document = verdict.public()
    assert document["ranked_by"] == "median" and document["fastest"]["ranked_ms"] == document["fastest"]["median_ms"]
    assert document["fastest"]["ranked_interval_ms"] == document["fastest"]["median_ci_ms"]


def test_takes_too_few_for_a_p99_leave_the_verdict_undecided_and_say_how_many_it_needs():
    rows = measured(rounds_kept=40)
    (verdict,) = verdicts(rows, "torch-eager", by=RANKINGS["p99"])
    assert verdict.undecided and {row.toolchain for row in [verdict.fastest, *verdict.tied]} == {"torch-eager", "steady"}
    assert all(estimate is None for *_, estimate in verdict.comparisons)
    (sentence, *_) = verdict.sentences()
    # No speedup from p99s their takes cannot bound: neither the words nor the JSON give one.
    assert sentence == (
        "m: undecided by p99: fp16 on steady and fp16 on torch-eager (p99 1.200 ms unbounded; p99 2.000 ms unbounded) "
        "cannot be told apart (p99 needs 437 takes, has 40) — no speedup over the baseline (fp16 on torch-eager) "
        "is claimed while a p99 is unbounded."
    )
    assert sentence.count("needs 437 takes") == 1  # said once, not for each engine
    document = verdict.public()
    assert document["fastest"]["ranked_takes_needed"] == 437
    assert document["speedup_over_baseline"] is None and document["speedup_interval"] is None

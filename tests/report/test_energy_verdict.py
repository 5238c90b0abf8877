"""The verdict ranked by energy (`pipeline compare --by energy`): paired round by round as the
median is, its words and JSON saying so, and an engine without a reading never ranked."""

from __future__ import annotations

import numpy as np

from pipeline.measuring.energy import NoEnergy
from pipeline.measuring.ranking import ENERGY, MEDIAN
from pipeline.report.energy import attach_energy
from pipeline.report.row_times import take_rounds
from pipeline.report.rows import ComparisonRow
from pipeline.report.verdict import verdicts
from tests.measuring.test_energy_ranking import rounds


def rows_of(outcome) -> list[ComparisonRow]:
    rows = []
    for entrant in outcome.entrants:
        record = outcome.record(entrant)
        row = ComparisonRow(model="m", variant="fp16", toolchain=entrant, status="measured (GPU time)", outcome="measured")
        row.median_ms = float(np.median([take.median_ms for take in record.takes]))
        take_rounds(row, [record])
        attach_energy(row, [record])
        rows.append(row)
    return rows


def test_by_energy_the_engine_spending_less_is_the_answer_paired():
    rows = rows_of(rounds("energy", energies=(1.5, 1.0), times=(1.0, 1.0)))
    (by_energy,) = verdicts(rows, "a", by=ENERGY)
    assert by_energy.fastest.toolchain == "b" and not by_energy.tied and by_energy.ranked_by == "energy"
    (sentence, *_) = by_energy.sentences()
    assert sentence.startswith("m: least energy is fp16 on b, energy 0.99") and "1.50× fp16 on a (energy 1.4" in sentence
    assert "J/inf, less energy per inference than the other with 95% confidence (paired over" in sentence
    (pair,) = by_energy.comparisons
    assert pair[2].paired and pair[2].outcome in ("faster", "slower")
    document = by_energy.public()
    assert document["ranked_by"] == "energy" and document["fastest"]["ranked_ms"] == rows[1].joules_per_inference
    assert document["fastest"]["ranked_interval_ms"] is None and document["fastest"]["ranked_takes_needed"] is None
    (by_median,) = verdicts(rows, "a", by=MEDIAN)  # the same rows by time: equal, a tie
    assert by_median.ranked_by == "median" and by_median.tied


def test_an_engine_without_an_energy_reading_is_never_ranked_by_it():
    rows = rows_of(rounds("energy", energies=(1.5, 1.0), times=(1.0, 1.0), gpu=NoEnergy("no NVML: stand-in")))
    (verdict,) = verdicts(rows, "a", by=ENERGY)
    assert verdict.undecided and all(estimate is None for *_, estimate in verdict.comparisons)
    (sentence, *_) = verdict.sentences()
    assert sentence.startswith(
        "m: undecided by energy: fp16 on a and fp16 on b cannot be told apart (no energy reading: no NVML: stand-in)"
    ), sentence
    assert sentence.endswith("the baseline toolchain's engine has no energy reading either.")  # not "no baseline-toolchain row"
    assert verdict.public()["undecided"]
    # Rounds that ran out of budget on the medians: no longer budget would give a reading, so none is blamed.
    for row in rows:
        row.rounds_stop = "budget"
    (verdict,) = verdicts(rows, "a", by=ENERGY)
    assert "budget_s" not in verdict.sentences()[0]


def test_a_lone_engine_without_an_energy_reading_is_not_named_the_least_energy():
    (_, lone) = rows_of(rounds("energy", energies=(1.5, 1.0), times=(1.0, 1.0), gpu=NoEnergy("no NVML: stand-in")))
    (verdict,) = verdicts([lone], "a", by=ENERGY)
    assert verdict.unranked and verdict.undecided
    (sentence,) = verdict.sentences()
    assert (
        sentence
        == "m: undecided by energy: fp16 on b cannot be ranked (no energy reading: no NVML: stand-in) — no baseline-toolchain row to compare with."
    )
    document = verdict.public()
    assert document["decided"] is False and document["undecided"] is True
    (timed,) = verdicts([lone], "a", by=MEDIAN)  # by time it is the answer, alone
    assert not timed.unranked and timed.public()["decided"] is True


def test_every_report_titles_the_answer_by_its_ranking():
    from pipeline.report.answer import Answer
    from pipeline.report.html import _answer

    answer = Answer(verdicts=verdicts(rows_of(rounds("energy", energies=(1.5, 1.0), times=(1.0, 1.0))), "a", by=ENERGY), sweeps=[])
    title = "The answer: the engine of least energy that meets the accuracy floor"
    assert answer.headline() == title
    assert answer.markdown().startswith(f"## {title}\n\n- m: least energy is fp16 on b")
    assert f"<h2>{title}</h2>" in _answer(answer)[0]

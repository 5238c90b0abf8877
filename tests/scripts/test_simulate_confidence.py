"""scripts/simulate_confidence.py: the product's own rounds and verdict, run on engines of known
truth, name a wrong fastest engine and claim a difference inside the tie band no more often than
the 95 % they claim — every look at the data and every pair of a point counted — with and without
racing; and docs/confidence.md shows the table this run prints."""

from __future__ import annotations

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def simulation(import_script):
    return import_script("simulate_confidence")


def test_the_answer_and_its_claims_are_wrong_no_more_often_than_the_confidence_it_states(simulation):
    table = simulation.simulate(simulation.POINTS)
    printed = simulation.markdown(table)
    print("\n" + printed)
    for scenario, noise, tallies in table:
        for rule, tally in tallies.items():
            where = f"{noise.name}, {scenario.name}, {rule}"
            assert tally.points == simulation.POINTS
            assert tally.wrong_fastest / tally.points <= 0.05, where
            assert tally.false_difference / tally.points <= 0.05, where
    # Racing spends the budget on the contenders: at the matrix-like point, which the budget ends,
    # they are timed for longer (rounds of a second at least: longer takes rather than more rounds).
    matrix = [tallies for scenario, _, tallies in table if scenario.name.startswith("10: 3 within")]
    assert all(t["racing"].contenders_s > 1.5 * t["every round"].contenders_s for t in matrix)
    assert printed in (REPO_ROOT / "docs" / "confidence.md").read_text(), "docs/confidence.md shows another table: paste the one above"


def test_the_simulation_catches_the_rule_it_replaced(simulation, monkeypatch):
    """The same harness, with the paired interval read as a fixed-n sign test after every round
    (the rule before the confidence sequence), finds pairs on the tie band's edge called faster
    or slower in more than 5 % of points on the CI VM's spells: the table can fail."""
    import pipeline.measuring.stats as stats

    monkeypatch.setattr(stats, "sequential_median_interval", lambda values, confidence=0.95: stats.median_interval(values, confidence))
    noise = next(i for i, n in enumerate(simulation.NOISES) if n.name.startswith("CI VM"))
    edge = next(i for i, s in enumerate(simulation.scenarios()) if s.name == "5 a tie width apart")
    tallies = simulation._one_row((noise, edge, 100, 0))
    assert tallies["every round"].false_difference / 100 > 0.05


def test_the_simulation_catches_rounds_shorter_than_the_hosts_spells(simulation, monkeypatch):
    """Takes of 100 ms with no least length of a round: two equal engines, one launch-bound, make
    rounds of 0.2 s, six of which fit in one of the lent GPUs' spells; the harness finds them
    called different in more than 5 % of points. Why a round lasts round_ms at least."""
    short = simulation.SETTINGS.model_copy(update={"round_ms": 0.0})
    monkeypatch.setattr(simulation, "SETTINGS", short)
    monkeypatch.setattr(simulation, "RULES", {"every round": short.model_copy(update={"racing": False}), "racing": short})
    noise = next(i for i, n in enumerate(simulation.NOISES) if n.name.startswith("lent GPU"))
    equal = next(i for i, s in enumerate(simulation.scenarios()) if s.name == "2 equal")
    tallies = simulation._one_row((noise, equal, 100, 0))
    assert tallies["every round"].false_difference / 100 > 0.05

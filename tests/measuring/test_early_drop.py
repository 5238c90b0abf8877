"""Racing's early rule (pipeline/measuring/stopping.py, ``grossly_slower``): an engine whose every
kept take, over GROSS_ROUNDS rounds, lasted more than GROSS_FACTOR times the leader's slowest take
in the same rounds leaves the rounds before the interval can act; one stalled take, a spell that
slows the leader, or an engine 1.5x slower does not make it leave early; the baseline stays; the
record says which rule took an engine out; and the verdict leaves such an engine out of the answer
rather than calling it undecided."""

from __future__ import annotations

import random

from pipeline.catalog import ProfileSettings
from pipeline.measuring.host_speed import HostTake
from pipeline.measuring.rounds import RoundsOutcome, rounds_loop
from pipeline.measuring.stats import first_deciding_round
from pipeline.measuring.stopping import GROSS, GROSS_FACTOR, GROSS_ROUNDS, INTERVAL, gross


class ByRound:
    """An engine whose take in round r lasts ``ms`` times ``factor(r)``, at once (nothing is
    timed): the rule's decisions without a clock."""

    timing = "GPU time (CUDA events)"

    def __init__(self, ms: float, factor=lambda r: 1.0):
        self.ms, self.factor, self.round = ms, factor, -1

    def take(self, runs: int, min_ms: float) -> list[float]:
        self.round += 1
        return [self.ms * self.factor(self.round)] * 3

    def evidence(self) -> dict:
        return {}


class _QuietHost:
    alone_ms, source, noise = 1.0, "test", 1.0

    def before_take(self) -> None:
        pass

    def after_take(self) -> HostTake:
        return HostTake(slowdown=1.0, others_cpus=None, throttled=0.0)


class _Unheld:
    mode = None


WOBBLE = [1.0, 1.03, 0.97, 1.02, 0.98, 1.01, 0.99, 1.025, 0.975, 1.0]


def rounds(engines: dict, racing: bool = True, stays: frozenset[str] = frozenset({"base"})) -> RoundsOutcome:
    """The rounds loop on ``engines``, the host quiet and unheld (no retaken first round): a and b,
    a tie width apart, keep the rounds going past the first look."""
    settings = ProfileSettings(take_ms=1, take_runs=3, round_ms=0, min_rounds=6, budget_s=60, racing=racing)
    return rounds_loop(engines, settings, random.Random(3), None, None, _QuietHost(), _Unheld(), {}, stays=stays)


def contenders(**others) -> dict:
    return {"a": ByRound(1.0), "b": ByRound(1.03, lambda r: WOBBLE[r % len(WOBBLE)]), **others}


def test_the_rule_compares_every_take_with_the_leaders_slowest_over_enough_rounds():
    leader = {0: 1.0, 1: 1.1, 2: 1.0}
    assert gross(leader, {0: 3.4, 1: 3.5, 2: 3.6})  # every take over 3 × 1.1
    assert not gross(leader, {0: 3.4, 1: 3.2, 2: 3.6})  # one at 3.2, under 3.3
    assert not gross({0: 1.0, 1: 1.0}, {0: 9.0, 1: 9.0})  # two rounds: too few
    assert not gross({0: 1.0, 1: 1.0, 5: 1.0}, {0: 9.0, 1: 9.0, 2: 9.0})  # two shared
    assert not gross({0: 1.0, 1: 10.0, 2: 1.0}, {0: 9.0, 1: 9.0, 2: 9.0})  # the leader stalled once
    assert (GROSS_FACTOR, GROSS_ROUNDS) == (3.0, 3)


def test_a_grossly_slower_engine_leaves_after_the_rules_rounds_and_the_baseline_stays():
    done = rounds(contenders(slow=ByRound(4.0), base=ByRound(5.0)))
    assert done.raced_out == {"slow": GROSS_ROUNDS} and done.raced_out_by == {"slow": GROSS}
    assert len(done.takes["slow"]) == GROSS_ROUNDS < first_deciding_round(4)
    assert len(done.takes["base"]) == len(done.takes["a"]) == done.rounds > GROSS_ROUNDS  # the baseline stays
    record = done.record("a")
    assert (record.raced_out, record.raced_out_by) == ({"slow": GROSS_ROUNDS}, {"slow": GROSS})


def test_one_stalled_take_or_a_spell_on_the_leader_does_not_make_an_engine_leave_early():
    stalled = ByRound(1.0, lambda r: 20.0 if r == 1 else 1.0)  # as fast as a, one take 20x
    gross_but_leader_slowed = ByRound(4.0)
    engines = contenders(stalled=stalled, slow=gross_but_leader_slowed)
    engines["a"].factor = lambda r: 1.8 if r == 2 else 1.0  # a spell slows the leader (alone) in round 3
    done = rounds(engines, stays=frozenset())
    assert "stalled" not in done.raced_out
    # 4x a but for one round at 2.2x: not gross over the first three; over four it is not either
    # (the leader's slowest take is still in them), so only the interval takes it out.
    assert done.raced_out_by.get("slow") == INTERVAL and done.raced_out["slow"] >= first_deciding_round(4)


def test_an_engine_one_and_a_half_times_slower_leaves_only_by_the_interval():
    done = rounds(contenders(mid=ByRound(1.5), base=ByRound(2.0)))
    first = first_deciding_round(4)
    assert done.raced_out == {"mid": first} and done.raced_out_by == {"mid": INTERVAL}
    assert len(done.takes["mid"]) == first


def test_no_racing_keeps_every_engine_in_every_round():
    done = rounds(contenders(slow=ByRound(10.0), base=ByRound(5.0)), racing=False)
    assert done.raced_out == {} and done.raced_out_by == {}
    assert all(len(takes) == done.rounds for takes in done.takes.values())


def test_the_row_says_which_rule_and_the_verdict_leaves_a_grossly_slower_engine_out_of_the_answer():
    from pipeline.report.row_times import take_rounds
    from pipeline.report.rows import ComparisonRow
    from pipeline.report.verdict import verdicts

    done = rounds(contenders(slow=ByRound(4.0), mid=ByRound(1.5), base=ByRound(5.0)))
    assert done.raced_out_by == {"slow": GROSS, "mid": INTERVAL}
    rows = {}
    for entrant in done.entrants:
        toolchain = "eager" if entrant == "base" else entrant
        row = ComparisonRow(model="m", variant="v", toolchain=toolchain, status="measured (GPU time)", outcome="measured", shape="1x1")
        row.median_ms = sorted(t.median_ms for t in done.takes[entrant])[len(done.takes[entrant]) // 2]
        take_rounds(row, [done.record(entrant)])
        rows[entrant] = row
    slow, mid = rows["slow"], rows["mid"]
    assert f"out of the running after {GROSS_ROUNDS} of {done.rounds} rounds (racing: grossly slower" in slow.full_status
    assert f"out of the running after {mid.rounds} of {done.rounds} rounds (racing)" in mid.full_status
    assert "raced_out_by" not in slow.public() and slow.public()["raced_out_after"] == GROSS_ROUNDS
    (verdict,) = verdicts(list(rows.values()), "eager")
    # a against b decided (a tie width apart, a faster), slow out of the answer by the rule that
    # took it out: no comparison of it is made, none claimed.
    assert verdict.fastest is rows["a"] and verdict.tied == []
    assert all(slow not in (x, y) for x, y, _ in verdict.comparisons)
    # Without the record of the rule (a manifest written before it), its three rounds decide
    # nothing against the others: the answer is undecided rather than wrong.
    slow.raced_out_by = INTERVAL
    (verdict,) = verdicts(list(rows.values()), "eager")
    assert slow in verdict.tied and verdict.undecided

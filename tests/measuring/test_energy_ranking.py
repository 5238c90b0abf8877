"""Ranking by energy (``by = "energy"``, pipeline/measuring/ranking.py): the rounds pair each round's
takes by their joules per inference instead of their medians, stop when the leader's energy
comparisons are decided, and never rank an engine without a reading. A stand-in meter gives each
engine's takes the energy it is told to, so that energy and time can differ independently."""

from __future__ import annotations

import random

from pipeline.catalog import ProfileSettings
from pipeline.catalog.settings import RANKED_BY
from pipeline.measuring.energy import Energy, EnergyMeter, EnergyReading, NoEnergy
from pipeline.measuring.ranking import ENERGY, MEDIAN, RANKINGS
from pipeline.measuring.rounds import measure_in_rounds
from pipeline.measuring.stopping import _against_the_leader, undecided


class Metered:
    """An engine on the GPU whose runs last ``ms`` (a little noise) and cost ``joules`` each: its
    take tells the meter whose take it is."""

    timing, on_gpu = "GPU time (CUDA events)", True

    def __init__(self, meter: StandIn, ms: float, joules: float, noise: float = 0.01):
        self.meter, self.ms, self.joules, self.noise = meter, ms, joules, noise
        self.rng = random.Random(int(ms * 1000 + joules * 10))

    def take(self, runs: int, min_ms: float) -> list[float]:
        self.meter.current = self
        return [self.ms * self.rng.uniform(1 - self.noise, 1 + self.noise) for _ in range(max(runs, 3))]

    def evidence(self) -> dict:
        return {"device": "stand-in"}


class StandIn(EnergyMeter):
    """A counter that resolves every take and reads the joules its engine costs (2 % noise)."""

    source, scope, counter = "nvml", "the whole GPU (stand-in)", "a stand-in"

    def __init__(self):
        self.current: Metered | None = None
        self.rng = random.Random(7)

    def during(self, work):
        result = work()
        times = result[0]  # the take's times (and the SM clock read around them)
        inferences = len(times) + 1  # the untimed run before them, which the counter also sees
        joules = self.current.joules * inferences * self.rng.uniform(0.98, 1.02)
        return result, EnergyReading(joules=joules, steps=20, wall_ms=sum(times), resolved=True)


def settings(by: str) -> ProfileSettings:
    return ProfileSettings(take_ms=1, take_runs=1, round_ms=0, min_rounds=6, budget_s=20, racing=False, by=by)


def rounds(by: str, energies: tuple[float, float], times: tuple[float, float], gpu=None, noise: float = 0.01):
    meter = StandIn()
    engines = {"a": Metered(meter, times[0], energies[0], noise), "b": Metered(meter, times[1], energies[1], noise)}
    meters = Energy(gpu=gpu or meter, cpu=NoEnergy("no RAPL"))
    return measure_in_rounds(engines, settings(by), seed=3, energy=meters)


def test_energy_is_a_ranking_the_catalog_knows():
    assert "energy" in RANKED_BY and RANKINGS["energy"] is ENERGY and ENERGY.paired and MEDIAN.paired
    assert ProfileSettings(by="energy").reads_energy  # ranking by it reads it, [profile] energy or not


def test_equal_times_different_energies_the_rounds_stop_when_energy_is_decided():
    done = rounds("energy", energies=(1.0, 1.5), times=(1.0, 1.0))
    assert done.stop == "decided" and done.rounds < 40 and not undecided(done.takes, 0.03, 2, ENERGY)
    ((leader, other, estimate),) = _against_the_leader(done.takes, 0.03, 2, ENERGY)
    assert (leader, other, estimate.outcome) == ("a", "b", "faster") and 0.6 < estimate.ratio < 0.7


def test_equal_energies_different_times_are_the_same_by_energy():
    done = rounds("energy", energies=(1.0, 1.0), times=(1.0, 1.5))
    ((_, _, by_energy),) = _against_the_leader(done.takes, 0.03, 2, ENERGY)
    ((leader, _, by_time),) = _against_the_leader(done.takes, 0.03, 2, MEDIAN)
    assert by_energy.outcome == "same" and by_time.outcome == "faster" and leader == "a"


def test_engines_without_a_reading_are_compared_with_nothing_by_energy():
    done = rounds("energy", energies=(1.0, 1.5), times=(1.0, 1.0), gpu=NoEnergy("no NVML: stand-in"))
    assert all(take.joules is None for take in done.takes["a"])
    # No figure to pair: no comparison the rounds could wait on, and none claimed.
    assert done.stop == "decided" and done.rounds == 6
    assert done.record("a").energy_why_not == "no NVML: stand-in"


def test_with_no_engine_read_by_energy_the_rounds_stop_on_the_medians_and_say_so():
    """No meter reads (no NVML here): by energy nothing is compared, and the rounds would stop
    after min_rounds, the times measured no longer than that. They stop on the medians instead,
    as long as the times need, and the run's warning says why."""
    from pipeline.measuring.stopping import unranked_words

    done = rounds("energy", energies=(1.0, 1.0), times=(1.0, 1.01), gpu=NoEnergy("no NVML: stand-in"), noise=0.05)
    assert done.stopped_by == "median" and done.rounds > 6  # min_rounds: what energy would have stopped at
    assert done.stop == "budget" or not undecided(done.takes, 0.03, 2, MEDIAN)
    assert unranked_words(done) == ("nothing to rank by energy: no engine read (no NVML: stand-in); the rounds stopped on the medians")
    read = rounds("energy", energies=(1.0, 1.5), times=(1.0, 1.0))
    assert read.stopped_by == "energy"

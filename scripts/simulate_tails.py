"""How often a row's p90 and p99 intervals hold the engine's true percentile, measured by timing
synthetic engines of known run-time distributions with the product's own rounds.

An engine is timed in rounds beside another, its takes as the product's rounds take them
(pipeline/measuring/rounds.py: in a random order, lengthened to fill a round of a second while a
launch-bound engine is open), with the noise shapes of scripts/simulate_confidence.py: take-to-take noise of 1 % and 3 %, the CI VM's
spells, the lent GPUs' spells on launch-bound engines, the lent GPU as measured (runs spread,
stalls) and its GPU-bound shapes (clock dips, a slow first run). Drift over a point is left out: a
percentile of one measurement speaks for the span it was measured over, and a drifting GPU has no
one true percentile beyond it. The truth is the percentile of the runs of a long stationary run
under the same noise (4000 rounds). Each point's interval — read by its takes
(pipeline/measuring/quantiles.py, ``take_quantile_interval``), the p90 over the first 60 takes and
the p99 over 400 — either holds it or misses it; the rate of points it holds is the coverage, to
be at least the 95 % the interval claims, printed with its exact one-sided 95 % lower bound. The
same points read as if every run were independent (``quantile_interval``) show why the takes are
the unit.

The second table runs the product's rounds ranked by a percentile (``[profile] by``, ``--by p99``:
pipeline/measuring/ranking.py) on engines of known percentile until they are decided or the
budget is spent, reads the point's verdict as ``pipeline compare --by`` would, and counts the
points where it made a wrong claim: a "faster" or "slower" the true percentiles do not back, a
"the same" where they lie beyond the tie band (simulate_confidence.claim_is_false), with its exact
one-sided 95 % upper bound.

    python scripts/simulate_tails.py                 # the tables docs/tails.md shows
    python scripts/simulate_tails.py --points 40     # quicker, coarser
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import simulate_confidence as confidence

from pipeline.measuring.pace import take_length
from pipeline.measuring.quantiles import quantile_interval, take_quantile_interval
from pipeline.measuring.ranking import ranking
from pipeline.measuring.rounds import rounds_loop
from pipeline.precision.bounds import exact_upper
from pipeline.report.row_times import tail_bounds
from pipeline.report.verdict import verdicts

POINTS = 400
# The takes each percentile is read over: enough for its interval to exist (36 for a p90, 368
# for a p99), as a point timed that long has.
TAKES = {0.9: 60, 0.99: 400}
KINDS = {"launch-bound": True, "GPU-bound": False}
NOISES = tuple(replace(noise, drift=0.0) for noise in confidence.NOISES)
SETTINGS = confidence.SETTINGS


@dataclass
class Coverage:
    points: int = 0
    held: int = 0  # by the takes
    held_as_runs: int = 0  # read as if every run were independent
    unbounded: int = 0  # too few takes for an interval

    def rate(self) -> float:
        return self.held / self.points

    def lower(self) -> float:
        """The exact one-sided 95 % lower bound of the coverage over these points."""
        return 1.0 - exact_upper(self.points - self.held, self.points)


def _engines(noise, launch_bound: bool, rng: random.Random, clock):
    spells = confidence.Spells(*noise.spells, random.Random(rng.random())) if noise.spells else None
    return {
        "e0/torch-eager": confidence.SyntheticEngine(10.0, launch_bound, noise, clock, spells, random.Random(rng.random()), 0.0),
        "e1/chain1": confidence.SyntheticEngine(10.0, False, noise, clock, spells, random.Random(rng.random()), 0.0),
    }


def timed(noise, launch_bound: bool, rounds: int, rng: random.Random) -> list[list[float]]:
    """The engine's runs, take by take, over ``rounds`` rounds beside a GPU-bound one: each take
    as long as the rounds make it (take_length where the host sets the pace, as it does while a
    launch-bound engine is in the open pair; take_ms where both are GPU-bound)."""
    clock = confidence.Clock()
    engines = _engines(noise, launch_bound, rng, clock)
    host_paced = launch_bound or noise.every_engine
    take_ms = take_length(SETTINGS, len(engines)) if host_paced else SETTINGS.take_ms
    order, taken = list(engines), []
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            runs = engines[name].take(SETTINGS.take_runs, take_ms)
            if name == "e0/torch-eager":
                taken.append(runs)
    return taken


def truth(noise, launch_bound: bool, q: float, rounds: int = 4000) -> float:
    """The q-quantile of the engine's runs over a long stationary run under ``noise``."""
    runs = sorted(run for take in timed(noise, launch_bound, rounds, random.Random(10**6)) for run in take)
    return runs[min(len(runs) - 1, int(q * len(runs)))]


def _row(job: tuple[int, str, float, int, int]) -> Coverage:
    noise_index, kind, q, points, seed = job
    noise, launch_bound = NOISES[noise_index], KINDS[kind]
    true = truth(noise, launch_bound, q)
    tally = Coverage()
    for index in range(points):
        taken = timed(noise, launch_bound, TAKES[q], random.Random(seed * 10**6 + index))
        tally.points += 1
        interval = take_quantile_interval(taken, q)
        if interval is None:
            tally.unbounded += 1
            continue
        tally.held += interval[0] <= true <= interval[1]
        as_runs = quantile_interval([run for take in taken for run in take], q)
        tally.held_as_runs += as_runs is not None and as_runs[0] <= true <= as_runs[1]
    return tally


def simulate(points: int, seed: int = 0, workers: int = 2) -> list[tuple[str, str, float, Coverage]]:
    jobs = [(n, kind, q, points, seed) for n in range(len(NOISES)) for kind in KINDS for q in TAKES]
    rows = confidence._each(_row, jobs, workers)
    return [(NOISES[n].name, kind, q, tally) for (n, kind, q, _, _), tally in zip(jobs, rows)]


def markdown(table: list[tuple[str, str, float, Coverage]]) -> str:
    lines = [
        "| noise | engine | percentile (takes) | held by the takes (exact lower bound) | held, read as independent runs |",
        "|---|---|---|---|---|",
    ]
    for noise, kind, q, tally in table:
        lines.append(
            f"| {noise} | {kind} | p{q * 100:g} ({TAKES[q]}) | {tally.rate():.1%} (≥ {tally.lower():.1%}) | {tally.held_as_runs / tally.points:.1%} |"
        )
    return "\n".join(lines)


# --- ranking by a percentile: the verdict's wrong claims ------------------------------------------

# Points per ranking, scenario and noise; a scenario's rate and its exact bound pool its noises.
RANK_POINTS = 40
# The rounds' budget, in rounds of the point's length: a p99 of two engines needs 437 takes, of
# three 477.
RANK_BUDGET_ROUNDS = 600
# The noises it runs under: take-to-take noise, the CI VM's spells, and the lent GPUs' shapes.
RANK_NOISES = tuple(noise for noise in NOISES if noise.name.startswith(("independent, 3", "CI VM", "lent GPU as", "lent GPU, GPU")))
E0, E1, E2 = f"e0/{confidence.BASELINE}", "e1/chain1", "e2/chain2"


@dataclass(frozen=True)
class Ranked:
    """A point's engines, (name, true median ms, launch-bound); the first the baseline's."""

    name: str
    engines: tuple[tuple[str, float, bool], ...]
    gpu_bound: bool = False

    def under(self, noise) -> bool:
        return not ((self.gpu_bound or not all(bound for *_, bound in self.engines)) and noise.every_engine)


def rank_scenarios() -> list[Ranked]:
    """Equal engines (every claim of a difference is false), a tie width apart (the band's edge),
    clearly apart, three of which two are equal, and a launch-bound engine of lower median beside a
    GPU-bound one whose p99 may be lower (the lent GPU's run spread and stalls are the launch-bound
    engines' own)."""
    return [
        Ranked("2 equal", ((E0, 50.0, True), (E1, 50.0, True))),
        Ranked("2 a tie width apart", ((E0, 50.0 * 1.03, True), (E1, 50.0, True))),
        Ranked("3: two equal, one 1.2x", ((E0, 60.0, True), (E1, 50.0, True), (E2, 50.0, True))),
        Ranked("2 equal, GPU-bound", ((E0, 50.0, False), (E1, 50.0, False)), gpu_bound=True),
        Ranked("a launch-bound engine 0.8x the median of a GPU-bound one", ((E0, 40.0, True), (E1, 50.0, False))),
    ]


def _take_ms(scenario: Ranked, noise) -> float:
    """How long the rounds make a take: a round's share while a launch-bound engine is in the open
    pair (or the host times every engine), take_ms for GPU-bound engines alone."""
    host_paced = noise.every_engine or any(bound for *_, bound in scenario.engines)
    return take_length(SETTINGS, len(scenario.engines)) if host_paced else SETTINGS.take_ms


def true_percentile(scenario: Ranked, noise, engine: tuple[str, float, bool], q: float, rounds: int = 4000) -> float:
    """The engine's q-quantile over a long stationary run under ``noise``, its takes as long as the
    point's rounds make them, the others' takes' time passing between them; seeded by its kind and
    time alone, so that two equal engines have one truth."""
    _, true_ms, bound = engine
    rng = random.Random(hash((true_ms, bound)) % 10**6)
    clock = confidence.Clock()
    spells = confidence.Spells(*noise.spells, random.Random(rng.random())) if noise.spells else None
    timed_engine = confidence.SyntheticEngine(true_ms, bound, noise, clock, spells, random.Random(rng.random()), 0.0)
    take_ms = _take_ms(scenario, noise)
    runs = []
    for _ in range(rounds):
        clock.s += take_ms / 1000.0 * (len(scenario.engines) - 1)
        runs += timed_engine.take(SETTINGS.take_runs, take_ms)
    runs.sort()
    return runs[min(len(runs) - 1, int(q * len(runs)))]


@dataclass
class Claims:
    points: int = 0
    wrong: int = 0  # points with a wrong claim about a pair
    wrong_fastest: int = 0  # points whose answer (or tied group) holds no truly fastest engine
    decided: int = 0
    rounds: list[int] = field(default_factory=list)

    def upper(self) -> float:
        """The exact one-sided 95 % upper bound of the wrong-claim rate over these points."""
        return exact_upper(self.wrong, self.points)


def ranked_point(scenario: Ranked, noise, by: str, seed: int, truth: dict[str, float]) -> tuple[bool, bool, bool, int]:
    """(a wrong claim, a wrong fastest, decided, rounds) of one point ranked ``by``: its rounds
    stopping on the percentile, its verdict as compare reads the manifests."""
    rng = random.Random(seed)
    clock = confidence.Clock()
    spells = confidence.Spells(*noise.spells, random.Random(rng.random())) if noise.spells else None
    engines = {
        name: confidence.SyntheticEngine(ms, bound, noise, clock, spells, random.Random(rng.random()), 0.0)
        for name, ms, bound in scenario.engines
    }
    round_s = _take_ms(scenario, noise) * len(engines) / 1000.0
    settings = SETTINGS.model_copy(update={"by": by, "budget_s": RANK_BUDGET_ROUNDS * round_s})
    outcome = rounds_loop(
        engines, settings, random.Random(seed), None, None, confidence._QuietHost(), confidence._Unheld(), {}, now=clock, stays={E0}
    )
    rows = confidence.rows_of(outcome, confidence.timing_under(noise))
    for row, entrant in zip(rows, outcome.entrants):
        row.samples_ms = list(outcome.times_ms[entrant])
        row.p90_ms, row.p99_ms = (float(value) for value in np.percentile(row.samples_ms, [90, 99]))
        tail_bounds(row, [outcome.record(entrant)])
    (verdict,) = verdicts(rows, confidence.BASELINE, tie=SETTINGS.tie, by=ranking(by))
    name = {id(row): entrant for row, entrant in zip(rows, outcome.entrants)}
    judged = [
        confidence.claim_is_false(estimate, truth[name[id(a)]] / truth[name[id(b)]], SETTINGS.tie) for a, b, estimate in verdict.comparisons
    ]
    best = min(truth, key=truth.get)
    _, highest = confidence.tie_band(SETTINGS.tie)
    group = [verdict.fastest, *verdict.tied]
    wrong_fastest = not any(truth[name[id(row)]] / truth[best] <= highest for row in group)
    return any(false for false in judged if false is not None), wrong_fastest, not verdict.tied, outcome.rounds


def _ranked_row(job: tuple[int, int, str, int, int]) -> Claims:
    noise_index, scenario_index, by, points, seed = job
    noise, scenario = RANK_NOISES[noise_index], rank_scenarios()[scenario_index]
    q = ranking(by).quantile
    truth = {engine[0]: true_percentile(scenario, noise, engine, q) for engine in scenario.engines}
    tally = Claims()
    for index in range(points):
        wrong, wrong_fastest, decided, rounds = ranked_point(scenario, noise, by, seed * 10**6 + index, truth)
        tally.points += 1
        tally.wrong += wrong
        tally.wrong_fastest += wrong_fastest
        tally.decided += decided
        tally.rounds.append(rounds)
    return tally


RANKED_BY = ("p99", "p90")


def simulate_ranking(points: int, seed: int = 0, workers: int = 2) -> list[tuple[Ranked, str, Claims, dict[str, Claims]]]:
    """Each scenario ranked by each percentile, under each noise it runs under: (scenario, by,
    its noises pooled, each noise's own)."""
    scenarios = rank_scenarios()
    jobs = [
        (n, i, by, points, seed)
        for by in RANKED_BY
        for i, scenario in enumerate(scenarios)
        for n, noise in enumerate(RANK_NOISES)
        if scenario.under(noise)
    ]
    tallies = confidence._each(_ranked_row, jobs, workers)
    table: dict[tuple[int, str], dict[str, Claims]] = {}
    for (n, i, by, _, _), tally in zip(jobs, tallies):
        table.setdefault((i, by), {})[RANK_NOISES[n].name] = tally
    out = []
    for (i, by), by_noise in table.items():
        pooled = Claims()
        for tally in by_noise.values():
            pooled.points += tally.points
            pooled.wrong += tally.wrong
            pooled.wrong_fastest += tally.wrong_fastest
            pooled.decided += tally.decided
            pooled.rounds += tally.rounds
        out.append((scenarios[i], by, pooled, by_noise))
    return out


def markdown_ranking(table: list[tuple[Ranked, str, Claims, dict[str, Claims]]]) -> str:
    lines = [
        "| by | engines | noises | points | wrong claims (exact upper bound) | worst noise (its bound) | wrong fastest | decided | rounds (median, most) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, by, pooled, by_noise in table:
        rounds = sorted(pooled.rounds)
        # The noise with the most wrong claims, with its own bound: 40 points alone bound a rate
        # loosely (none wrong: ≤ 7.2 %; one: ≤ 11.3 %), which is why the rate CI holds is pooled.
        worst = max(by_noise.values(), key=lambda tally: tally.wrong / tally.points)
        lines.append(
            f"| {by} | {scenario.name} | {len(by_noise)} | {pooled.points} | {pooled.wrong / pooled.points:.1%} (≤ {pooled.upper():.1%}) | "
            f"{worst.wrong / worst.points:.1%} (≤ {worst.upper():.1%}) | {pooled.wrong_fastest / pooled.points:.1%} | {pooled.decided / pooled.points:.0%} | "
            f"{rounds[len(rounds) // 2]}, {rounds[-1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=POINTS, help=f"points per noise, engine and percentile (default {POINTS})")
    parser.add_argument(
        "--rank-points", type=int, default=RANK_POINTS, help=f"points per ranking, noise and scenario (default {RANK_POINTS})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(markdown(simulate(args.points, args.seed, args.workers)))
    print()
    print(markdown_ranking(simulate_ranking(args.rank_points, args.seed, args.workers)))
    print(f"\n{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

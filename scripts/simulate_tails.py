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

    python scripts/simulate_tails.py                 # the table docs/tails.md shows
    python scripts/simulate_tails.py --points 40     # quicker, coarser
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, replace

import simulate_confidence as confidence

from pipeline.measuring.pace import take_length
from pipeline.measuring.quantiles import quantile_interval, take_quantile_interval
from pipeline.precision.bounds import exact_upper

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=POINTS, help=f"points per noise, engine and percentile (default {POINTS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(markdown(simulate(args.points, args.seed, args.workers)))
    print(f"\n{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

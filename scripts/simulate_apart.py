"""How often the answer and its claims are wrong where a point's engines were timed apart: each
engine in a set of rounds of its own run, as a sweep over many builds writes them (a run per set of
toolchains) or a tool's engine profiled alone. Compare tells such engines apart by their medians'
own intervals (stats.unpaired_ratio: A's low over B's high to A's high over B's low), not by paired
rounds, and no family-wise level covers those pairs (docs/confidence.md).

The engines, noises and truth are scripts/simulate_confidence.py's; each point's engines are split
into two runs (the even ones, the baseline among them, and the odd ones), each run its own rounds
on a host of its own: its own spells, and its own drift of the GPU's speed (a run starts on a GPU
in whatever state the last left it). Pairs within a run are still paired; the others are not.
Scored as the first table scores a point (a wrong fastest; any false claim about a pair), with the
claims about pairs timed apart counted on their own.

    python scripts/simulate_apart.py              # the table docs/confidence.md shows
    python scripts/simulate_apart.py --points 50  # quicker, coarser
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import simulate_confidence as confidence

# Points per scenario and noise: the table in docs/confidence.md, which CI prints again.
POINTS = 150


def apart_scenarios() -> list[confidence.Scenario]:
    """The first table's points, but those compared at a fixed look (a stop the rounds did not
    choose, which says nothing of runs apart)."""
    return [scenario for scenario in confidence.scenarios() if scenario.look is None]


def runs_of(scenario: confidence.Scenario) -> list[confidence.Scenario]:
    """The point's engines in two runs: the even ones (the baseline's among them) and the odd."""
    return [replace(scenario, engines=scenario.engines[start::2]) for start in (0, 1)]


def run_apart(scenario: confidence.Scenario, noise: confidence.Noise, seed: int, truth) -> confidence.Tally:
    """One point timed in two runs, each on a host and GPU state of its own, judged together."""
    rows, entrants, timed, rounds, seconds = [], [], {}, 0, 0.0
    for index, run in enumerate(runs_of(scenario)):
        outcome, run_timed = confidence.run_point(run, noise, seed * 2 + index)
        rows += confidence.rows_of(outcome, confidence.timing_under(noise))
        entrants += outcome.entrants
        timed.update(run_timed)
        rounds, seconds = rounds + outcome.rounds, seconds + outcome.elapsed_s
    return confidence.judge_rows(rows, entrants, rounds, seconds, timed, truth, confidence.SETTINGS.tie)


def _one_row(job: tuple[int, int, int, int]) -> confidence.Tally:
    noise_index, scenario_index, points, seed = job
    noise, scenario = confidence.NOISES[noise_index], apart_scenarios()[scenario_index]
    truth = confidence.true_ratios(scenario, noise)
    tally = confidence.Tally()
    for index in range(points):
        tally.add(run_apart(scenario, noise, seed * 10**6 + index, truth))
    return tally


def simulate(points: int, seed: int = 0, workers: int = 2) -> list[tuple[confidence.Scenario, confidence.Noise, confidence.Tally]]:
    """Every scenario under every noise, each row seeded on its own."""
    jobs = [
        (n, i, points, seed)
        for n, noise in enumerate(confidence.NOISES)
        for i, scenario in enumerate(apart_scenarios())
        if scenario.under(noise)
    ]
    tallies = confidence._each(_one_row, jobs, workers)
    return [(apart_scenarios()[i], confidence.NOISES[n], tally) for (n, i, _, _), tally in zip(jobs, tallies)]


def markdown(table: list[tuple[confidence.Scenario, confidence.Noise, confidence.Tally]]) -> str:
    lines = [
        "| noise | engines, in two runs | wrong fastest | false claim | claims apart false (of made) | claims false (of made) |",
        "|---|---|---|---|---|---|",
    ]
    for scenario, noise, t in table:
        cells = [
            confidence.rate(t.wrong_fastest, t.points),
            confidence.rate(t.false_claim, t.points),
            f"{t.unpaired_false} of {t.unpaired_claims}",
            f"{t.false_claims} of {t.claims}",
        ]
        lines.append(f"| {noise.name} | {scenario.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=POINTS, help=f"points per scenario and noise (default {POINTS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    table = simulate(args.points, args.seed, args.workers)
    print(markdown(table))
    print(f"\n{len(table) * args.points} points in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Each row's p90 and p99 with the interval its takes can bound (pipeline/report/rows.py, from
pipeline/measuring/quantiles.py): its runs split take by take as its rounds kept them, dropped takes
left out, and how many takes it needs where it has too few."""

from __future__ import annotations

import random

from pipeline.measuring.quantiles import take_quantile_interval
from pipeline.measuring.records import RoundsRecord, Take
from pipeline.report.row_times import tail_bounds
from pipeline.report.rows import ComparisonRow


def rounds_record(takes: list[list[float]], dropped: set[int] = frozenset(), group: str = "g", entrant: str = "fp16/a") -> RoundsRecord:
    """One engine's rounds record: a take a round, each of ``takes``' runs (``dropped``: rounds
    whose take was dropped)."""
    return RoundsRecord(
        group=group,
        entrant=entrant,
        entrants=[entrant],
        takes=[
            Take(round=i, order=0, runs=len(runs), median_ms=sorted(runs)[len(runs) // 2], dropped="throttled" if i in dropped else None)
            for i, runs in enumerate(takes)
        ],
        rounds=len(takes),
        stop="decided",
        elapsed_s=1.0,
        take_ms=100.0,
        take_runs=1,
        min_rounds=6,
        budget_s=30.0,
        tie=0.03,
        seed=0,
    )


def _row(takes: list[list[float]], dropped: set[int] = frozenset()) -> ComparisonRow:
    row = ComparisonRow(model="m", variant="fp16", toolchain="a", status="measured")
    # A manifest's per-iteration times hold the kept takes' runs only, in order.
    row.samples_ms = [run for i, runs in enumerate(takes) if i not in dropped for run in runs]
    tail_bounds(row, [rounds_record(takes, dropped)])
    return row


def test_the_percentiles_are_bounded_by_the_kept_takes():
    rng = random.Random(1)
    takes = [[rng.uniform(10, 12)] * 5 for _ in range(50)]
    row = _row(takes, dropped={3, 7})
    kept = [runs for i, runs in enumerate(takes) if i not in {3, 7}]
    assert row.tail_takes == 48
    assert row.p90_interval_ms == take_quantile_interval(kept, 0.9) and row.p90_takes_needed is None
    assert row.p99_interval_ms is None and row.p99_takes_needed == 368  # 48 takes cannot bound a p99


def test_too_few_takes_say_how_many_would_do():
    row = _row([[10.0, 10.1, 10.2]] * 20)
    assert row.tail_takes == 20 and row.p90_interval_ms is None and row.p99_interval_ms is None
    assert (row.p90_takes_needed, row.p99_takes_needed) == (36, 368)


def test_runs_that_do_not_split_as_the_rounds_kept_them_are_left_unbounded():
    row = ComparisonRow(model="m", variant="fp16", toolchain="a", status="measured")
    row.samples_ms = [10.0] * 7  # a hand-edited manifest: not the takes' 3 + 3 runs
    tail_bounds(row, [rounds_record([[10.0] * 3, [10.0] * 3])])
    assert row.tail_takes is None and row.p90_interval_ms is None and row.p90_takes_needed is None

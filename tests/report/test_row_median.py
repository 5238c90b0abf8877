"""A row timed in rounds takes its median from its takes' medians, the figure its interval bounds
(pipeline/report/row_times.py, take_rounds): each take weighs alike, however many runs it held."""

from __future__ import annotations

import statistics

from pipeline.measuring.records import RoundsRecord, Take
from pipeline.measuring.stats import median_interval
from pipeline.report.row_times import take_rounds
from pipeline.report.rows import ComparisonRow


def _record(takes: list[list[float]], dropped: set[int] = frozenset()) -> RoundsRecord:
    return RoundsRecord(
        group="g",
        entrant="fp16/a",
        entrants=["fp16/a"],
        takes=[
            Take(round=i, order=0, runs=len(runs), median_ms=statistics.median(runs), dropped="throttled" if i in dropped else None)
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


def test_the_median_is_the_takes_and_lies_within_its_interval():
    # Takes as long in milliseconds: five fast ones hold many runs, fifteen slow ones few. Pooled,
    # the fast runs outnumber the slow; take by take, the slow takes are most.
    fast = [[1.0 + 0.001 * i] * 200 for i in range(5)]
    slow = [[2.0 + 0.01 * i] * 10 for i in range(15)]
    takes = fast + slow
    row = ComparisonRow(model="m", variant="fp16", toolchain="a", status="measured")
    row.median_ms = statistics.median(run for runs in takes for run in runs)  # what the manifest's pooled runs say
    assert row.median_ms < 1.01
    take_rounds(row, [_record(takes)])
    medians = [statistics.median(runs) for runs in takes]
    assert row.median_ms == statistics.median(medians) > 2.0
    low, high = row.median_ci_ms
    assert (low, high) == median_interval(medians) and low <= row.median_ms <= high


def test_dropped_takes_count_for_neither():
    takes = [[1.0] * 3, [5.0] * 3, [1.2] * 3, [1.1] * 3, [5.0] * 3, [1.3] * 3, [1.4] * 3]
    row = ComparisonRow(model="m", variant="fp16", toolchain="a", status="measured")
    take_rounds(row, [_record(takes, dropped={1, 4})])
    assert row.median_ms == 1.2 and row.median_ci_ms == (1.0, 1.4)

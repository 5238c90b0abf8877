"""A row timed in rounds takes its median from its takes' medians, the figure its interval bounds
(pipeline/report/row_times.py, take_rounds): each take weighs alike, however many runs it held."""

from __future__ import annotations

import statistics

from pipeline.measuring.stats import median_interval
from pipeline.report.row_times import take_rounds
from pipeline.report.rows import ComparisonRow
from tests.report.test_tail_bounds import rounds_record


def test_the_median_is_the_takes_and_lies_within_its_interval():
    # Takes as long in milliseconds: five fast ones hold many runs, fifteen slow ones few. Pooled,
    # the fast runs outnumber the slow; take by take, the slow takes are most.
    fast = [[1.0 + 0.001 * i] * 200 for i in range(5)]
    slow = [[2.0 + 0.01 * i] * 10 for i in range(15)]
    takes = fast + slow
    row = ComparisonRow(model="m", variant="fp16", toolchain="a", status="measured")
    row.median_ms = statistics.median(run for runs in takes for run in runs)  # what the manifest's pooled runs say
    assert row.median_ms < 1.01
    take_rounds(row, [rounds_record(takes)])
    medians = [statistics.median(runs) for runs in takes]
    assert row.median_ms == statistics.median(medians) > 2.0
    low, high = row.median_ci_ms
    assert (low, high) == median_interval(medians) and low <= row.median_ms <= high


def test_dropped_takes_count_for_neither():
    takes = [[1.0] * 3, [5.0] * 3, [1.2] * 3, [1.1] * 3, [5.0] * 3, [1.3] * 3, [1.4] * 3]
    row = ComparisonRow(model="m", variant="fp16", toolchain="a", status="measured")
    take_rounds(row, [rounds_record(takes, dropped={1, 4})])
    assert row.median_ms == 1.2 and row.median_ci_ms == (1.0, 1.4)


def _timed_apart(fast: float, slow: float, fast_runs: int, slow_runs: int, toolchain: str) -> ComparisonRow:
    """A row timed in a set of rounds of its own at 2x512: ten takes at ``fast`` ms of
    ``fast_runs`` runs, ten at ``slow`` of ``slow_runs``."""
    takes = [[fast] * fast_runs if i % 2 else [slow] * slow_runs for i in range(20)]
    row = ComparisonRow(model="bert", variant="fp16", toolchain=toolchain, status="measured", shape="2x512", batch_size=2)
    row.samples_ms = [run for runs in takes for run in runs]
    row.median_ms = statistics.median(row.samples_ms)
    take_rounds(row, [rounds_record(takes, group=f"{toolchain}@2x512", entrant=f"fp16/{toolchain}")])
    return row


def test_rows_timed_in_rounds_apart_are_told_apart_by_their_takes_not_their_pooled_runs(tmp_path):
    """Pooled, one row's runs sit at 1.0 ms and the other's at 1.35 ms, which a bootstrap of the
    runs tells apart; their take medians spread over the same 1.0–1.35 ms, and their intervals
    overlap: the table must not mark the change beyond the noise."""
    from pipeline.report.row_cache import RowCache
    from pipeline.report.row_comparisons import compare_rows
    from pipeline.runtimes import load_catalog
    from tests.conftest import CPU_TOOLCHAINS, tiny_bert_catalog, write_catalog

    catalog = load_catalog(write_catalog(tmp_path, tiny_bert_catalog(["2x512"], ["fp16"], ["fp16"]) + CPU_TOOLCHAINS))
    onnx = _timed_apart(1.0, 1.3, fast_runs=100, slow_runs=10, toolchain="onnxruntime")
    eager = _timed_apart(1.05, 1.35, fast_runs=10, slow_runs=100, toolchain="torch-eager")
    assert statistics.median(onnx.samples_ms) == 1.0 and statistics.median(eager.samples_ms) == 1.35
    compare_rows(catalog, [onnx, eager], None, RowCache(None, 0.1))
    assert onnx.vs_baseline_toolchain == eager.median_ms / onnx.median_ms
    assert onnx.vs_baseline_toolchain_significant is False
    # Takes apart by more than their intervals: beyond the noise.
    far = _timed_apart(2.0, 2.3, fast_runs=10, slow_runs=10, toolchain="torch-eager")
    compare_rows(catalog, [onnx, far], None, RowCache(None, 0.1))
    assert onnx.vs_baseline_toolchain_significant is True

"""`--p99-under` (pipeline/report/streams.py): the engine and concurrency serving the most
inferences/s whose p99 is shown, by its interval's upper end, to be within the budget — picked from
rows made here, as a manifest's serving gives them."""

from __future__ import annotations

import pytest

from pipeline.report.rows import ComparisonRow
from pipeline.report.streams import p99_under, parse_budget, serving_tables, streams_lines, streams_markdown
from pipeline.running.errors import UsageError


def entry(streams: int, per_s: float, p99: float, upper: float | None, requests: int = 400, mode: str = "threads") -> dict:
    return {
        "streams": streams, "mode": mode, "how": "", "why_not": None, "inferences_per_s": per_s, "samples_per_s": 2 * per_s,
        "tokens_per_s": None, "requests": requests, "span_s": 2.0, "bounded_by": "requests",
        "median_ms": p99 / 2, "median_interval_ms": [p99 / 2, p99 / 2], "median_requests_needed": None,
        "p90_ms": p99 * 0.8, "p90_interval_ms": [p99 * 0.8, p99 * 0.8], "p90_requests_needed": None,
        "p99_ms": p99, "p99_interval_ms": None if upper is None else [p99 * 0.9, upper], "p99_requests_needed": None if upper else 368,
    }  # fmt: skip


def row(variant: str, toolchain: str, *entries: dict, flags=()) -> ComparisonRow:
    return ComparisonRow(
        model="m", variant=variant, toolchain=toolchain, status="measured", shape="2x512", streams=list(entries), flags=list(flags)
    )


def test_the_most_inferences_whose_p99_bound_is_within_the_budget():
    rows = [
        row("fp16", "torch-cudagraphs", entry(1, 312.7, 4.0, 4.5), entry(2, 360.4, 7.0, 9.0), entry(4, 417.9, 9.5, 10.4)),
        row("fp16", "torch-eager", entry(1, 51.8, 20.0, 22.0), entry(2, 59.8, 35.0, 36.0)),
        # The most inferences of all, and a p99 reading under the budget, but its requests cannot bound it.
        row("fp16", "onnxruntime", entry(4, 900.0, 3.0, None, requests=200)),
    ]
    (pick,) = p99_under(rows, 10.0)
    assert pick.chosen["variant"] == "fp16" and pick.chosen["toolchain"] == "torch-cudagraphs"
    assert (pick.chosen["streams"], pick.chosen["inferences_per_s"], pick.chosen["p99_upper_ms"]) == (2, 360.4, 9.0)
    assert (pick.within, len(pick.above), len(pick.unbounded)) == (2, 3, 1)
    assert pick.sentence() == (
        "m at 2×512: serving with a p99 within 10 ms, fp16 on torch-cudagraphs at 2 streams (threads) serves the most: "
        "360.4 inferences/s, p99 7.000 ms (95% interval up to 9.000 ms), of 2 engine–concurrency pairs shown within it."
    )
    # A budget that holds the 4-stream p99's whole interval takes it.
    assert p99_under(rows, 10.5)[0].chosen["streams"] == 4


def test_nothing_bounded_says_how_many_requests_a_p99_needs():
    rows = [row("fp32", "onnxruntime", entry(1, 600.0, 2.0, None, requests=300), entry(2, 680.0, 6.8, None, requests=341))]
    (pick,) = p99_under(rows, 10.0)
    assert pick.chosen is None
    assert pick.sentence() == (
        "m at 2×512: no engine is shown to serve with a p99 within 10 ms: 2 engine–concurrency pairs cannot be bounded: "
        "a p99 needs 368 requests, and the most any had was 341 (fp32 on onnxruntime at 2 streams); serve longer ([profile] serve_s)."
    )


def test_bounded_above_the_budget_names_the_lowest_bound_and_inaccurate_rows_stay_out():
    rows = [
        row("fp32", "onnxruntime", entry(1, 100.0, 11.0, 12.5)),
        row("int8", "onnxruntime", entry(1, 400.0, 1.0, 1.2), flags=["inaccurate: cosine 0.91"]),
    ]
    (pick,) = p99_under(rows, 10.0)
    assert pick.chosen is None
    assert "the lowest p99 bound is 12.500 ms (fp32 on onnxruntime at 1 stream)" in pick.sentence()


def test_a_count_not_measured_takes_no_part_and_points_are_picked_apart():
    rows = [
        row("fp32", "trt-rtx1.7", {"streams": 2, "mode": "threads", "how": "", "why_not": "does not serve concurrent streams yet"}),
        row("fp32", "onnxruntime", entry(1, 100.0, 1.0, 1.5)),
    ]
    other = row("fp32", "onnxruntime", entry(1, 50.0, 1.0, 1.5))
    other.shape = "4x512"
    picks = p99_under([*rows, other], 10.0)
    assert [(pick.shape, pick.chosen["inferences_per_s"]) for pick in picks] == [("2x512", 100.0), ("4x512", 50.0)]


def test_engines_measured_at_the_point_that_did_not_serve_are_named_in_the_answer_and_the_tables():
    served = row("fp32", "onnxruntime", entry(1, 100.0, 1.0, 1.5))
    unserved = ComparisonRow(model="m", variant="fp32", toolchain="torch-eager", status="measured", shape="2x512", median_ms=2.0)
    elsewhere = ComparisonRow(model="m", variant="fp32", toolchain="torch-eager", status="measured", shape="4x512", median_ms=4.0)
    rows = [served, unserved, elsewhere]  # no row served at 4x512: no table there to be missing from
    (pick,) = p99_under(rows, 10.0)
    assert pick.not_served == ["fp32 on torch-eager"] and pick.public()["not_served"] == ["fp32 on torch-eager"]
    assert pick.sentence().endswith(". Not served (profiled without --streams): fp32 on torch-eager.")
    ((_, cells, note),) = serving_tables(rows)
    assert len(cells) == 1 and note.endswith("; not served (profiled without --streams): fp32 on torch-eager")
    assert not note.startswith("?")  # no p99 here lacks its bound
    assert streams_markdown(rows).count("not served (profiled without --streams): fp32 on torch-eager") == 1
    assert any("not served (profiled without --streams)" in line for line, _ in streams_lines(rows, None))


def test_the_note_explains_a_question_mark_only_where_a_p99_has_one():
    ((_, cells, note),) = serving_tables([row("fp32", "onnxruntime", entry(1, 100.0, 1.0, None, requests=200))])
    assert cells[0][-2] == "1.000?" and note.startswith("? = too few requests to bound the p99")


def test_the_note_names_the_rows_whose_serving_is_the_hosts_speed():
    host = "launch-bound: the host needs 120% of a run's GPU time to issue it; its time is the host's speed"
    near = "near launch-bound: the host needs 60% of a run's GPU time to issue it; a host 1.7x slower would set its time"
    rows = [
        row("bf16", "torch-compile", entry(1, 224.0, 8.9, 66.6), flags=[host]),
        row("bf16", "torch-eager", entry(1, 60.0, 20.0, 22.0), flags=[near]),
        row("bf16", "torch-cudagraphs", entry(1, 310.0, 3.3, 3.4), flags=["noisy: CV 12%"]),
    ]
    ((_, _, note),) = serving_tables(rows)
    assert "launch-bound in the rounds: bf16 on torch-compile, bf16 on torch-eager — inf/s at the host's speed" in note
    ((_, _, calm),) = serving_tables(rows[2:])
    assert "launch-bound" not in calm


@pytest.mark.parametrize("text, ms", [("10ms", 10.0), ("10", 10.0), ("0.5s", 500.0), ("800us", 0.8), (" 2.5 ms ", 2.5)])
def test_budgets_read_in_their_units(text, ms):
    assert parse_budget(text) == pytest.approx(ms)


@pytest.mark.parametrize("text", ["", "fast", "0ms", "-1ms", "10 min"])
def test_bad_budgets_are_usage_errors(text):
    with pytest.raises(UsageError, match="give a latency budget above 0"):
        parse_budget(text)

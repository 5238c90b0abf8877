"""The answer says a reason many engines were left out for once (pipeline/report/reasons.py): under
load, every engine of a point left out because the host slowed it — one long reason whose figures
differ by engine — is one clause naming them all with the figures' ranges, not a sentence each."""

from __future__ import annotations

from pipeline.catalog.floor import AccuracyFloor
from pipeline.report.answer import Answer
from pipeline.report.reasons import grouped_reasons
from pipeline.report.rows import ComparisonRow
from pipeline.report.verdict import verdicts


def slowed(slowdown: float, worst: float, takes: int, others: float) -> str:
    """A host-slowed flag as pipeline/report/flags.py words it."""
    return (
        f"host slowed: its CPUs ran {slowdown:.2f}x slower than alone over its median take (worst {worst:.2f}x, {takes} of 8 takes) "
        f"while other processes used {others:.1f} CPUs, beyond the tie band of 3% and the host's own noise (1.02x); its time is the host's"
    )


def _row(variant: str, median: float, flag: str) -> ComparisonRow:
    return ComparisonRow(
        model="vit",
        variant=variant,
        toolchain="onnxruntime",
        status="measured (host latency)",
        shape="1x224",
        median_ms=median,
        median_ci_ms=(median * 0.99, median * 1.01),
        flags=[flag],
        # Timed together in one set of rounds, as a run measures a point's engines.
        round_medians={"vit@1x224": [median * (1 + 0.001 * (i % 3)) for i in range(12)]},
        rounds=12,
    )


def test_every_engine_left_out_for_one_reason_is_said_once_with_its_figures_as_ranges():
    rows = [
        _row("fp32", 3.0, slowed(1.06, 1.09, 5, 1.2)),
        _row("int8", 2.0, slowed(1.08, 1.12, 8, 1.1)),
        _row("int8_plan", 2.2, slowed(1.07, 1.10, 6, 1.3)),
    ]
    (verdict,) = verdicts(rows, "onnxruntime", {"vit": AccuracyFloor()})
    text = " ".join(verdict.sentences())
    assert text.count("host slowed") == 1, text
    assert (
        "Left out: fp32 on onnxruntime, int8 on onnxruntime and int8_plan on onnxruntime (all three: host slowed: its CPUs ran "
        "1.06–1.08x slower than alone over its median take (worst 1.09–1.12x, 5–8 of 8 takes) while other processes used "
        "1.1–1.3 CPUs, beyond the tie band of 3% and the host's own noise (1.02x); its time is the host's)." in text
    )
    # The answer's paragraph at a terminal's width of 120: the answer and one clause of why (five
    # lines), where a sentence per engine took nine.
    paragraph = [line for line, _ in Answer([verdict], []).lines(120)[1:] if line]
    assert len(paragraph) == 5, paragraph


def test_reasons_that_differ_in_words_stay_apart_in_the_order_of_their_first_engine():
    left_out = [
        ("fp16 on trt", "below the accuracy floor: cosine 0.9700 < 0.99"),
        ("fp16 on rtx", "build refused: no kernel"),
        ("int8 on trt", "below the accuracy floor: cosine 0.9500 < 0.99"),
        ("nvfp4 on rtx", "build refused: no kernel"),
        ("fp8 on trt", "unstable: its measurements disagree"),
    ]
    assert grouped_reasons(left_out) == [
        "fp16 on trt and int8 on trt (both: below the accuracy floor: cosine 0.9500–0.9700 < 0.99)",
        "fp16 on rtx and nvfp4 on rtx (both: build refused: no kernel)",
        "fp8 on trt (unstable: its measurements disagree)",
    ]
    # A figure inside a name is no figure of the reason: fp16's and sm89's digits stay as they are.
    assert grouped_reasons([("a", "skipped: sm89 needs fp16"), ("b", "skipped: sm90 needs fp16")]) == [
        "a (skipped: sm89 needs fp16)",
        "b (skipped: sm90 needs fp16)",
    ]

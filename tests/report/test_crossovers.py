"""The crossover sentences (pipeline/report/sweep.py) read an engine that left its rounds grossly
slower as the verdict does (pipeline/report/pairs.py, grossly_beaten): the other is named faster by
their medians, with no interval claimed from its few rounds; and the lead changes are said along
the last axis of a point of any number of axes, at each of its other sizes."""

from __future__ import annotations

from pipeline.measuring.stopping import GROSS, INTERVAL
from pipeline.report.rows import ComparisonRow
from pipeline.report.sweep import sweeps
from pipeline.report.verdict import verdicts
from tests.report.test_sweep import _row

STEADY = [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.01]


def _timed(toolchain: str, shape: str, medians: list[float | None], pooled: float | None = None, **extra) -> ComparisonRow:
    """A row timed in the rounds of its point's one set ("g@<shape>"), its take median in each
    round given (None: it had left them)."""
    kept = [value for value in medians if value is not None]
    group = f"g@{shape}"
    row = ComparisonRow(
        model="m",
        variant="fp16",
        toolchain=toolchain,
        status="measured (GPU time)",
        shape=shape,
        median_ms=pooled if pooled is not None else sorted(kept)[len(kept) // 2],
        round_medians={group: list(medians)},
        round_entrants={group: (toolchain, ("fast", "slow", "other"))},
        rounds=len(kept),
        rounds_stop="decided",
    )
    for key, value in extra.items():
        setattr(row, key, value)
    return row


def _grossly_slower(toolchain: str, shape: str, times: float) -> ComparisonRow:
    """Three rounds at ``times`` the steady engine's, then out of the running by the early rule."""
    return _timed(toolchain, shape, [times * m for m in STEADY[:3]] + [None] * 5, raced_out_by=GROSS, raced_out_after=3)


def test_an_engine_left_grossly_slower_is_named_slower_never_a_tie():
    """The reviewer's case: B raced out grossly slower after three rounds, 48× A. The crossover
    said "A and B cannot be told apart [47.82–48.96]"; it names A faster, says why B has no
    interval, and claims none."""
    rows = []
    for shape in ("2x512", "2x2048"):
        rows += [_timed("fast", shape, STEADY), _grossly_slower("slow", shape, 48.0)]
    (sweep,) = sweeps(rows, verdicts(rows, "fast"))
    (sentence,) = sweep.crossovers()
    assert sentence == (
        "fp16: fast is faster than slow by 48.00× (slow left its rounds grossly slower, every take over 3× fast's slowest: "
        "no interval) at 2×512 and 48.00× (grossly slower: no interval) at 2×2048."
    )
    assert "cannot be told apart" not in sentence and "[" not in sentence
    leads = sweep.crossover_leads()
    assert [(lead.first.toolchain, lead.outcome, lead.decided, lead.estimate) for lead in leads] == [("fast", GROSS, True, None)] * 2


def test_without_the_rule_recorded_its_few_rounds_decide_nothing():
    """A manifest written before the rule was recorded: the three rounds are read by their
    interval, which cannot decide, as the verdict reads them (undecided, not won)."""
    rows = [_timed("fast", "2x512", STEADY), _grossly_slower("slow", "2x512", 48.0)]
    rows[1].raced_out_by = INTERVAL
    (sweep,) = sweeps(rows, verdicts(rows, "fast"))
    (sentence,) = sweep.crossovers()
    assert (
        sentence
        == "fp16: fast and slow cannot be told apart in 3 rounds, too few for an interval (their ratios ranged 48.00–48.00) at 2×512."
    )


def test_the_lead_changes_from_a_gross_lead_to_one_the_interval_shows():
    rows = [
        _timed("fast", "2x512", STEADY),
        _grossly_slower("slow", "2x512", 10.0),
        _timed("fast", "2x2048", [2 * m for m in STEADY]),
        _timed("slow", "2x2048", STEADY),
    ]
    (sweep,) = sweeps(rows, verdicts(rows, "fast"))
    (sentence,) = sweep.crossovers()
    assert sentence.startswith("fp16: fast is faster than slow by 10.00× (slow left its rounds grossly slower")
    assert sentence.endswith("; slow is faster than fast by 2.00× [2.00–2.00] at 2×2048; slow takes the lead between 2×512 and 2×2048.")


def test_the_answer_is_never_said_sure_against_an_engine_left_grossly_slower():
    """The answer is not the engine of least median (its pooled median is lower, every round
    slower): its sureness was said against every other candidate, the grossly slower one
    included — "faster than the 2 others with 95% confidence (paired over 3–8 rounds)" counted
    an interval of three rounds that decides nothing."""
    a = _timed("fast", "2x512", [10.0, 18.0] * 4, pooled=14.0)
    b = _timed("other", "2x512", [11.0, 19.8] * 4, pooled=12.0)
    slow = _timed("slow", "2x512", [480.0, 481.0, 482.0] + [None] * 5, raced_out_by=GROSS)
    (verdict,) = verdicts([a, b, slow], "other")
    assert verdict.fastest is a and not verdict.tied
    assert all(slow not in (x, y) for x, y, _ in verdict.comparisons)
    assert (
        "faster than the other with 95% confidence (paired over 8 rounds); 1 more left its rounds grossly slower" in verdict.sentences()[0]
    )


def test_the_answer_is_said_sure_only_against_the_engines_it_beat_by_its_interval():
    """The answer (not the least median) met an engine the least median had beaten, and that
    comparison decided nothing: it is not counted among the engines it is faster than."""
    from pipeline.measuring.stats import RatioEstimate
    from pipeline.report.verdict import Verdict

    answer, least, other = _row("a", "2x512", 10.0), _row("b", "2x512", 9.0), _row("c", "2x512", 20.0)
    won = RatioEstimate(ratio=0.8, low=0.7, high=0.9, rounds=8, outcome="faster")
    undecided = RatioEstimate(ratio=0.6, low=0.3, high=1.2, outcome="ambiguous")

    def said(against_other: RatioEstimate) -> str:
        verdict = Verdict(model="m", shape="2x512", gpu_type=None, fastest=answer, baseline=None, candidates=[answer, least, other])
        verdict.comparisons = [(answer, least, won), (answer, other, against_other)]
        return verdict.sentences()[0]

    assert ", faster than 1 of the 2 others with 95% confidence (paired over 8 rounds) —" in said(undecided)
    apart = won.model_copy(update={"rounds": None})
    assert ", faster than the 2 others with 95% confidence (paired over 8 rounds, the rest by their own intervals) —" in said(apart)


def test_the_lead_changes_along_the_sequence_at_each_batch_and_frames_of_a_three_axis_point():
    """batch × frames × sequence: points sort 2×3×8, 2×5×8, 2×3×16, 2×5×16. Grouped by the batch
    alone, one series ran across the frames and said the lead changed "between 2×3×8 and 2×5×8";
    each series holds batch and frames and grows the sequence."""
    times = {"2x3x8": (10, 20), "2x5x8": (20, 10), "2x3x16": (40, 20), "2x5x16": (20, 40)}
    rows = [_row(name, shape, pair[i]) for shape, pair in times.items() for i, name in enumerate(("a", "b"))]
    (sweep,) = sweeps(rows, verdicts(rows, "a"))
    assert sweep.shapes == ["2x3x8", "2x5x8", "2x3x16", "2x5x16"]
    (sentence,) = sweep.crossovers()
    assert sentence.endswith("; b takes the lead between 2×3×8 and 2×3×16; a takes the lead between 2×5×8 and 2×5×16.")


def test_the_table_marks_a_pair_told_apart_by_the_gross_rule_as_the_words_do(tmp_path):
    """Three rounds decide nothing by an interval ("~" in the table), but an engine the rounds
    left grossly slower than the other is apart from it by that rule: the sweep's words name the
    other faster, and the table's change column must not call it within the spread."""
    from pipeline.report.row_cache import RowCache
    from pipeline.report.row_comparisons import compare_rows
    from pipeline.runtimes import load_catalog
    from tests.conftest import CPU_TOOLCHAINS, tiny_bert_catalog, write_catalog

    catalog = load_catalog(write_catalog(tmp_path, tiny_bert_catalog(["2x512"], ["fp16"], ["fp16"]) + CPU_TOOLCHAINS))
    for slow_by in (48.0, None):  # raced out grossly slower, or kept in its three rounds
        fast = _timed("onnxruntime", "2x512", STEADY[:3])
        slow = _grossly_slower("torch-eager", "2x512", 48.0) if slow_by else _timed("torch-eager", "2x512", [48 * m for m in STEADY[:3]])
        for row in (fast, slow):
            row.model, row.samples_ms = "bert", [m for m in row.round_medians["g@2x512"] if m is not None]
            row.round_entrants = {"g@2x512": (f"fp16/{row.toolchain}", ("fp16/onnxruntime", "fp16/torch-eager"))}
        compare_rows(catalog, [fast, slow], None, RowCache(None, 0.1))
        assert fast.vs_baseline_toolchain_significant is (slow_by is not None)

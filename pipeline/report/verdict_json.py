"""A verdict as `pipeline compare --format json` keeps it: one entry per model and shape point,
each engine it names written once and shared wherever it is named (pipeline/report/verdict.py
says what a verdict is)."""

from __future__ import annotations

from typing import Any

from pipeline.report import pairs
from pipeline.report.rows import ComparisonRow


def verdict_document(verdict) -> dict[str, Any]:
    """A Verdict (pipeline/report/verdict.py, which calls this: no import back) as the compare JSON
    keeps it (docs/reports.md, docs/compare.schema.json)."""
    # Each engine's entry is made once and stands wherever it is named: an engine timed in a
    # set of 30 is named in up to 30 comparisons, and the document is only written, never changed.
    entries: dict[int, dict[str, Any]] = {}

    def named(row: ComparisonRow | None) -> dict[str, Any] | None:
        if row is None:
            return None
        if id(row) not in entries:
            entries[id(row)] = entry(row)
        return entries[id(row)]

    def entry(row: ComparisonRow) -> dict[str, Any]:
        reading = verdict.reading
        interval = row.median_ci_ms if reading is None else reading.interval(row)
        return {
            "variant": row.variant,
            "toolchain": row.toolchain,
            "engine": row.engine,
            "median_ms": row.median_ms,
            "median_ci_ms": list(row.median_ci_ms) if row.median_ci_ms else None,
            "rounds": row.rounds,
            "tokens_per_s": row.tokens_per_s,
            # The figure it was ranked by (ranked_by: its median, or its percentile) and that
            # figure's interval (a percentile's at the level that holds the point's engines
            # together), or the takes a percentile needs where its takes cannot bound it.
            "ranked_ms": verdict.figure(row),
            "ranked_interval_ms": list(interval) if interval else None,
            "ranked_takes_needed": reading.takes_needed() if reading is not None and reading.short_of_takes(row) else None,
        }

    speedup = verdict.speedup_estimate
    return {
        "model": verdict.model,
        "shape": verdict.shape,
        "gpu_type": verdict.gpu_type,
        "ranked_by": verdict.ranked_by,
        "fastest": named(verdict.fastest),
        "tied": [named(row) for row in verdict.tied],
        "decided": verdict.fastest is not None and not verdict.tied and not verdict.unranked,
        "undecided": (bool(verdict.tied) and verdict.undecided) or verdict.unranked,
        "tie_width": verdict.tie,
        "baseline": named(verdict.baseline),
        "speedup_over_baseline": verdict.speedup,
        "speedup_interval": [speedup.low, speedup.high] if speedup and speedup.bounded else None,
        "speedup_rounds": speedup.rounds if speedup else None,
        "untrusted": verdict.untrusted,
        "accuracy_floor": {
            "thresholds": [{"metric": "cosine" if metric == "cos" else "top1", "min": value} for metric, value in verdict.floor.thresholds],
            "source": verdict.floor.source if verdict.floor.thresholds else "each precision's own check",
        },
        "comparisons": [comparison_json(named(a), named(b), estimate, verdict.tie) for a, b, estimate in verdict.comparisons],
        "excluded": [{"variant": r.variant, "toolchain": r.toolchain, "why": why} for r, why in verdict.excluded],
        "not_run": [{"variant": r.variant, "toolchain": r.toolchain, "why": r.status} for r in verdict.skipped],
        "out_of_memory": [
            {"variant": r.variant, "toolchain": r.toolchain, "why": r.status, "facts": r.out_of_memory} for r in verdict.did_not_fit
        ],
        "accuracy_unchecked": verdict.fastest.accuracy_unchecked if verdict.fastest is not None else None,
        "text": " ".join(verdict.sentences()),
    }


def comparison_json(a: dict, b: dict, estimate, tie: float) -> dict:
    """One pair the verdict compared: A over B with its interval, or, where its rounds are too few
    for an interval at the pair's level, what their ratios ranged over — never to be read as an
    interval (schema 16; before, that range stood in low and high)."""
    bounded = estimate is not None and estimate.bounded
    return {
        "a": a,
        "b": b,
        "ratio": estimate.ratio if estimate else None,
        "low": estimate.low if bounded else None,
        "high": estimate.high if bounded else None,
        "rounds": estimate.rounds if estimate else None,
        "paired": estimate.paired if estimate else False,
        "outcome": estimate.outcome if estimate else "ambiguous",
        "at_band_edge": pairs.on_band_edge(estimate, tie),
        "confidence": estimate.confidence if bounded else None,
        "bounded": bounded,
        "ratios_range": [estimate.low, estimate.high] if estimate and not bounded else None,
        "widened_by": estimate.widened_by if estimate else None,
    }

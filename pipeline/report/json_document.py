"""`pipeline compare --format json`: the versioned document scripts read (docs/reports.md says what
each version changed; docs/compare.schema.json is its JSON Schema, which the tests hold real output
to)."""

from __future__ import annotations

import json

from pipeline.report.answer import Answer
from pipeline.report.rows import ComparisonRow

# The version of `compare --format json` (docs/reports.md, docs/compare.schema.json): 1 was a
# list of rows; 2 the object {verdicts, sweeps, rows}, without this key; 3 adds it, and the
# verdict's tie, speedup interval and every comparison with its outcome; 4 each row's error
# against the FP32 reference (max and mean absolute, MSE); 5 the comparisons the answer was decided
# on; 6 each row's gpu_device and each sweep's gpus; 7 each row's outcome ("measured",
# "out_of_memory", "faulted", …), out_of_memory facts and accuracy_unchecked, each verdict's
# out_of_memory rows (no longer among its excluded) and accuracy_unchecked, each sweep line's ends;
# 8 each comparison's at_band_edge, and such a pair no longer decides the answer; 9 each row's
# raced_out_after, the paired intervals read as confidence sequences, and only the pairs the
# answer rests on among the comparisons; 10 each comparison's confidence, every paired interval
# read so that all pairs of its set of rounds hold at 95 % together; 11 a pair whose interval
# excludes 1 decides again where it reaches across an edge of the tie band (at_band_edge marks it);
# 12 each row's p90_ms, its p90 and p99 intervals bounded by its takes, and the takes they need;
# 13 each verdict's ranked_by (the median, or a percentile: compare --by), and each engine it
# names the figure it was ranked by, that figure's interval and the takes a percentile needs.
# 14 each row's energy: joules_per_inference, inferences_per_joule, tokens_per_joule,
# energy_source, energy_scope and energy_why_not (docs/energy.md).
# 15 each row's streams (its serving at each stream count: inferences/s, the requests' latency
# with its intervals, or why not measured) and, with --p99-under, the document's serving (the
# engine and concurrency that serve the most within the budget, per model and point). Still 15:
# ranked_by may be "energy", its ranked_ms then joules per inference (the figure ranked_by names,
# in its unit; no key changed name or kind: docs/reports.md).
# 16 each comparison's bounded and ratios_range: where its rounds are too few for an interval,
# low, high and confidence are null (they held the rounds' range) and ratios_range holds it; the
# verdict's speedup_interval null then.
# 17 each streams entry's takes_inferences_per_s: each take's inferences/s where the count was
# served in several (serve_rounds), [] for one take.
# 18 each row's median_ms, where timed in rounds, the median of its take medians (the figure its
# median_ci_ms bounds; 17 gave the pooled runs' median, which could fall outside it); a verdict
# ranked by a percentile a row's takes cannot bound, a null speedup_over_baseline; each serving
# pick's not_served.
# 19 each comparison's widened_by: a pair timed apart of which either engine follows the host
# (timed by its clock, launch-bound or near it) has its interval widened by pace.HOST_SWING each
# way (confidence.apart_ratio), and is told apart only beyond it.
JSON_SCHEMA_VERSION = 19


def render_json(rows: list[ComparisonRow], answer: Answer | None = None) -> str:
    """{"verdicts": the answer per model and point, "sweeps": each model across its shape points
    (with the crossovers in words), "rows": every row's figures}."""
    answer = answer or Answer([], [], "ms")
    data = {
        "schema": JSON_SCHEMA_VERSION,
        "verdicts": [verdict.public() for verdict in answer.verdicts],
        "sweeps": [sweep.public(answer.metric) for sweep in answer.sweeps],
        "rows": [row.public() for row in rows],
    }
    if answer.serving:
        data["serving"] = [pick.public() for pick in answer.serving]
    return _one_entry_a_line(data)


def _one_entry_a_line(data: dict) -> str:
    """The document with each key of the top level, and each entry of its lists, on a line of its
    own: as diffable as an indented document, and written by json's C encoder (which indents
    nothing) in a third of the time — 3000 engines at a point make 18 MB."""
    lines = []
    for index, (key, value) in enumerate(data.items()):
        end = "," if index < len(data) - 1 else ""
        if isinstance(value, list) and value:
            entries = [_verdict_json(entry) if key == "verdicts" else json.dumps(entry) for entry in value]
            lines.append(f"  {json.dumps(key)}: [")
            lines.extend(f"    {entry}," for entry in entries[:-1])
            lines.append(f"    {entries[-1]}")
            lines.append(f"  ]{end}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{end}")
    return "{\n" + "\n".join(lines) + "\n}\n"


def _verdict_json(verdict: dict) -> str:
    """``json.dumps(verdict)``, the same text, with each engine its comparisons name encoded once.
    A verdict names an engine in up to one comparison per other candidate (16,490 comparisons for
    3000 engines in sets of ten), each naming it by the same entry (verdict_json.py): encoding that
    entry, floats and all, at every mention was most of the time the document took to write."""
    comparisons = verdict.get("comparisons")
    if not comparisons or any(list(pair)[:2] != ["a", "b"] for pair in comparisons):
        return json.dumps(verdict)
    engines: dict[int, str] = {}

    def engine(entry) -> str:
        if id(entry) not in engines:
            engines[id(entry)] = json.dumps(entry)
        return engines[id(entry)]

    pairs = []
    for pair in comparisons:
        rest = json.dumps({key: value for key, value in pair.items() if key not in ("a", "b")})
        pairs.append(f'{{"a": {engine(pair["a"])}, "b": {engine(pair["b"])}' + (f", {rest[1:]}" if rest != "{}" else "}"))
    keys = list(verdict)
    at = keys.index("comparisons")
    before = json.dumps({key: verdict[key] for key in keys[:at]})
    after = json.dumps({key: verdict[key] for key in keys[at + 1 :]})
    spliced = f'"comparisons": [{", ".join(pairs)}]'
    return (before[:-1] + ", " if before != "{}" else "{") + spliced + (", " + after[1:] if after != "{}" else "}")

"""The compare JSON is written as json.dumps writes each entry (pipeline/report/json_document.py),
whatever the shortcuts taken to write it fast."""

from __future__ import annotations

import json

from pipeline.report.json_document import _one_entry_a_line, _verdict_json


def _engine(name: str, median: float) -> dict:
    return {"variant": "fp16", "toolchain": name, "engine": "m_fp16", "median_ms": median, "median_ci_ms": [median * 0.9, median * 1.1]}


def _verdict() -> dict:
    a, b, c = _engine("x", 1.0 / 3), _engine("y", 2.0 / 3), _engine("z\u00e9\n", float("nan"))
    pair = {"ratio": 0.5, "low": 0.4, "high": None, "outcome": "faster", "ratios_range": [0.1, 0.2]}
    return {
        "model": "m",
        "fastest": a,
        "tied": [b],
        "comparisons": [{"a": a, "b": b, **pair}, {"a": a, "b": c, **pair}, {"a": None, "b": a, **pair}, {"a": c, "b": b}],
        "excluded": [],
        "text": 'says "comparisons": [] in words',
    }


def test_a_verdict_is_written_as_json_dumps_writes_it():
    verdict = _verdict()
    assert _verdict_json(verdict) == json.dumps(verdict)


def test_a_verdict_without_comparisons_or_keys_around_them_is_written_as_json_dumps_writes_it():
    verdict = _verdict()
    alone = {"comparisons": verdict["comparisons"]}
    first = {key: verdict[key] for key in ("comparisons", "text")}
    last = {key: verdict[key] for key in ("model", "comparisons")}
    for shape in (alone, first, last, {**verdict, "comparisons": []}):
        assert _verdict_json(shape) == json.dumps(shape)


def test_a_comparison_not_opening_with_its_engines_is_written_as_json_dumps_writes_it():
    verdict = _verdict()
    verdict["comparisons"].append({"ratio": 1.0, "a": verdict["fastest"], "b": verdict["fastest"]})
    assert _verdict_json(verdict) == json.dumps(verdict)


def test_the_document_parses_back_to_its_data():
    data = {"schema": 18, "verdicts": [_verdict(), _verdict()], "sweeps": [], "rows": [{"model": "m"}]}
    written = _one_entry_a_line(data)
    assert json.loads(written.replace("NaN", "null")) == json.loads(json.dumps(data).replace("NaN", "null"))
    assert written.splitlines()[3:5] == [f"    {json.dumps(_verdict())},", f"    {json.dumps(_verdict())}"]  # an entry a line

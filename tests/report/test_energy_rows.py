"""Each row's energy per inference (pipeline/report/energy.py): from the joules its takes read, the
takes that did not resolve or were dropped left out; paired by round between two rows
(confidence.energy_ratio); shown in the table, markdown, HTML and JSON, or why a row has none."""

from __future__ import annotations

import json

import pytest

from pipeline.measuring.energy import CPU_SCOPE, GPU_SCOPE, TOOL_TAKE, EnergyHow
from pipeline.measuring.records import RoundsRecord, Take
from pipeline.report.confidence import energy_ratio
from pipeline.report.energy import ALONE, BEFORE, attach_energy, energy_notes
from pipeline.report.html import render_html
from pipeline.report.json_document import JSON_SCHEMA_VERSION, render_json
from pipeline.report.rows import ComparisonRow
from pipeline.report.tables import parse_columns, render_markdown, render_table

HOW = EnergyHow(source="nvml", scope=GPU_SCOPE, counter="nvmlDeviceGetTotalEnergyConsumption", min_steps=10, step_ms=20.0)


def record(
    entrant: str, joules: list[float | None], runs: int = 9, resolved=None, dropped=(), how=HOW, why=None, group="g"
) -> RoundsRecord:
    """One engine's rounds: take i read joules[i] over runs + 1 inferences (the untimed one too)."""
    return RoundsRecord(
        group=group,
        entrant=entrant,
        entrants=["fp16/a", "fp16/b"],
        takes=[
            Take(
                round=i,
                order=0,
                runs=runs,
                median_ms=1.0,
                dropped="throttled" if i in dropped else None,
                joules=j,
                energy_runs=None if j is None else runs + 1,
                energy_steps=None if j is None else 12,
                energy_resolved=None if j is None else (resolved is None or resolved[i]),
            )
            for i, j in enumerate(joules)
        ],
        rounds=len(joules),
        stop="decided",
        elapsed_s=1.0,
        take_ms=100.0,
        take_runs=1,
        min_rounds=6,
        budget_s=30.0,
        tie=0.03,
        seed=0,
        energy=how,
        energy_why_not=why,
    )


def row(variant="fp16", toolchain="a", records=(), tokens=None) -> ComparisonRow:
    made = ComparisonRow(model="m", variant=variant, toolchain=toolchain, status="measured (GPU time)", outcome="measured")
    made.median_ms, made.images_per_s, made.batch_size, made.tokens_per_s = 1.0, 8000.0, 8, tokens
    made.p5_ms, made.p95_ms, made.samples_ms = 0.9, 1.1, [0.9, 1.0, 1.1]
    made.round_entrants = {"g": (f"{variant}/{toolchain}", ("fp16/a", "fp16/b"))}
    attach_energy(made, list(records))
    return made


def test_energy_per_inference_is_the_resolved_kept_takes_joules_over_their_inferences():
    # Ten inferences a take; take 2 did not resolve (a reading of one counter step), take 4 was
    # throttled: both left out, as a dropped take is out of the times.
    joules = [2.0, 2.2, 0.5, 1.8, 9.0, 2.0]
    made = row(records=[record("fp16/a", joules, resolved=[True, True, False, True, True, True], dropped={4})])
    assert made.joules_per_inference == pytest.approx((2.0 + 2.2 + 1.8 + 2.0) / 40)
    assert made.inferences_per_joule == pytest.approx(40 / 8.0)
    assert made.energy_source == "nvml" and made.energy_scope == GPU_SCOPE and made.energy_why_not is None
    assert made.round_energies == {"g": [0.2, pytest.approx(0.22), None, 0.18, None, 0.2]}
    assert made.tokens_per_joule is None
    # A row with tokens: 8 sequences of 128 tokens a run.
    tokens = row(records=[record("fp16/a", joules)], tokens=8000.0 * 128)
    assert tokens.tokens_per_joule == pytest.approx(8 * 128 * tokens.inferences_per_joule)


@pytest.mark.parametrize(
    "records, why",
    [
        ([], ALONE),
        ([record("fp16/a", [None] * 6, how=None, why="no RAPL: /sys/class/powercap absent")], "no RAPL: /sys/class/powercap absent"),
        ([record("fp16/a", [None] * 6, how=None, why=TOOL_TAKE)], TOOL_TAKE),
        ([record("fp16/a", [None] * 6, how=None)], BEFORE),
        (
            [record("fp16/a", [0.1] * 6, resolved=[False] * 6, how=HOW.model_copy(update={"least_take_ms": 4000.0}))],
            "nvml's counter did not resolve in any take (fewer than 10 steps, takes lengthened up to 4000 ms)",
        ),
    ],
)
def test_a_row_without_energy_says_why(records, why):
    made = row(records=records)
    assert made.joules_per_inference is None and made.energy_why_not == why and made.round_energies == {}


def test_two_rows_timed_together_compare_their_energy_round_by_round():
    """B spends 1.5× A's joules in every round, while the GPU's idle power moves both alike
    (a neighbour's work, the board warming): paired by round the ratio holds; unpaired it would not."""
    drift = [1.0, 1.4, 0.8, 1.2, 0.9, 1.3, 1.1, 0.7, 1.0, 1.2]
    a = row("fp16", "a", [record("fp16/a", [2.0 * d for d in drift])])
    b = row("fp16", "b", [record("fp16/b", [3.0 * d for d in drift])])
    estimate = energy_ratio(a, b, tie=0.03)
    assert estimate.ratio == pytest.approx(2 / 3) and estimate.paired and estimate.rounds == 10
    assert estimate.outcome == "faster"  # A spends less
    assert energy_ratio(b, a, tie=0.03).outcome == "slower"
    apart = row("fp16", "c", [record("fp16/a", [2.0] * 10, group="other")])
    rapl = row("fp16", "b", [record("fp16/b", [3.0] * 10, how=HOW.model_copy(update={"source": "rapl", "scope": CPU_SCOPE}))])
    none = row("fp16", "b", [])
    assert energy_ratio(a, apart, 0.03) is None  # no round shared: nothing to pair
    assert energy_ratio(a, rapl, 0.03) is None  # a GPU's joules against a CPU package's
    assert energy_ratio(a, none, 0.03) is None and energy_ratio(none, a, 0.03) is None


def rows_of_a_gpu_point():
    measured = row("fp16", "torch-eager", [record("fp16/a", [2.0] * 6)])
    alone = row("fp16", "trt10.14", [])
    return [measured, alone]


def test_every_format_shows_the_energy_and_why_a_row_has_none():
    rows = rows_of_a_gpu_point()
    table = "\n".join(text for text, _ in render_table(rows, width=250, wide=True).lines)
    assert "J/inf" in table and "inf/J" in table and "  0.2  " in table
    notes = energy_notes(rows)
    assert notes == [
        f"J/inf: joules per inference (a run of its batch) from the energy counter read around each take, nvml: {GPU_SCOPE} (inf/J: its inverse)",
        f"no energy (fp16/trt10.14): {ALONE}",
    ]
    assert all(note in table for note in notes)
    # A terminal too narrow for the inverses says where they are, rather than name columns it lacks.
    narrow = "\n".join(text for text, _ in render_table(rows, width=150).lines)
    assert "J/inf" in narrow and "inf/J  " not in narrow and "(inf/J, its inverse: --wide, or --format md)" in narrow.replace("\n    ", " ")
    markdown = render_markdown(rows)
    assert "| J/inf | inf/J |" in markdown and f"no energy (fp16/trt10.14): {ALONE}." in markdown
    page = render_html(rows, [])
    assert "<th>J/inf</th>" in page and "idle power included" in page and "measured alone by its tool" in page
    document = json.loads(render_json(rows))
    assert document["schema"] == JSON_SCHEMA_VERSION == 19
    first, second = document["rows"]
    assert first["joules_per_inference"] == pytest.approx(0.2) and first["energy_source"] == "nvml" and first["energy_why_not"] is None
    assert second["joules_per_inference"] is None and second["energy_why_not"] == ALONE
    assert "round_energies" not in first


def test_the_energy_note_names_as_shown_only_the_inverse_columns_the_table_has():
    rows = [row(records=[record("fp16/a", [2.0] * 6)], tokens=8000.0 * 128)]

    def note(columns: str) -> str:
        table = "\n".join(text for text, _ in render_table(rows, width=250, columns=parse_columns(columns)).lines)
        return next(line for line in table.replace("\n    ", " ").splitlines() if "J/inf:" in line)

    assert note("median,j/inf,inf/j,tok/j").endswith("(inf/J, tok/J: its inverse)")
    assert note("median,j/inf,tok/j").endswith("(tok/J: its inverse; inf/J: --wide, or --format md)")
    assert note("median,j/inf,inf/j").endswith("(inf/J: its inverse; tok/J: --wide, or --format md)")
    assert note("median,j/inf").endswith("(inf/J, tok/J, its inverse: --wide, or --format md)")


def test_a_table_with_no_energy_anywhere_says_why_once_and_shows_no_energy_columns():
    why = "no RAPL: /sys/class/powercap absent"
    rows = [row(v, "onnxruntime", [record(f"{v}/onnxruntime", [None] * 6, how=None, why=why)]) for v in ("fp32", "fp16")]
    table = "\n".join(text for text, _ in render_table(rows, width=250).lines)
    assert "J/inf" not in table and f"no energy: {why}" in table

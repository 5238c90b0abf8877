"""The comparison as text: the terminal table (fitted to its width), markdown, JSON and CSV. Every
format renders the same rows and the same cells; the HTML report uses them too.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import UsageError
from pipeline.report.rows import ComparisonRow


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _marked(value: float | None, significant: bool | None, text: str) -> str:
    if value is None:
        return "–"
    return ("" if significant in (None, True) else "~") + text


def _roofline(row: ComparisonRow) -> str:
    if row.achieved_tflops is None:
        return "–"
    return f"{row.achieved_tflops:.3g}" + (f" ({row.peak_fraction:.0%})" if row.peak_fraction is not None else "")


def _change(row: ComparisonRow) -> str:
    if row.change_pct is None:
        return "–"
    return ("" if row.change_significant else "~") + f"{row.change_pct:+.1f}% ({row.change_ms:+.3f} ms) vs {row.reference_toolchain}"


def _accuracy(row: ComparisonRow, text: str) -> str:
    if row.accuracy_source == "measured" and row.nonfinite_values:
        return "NaN/Inf"
    return f"{text} (proxy)" if row.accuracy_source == "proxy" and text != "–" else text


@dataclass(frozen=True)
class Column:
    """One column of the comparison: its name for --columns, its header, and how a row fills it."""

    key: str
    header: str
    cell: Callable[[ComparisonRow], str]
    # Words, left-aligned, that may wrap in a narrow terminal; numbers are never wrapped or cut.
    text: bool = False
    # The header in a compact table, on two lines where that saves width.
    short_header: str | None = None


COLUMNS = (
    Column("engine", "engine", lambda r: r.engine, text=True),
    Column("variant", "variant", lambda r: r.variant, text=True),
    Column("toolchain", "toolchain", lambda r: r.target, text=True),
    Column("median", "median ms", lambda r: _fmt(r.median_ms, ".3f")),
    Column("p99", "p99 ms", lambda r: _fmt(r.p99_ms, ".3f")),
    Column("cv", "CV", lambda r: _fmt(r.cv * 100 if r.cv is not None else None, ".1f", "%")),
    Column("img/s", "img/s", lambda r: _fmt(r.images_per_s, ".1f")),
    Column("speedup", "speedup", lambda r: _marked(r.speedup, r.speedup_significant, f"{r.speedup or 0:.2f}x vs {r.baseline}"), text=True),
    Column(
        "vs-baseline-toolchain",
        "vs baseline toolchain",
        lambda r: _marked(
            r.vs_baseline_toolchain, r.vs_baseline_toolchain_significant, f"{r.vs_baseline_toolchain or 0:.2f}x vs {r.baseline_toolchain}"
        ),
        text=True,
        short_header="vs baseline\ntoolchain",
    ),
    Column("vs-ref-toolchain", "vs ref toolchain", _change, text=True, short_header="vs ref\ntoolchain"),
    Column("engine-mb", "engine MB", lambda r: _fmt(r.engine_mb, ".1f")),
    Column("build-s", "build s", lambda r: _fmt(r.build_s, ".1f")),
    Column("accuracy", "vs FP32 cos", lambda r: _accuracy(r, _fmt(r.accuracy_cosine, ".4f")), short_header="cos vs\nFP32"),
    Column(
        "top1",
        "top-1 vs FP32",
        lambda r: _accuracy(r, _fmt(r.top1_agreement * 100 if r.top1_agreement is not None else None, ".0f", "%")),
        short_header="top-1",
    ),
    Column("top1-acc", "top-1 acc (labels)", lambda r: _fmt(r.top1_accuracy * 100 if r.top1_accuracy is not None else None, ".1f", "%")),
    Column("audit", "layer audit", lambda r: r.audit or "–", text=True),
    Column("tflops", "TFLOP/s (peak %)", _roofline, short_header="TFLOP/s\n(peak %)"),
    Column("status", "status", lambda r: r.full_status, text=True),
)
COLUMNS_BY_KEY = {column.key: column for column in COLUMNS}
# Every column: files (markdown, HTML) and wide terminals.
WIDE = tuple(c for c in COLUMNS if c.key != "variant")
# Narrower sets, tried in turn when every column does not fit (NARROW, with the accuracy, fits about
# 95 columns). The model is the table's title; the speedups' references and the status's details
# are notes under it. COMPACT fits 80 columns.
MEDIUM = (
    "variant",
    "toolchain",
    "median",
    "p99",
    "cv",
    "img/s",
    "speedup",
    "vs-baseline-toolchain",
    "vs-ref-toolchain",
    "accuracy",
    "top1",
    "status",
)
NARROW = ("variant", "toolchain", "median", "p99", "img/s", "speedup", "accuracy", "top1", "status")
COMPACT = ("variant", "toolchain", "median", "p99", "img/s", "speedup", "status")
HEADERS = tuple(c.header for c in WIDE)


def row_cells(row: ComparisonRow) -> tuple[str, ...]:
    """The text of each of the row's cells, in the order of HEADERS: what every format shows."""
    return tuple(column.cell(row) for column in WIDE)


def parse_columns(text: str) -> tuple[str, ...]:
    """`--columns median,p99,status` → column keys, checked (engine and toolchain always lead)."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    unknown = [key for key in keys if key not in COLUMNS_BY_KEY]
    if unknown or not keys:
        raise UsageError(
            f"unknown column(s) {', '.join(map(repr, unknown)) or '(none given)'} for --columns.",
            hint=f"choose from {', '.join(COLUMNS_BY_KEY)}",
        )
    lead = [] if {"engine", "variant"} & set(keys) else ["variant"]
    return tuple(dict.fromkeys([*lead, *([] if "toolchain" in keys else ["toolchain"]), *keys]))


def render_markdown(rows: list[ComparisonRow]) -> str:
    out = []
    for model in dict.fromkeys(r.model for r in rows):
        out.append(f"### {model}\n")
        out.append("| " + " | ".join(HEADERS) + " |")
        out.append("|" + "|".join("---" for _ in HEADERS) + "|")
        for row in (r for r in rows if r.model == model):
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row_cells(row)) + " |")
        out.append("")
    out.append("`~`: within the runs' own spread (95% bootstrap CI of the median difference contains 0).")
    return "\n".join(out) + "\n"


class _Notes:
    """Numbered notes under a compact table: one per distinct text, in order of first use."""

    def __init__(self):
        self.texts: dict[str, int] = {}

    def mark(self, text: str) -> str:
        number = self.texts.setdefault(text, len(self.texts) + 1)
        return f"[{number}]"

    def lines(self) -> list[str]:
        return [f"[{n}] {text}" for text, n in self.texts.items()]


def _compact_status(row: ComparisonRow, notes: _Notes) -> str:
    word = row.status.split(" ", 1)[0].rstrip(":")
    word = {"build": "refused", "not": "not profiled"}.get(word, word)
    for kind in ("inaccurate", "busy", "throttled", "noisy", "measured differently"):
        if any(flag.startswith(kind) for flag in row.flags):
            word = "differs" if kind.startswith("measured") else kind
            break
    return f"{word} {notes.mark(row.full_status)}"


def render_table(rows: list[ComparisonRow], width: int, columns: tuple[str, ...] | None = None, wide: bool = False):
    """The comparison for a terminal ``width`` columns wide, every number whole.

    Every column when they fit (or with ``wide``, at whatever width that takes), else the first
    of MEDIUM, NARROW and COMPACT that fits; ``columns`` chooses them. Long texts wrap; numbers
    and names are never cut.
    """
    from rich.console import Group

    if columns is None and not wide:
        everything = _tables(rows, WIDE, compact=False)
        if _fits(everything, width):
            return everything
        for keys in (MEDIUM, NARROW):
            tables = _tables(rows, tuple(COLUMNS_BY_KEY[key] for key in keys), compact=True)
            if _fits(tables, width):
                return tables
        columns = COMPACT
    chosen = tuple(COLUMNS_BY_KEY[key] for key in columns) if columns else WIDE
    return _tables(rows, chosen, compact=bool(columns)) or Group()


def _fits(tables, width: int) -> bool:
    """Whether every table's natural width (long texts wrapped at WRAP_AT) fits in ``width``."""
    import io

    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    console = Console(file=io.StringIO(), width=10_000)
    return all(Measurement.get(console, console.options, part).maximum <= width for part in tables.renderables if isinstance(part, Table))


# Long texts (a skip reason, the layer audit) wrap at this width in a wide table.
WRAP_AT = 36


def _tables(rows: list[ComparisonRow], columns: tuple[Column, ...], compact: bool):
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts = []
    for model in dict.fromkeys(r.model for r in rows):
        model_rows = [r for r in rows if r.model == model]
        notes = _Notes() if compact else None
        table = Table(
            title=f"{model}: medians of per-iteration latency",
            box=box.SIMPLE_HEAD,
            collapse_padding=True,
            pad_edge=False,
            title_justify="left",
        )
        for column in columns:
            cells = [_cell(column, row, notes) for row in model_rows]
            header = (column.short_header or column.header) if compact else column.header
            if column.key in ("status", "audit"):
                table.add_column(header, justify="left", overflow="fold", max_width=None if compact else WRAP_AT)
            elif column.text:
                table.add_column(header, justify="left", no_wrap=True)
            else:
                widest = max([*map(len, header.splitlines()), *map(len, cells)])
                table.add_column(header, justify="right", no_wrap=True, min_width=widest)
        for row in model_rows:
            table.add_row(*(_cell(column, row, notes) for column in columns), style=None if row.median_ms is not None else "dim")
        parts.append(table)
        footer = ["~ = within the runs' own spread"]
        if notes is not None:
            footer += _reference_notes(model_rows, {c.key for c in columns})
        parts.append(Text("\n".join(footer + (notes.lines() if notes else [])), style="dim"))
        parts.append(Text(""))
    return Group(*parts) if parts else None


def _reference_notes(rows: list[ComparisonRow], keys: set[str]) -> list[str]:
    """What the speedup columns of a compact table are measured against (named in the cells of a wide one)."""
    notes = []
    if "speedup" in keys:
        bases: dict[str, list[str]] = {}
        for row in rows:
            if row.baseline and row.toolchain not in bases.get(row.baseline, []):
                bases.setdefault(row.baseline, []).append(row.toolchain)
        if len(bases) == 1:
            notes.append(f"speedup: against the {next(iter(bases))} variant of the same toolchain")
        elif bases:
            notes.append("speedup: against the toolchain's " + "; ".join(f"{b} variant ({', '.join(t)})" for b, t in bases.items()))
    reference = next((r.baseline_toolchain for r in rows if r.baseline_toolchain), None)
    if "vs-baseline-toolchain" in keys and reference:
        notes.append(f"vs baseline toolchain: speedup over {reference}, same variant")
    reference = next((r.reference_toolchain for r in rows if r.reference_toolchain), None)
    if "vs-ref-toolchain" in keys and reference:
        notes.append(f"vs ref toolchain: change against {reference}, same variant")
    if {"accuracy", "top1"} & keys and any(r.accuracy_source for r in rows):
        notes.append("cos, top-1: the engine's own outputs against the FP32 PyTorch model's on the reference batch")
        if any(r.accuracy_source == "proxy" for r in rows):
            notes.append("*: accuracy proxy (the fake-quantized PyTorch model), where no engine's outputs were checked")
    return notes


def _cell(column: Column, row: ComparisonRow, notes: _Notes | None) -> str:
    """A cell of a wide table, or its short form in a compact one (references go in the notes)."""
    if notes is None:
        return column.cell(row)
    if column.key == "status":
        return _compact_status(row, notes)
    if column.key == "speedup":
        return _marked(row.speedup, row.speedup_significant, f"{row.speedup or 0:.2f}x")
    if column.key == "vs-baseline-toolchain":
        return _marked(row.vs_baseline_toolchain, row.vs_baseline_toolchain_significant, f"{row.vs_baseline_toolchain or 0:.2f}x")
    if column.key in ("accuracy", "top1") and row.accuracy_source == "proxy" and row.accuracy_cosine is not None:
        return column.cell(row).replace(" (proxy)", "*")  # the note under the table says what * is
    if column.key == "vs-ref-toolchain" and row.change_pct is not None:
        return ("" if row.change_significant else "~") + f"{row.change_pct:+.1f}%"
    return column.cell(row)


def render_json(rows: list[ComparisonRow]) -> str:
    return json.dumps([row.public() for row in rows], indent=2) + "\n"


def render_csv(rows: list[ComparisonRow]) -> str:
    buffer = io.StringIO()
    fields = list(rows[0].public().keys()) if rows else []
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        data = row.public()
        data["median_ci_ms"] = "" if data["median_ci_ms"] is None else f"{data['median_ci_ms'][0]:.6f}..{data['median_ci_ms'][1]:.6f}"
        writer.writerow(data)
    return buffer.getvalue()

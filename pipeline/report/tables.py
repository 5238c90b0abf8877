"""The comparison as text: the terminal table (fitted to its width), markdown, JSON and CSV. Every
format renders the same rows and the same cells; the HTML report uses them too.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.catalog.shape import shown
from pipeline.report.answer import GAP, Answer, cell_len, wrap
from pipeline.report.energy import energy_notes
from pipeline.report.rows import ComparisonRow
from pipeline.report.streams import streams_lines, streams_markdown
from pipeline.running.errors import UsageError


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


# What the p99 cell's mark means (a row whose takes cannot bound its p99), said under each table.
UNBOUNDED_P99 = "? = too few takes to bound the p99 (it needs {needed}; a take's runs share its host and clock and count about as one)"


def _p99(row: ComparisonRow) -> str:
    """The p99, marked "?" where its runs cannot bound it (UNBOUNDED_P99)."""
    return _fmt(row.p99_ms, ".3f") + ("?" if row.p99_ms is not None and row.p99_interval_ms is None else "")


def _p99_interval(row: ComparisonRow) -> str:
    if row.p99_interval_ms is not None:
        return f"{row.p99_interval_ms[0]:.3f}–{row.p99_interval_ms[1]:.3f}"
    if row.p99_takes_needed is not None:
        return f"needs {row.p99_takes_needed} takes ({row.tail_takes})"
    return "–" if row.p99_ms is None else "not timed in takes"


def unbounded_p99_note(rows: list[ComparisonRow]) -> list[str]:
    """The note that explains the "?" mark, where a row carries it."""
    from pipeline.measuring.quantiles import runs_needed

    return [UNBOUNDED_P99.format(needed=runs_needed(0.99))] if any(_p99(row).endswith("?") for row in rows) else []


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
    Column("shape", "shape", lambda r: shown(r.shape) or "–", text=True),
    Column("median", "median ms", lambda r: _fmt(r.median_ms, ".3f")),
    Column("p99", "p99 ms", _p99),
    Column("p99-interval", "p99 95% interval", _p99_interval, text=True, short_header="p99 95%\ninterval"),
    Column("cv", "CV", lambda r: _fmt(r.cv * 100 if r.cv is not None else None, ".1f", "%")),
    Column("img/s", "img/s", lambda r: _fmt(r.images_per_s, ".1f")),
    Column("tok/s", "tokens/s", lambda r: _fmt(r.tokens_per_s, ",.0f")),
    Column("j/inf", "J/inf", lambda r: _fmt(r.joules_per_inference, ".4g")),
    Column("inf/j", "inf/J", lambda r: _fmt(r.inferences_per_joule, ".4g")),
    Column("tok/j", "tok/J", lambda r: _fmt(r.tokens_per_joule, ",.0f")),
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
    Column("max-abs", "max |err| vs FP32", lambda r: _accuracy(r, _fmt(r.max_abs_error, ".3g")), short_header="max |err|\nvs FP32"),
    Column("mean-abs", "mean |err| vs FP32", lambda r: _accuracy(r, _fmt(r.mean_abs_error, ".3g")), short_header="mean |err|\nvs FP32"),
    Column("mse", "MSE vs FP32", lambda r: _accuracy(r, _fmt(r.mse, ".3g")), short_header="MSE\nvs FP32"),
    Column("top1-acc", "top-1 acc (labels)", lambda r: _fmt(r.top1_accuracy * 100 if r.top1_accuracy is not None else None, ".1f", "%")),
    Column("audit", "layer audit", lambda r: r.audit or "–", text=True),
    Column("tflops", "TFLOP/s (peak %)", _roofline, short_header="TFLOP/s\n(peak %)"),
    Column("status", "status", lambda r: r.full_status, text=True),
)
COLUMNS_BY_KEY = {column.key: column for column in COLUMNS}
# Every column: files (markdown, HTML) and wide terminals; the error columns only by --columns
# (attention kernels against the math kernel, say), as cosine and top-1 say enough of most models.
ERROR_COLUMNS = ("max-abs", "mean-abs", "mse")
WIDE = tuple(c for c in COLUMNS if c.key != "variant" and c.key not in ERROR_COLUMNS)
# Narrower sets, tried in turn when every column does not fit (NARROW, with the accuracy, fits about
# 95 columns). The model is the table's title; the speedups' references and the status's details
# are notes under it. COMPACT fits 80 columns.
MEDIUM = (
    "variant",
    "toolchain",
    "shape",
    "median",
    "p99",
    "cv",
    "img/s",
    "tok/s",
    "j/inf",
    "speedup",
    "vs-baseline-toolchain",
    "vs-ref-toolchain",
    "accuracy",
    "top1",
    "status",
)
NARROW = ("variant", "toolchain", "shape", "median", "p99", "img/s", "tok/s", "speedup", "accuracy", "top1", "status")
COMPACT = ("variant", "toolchain", "shape", "median", "p99", "tok/s", "img/s", "speedup", "status")
# Columns a model's table shows only when one of its rows has a value there (shape points, tokens).
OPTIONAL = {"shape": lambda r: r.shape, "tok/s": lambda r: r.tokens_per_s}
# Energy: where a row of the table has a figure; a note under it says why the others have none.
OPTIONAL.update({"j/inf": lambda r: r.joules_per_inference, "inf/j": lambda r: r.inferences_per_joule})
OPTIONAL["tok/j"] = lambda r: r.tokens_per_joule


def columns_for(rows: list[ComparisonRow], keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` without the optional columns none of ``rows`` fills (a timm model has no shape points)."""
    return tuple(key for key in keys if key not in OPTIONAL or any(OPTIONAL[key](row) for row in rows))


def samples_header(rows: list[ComparisonRow]) -> str:
    """The throughput column's header in the model's unit: img/s, or seq/s for token inputs."""
    units = {row.sample_unit for row in rows}
    return {"img": "img/s", "seq": "seq/s"}.get(units.pop(), "samples/s") if len(units) == 1 else "samples/s"


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


def render_markdown(rows: list[ComparisonRow], answer: Answer | None = None) -> str:
    out = [answer.markdown()] if answer is not None else []
    for model in dict.fromkeys(r.model for r in rows):
        model_rows = [r for r in rows if r.model == model]
        columns = [COLUMNS_BY_KEY[key] for key in columns_for(model_rows, tuple(c.key for c in WIDE))]
        headers = [samples_header(model_rows) if c.key == "img/s" else c.header for c in columns]
        out.append(f"### {model}\n")
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "|".join("---" for _ in headers) + "|")
        for row in model_rows:
            out.append("| " + " | ".join(column.cell(row).replace("|", "\\|") for column in columns) + " |")
        out.append("")
    out.append(
        "`~`: within the runs' own spread (the 95% interval of the ratio, paired by round where timed in rounds, "
        "else a bootstrap of the medians' difference, contains no change), or too few rounds for an interval."
    )
    out += [f"`?`{note[1:]}" for note in unbounded_p99_note(rows)]
    out += [f"{note}." for note in energy_notes(rows)]
    served = streams_markdown(rows)
    return "\n".join(out) + "\n" + (f"\n{served}" if served else "")


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
    word = {"out_of_memory": "out of memory", "faulted": "faulted"}.get(row.outcome, word)
    for kind in ("inaccurate", "busy", "host slowed", "throttled", "noisy", "measured differently", "out of the running"):
        if any(flag.startswith(kind) for flag in row.flags):
            word = {"measured differently": "differs", "out of the running": "raced out"}.get(kind, kind)
            break
    return f"{word} {notes.mark(row.full_status)}"


def render_table(
    rows: list[ComparisonRow], width: int, columns: tuple[str, ...] | None = None, wide: bool = False, answer: Answer | None = None
):
    """The comparison for a terminal ``width`` columns wide, every number whole: lines laid out here, for rich to print.

    Every column when they fit (or with ``wide``, at whatever width that takes), else the first
    of MEDIUM, NARROW and COMPACT that fits; ``columns`` chooses them. Long texts wrap; numbers
    and names are never cut.
    """
    by_model: dict[str, list[ComparisonRow]] = {}
    for row in rows:
        by_model.setdefault(row.model, []).append(row)
    if columns is None and not wide:
        for keys, compact in ((tuple(c.key for c in WIDE), False), (MEDIUM, True), (NARROW, True)):
            tables = [_TextTable(model, model_rows, keys, compact) for model, model_rows in by_model.items()]
            if all(table.width <= width for table in tables):
                return _text(tables, width, answer)
        columns = COMPACT
    keys = columns or tuple(c.key for c in WIDE)
    tables = [_TextTable(model, model_rows, keys, compact=bool(columns)) for model, model_rows in by_model.items()]
    if wide:
        return _text(tables, None, answer)
    for table in tables:
        table.narrow_to(width)
    return _text(tables, width, answer)


# Long texts (a skip reason, the layer audit) wrap at this width in a wide table.
WRAP_AT = 36


class _TextTable:
    """One model's table as lines of text: the terminal table is drawn here rather than by rich's
    Table, which measures and renders every cell through its layout engine and took about 10 s for
    a results folder of 3000 manifests (scripts/benchmark_compare.py)."""

    def __init__(self, model: str, rows: list[ComparisonRow], keys: tuple[str, ...], compact: bool):
        self.model, self.rows = model, rows
        self.columns = [COLUMNS_BY_KEY[key] for key in columns_for(rows, keys)]
        self.notes = _Notes() if compact else None
        self.headers = [
            [samples_header(rows)] if c.key == "img/s" else ((c.short_header or c.header) if compact else c.header).splitlines()
            for c in self.columns
        ]
        self.cells = [[_cell(column, row, self.notes) for column in self.columns] for row in rows]
        # Words that may wrap (the status, the layer audit): at WRAP_AT in a wide table.
        self.wraps = [column.key in ("status", "audit") for column in self.columns]
        self.widths = []
        for index, header in enumerate(self.headers):
            widest = max([cell_len(line) for line in header] + [cell_len(cells[index]) for cells in self.cells])
            if self.wraps[index] and not compact:
                widest = max([cell_len(line) for line in header] + [min(WRAP_AT, widest)])
            self.widths.append(widest)

    @property
    def width(self) -> int:
        return sum(self.widths) + len(GAP) * (len(self.widths) - 1)

    def narrow_to(self, width: int) -> None:
        """Wrap the long texts narrower where the table is still wider than the terminal (numbers keep their width)."""
        for index, wraps in enumerate(self.wraps):
            excess = self.width - width
            if wraps and excess > 0:
                floor = max([12] + [len(line) for line in self.headers[index]])
                self.widths[index] = max(floor, self.widths[index] - excess)

    def lines(self, width: int | None) -> list[tuple[str, str | None]]:
        """(text, style) of each line: the title, the header, a rule, the rows and the notes
        (wrapped at ``width``, with a hanging indent)."""
        out: list[tuple[str, str | None]] = [(f"{self.model}: medians of per-iteration latency", "italic")]
        height = max(len(header) for header in self.headers)
        for line in range(height):
            # Headers sit on the last lines, over their numbers.
            texts = [header[line - height + len(header)] if line >= height - len(header) else "" for header in self.headers]
            out.append((self._join(texts), "bold"))
        out.append(("─" * self.width, None))
        for row, cells in zip(self.rows, self.cells):
            wrapped = [wrap(text, self.widths[i]) if self.wraps[i] else [text] for i, text in enumerate(cells)]
            for line in range(max(map(len, wrapped))):
                texts = [parts[line] if line < len(parts) else "" for parts in wrapped]
                out.append((self._join(texts), None if row.median_ms is not None else "dim"))
        footer = ["", "~ = within the runs' own spread, or too few rounds to tell"]
        if any(column.key == "p99" for column in self.columns):
            footer += unbounded_p99_note(self.rows)
        footer += energy_notes(self.rows, shown={column.key for column in self.columns})
        if self.notes is not None:
            footer += _reference_notes(self.rows, {c.key for c in self.columns}) + self.notes.lines()
        for note in footer:
            out += [(line, "dim") for line in (wrap(note, width, indent="    ") if width else [note])]
        return out + [("", None)]

    def _join(self, texts: list[str]) -> str:
        parts = []
        for text, width, column in zip(texts, self.widths, self.columns):
            padding = " " * max(0, width - cell_len(text))
            parts.append(text + padding if column.text else padding + text)
        return GAP.join(parts).rstrip()


def _text(tables: list[_TextTable], width: int | None, answer: Answer | None = None) -> _Lines:
    lead = answer.lines(width) if answer is not None else []
    rows = [row for table in tables for row in table.rows]
    return _Lines(lead + [line for table in tables for line in table.lines(width)] + streams_lines(rows, width))


class _Lines:
    """Styled lines for rich to print as they are: laid out here already, so rich neither wraps
    nor measures them again (which, over thousands of rows, took longer than everything else)."""

    def __init__(self, lines: list[tuple[str, str | None]]):
        self.lines = lines

    def __rich_console__(self, console, options):
        from rich.segment import Segment

        styles: dict[str | None, object] = {None: None}
        for text, style in self.lines:
            if style not in styles:
                styles[style] = console.get_style(style)
            yield Segment(text, styles[style])
            yield Segment.line()


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


def render_csv(rows: list[ComparisonRow]) -> str:
    buffer = io.StringIO()
    fields = list(rows[0].public().keys()) if rows else []
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        data = row.public()
        data["median_ci_ms"] = "" if data["median_ci_ms"] is None else f"{data['median_ci_ms'][0]:.6f}..{data['median_ci_ms'][1]:.6f}"
        data["streams"] = json.dumps(data["streams"]) if data["streams"] else ""  # one cell: the JSON's entries
        writer.writerow(data)
    return buffer.getvalue()

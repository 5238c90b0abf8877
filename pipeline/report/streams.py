"""Serving at N concurrent streams in the reports (docs/streams.md): each row's figures per stream
count (``ComparisonRow.streams``), the "streams" section of the terminal and markdown reports, and
`--p99-under`'s answer — the engine and concurrency that serve the most inferences/s whose p99 is
shown, by its 95 % interval's upper end, to be within a budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog.shape import shown
from pipeline.report.answer import GAP, cell_len, wrap
from pipeline.report.flags import launch_bound
from pipeline.running.errors import UsageError

# How many requests bound a p99 at 95 % (quantiles.runs_needed(0.99)), said where none had enough.
_P99 = "99"


def served_entries(records) -> list[dict[str, Any]]:
    """A row's serving, one entry a stream count and way of serving, from its profile's records
    (ProfileDetails.streams): what the reports and the JSON show, without the requests' latencies."""
    out = []
    for record in records:
        entry: dict[str, Any] = {"streams": record.streams, "mode": record.mode, "how": record.how, "why_not": record.why_not}
        if record.why_not is None:
            entry.update(
                inferences_per_s=record.inferences_per_s,
                samples_per_s=record.samples_per_s,
                tokens_per_s=record.tokens_per_s,
                requests=record.completed,
                span_s=record.span_s,
                bounded_by=record.bounded_by,
                takes_inferences_per_s=list(record.takes_per_s),
            )
            for percent, name in (("50", "median"), ("90", "p90"), ("99", "p99")):
                entry[f"{name}_ms"] = record.latency_ms.get(percent)
                entry[f"{name}_interval_ms"] = record.interval_ms.get(percent)
                entry[f"{name}_requests_needed"] = record.requests_needed.get(percent)
        out.append(entry)
    return out


# --- the section -----------------------------------------------------------------------------------


# "throughput": samples (img, seq) a second, or tokens where a request carries them, each cell in its unit.
# "takes inf/s": the lowest and highest of the count's takes (serve_rounds), how far the host moved it.
STREAM_HEADERS = (
    "variant",
    "toolchain",
    "streams",
    "mode",
    "inf/s",
    "throughput",
    "takes inf/s",
    "median ms",
    "p90 ms",
    "p99 ms",
    "p99 95% interval",
)


def stream_cells(row, entry: dict[str, Any]) -> list[str]:
    head = [row.variant, row.target, str(entry["streams"]), entry["mode"]]
    if entry["why_not"] is not None:
        return [*head, "–", "–", "–", "–", "–", "–", f"not measured: {entry['why_not']}"]
    rate = f"{entry['tokens_per_s']:,.0f} tok/s" if entry.get("tokens_per_s") else f"{entry['samples_per_s']:.1f} {row.sample_unit}/s"
    bounded = entry["p99_interval_ms"]
    if bounded is not None:
        interval = f"{bounded[0]:.3f}–{bounded[1]:.3f}"
    elif entry["p99_requests_needed"] is not None:
        interval = f"needs {entry['p99_requests_needed']} (has {entry['requests']})"
    else:
        interval = entry["bounded_by"]
    p99 = f"{entry['p99_ms']:.3f}" + ("" if bounded is not None else "?") if entry["p99_ms"] is not None else "–"
    takes = entry.get("takes_inferences_per_s") or []
    spread = f"{min(takes):.1f}–{max(takes):.1f}" if len(takes) > 1 else "–"
    figures = [f"{entry['inferences_per_s']:.1f}", rate, spread, _ms(entry["median_ms"]), _ms(entry["p90_ms"]), p99, interval]
    return [*head, *figures]


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _groups(rows) -> dict[tuple, list]:
    """Rows that served, by model and point (GPU type, shape)."""
    groups: dict[tuple, list] = {}
    for row in rows:
        if row.streams:
            groups.setdefault(_point(row), []).append(row)
    return groups


def _point(row) -> tuple:
    return (row.model, row.gpu_type, row.shape)


def _unserved(rows) -> dict[tuple, list[str]]:
    """By the points where some row served: the measured rows there that did not (profiled
    without --streams), named, so that no engine leaves a serving table without a word."""
    served = {_point(row) for row in rows if row.streams}
    unserved: dict[tuple, list[str]] = {}
    for row in rows:
        if not row.streams and row.median_ms is not None and _point(row) in served:
            unserved.setdefault(_point(row), []).append(f"{row.variant} on {row.target}")
    return unserved


def _title(model: str, gpu_type: str | None, shape: str | None) -> str:
    where = " ".join(part for part in (shown(shape), f"on {gpu_type}" if gpu_type else "") if part)
    return f"{model}{f' at {where}' if where else ''}: serving concurrent streams (inferences/s and each request's latency)"


def streams_note(served: list, unserved: list[str]) -> str:
    """The note under a serving table of ``served`` rows: what a "?" after a p99 means where one
    has it, what the streams were, which rows' figures are the host's speed (launch-bound: a
    reading over seconds is the host's then, docs/streams.md), and the measured rows of its points
    that did not serve."""
    parts = []
    if any(
        entry["why_not"] is None and entry["p99_ms"] is not None and entry["p99_interval_ms"] is None
        for row in served
        for entry in row.streams
    ):
        parts.append("? = too few requests to bound the p99 (the interval column says how many could)")
    parts.append("streams: each its own inputs, started together, timed over the span of each take (docs/streams.md)")
    hosts = [f"{row.variant} on {row.target}" for row in served if launch_bound(row.flags, near=True)]
    if hosts:
        parts.append(
            f"launch-bound in the rounds: {', '.join(hosts)} — inf/s at the host's speed while serving, which changes"
            " in spells (takes inf/s: how far), so comparable with another process's only in takes timed in turn"
        )
    if unserved:
        parts.append(f"not served (profiled without --streams): {', '.join(unserved)}")
    return "; ".join(parts)


# What a narrow terminal leaves out first, by header, until the table fits (the p99 and its interval,
# what --p99-under reads, stay); files and --wide keep them.
NARROW_DROPS = ("takes inf/s", "p90 ms", "median ms", "throughput")
# Columns whose text reads from the left (the rest are numbers, right-aligned).
_TEXT_COLUMNS = ("variant", "toolchain", "mode", "p99 95% interval")


def serving_tables(rows) -> list[tuple[str, list[list[str]], str]]:
    """Per model and point where some row served streams: the table's title, its cells (in
    STREAM_HEADERS' columns) and its note — what the terminal, markdown and HTML reports show."""
    unserved = _unserved(rows)
    return [
        (_title(*point), [stream_cells(row, entry) for row in group for entry in row.streams], streams_note(group, unserved.get(point, [])))
        for point, group in _groups(rows).items()
    ]


def streams_lines(rows, width: int | None) -> list[tuple[str, str | None]]:
    """The terminal's streams section: a table per model and point whose rows served streams,
    fitted to ``width`` by leaving out NARROW_DROPS in turn (None: every column)."""
    out: list[tuple[str, str | None]] = []
    for title, cells, note in serving_tables(rows):
        keep = list(range(len(STREAM_HEADERS)))
        widths = [max(cell_len(text) for text in column) for column in zip(STREAM_HEADERS, *cells)]
        dropped = []
        for header in NARROW_DROPS:
            if width is None or sum(widths[i] for i in keep) + len(GAP) * (len(keep) - 1) <= width:
                break
            keep.remove(STREAM_HEADERS.index(header))
            dropped.append(header)

        def join(texts: list[str], keep: list[int] = keep, widths: list[int] = widths) -> str:
            parts = [(texts[i].ljust(widths[i]) if STREAM_HEADERS[i] in _TEXT_COLUMNS else texts[i].rjust(widths[i])) for i in keep]
            return GAP.join(parts).rstrip()

        out.append((title, "italic"))
        out.append((join(list(STREAM_HEADERS)), "bold"))
        out.append(("─" * (sum(widths[i] for i in keep) + len(GAP) * (len(keep) - 1)), None))
        out += [(join(texts), None) for texts in cells]
        note += f"; left out to fit: {', '.join(dropped)} (--wide, or --format md, shows them)" if dropped else ""
        out += [(line, "dim") for line in (wrap(note, width, indent="    ") if width else [note])]
        out.append(("", None))
    return out


def streams_markdown(rows) -> str:
    out = []
    for title, cells, note in serving_tables(rows):
        out.append(f"### {title}\n")
        out.append("| " + " | ".join(STREAM_HEADERS) + " |")
        out.append("|" + "|".join("---" for _ in STREAM_HEADERS) + "|")
        out += ["| " + " | ".join(text.replace("|", "\\|") for text in texts) + " |" for texts in cells]
        out += ["", note.replace("? =", "`?` =", 1), ""]
    return "\n".join(out) + ("\n" if out else "")


# --- --p99-under -----------------------------------------------------------------------------------


def parse_budget(text: str) -> float:
    """--p99-under's budget in milliseconds: "10ms", "10", "0.5s", "800us" (a number alone is ms)."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|us|µs)?\s*", text or "")
    if found is None or float(found.group(1)) <= 0:
        raise UsageError(
            f"--p99-under {text!r}: give a latency budget above 0, in ms, s or us.",
            hint="e.g. --p99-under 10ms (a number alone is milliseconds)",
        )
    scale = {"s": 1000.0, "us": 0.001, "µs": 0.001}.get(found.group(2) or "ms", 1.0)
    return float(found.group(1)) * scale


@dataclass
class ServingPick:
    """--p99-under at one model and point: the engine and concurrency that serve the most
    inferences/s with the upper end of its p99's 95 % interval within ``budget_ms``, or why none."""

    model: str
    gpu_type: str | None
    shape: str | None
    budget_ms: float
    # The chosen pair: variant, toolchain, streams, mode, inferences_per_s, samples_per_s,
    # tokens_per_s, p99_ms, p99_upper_ms; None where none is shown to serve within the budget.
    chosen: dict[str, Any] | None = None
    # How many pairs were bounded within the budget, bounded above it, and could not be bounded.
    within: int = 0
    above: list[dict[str, Any]] = field(default_factory=list)
    unbounded: list[dict[str, Any]] = field(default_factory=list)
    # The measured engines at this point that did not serve (profiled without --streams).
    not_served: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        where = " ".join(part for part in (shown(self.shape), f"on {self.gpu_type}" if self.gpu_type else "") if part)
        head = f"{self.model}{f' at {where}' if where else ''}"
        budget = f"a p99 within {self.budget_ms:g} ms"
        unserved = f" Not served (profiled without --streams): {', '.join(self.not_served)}." if self.not_served else ""
        return self._answer(head, budget) + unserved

    def _answer(self, head: str, budget: str) -> str:
        if self.chosen is not None:
            c = self.chosen
            others = self.within - 1
            return (
                f"{head}: serving with {budget}, {c['variant']} on {c['toolchain']} at {_count(c['streams'])} ({c['mode']}) serves the most: "
                f"{c['inferences_per_s']:.1f} inferences/s, p99 {c['p99_ms']:.3f} ms (95% interval up to {c['p99_upper_ms']:.3f} ms)"
                + (f", of {others + 1} engine–concurrency pairs shown within it." if others else ", the one pair shown within it.")
            )
        words = []
        if self.above:
            lowest = min(self.above, key=lambda pair: pair["p99_upper_ms"])
            words.append(
                f"the lowest p99 bound is {lowest['p99_upper_ms']:.3f} ms ({lowest['variant']} on {lowest['toolchain']} at {_count(lowest['streams'])})"
            )
        short = [pair for pair in self.unbounded if pair["needed"] is not None]
        if short:
            most = max(short, key=lambda pair: pair["requests"])
            words.append(
                f"{len(short)} engine–concurrency pair{'s' if len(short) > 1 else ''} cannot be bounded: a p99 needs "
                f"{most['needed']} requests, and the most any had was {most['requests']} ({most['variant']} on {most['toolchain']} "
                f"at {_count(most['streams'])}); serve longer ([profile] serve_s)"
            )
        if len(short) < len(self.unbounded):
            tools = len(self.unbounded) - len(short)
            words.append(f"{tools} pair{'s' if tools > 1 else ''} read from a tool's own summary, which nothing bounds")
        return f"{head}: no engine is shown to serve with {budget}: " + "; ".join(words) + "."

    def public(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu_type": self.gpu_type,
            "shape": self.shape,
            "budget_ms": self.budget_ms,
            "chosen": self.chosen,
            "within": self.within,
            "above": len(self.above),
            "unbounded": len(self.unbounded),
            "not_served": list(self.not_served),
            "sentence": self.sentence(),
        }


def _count(streams: int) -> str:
    return f"{streams} stream{'s' if streams > 1 else ''}"


def p99_under(rows, budget_ms: float) -> list[ServingPick]:
    """Per model and point whose rows served streams: the pair (engine, concurrency) with the most
    inferences/s among those whose p99's upper bound is within ``budget_ms``. A pair's p99 that
    its requests cannot bound counts as not shown within, whatever its reading; rows whose own
    accuracy failed its check (flagged ``inaccurate``) do not take part."""
    picks = []
    unserved = _unserved(rows)
    for (model, gpu_type, shape), group in _groups(rows).items():
        pick = ServingPick(model, gpu_type, shape, budget_ms, not_served=unserved.get((model, gpu_type, shape), []))
        best: dict[str, Any] | None = None
        for row in group:
            if any(flag.startswith("inaccurate") for flag in row.flags):
                continue
            for entry in row.streams:
                if entry["why_not"] is not None or entry.get("p99_ms") is None:
                    continue
                pair = {"variant": row.variant, "toolchain": row.target, "streams": entry["streams"], "mode": entry["mode"]}
                if entry["p99_interval_ms"] is None:
                    needed = entry.get("p99_requests_needed")  # None: a tool's summary, not the requests
                    pick.unbounded.append({**pair, "requests": entry.get("requests") or 0, "needed": needed})
                    continue
                upper = entry["p99_interval_ms"][1]
                if upper > budget_ms:
                    pick.above.append({**pair, "p99_upper_ms": upper})
                    continue
                pick.within += 1
                candidate = {
                    **pair,
                    "inferences_per_s": entry["inferences_per_s"],
                    "samples_per_s": entry["samples_per_s"],
                    "tokens_per_s": entry.get("tokens_per_s"),
                    "p99_ms": entry["p99_ms"],
                    "p99_upper_ms": upper,
                }
                if best is None or candidate["inferences_per_s"] > best["inferences_per_s"]:
                    best = candidate
        pick.chosen = best
        picks.append(pick)
    return picks

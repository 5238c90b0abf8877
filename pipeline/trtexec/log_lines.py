"""A trtexec log's lines as trtexec printed them, from whatever text holds them: a log pasted onto
one line, a wrapper's prefix before every line (a CI runner's time stamps), foreign text before
trtexec's own time stamp, and summary lines run together. pipeline/trtexec/log.py reads the lines.
"""

from __future__ import annotations

import re
from collections import Counter

from pipeline.trtexec.log_records import SUMMARY_FIELDS, TOTAL_FIELDS
from pipeline.trtexec.text import log_lines

# "[date] [I] message", also pasted as "[I] message" and indented (inside a list, a quote).
PREFIX = re.compile(r"^\s*(?:\[(?P<stamp>[^\]]*)\]\s*)?\[(?P<severity>[VIWEF])\] ?(?P<message>.*)$")
BANNER = re.compile(
    r"^&&&& (?P<status>RUNNING|PASSED|FAILED|WAIVED) TensorRT\.trtexec \[TensorRT v(?P<code>\d+)\]"
    r"(?: \[(?P<build>b\d+)\])? # (?P<command>.*)$"
)

# Where a trtexec line starts inside a longer one: its banner, or a severity tag with or without
# the date trtexec writes before it ("[07/07/2026-02:11:26] [I] ").
_LINE_START = re.compile(
    r"&&&& (?:RUNNING|PASSED|FAILED|WAIVED) TensorRT\.trtexec\b|\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[VIWEF]\]|\[[VIWEF]\] "
)
# Lines trtexec prints without a severity tag, which may follow a separator in a joined log.
# (A "[6] …" line is the detail of a parser error.)
_UNTAGGED_START = re.compile(r"=== |Layer\(|Name: |Bindings:|--- |Average on \d|\.\.\. Omitting |\[\d+\] ")
# Characters a line's own text ends with, never a separator's first.
_LINE_END_CHARACTERS = re.compile(r"^[\w)\]}.%'\"]+")


def trtexec_lines(text: str) -> list[str]:
    """The text's lines as trtexec printed them: split at line feeds, a log pasted onto one line
    split again at its separator, a wrapper's prefix before every line taken off, text before
    trtexec's own time stamp on a line taken off, and summary lines run together split apart."""
    lines = _without_wrapper_prefix([piece for line in log_lines(text) for piece in _split_joined(line)])
    return [piece for line in lines for piece in _split_summaries(_from_time_stamp(line))]


# trtexec's own time stamp and severity tag ("[12/03/2025-10:11:12] [E] "): distinctive enough to
# tell where its line starts after foreign text.
_DATED_TAG = re.compile(r"\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[VIWEF]\]")
_SUMMARY_LABEL = "|".join(re.escape(label) for label in sorted([*SUMMARY_FIELDS, *TOTAL_FIELDS], key=len, reverse=True))
# Where a summary line run onto the one before it starts: after the unit that ends a summary line's
# figures, a summary label and its colon, or a severity tag (with or without its time stamp).
_SUMMARY_JOIN = re.compile(rf"(?:(?<=\bms)|(?<=\bs)|(?<=\bqps))\s+(?=(?:{_SUMMARY_LABEL}):|(?:\[[^\]]*\]\s*)?\[[VIWEF]\] )")


def _from_time_stamp(line: str) -> str:
    """A line that does not start as trtexec's do but holds trtexec's dated tag (a markdown list
    item, "* build step: failed [12/03/2025-10:11:12] [E] Error[3]: …"), from that tag on."""
    stripped = line.lstrip()
    if PREFIX.match(stripped) or BANNER.match(stripped):
        return line
    found = _DATED_TAG.search(line)
    return line[found.start() :] if found else line


def _split_summaries(line: str) -> list[str]:
    """A performance-summary line with the lines after it run onto it (their line feeds lost in a
    paste: "… D2H Latency: … ms Total Host Walltime: 3.0 s [W] * Throughput may be …"), as its lines."""
    tagged = PREFIX.match(line)
    message = tagged.group("message") if tagged else line.strip()
    if message.partition(":")[0].strip() not in (*SUMMARY_FIELDS, *TOTAL_FIELDS):
        return [line]
    return _SUMMARY_JOIN.split(line)


def _split_joined(line: str) -> list[str]:
    """A line holding several trtexec lines, joined by a separator (" / ", " | ", a literal "\\n"),
    as its lines. The separator is what comes before every line start; the line is split there,
    and at the separator where an untagged trtexec line (a layer, a section header) follows.
    A line with fewer than three line starts is left alone."""
    starts = [match.start() for match in _LINE_START.finditer(line)]
    if len(starts) < 3:
        return [line]
    separator = _common_suffix([line[begin:end] for begin, end in zip(starts, starts[1:])])
    end_of_line = _LINE_END_CHARACTERS.match(separator)
    if end_of_line:
        separator = separator[end_of_line.end() :]
    if not separator.strip():  # joined by nothing but spaces: split only where a tagged line starts
        return [line[begin:end] for begin, end in zip([0, *starts[1:]], [*starts[1:], len(line)])]
    head = line[: starts[0]]
    # Untagged lines before the first tagged one ("--- infStreams=1 / [date] [I] …"), unless what
    # comes first is a prefix of the first line itself.
    first = 0 if not head.endswith(separator) else starts[0]
    pieces = _split_untagged(head[: -len(separator)], separator) if first else []
    for begin, end in zip([first, *starts[1:]], [*starts[1:], len(line) + len(separator)]):
        pieces += _split_untagged(line[begin : end - len(separator)], separator)
    return [piece for piece in pieces if piece.strip()]


def _split_untagged(piece: str, separator: str) -> list[str]:
    """A piece between two tagged lines, split where the separator comes before an untagged line."""
    parts = piece.split(separator)
    joined = [parts[0]]
    for part in parts[1:]:
        if not part.strip() or _UNTAGGED_START.match(part.lstrip()):
            joined.append(part)  # an empty line, or an untagged trtexec line
        else:
            joined[-1] += separator + part  # the separator's text belongs to the line
    return joined


def _common_suffix(texts: list[str]) -> str:
    shortest = min(texts, key=len)
    length = 0
    while length < len(shortest) and all(text[len(text) - length - 1] == shortest[len(shortest) - length - 1] for text in texts):
        length += 1
    return shortest[len(shortest) - length :]


def _without_wrapper_prefix(lines: list[str]) -> list[str]:
    """``lines`` without the prefix a wrapper put before each of them ("[INFO] ", "bench | ", a
    time stamp of its own): the text before trtexec's tag or banner, the same on nearly every
    tagged line (digits may differ), taken off every line that starts with it."""
    prefixes = [line[: match.start()] for line in lines if (match := _LINE_START.search(line))]
    if len(prefixes) < 3:
        return lines
    shapes = Counter(re.sub(r"\d+", "0", prefix) for prefix in prefixes)
    shape, count = shapes.most_common(1)[0]
    if not shape.strip() or count < 0.9 * len(prefixes):
        return lines
    pattern = re.compile("".join(r"\d+" if part == "0" else re.escape(part) for part in re.split(r"(0)", shape) if part))
    return [line[match.end() :] if (match := pattern.match(line)) else line for line in lines]

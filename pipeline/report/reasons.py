"""Engines left out for the same reason, said once: "fp32 on onnxruntime, int8 on onnxruntime and
int8_plan on onnxruntime (all three: host slowed: its CPUs ran 1.06–1.08x slower …)".

Under load every engine of a point may be left out for one reason whose words differ only in their
figures (each engine's own slowdown, its own count of takes); the answer says that reason once,
each figure as the range the engines span, rather than repeating a long sentence per engine.
Reasons whose words differ otherwise stay apart, in the order of their first engine."""

from __future__ import annotations

import re

# A figure in a reason's words: a number not inside a name ("fp16", "sm89", "2x512"'s 512).
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
HOW_MANY = {2: "both", 3: "all three", 4: "all four", 5: "all five", 6: "all six", 7: "all seven", 8: "all eight"}


def grouped_reasons(left_out: list[tuple[str, str]]) -> list[str]:
    """(engine, why) pairs as the answer's "Left out" parts: each reason once, its engines named
    together, the figures that differ between them as ranges."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for name, why in left_out:
        groups.setdefault(FIGURE.sub("#", why), []).append((name, why))
    parts = []
    for members in groups.values():
        names = [name for name, _ in members]
        if len(members) == 1:
            parts.append(f"{names[0]} ({members[0][1]})")
            continue
        named = ", ".join(names[:-1]) + f" and {names[-1]}"
        how_many = HOW_MANY.get(len(members), f"all {len(members)}")
        parts.append(f"{named} ({how_many}: {_ranges([why for _, why in members])})")
    return parts


def _ranges(reasons: list[str]) -> str:
    """One reason's words with each figure the range the reasons span ("1.06–1.08"), or the figure
    itself where they all give it."""
    figures = [FIGURE.findall(why) for why in reasons]
    spans = iter(_span(column) for column in zip(*figures))
    return FIGURE.sub(lambda _: next(spans), reasons[0])


def _span(texts: tuple[str, ...]) -> str:
    low, high = min(texts, key=float), max(texts, key=float)
    return low if float(low) == float(high) else f"{low}–{high}"

"""What every report opens with: the answer — a verdict per model and shape point — and the sweep
tables (pipeline/report/sweep.py), as terminal lines and as markdown; and the text layout the
terminal table shares with them (wrapping, cell widths)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from pipeline.catalog.shape import shown

# Between two columns.
GAP = "  "


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    import textwrap

    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False) or [""]


@functools.lru_cache(maxsize=4096)
def cell_len(text: str) -> int:
    """Terminal columns the text takes (CJK characters take two); most cells repeat ("–", "1.00x")."""
    from rich.cells import cell_len

    return len(text) if text.isascii() else cell_len(text)


def _join_sweep(texts: list[str], widths: list[int]) -> str:
    """A sweep table's line: the two names left-aligned, the figures right-aligned."""
    return GAP.join(t.ljust(w) if i < 2 else t.rjust(w) for i, (t, w) in enumerate(zip(texts, widths))).rstrip()


METRIC_WORDS = {"ms": "median latency, ms", "tokens": "tokens/s", "memory": "GPU memory, MiB"}


@dataclass
class Answer:
    """What every report opens with: a verdict per model and point, and the sweep tables."""

    verdicts: list
    sweeps: list
    metric: str = "ms"
    # --p99-under's answer per model and point (pipeline/report/streams.py, ServingPick), if asked.
    serving: list = field(default_factory=list)

    def headline(self) -> str:
        """The title over the verdicts (terminal, markdown, HTML), naming what they rank by where it is not the median."""
        bys = {verdict.ranked_by: verdict.reading.by.best for verdict in self.verdicts if verdict.reading is not None}
        if len(bys) != 1:  # by the median (or, read from mixed manifests, by more than one figure)
            return "The answer: the fastest engine that meets the accuracy floor"
        ((name, best),) = bys.items()
        if best == "fastest":
            return f"The answer: the fastest engine by {name} that meets the accuracy floor"
        return f"The answer: the engine of {best} that meets the accuracy floor"

    def verdict_text(self) -> list[str]:
        return [" ".join(verdict.sentences()) for verdict in self.verdicts]

    def sweep_table(self, sweep) -> tuple[list[str], list[list[str]]]:
        """(headers, cells) of one sweep: a line per variant × toolchain, a column per shape point."""
        headers = ["variant", "toolchain", *(shown(shape) for shape in sweep.shapes)]
        cells = [
            [variant, target, *(sweep.cell((variant, target), shape, self.metric) for shape in sweep.shapes)]
            for variant, target in sweep.lines
        ]
        return headers, cells

    def sweep_title(self, sweep) -> str:
        return f"{sweep.title}: {METRIC_WORDS[self.metric]} at each shape point (* the verdict's choice, = not told apart from it)"

    def lines(self, width: int | None) -> list[tuple[str, str | None]]:
        """The terminal's: the verdicts, then each sweep's table and crossovers."""
        out: list[tuple[str, str | None]] = []
        if self.verdicts:
            out.append((self.headline(), "bold"))
            for text in self.verdict_text():
                out += [(line, None) for line in (wrap(text, width, indent="    ") if width else [text])]
            out.append(("", None))
        if self.serving:
            out.append(
                (f"Serving within a p99 of {self.serving[0].budget_ms:g} ms: the engine and concurrency that serve the most", "bold")
            )
            for pick in self.serving:
                out += [(line, None) for line in (wrap(pick.sentence(), width, indent="    ") if width else [pick.sentence()])]
            out.append(("", None))
        for sweep in self.sweeps:
            headers, cells = self.sweep_table(sweep)
            widths = [max(cell_len(text) for text in column) for column in zip(headers, *cells)]

            join = functools.partial(_join_sweep, widths=widths)
            out.append((self.sweep_title(sweep), "italic"))
            out.append((join(headers), "bold"))
            out.append(("─" * (sum(widths) + len(GAP) * (len(widths) - 1)), None))
            out += [(join(row), None) for row in cells]
            for sentence in sweep.notes():
                out += [(line, "dim") for line in (wrap(sentence, width, indent="    ") if width else [sentence])]
            out.append(("", None))
        return out

    def markdown(self) -> str:
        out = []
        if self.verdicts:
            out.append(f"## {self.headline()}\n")
            out += [f"- {text}" for text in self.verdict_text()]
            out.append("")
        if self.serving:
            out.append(f"## Serving within a p99 of {self.serving[0].budget_ms:g} ms\n")
            out += [f"- {pick.sentence()}" for pick in self.serving]
            out.append("")
        for sweep in self.sweeps:
            headers, cells = self.sweep_table(sweep)
            out.append(f"### {self.sweep_title(sweep)}\n")
            out.append("| " + " | ".join(headers) + " |")
            out.append("|" + "|".join("---" for _ in headers) + "|")
            out += ["| " + " | ".join(cell.replace("|", "\\|").replace("*", "\\*") for cell in row) + " |" for row in cells]
            out.append("")
            out += [f"- {sentence}" for sentence in sweep.notes()]
            out.append("")
        return "\n".join(out) + ("\n" if out else "")

"""What the user sees while stages run: one line per stage, details only with -v.

Progress goes to stderr so stdout stays clean for tables and JSON that scripts capture.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape


class Reporter:
    def __init__(self, verbose: bool = False, console: Console | None = None):
        self.verbose = verbose
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)

    def _line(self, stage: str, engine: str, text: str) -> None:
        self.console.print(f"{stage:<8} {escape(engine):<26} {text}")

    def done(self, stage: str, engine: str, seconds: float, note: str = "") -> None:
        self._line(stage, engine, f"[green]done[/] in {seconds:.1f}s{escape(note)}")

    def unchanged(self, stage: str, engine: str) -> None:
        self._line(stage, engine, "[dim]didn't change, skipping[/]")

    def skipped(self, stage: str, engine: str, reason: str) -> None:
        self._line(stage, engine, f"[yellow]skipped[/]: {escape(reason)}")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]WARNING[/] {escape(text)}")

    def info(self, text: str) -> None:
        self.console.print(escape(text))

    def detail(self, text: str) -> None:
        """Tool output and internals: shown only with -v."""
        if self.verbose:
            self.console.print(f"[dim]{escape(text)}[/]")

    @contextlib.contextmanager
    def captured(self, tool: str) -> Iterator[None]:
        """Hold back what Python-level tools print (torch tracer warnings, ModelOpt's progress).

        Shown with -v; otherwise dropped, because the stage's own error says what failed.
        """
        import io
        import warnings

        buffer = io.StringIO()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                    yield
            finally:
                if self.verbose:
                    for line in buffer.getvalue().splitlines():
                        self.detail(f"[{tool}] {line}")
                    for warning in caught:
                        self.detail(f"[{tool}] {warning.category.__name__}: {warning.message}")

    @contextlib.contextmanager
    def working(self, stage: str, engine: str) -> Iterator[None]:
        """A spinner while a long stage runs (only on a terminal; logs stay clean)."""
        if self.console.is_terminal and not self.verbose:
            with self.console.status(f"{stage} {escape(engine)} …"):
                yield
        else:
            if self.verbose:
                self._line(stage, engine, "running …")
            yield


def print_error(message: str, hint: str | None = None) -> None:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"[bold red]ERROR[/] {escape(message)}")
    if hint:
        console.print(f"[bold cyan]TIP[/] {escape(hint)}")
    sys.stderr.flush()


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 when the reader goes away (`pipeline compare | head`); a closed pipe is the
        # reader's choice, not a failure: the CLI's error boundary ends the command quietly with 0.
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    """Tables for stdout: the terminal's width, or $COLUMNS; piped with neither, 200 columns, so
    CI logs and files keep wide tables whole."""
    console = _StdoutConsole(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = _StdoutConsole(highlight=False, width=200)
    return console

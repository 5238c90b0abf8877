"""What the user sees while stages run: one line per stage, details only with -v.

Progress goes to stderr so stdout stays clean for tables and JSON that scripts capture. In a
terminal a running stage has a spinner that says what it is doing now and for how long
("calibrating: batch 3 of 16 · 0:12", "measuring: 1.4 s left, 212 runs · 0:05"); piped, the
stage's one line, and only for a stage still running after a minute, that same text once a
minute, so logs stay clean and a long export is never silent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.markup import escape


class _Activity:
    """The running stage's spinner text, rendered afresh at every refresh: what it does and the
    time it has taken so far."""

    def __init__(self, stage: str, engine: str):
        self.stage, self.engine = stage, engine
        self.step = ""  # the stage's part, e.g. "measurement 2 of 3"
        self.doing = ""  # what a tool or runtime says it is doing within it
        self.started = time.monotonic()

    def text(self) -> str:
        return f"{self.stage} {self.engine} … {self.now()}"

    def now(self) -> str:
        """What it does, and for how long so far: "calibrating: batch 3 of 16 · 0:12"."""
        elapsed = int(time.monotonic() - self.started)
        doing = ": ".join(part for part in (self.step, self.doing) if part)
        return f"{doing + ' · ' if doing else ''}{elapsed // 60}:{elapsed % 60:02d}"

    def __rich__(self):
        from rich.text import Text

        return Text(self.text())


class _Spinner:
    """The running stage's spinner in a terminal: redrawn by a thread of rich's, as its status
    is, until the stage measures; from then on drawn only when the thread that measures asks, so
    that nothing redraws beside a take (Reporter.MEASURING_REDRAW_S)."""

    def __init__(self, console: Console, activity: _Activity):
        from rich.live import Live
        from rich.spinner import Spinner

        self.console, self.renderable = console, Spinner("dots", text=activity, style="status.spinner")
        self.live = Live(self.renderable, console=console, refresh_per_second=12.5, transient=True)
        self.live.start()
        self.drawer: int | None = None  # the thread that measures, once the stage does
        self.drawn_at = 0.0

    def drawn_by_caller(self) -> None:
        import threading

        from rich.live import Live

        if self.drawer is None:
            # Live.stop tells rich's redrawing thread to end; it has ended once joined.
            redrawing = getattr(self.live, "_refresh_thread", None)
            self.live.stop()
            if redrawing is not None:
                redrawing.join(timeout=1.0)
            self.live = Live(self.renderable, console=self.console, auto_refresh=False, transient=True)
            self.live.start(refresh=True)
        self.drawer = threading.get_ident()

    def redraw(self, every_s: float) -> None:
        import threading

        if self.drawer != threading.get_ident():  # not measuring, or not on the measuring thread
            return
        now = time.monotonic()
        if now - self.drawn_at >= every_s:
            self.drawn_at = now
            self.live.refresh()

    def stop(self) -> None:
        self.live.stop()


class Reporter:
    # Piped (no spinner): how often a stage still running says what it is doing.
    HEARTBEAT_S = 60.0
    # Once a stage measures, its spinner is drawn only when the measuring thread says how far it
    # has got (between takes: the rounds' progress), at most this often. rich's status redraws
    # 12.5 times a second on a thread of its own, taking the GIL from the thread that launches:
    # beside 100 ms takes of a launch-bound CPU workload it lengthened them by a median 0.1-1.9 %
    # of paired takes in five runs of scripts/benchmark_spinner.py on a 2-core VM (0.983-1.009
    # drawn between takes): small beside a take's noise, but always one way, on launch-bound
    # engines only, and only in a terminal, so that a run read there and one piped would differ.
    MEASURING_REDRAW_S = 0.5

    def __init__(self, verbose: bool = False, console: Console | None = None):
        self.verbose = verbose
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.activity: _Activity | None = None
        self._spinner: _Spinner | None = None

    def step(self, text: str) -> None:
        """The part of the running stage now under way ("measurement 2 of 3"); "" when none."""
        if self.activity is not None:
            self.activity.step, self.activity.doing = text, ""
            self._redraw()

    def measuring(self, text: str) -> None:
        """A step that starts measuring ("5 engine(s) in rounds"): nothing else may run beside it
        from here, the spinner's own redrawing included. Locally one more step; a cluster task also
        tells its driver (pipeline/cluster/worker.py)."""
        if self._spinner is not None:
            self._spinner.drawn_by_caller()
        self.step(text)

    def progress(self, text: str) -> None:
        """What the running stage is doing now ("calibrating: batch 3 of 16"), beside its spinner
        in a terminal; cheap enough to call in a loop (it keeps the text, and while measuring
        redraws the spinner at most every MEASURING_REDRAW_S)."""
        if self.activity is not None:
            self.activity.doing = text
            self._redraw()

    def _redraw(self) -> None:
        if self._spinner is not None:
            self._spinner.redraw(self.MEASURING_REDRAW_S)

    def _line(self, stage: str, engine: str, text: str) -> None:
        self.console.print(f"{stage:<8} {escape(engine):<26} {text}")

    def line(self, stage: str, engine: str, text: str) -> None:
        """A line of a stage's own about an engine ("reduce   m_fp32   iteration 3: …"), as given."""
        self._line(stage, engine, escape(text))

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

    def tool_output(self, tool: str, line: str) -> None:
        """A line a tool printed: shown with -v, and as what the stage is doing in a terminal."""
        self.detail(line)
        if self.activity is not None and line.strip():
            self.progress(f"{tool}: {_shortened(line)}")

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
        # Loggers keep the stream they were given (torch's symbolic-shapes warnings, say): quiet
        # them too, unless asked to see everything.
        quieted = logging.root.manager.disable
        if not self.verbose:
            logging.disable(logging.WARNING)
        # The pipeline's own lines (a WARNING the stage gives) still reach the terminal: a console
        # made for stderr looks the stream up as it prints, and would find the buffer.
        own_stream = getattr(self.console, "_file", None)
        self.console.file = own_stream or sys.stderr
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                    yield
            finally:
                self.console._file = own_stream
                logging.disable(quieted)
                if self.verbose:
                    for line in buffer.getvalue().splitlines():
                        self.detail(f"[{tool}] {line}")
                    for warning in caught:
                        self.detail(f"[{tool}] {warning.category.__name__}: {warning.message}")

    @contextlib.contextmanager
    def working(self, stage: str, engine: str) -> Iterator[None]:
        """While a stage runs, what it does: a spinner in a terminal; piped, a line a minute once
        it has run that long (a quick stage adds nothing to a log)."""
        self.activity = _Activity(stage, engine)
        try:
            if self.console.is_terminal and not self.verbose:
                self._spinner = _Spinner(self.console, self.activity)
                try:
                    yield
                finally:
                    self._spinner.stop()
                    self._spinner = None
            else:
                if self.verbose:
                    self._line(stage, engine, "running …")
                with self._heartbeat(self.activity):
                    yield
        finally:
            self.activity = None

    @contextlib.contextmanager
    def _heartbeat(self, activity: _Activity) -> Iterator[None]:
        import threading

        stop = threading.Event()
        # The stream as it is now: a stage that holds back a tool's output (`captured`) swaps
        # sys.stderr for every thread, and these lines must not be held back with it.
        console = Console(file=self.console.file, highlight=False, soft_wrap=True)

        def beat() -> None:
            while not stop.wait(self.HEARTBEAT_S):
                console.print(f"{activity.stage:<8} {escape(activity.engine):<26} … {escape(activity.now())}")

        thread = threading.Thread(target=beat, name="progress heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


# trtexec's and TensorRT's line prefixes: "[11/23/2026-20:01:02] [I] [TRT] ".
_PREFIXES = re.compile(r"^(\s*\[[^\]]*\d{2}:\d{2}:\d{2}[^\]]*\]|\s*\[[IWEV]\]|\s*\[TRT\])+\s*")


def _shortened(line: str, width: int = 70) -> str:
    text = _PREFIXES.sub("", line.strip())
    return text if len(text) <= width else text[: width - 1] + "…"


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


@contextlib.contextmanager
def native_stderr_held(hold: bool = True) -> Iterator[Callable[[], str]]:
    """Hold back what native libraries write straight to the process's stderr, past Python's
    ``sys.stderr`` (Ray's connection retries, the profiler's start/stop lines); yields a function
    that returns it, to put in an error where it explains one (empty when not held)."""
    if not hold:
        yield lambda: ""
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: (sink.seek(0), sink.read().decode(errors="replace"))[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)

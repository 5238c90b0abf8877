"""SIGTERM handled like Ctrl-C, in every process of the pipeline, and neither inside an import.

SIGTERM is what `docker stop`, schedulers and CI time-outs send. The command line, the cluster
driver's child process and the Ray connection (which replaces the handler) all install the same
handler, so the same clean-up runs — partial files removed, child tools and containers stopped —
and the command exits 143, as a shell reports a process that SIGTERM ended.

Python's import machinery is not safe against an exception raised at any bytecode: a
KeyboardInterrupt that lands while numpy.linalg is being imported (under torch's import, say) can
leave it half-made in ``sys.modules``, and the next ``import numpy.linalg`` then recurses until
Python gives up (a RecursionError, seen for SIGTERM during a PyTorch build). So a signal that
arrives while an import runs is delivered again a moment later, once the import is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
# How soon a signal put off by an import is sent again (the import may take seconds: torch's).
_AGAIN_S = 0.05


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so one clean-up path serves both."""


def _in_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def _outside_imports(signum: int, frame) -> bool:
    """False, with the signal sent to this process again shortly, while ``frame`` is in an import."""
    if not _in_import(frame):
        return True
    timer = threading.Timer(_AGAIN_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()
    return False


def raise_terminated(signum, frame) -> None:
    if _outside_imports(signum, frame):
        raise Terminated()


def raise_interrupted(signum, frame) -> None:
    if _outside_imports(signum, frame):
        raise KeyboardInterrupt()


def terminate_like_interrupt() -> None:
    """Install the handler (only the main thread may; elsewhere nothing changes)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_terminated)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """The handlers for the duration of a block, the previous ones restored after it: SIGTERM's,
    and Ctrl-C's where Python's own is in place (a SIGINT that the shell ignores stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, raise_terminated)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

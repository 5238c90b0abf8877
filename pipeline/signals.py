"""SIGTERM handled like Ctrl-C, in every process of the pipeline.

SIGTERM is what `docker stop`, schedulers and CI time-outs send. The command line, the cluster
driver's child process and the Ray connection (which replaces the handler) all install the same
handler, so the same clean-up runs — partial files removed, child tools and containers stopped —
and the command exits 143, as a shell reports a process that SIGTERM ended.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so one clean-up path serves both."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()


def terminate_like_interrupt() -> None:
    """Install the handler (only the main thread may; elsewhere nothing changes)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_terminated)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """The handler for the duration of a block, the previous one restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

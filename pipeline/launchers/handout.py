"""Jobs handed out to child processes one at a time, each over the child's own channel (child.py):
a child takes a job, does it, reports it, and is handed the next; a thread of this process hands
them out while this process goes on with its own work, and hears when a child ends.

Why not one queue the children share: a multiprocessing queue is a pipe behind a lock, and a child
killed while it waits on it (holding the lock) or writes to it (half a message in the pipe) leaves
every other child waiting for ever — Python's documentation warns of it — and nothing says which
job the dead one had taken. Here each child talks on its own channel: one that ends takes only
that channel with it, and the job it was handed and never reported is known. It is reported as
owed, with how the child ended ("killed by SIGKILL": the kernel's OOM killer, a signal), while
the jobs not yet handed out go to the others.

A child is handed its first job as it starts, and the next only once it has reported the last, so
a job waits here, not in a child still importing what it needs, for the first child free to take
it. Once ``last`` is said and no job is left, a child that asks is told there are no more (None)
and its channel is its own again (the compiling processes then serve what they kept over it).
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from pipeline.launchers.child import Child, ChildEnded, ended_words

# What the thread says when it has nothing more to say.
_OVER = object()


@dataclass(frozen=True)
class Reported:
    """A job ``child`` did and reported: ``value``, what it said of it."""

    child: Child
    job: Any
    value: Any


@dataclass(frozen=True)
class Owed:
    """A job ``child`` was handed and never reported: it ended first, ``ended`` in words
    (launchers.child.ended_words: "killed by SIGKILL", "exit status 1")."""

    child: Child
    job: Any
    ended: str


class Handout:
    """The jobs and the children that take them. ``add_child``, ``add`` and ``last`` are called by
    this process as it goes; ``reports`` waits for what becomes of every job handed out."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: deque = deque()  # not yet handed out
        self._free: list[Child] = []  # waiting for their next job
        self._holding: dict[Child, Any] = {}  # the job each busy child was handed
        self._taking: set[Child] = set()  # the children still in the handout: free, busy, or gone unheard
        self._last = False  # no more jobs will be added
        self._closed = False
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        # A pipe of this process's own, whose only use is to wake the thread from its wait.
        self._wake_ours, self._wake_theirs = multiprocessing.Pipe(duplex=False)
        self._thread = threading.Thread(target=self._run, name="pipeline-handout", daemon=True)
        self._started = False

    # --- in this process's own thread -----------------------------------------------------------

    def add_child(self, child: Child) -> None:
        """A started child that takes jobs (its target reads them with ``take_job``)."""
        with self._lock:
            self._taking.add(child)
            self._free.append(child)
            start, self._started = not self._started, True
        if start:
            self._thread.start()
        self._wake()

    def add(self, job: Any) -> None:
        with self._lock:
            self._pending.append(job)
        self._wake()

    def last(self) -> None:
        """No more jobs: each child is told so once it asks for one and none is left."""
        with self._lock:
            self._last = True
        self._wake()

    def reports(self, every_s: float = 1.0) -> Iterator[Reported | Owed]:
        """What becomes of each job handed out, as it does, until every one has been reported or is
        owed by a child that ended, and no job is left that a child could still take (after
        ``last``). The jobs left over then are ``unhanded``."""
        if not self._started:
            return
        while True:
            try:
                event = self._events.get(timeout=every_s)  # a timeout, so that Ctrl-C gets through
            except queue.Empty:
                continue
            if event is _OVER:
                if self._error is not None:
                    raise self._error
                return
            yield event

    def unhanded(self) -> list:
        """The jobs no child took: every one that could have ended first."""
        with self._lock:
            return list(self._pending)

    def close(self) -> None:
        """Stop handing out (the thread ends; the children are the caller's to stop)."""
        with self._lock:
            self._closed = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(5)
        for end in (self._wake_ours, self._wake_theirs):
            end.close()

    def _wake(self) -> None:
        try:
            self._wake_theirs.send_bytes(b"!")
        except (OSError, ValueError):  # closed: nobody to wake
            pass

    # --- in the handing-out thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # said where ``reports`` is read, not lost in this thread
            self._error = exc
        finally:
            self._events.put(_OVER)

    def _step(self) -> bool:
        """Hand out what can be, then wait for a child to report, to end, or to be added."""
        with self._lock:
            if self._closed:
                return False
            self._hand_out()
            if self._last and not self._holding and not self._free:
                return False  # every job reported or owed; any left over no child can take
            ends = {end: child for child in self._taking for end in child.ends}
        for end in wait([self._wake_ours, *ends]):
            if end is self._wake_ours:
                while self._wake_ours.poll():
                    self._wake_ours.recv_bytes()
                continue
            with self._lock:
                if ends[end] in self._taking:
                    self._hear(ends[end])
        return True

    def _hand_out(self) -> None:
        while self._free and (self._pending or self._last):
            child = self._free.pop(0)
            job = self._pending.popleft() if self._pending else None
            if not child.send(job):  # gone: its end is heard in turn; the job goes to another
                if job is not None:
                    self._pending.appendleft(job)
                continue
            if job is None:
                self._taking.discard(child)  # its channel is its own again
            else:
                self._holding[child] = job

    def _hear(self, child: Child) -> None:
        """What ``child`` said (a report: ``(value, more)``), or that it ended."""
        closed = False
        while child.poll():
            try:
                value, more = child.receive()
            except ChildEnded:  # its end of the channel closed: it is ending
                closed = True
                break
            job = self._holding.pop(child, None)
            if job is not None:
                self._events.put(Reported(child, job, value))
            if not more:  # it takes nothing more, and ends
                self._taking.discard(child)
                return
            self._free.append(child)
        if closed or child.ended():
            child.join(1.0)  # reaped, so that how it ended is known
            job = self._holding.pop(child, None)
            if job is not None:
                self._events.put(Owed(child, job, ended_words(child.exitcode)))
            self._taking.discard(child)
            if child in self._free:
                self._free.remove(child)


# --- in the child ----------------------------------------------------------------------------------


def take_job(channel) -> Any | None:
    """The next job handed to this child; None when there are no more (or the parent is gone)."""
    try:
        return channel.recv()
    except (EOFError, OSError):
        return None


def report_job(channel, value: Any, more: bool = True) -> None:
    """Report the job just done (``value``) and, where ``more``, ask for the next; without, this
    child takes nothing more (it ends, or serves on over the same channel once told)."""
    try:
        channel.send((value, more))
    except (OSError, EOFError, BrokenPipeError):  # the parent is gone: nobody to tell
        pass

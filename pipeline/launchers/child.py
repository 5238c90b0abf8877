"""A child process: a new interpreter that runs one function and talks to its parent over one channel.

Three shapes of talk, one helper:

- **one reply** (``Child(...)``): the child does its work and answers once (``answer_with``); the
  parent waits for it (``reply``), or, having waited for the child itself, reads whatever it said
  (``reply_if_any``);
- **requests** (``Child(..., requests=True)``): the parent asks (``ask``), the child answers each in
  turn (``serve_requests``) until told to stop (``stop_serving``) or the parent's end closes;
- **jobs** (``Child(..., requests=True)`` too): the parent hands the child one job at a time and the
  child reports each (launchers/handout.py), before it answers requests over the same channel.

A reply is a ``Reply``: ``ok`` with a value, ``error`` with the pipeline's own error (what the child
raised, its traceback left behind), or a word of the caller's own ("interrupted"). A child that
ends without a reply is a ``ChildEnded`` naming its exit status or the signal that ended it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.running.errors import PipelineError

# Every child is a new interpreter: CUDA cannot be forked, nor may Ray inherit a fork. Or it is
# forked from a server that is one (``preload``), which imported what the children need and
# nothing else: it never touched a GPU nor started Ray.
_SPAWN = multiprocessing.get_context("spawn")
OK, ERROR = "ok", "error"
# An error after which the child serves nothing more (a kernel fault poisoned its CUDA context).
ENDS = "error, and no more"


@dataclass(frozen=True)
class Reply:
    """What a child says: ``kind`` OK with its ``value``, ERROR (or ENDS) with the PipelineError it
    raised, or a word of the caller's own."""

    kind: str
    value: Any = None

    def result(self) -> Any:
        """The value, or the child's error raised here."""
        if self.kind in (ERROR, ENDS):
            raise self.value
        return self.value


class ChildEnded(PipelineError):
    """A child ended, or was found gone, without the reply it owed."""


def ended_words(exitcode: int | None) -> str:
    """How a process ended, in words: "exit status 1", "killed by SIGKILL", "still running"."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:  # multiprocessing's children say a signal so; a positive status is their own exit
        return f"killed by {signal_name(exitcode)}"
    return f"exit status {exitcode}"


def signal_name(exit_code: int) -> str | None:
    """The signal that ended a process, from its exit status: negative as Python's subprocess
    gives it (-11), or 128 + the signal's number as a shell or a container gives it (139)."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 128 + 65 else None
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def this_process_name() -> str:
    """The name this process was started under ("pipeline-compile-3"; "MainProcess" for the command)."""
    return multiprocessing.current_process().name


def inheritable(fd: int):
    """A descriptor of this process as a child receives it: pickled with the child's arguments, it
    arrives as a duplicate (``.detach()`` there gives its number), open as long as the child lives."""
    from multiprocessing.reduction import DupFd

    return DupFd(fd)


def _forking(preload: tuple[str, ...]):
    """The context whose children are forked from one server process that imported ``preload``
    (modules) first — multiprocessing's forkserver: a child then starts with them imported, at
    the cost of a fork, where a new interpreter imports them again (torch, Dynamo, Inductor and
    transformers: about 6 s of one CPU on a 2-core VM, and twelve compiling processes importing
    at once on the lent H200's 16 vCPUs spent 20-35 s a point beyond compiling it,
    docs/results/sweeps.md). One server a process, started with the first such child's modules.
    A new interpreter where there is no forkserver (Windows)."""
    if not forks_from_a_server():
        return _SPAWN
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))  # read once, when the server starts
    return context


def forks_from_a_server() -> bool:
    """Whether children with ``preload`` are forked from a server here (``_forking``), not each a
    new interpreter (no forkserver: Windows)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def start_server(preload: tuple[str, ...]) -> None:
    """Start the server children with ``preload`` are forked from (``_forking``) now: it imports
    the modules in the background, where the first such child would otherwise wait for them (its
    ``start`` returns once the server has forked it). Nothing where there is no forkserver."""
    if _forking(preload) is not _SPAWN:
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _in_environment(channel, environment: dict[str, str], target: Callable, *args) -> None:
    """``target(channel, *args)`` with ``environment`` as the process's: a child forked from the
    server has the environment the server started with, and this process's may have changed since
    (a later workspace's compiler cache, say)."""
    os.environ.clear()
    os.environ.update(environment)
    target(channel, *args)


class Child:
    """``target(channel, *args)`` in a new interpreter named ``name``. ``requests``: the channel
    carries the parent's requests and the child's answers (else only the child's one reply).
    ``daemon``: it ends with this process (it may start no processes of its own). ``preload``:
    modules every such child imports, imported once in a server it is forked from (``_forking``)."""

    def __init__(self, target: Callable, *args, name: str, requests: bool = False, daemon: bool = False, preload: tuple[str, ...] = ()):
        if requests:
            self._ours, self._theirs = _SPAWN.Pipe(duplex=True)
        else:
            self._ours, self._theirs = _SPAWN.Pipe(duplex=False)  # (receiving end, sending end)
        if preload:  # forked from the server: with this process's environment now, as a new interpreter would be
            target, args = _in_environment, (dict(os.environ), target, *args)
        context = _forking(preload) if preload else _SPAWN
        self.process = context.Process(target=target, args=(self._theirs, *args), name=name, daemon=daemon)

    def start(self) -> Child:
        self.process.start()
        self._theirs.close()  # the child's end lives in the child: its exit closes the channel
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def alive(self) -> bool:
        return self.process.is_alive()

    def ended(self) -> bool:
        """Whether it has ended (it was started, and is no longer running)."""
        return self.process.exitcode is not None

    @property
    def ends(self) -> tuple:
        """What ``multiprocessing.connection.wait`` watches of it: its channel (it said something,
        or closed it) and its process's sentinel (it ended)."""
        return self._ours, self.process.sentinel

    def join(self, timeout: float | None = None) -> None:
        self.process.join(timeout)

    def reply(self) -> Reply | None:
        """Wait for the child's reply; None when it ended without one."""
        try:
            return self._ours.recv()
        except EOFError:
            return None

    def reply_if_any(self) -> Reply | None:
        """The reply the child left, without waiting (after ``join``); None when it left none."""
        try:
            return self._ours.recv() if self._ours.poll() else None
        except (EOFError, OSError):
            return None

    def result(self, what: str, grace_s: float = 5.0, timeout_s: float | None = None) -> Any:
        """Wait for the reply and give its value, raising the child's error; a ChildEnded, naming
        ``what`` the child was doing, when it ended without one, or gave none in ``timeout_s``
        (then stopped). Interrupted (Ctrl-C, SIGTERM), it stops the child (``grace_s`` to end)
        before it goes."""
        try:
            if timeout_s is not None and not self._ours.poll(timeout_s):  # stopped below, as on Ctrl-C
                raise ChildEnded(f"the process {what} gave no result in {timeout_s:g} s; it was stopped.")
            said = self.reply()
        except BaseException:
            self.stop(grace_s)
            raise
        self.join()
        if said is None:
            raise ChildEnded(
                f"the process {what} ended without a result ({ended_words(self.exitcode)}).",
                hint="run the same command again; -v shows what it printed",
            )
        return said.result()

    def ask(self, request: Any) -> Any:
        """Send a request and wait for its answer (a Reply's value; the child's error raised here).
        ChildEnded when the child is gone."""
        try:
            self._ours.send(request)
            said = self._ours.recv()
        except (EOFError, OSError) as exc:
            self.join(1)
            raise ChildEnded(f"{self.name} ended ({ended_words(self.exitcode)})") from exc
        return said.result()

    def send(self, message: Any) -> bool:
        """Send a message that awaits no answer here (a job handed out: launchers/handout.py);
        False where the child is gone."""
        try:
            self._ours.send(message)
            return True
        except (OSError, ValueError):
            return False

    def poll(self) -> bool:
        """Whether it said something (or closed its end) that ``receive`` reads without waiting."""
        try:
            return self._ours.poll()
        except (OSError, ValueError):
            return True  # ``receive`` says it is gone

    def receive(self) -> Any:
        """What it said; ChildEnded where its end closed."""
        try:
            return self._ours.recv()
        except (EOFError, OSError, ValueError) as exc:
            raise ChildEnded(f"{self.name} ended ({ended_words(self.exitcode)})") from exc

    def stop_serving(self) -> None:
        """Tell a child that answers requests to stop; quietly, whatever state its channel is in."""
        try:
            self._ours.send(None)
        except (OSError, ValueError):
            pass
        try:
            self._ours.close()
        except OSError:
            pass

    def signal(self, number: int) -> None:
        """Send the child a signal (Ctrl-C passed on), if it is still there."""
        if self.alive() and self.pid is not None:
            os.kill(self.pid, number)

    def stop(self, grace_s: float = 5.0) -> None:
        """End the child: asked to (SIGTERM), then made to (SIGKILL) after ``grace_s``."""
        if self.alive():
            self.process.terminate()
            self.process.join(grace_s)
        if self.alive():
            self.process.kill()
            self.process.join()


# --- in the child ----------------------------------------------------------------------------------


def answer_with(channel, work: Callable[[], Any]) -> None:
    """Do ``work`` and send its value as the one reply; the pipeline's own error it raises is sent
    instead (without its traceback, which holds what cannot cross); anything else is this
    process's bug and propagates (the child then ends without a reply, and its parent says so)."""
    try:
        said = Reply(OK, work())
    except PipelineError as exc:
        said = Reply(ERROR, exc.plain())
    send_quietly(channel, said)


def send_quietly(channel, said: Reply) -> bool:
    """Send ``said``; False where the parent is gone (nobody to tell)."""
    try:
        channel.send(said)
        return True
    except (OSError, EOFError, BrokenPipeError):
        return False


def serve_requests(channel, answer: Callable[[Any], Reply]) -> None:
    """Answer the parent's requests one at a time with ``answer(request)`` until told to stop
    (None), the parent's end closes, or an answer ends the talk (``Reply.kind`` ENDS)."""
    while True:
        try:
            request = channel.recv()
        except (EOFError, OSError):  # the parent ended (or replaced itself after a fault)
            return
        if request is None:
            return
        said = answer(request)
        if not send_quietly(channel, said) or said.kind == ENDS:
            return

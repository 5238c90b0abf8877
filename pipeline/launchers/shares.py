"""Pure-Python work over many inputs, split in shares across copies of this process; and work
done for the file it leaves, beside what this process goes on with (``beside``).

The one place a process is forked rather than started afresh: a copy starts with everything this
process imported, where a new interpreter would import it again (half a second for `compare`, as
long as the work it would take over). `compare` reading 3000 manifests is the case: validating
them holds the GIL (pydantic-core builds Python objects as it goes), so threads would take turns,
and on a 2-CPU machine two processes read them in 0.6 of the time (pipeline/report/row_cache.py).

A copy is made only where it is safe: the platform forks, and this process runs no other Python
thread and has not imported CUDA's or Ray's Python (neither survives a fork; a thread's held lock
would stay held in the copy). Native libraries' own thread pools are not counted: the one compare
loads, numpy's OpenBLAS, joins its idle pool before a fork (its openblas_fork_handler registers
blas_thread_shutdown_ with pthread_atfork; driver/others/memory.c). The work must be pure — the
same inputs give the same outputs, and it changes nothing its result does not carry — because a
share is done again here wherever a copy fails at it: an error is then raised here, by the work's
own code, as a run without copies raises it, and a copy that cannot be made, is killed or fails
costs its share's time, never its result.

A copy writes nothing to this process's output (its stdout and stderr are /dev/null), dies of
Ctrl-C and SIGTERM without a word (their default actions: this process says what happened; one
making a file beside lets them go by and finishes it first), and
does not outlive this process by more than its share: it sends its result over a pipe only this
process reads, and a pipe with no reader ends it. This process kills and reaps every copy it made
before it returns or raises.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

Item = TypeVar("Item")

# Modules whose state a forked copy cannot use (a CUDA context, a Ray worker's connections).
_NOT_FORKABLE = ("torch", "ray", "tensorrt", "tensorrt_rtx", "cupy")


def in_shares(work: Callable[[list[Item]], list[Any]], items: list[Item], min_share: int) -> list[Any]:
    """``work(items)``: computed in contiguous shares of at least ``min_share`` items, one per CPU
    this process may use (the first share here, the others in copies of this process, side by side),
    their results joined in order; computed here, in one, where copies are not safe or not worth it."""
    shares = share_count(len(items), min_share)
    if shares <= 1:
        return work(items)
    size = -(-len(items) // shares)
    chunks = [items[start : start + size] for start in range(0, len(items), size)]
    copies: list[tuple[int, int] | None] = []
    try:
        for chunk in chunks[1:]:
            copies.append(_copy(work, chunk, [copy[1] for copy in copies if copy]))
        done = list(work(chunks[0]))
        for chunk, copy in zip(chunks[1:], copies):
            result = _result_of(copy) if copy else None
            done += result if result is not None else work(chunk)
        return done
    finally:
        for copy in copies:
            if copy:
                _end(*copy)


@contextlib.contextmanager
def beside(work: Callable[[], Any], worth_a_copy: bool = True) -> Iterator[None]:
    """``work()`` done in a copy of this process while the body of the ``with`` runs here, side by
    side, where a copy is safe, a second CPU is there and ``worth_a_copy``; here, before the body,
    otherwise. The body's end, whatever the body raised, waits for the copy, and where the copy
    failed or could not be made, does the work here (not after Ctrl-C). What ``work`` returns is
    not kept: it is done for what it leaves behind (a file), and done twice leaves the same.

    Ctrl-C and SIGTERM do not end the copy: killed halfway, it would leave its file half made (a
    temporary one, which its own clean-up would have removed). The first that reaches this process
    while it waits is raised once the copy is done; a second ends the wait, and the copy with it."""
    copy, raised, interrupted, done = None, None, None, None
    try:
        if worth_a_copy and _usable_cpus() >= 2 and _forkable():
            copy = _copy(lambda _: [work()], [None], [], interruptible=False)
        if copy is None:
            work()
            yield
            return
        try:
            yield
        except BaseException as exc:  # raised below, once the copy is done
            raised = exc
        done, interrupted = _awaited(copy)
    finally:
        if copy is not None:
            _end(*copy)  # killed, where a second interruption ended the wait
    if done is None and interrupted is None and not isinstance(raised, KeyboardInterrupt):
        try:
            work()
        except Exception:
            if raised is None:
                raise  # beside the body's error, that error is the one said
    if raised is not None:
        raise raised
    if interrupted is not None:
        raise interrupted


def _awaited(copy: tuple[int, int]) -> tuple[list[Any] | None, KeyboardInterrupt | None]:
    """(The copy's result once it has ended, the Ctrl-C or SIGTERM that came meanwhile): the first
    is held until the copy has ended, a second is raised at once."""
    try:
        return _result_of(copy), None
    except KeyboardInterrupt as first:  # Terminated (SIGTERM, running/signals.py) among them
        _result_of(copy)
        return None, first


def share_count(count: int, min_share: int) -> int:
    """How many processes share ``count`` items: one per usable CPU, each given ``min_share`` at
    the least; one where a copy of this process is not safe (the module's docstring says when)."""
    if count < 2 * min_share or not _forkable():
        return 1
    return max(1, min(_usable_cpus(), count // min_share))


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _forkable() -> bool:
    return hasattr(os, "fork") and threading.active_count() == 1 and not any(name in sys.modules for name in _NOT_FORKABLE)


def _copy(
    work: Callable[[list[Item]], list[Any]], chunk: list[Item], others: list[int], interruptible: bool = True
) -> tuple[int, int] | None:
    """A copy of this process doing ``work(chunk)``: (its pid, the pipe its result comes by), or
    None where none could be made (no process or pipe left to this user: the share is done here).
    ``others``: the pipes of earlier copies, which this one must not hold open. ``interruptible``:
    Ctrl-C and SIGTERM end it (else it lets them go by: ``beside``)."""
    try:
        readable, writable = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(readable)
        os.close(writable)
        return None
    if pid == 0:
        _be_the_copy(work, chunk, [readable, *others], writable, interruptible)
    os.close(writable)
    return pid, readable


def _be_the_copy(work, chunk, not_mine: list[int], writable: int, interruptible: bool) -> None:
    """The copy's life: its share's result pickled down the pipe, exit 0; anything else, exit 1."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL if interruptible else signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if interruptible else signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # this process gone: the write ends the copy
        for fd in not_mine:
            os.close(fd)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        sys.stdout = sys.stderr = os.fdopen(quiet, "w")  # whatever they were bound to, too
        result = pickle.dumps(list(work(chunk)), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(writable, "wb") as pipe:
            pipe.write(result)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent does the share again and says what went wrong
        pass
    finally:
        os._exit(code)


def _result_of(copy: tuple[int, int]) -> list[Any] | None:
    """The copy's result, once it has ended; None where it ended without one."""
    pid, readable = copy
    with os.fdopen(os.dup(readable), "rb") as pipe:
        data = pipe.read()
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already (a host that ignores SIGCHLD): its exit is unknown
        return None
    if not data or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - cut short: the share is done here
        return None


def _end(pid: int, readable: int) -> None:
    """Close the copy's pipe, and kill and reap it if it is still there (this process was
    interrupted, or the work raised here first)."""
    os.close(readable)
    with contextlib.suppress(ChildProcessError, ProcessLookupError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

"""Pure-Python work over many inputs, split in shares across copies of this process.

The one place a process is forked rather than started afresh: a copy starts with everything this
process imported, where a new interpreter would import it again (half a second for `compare`, as
long as the work it would take over). `compare` reading 3000 manifests is the case: validating
them holds the GIL (pydantic-core builds Python objects as it goes), so threads would take turns,
and on a 2-CPU machine two processes read them in 0.6 of the time (pipeline/report/row_cache.py).

A copy is made only where it is safe: the platform forks, and this process runs no other thread
and has not imported CUDA's or Ray's Python (neither survives a fork; a thread's held lock would
stay held in the copy). The work must be pure — the same inputs give the same outputs, and it
changes nothing a share's result does not carry — because a share is done again here wherever a
copy fails at it: an error is then raised here, by the work's own code, as a run without copies
raises it, and a copy killed mid-share costs its share's time, never its result.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
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
    with ProcessPoolExecutor(max_workers=len(chunks) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_share, work, chunk) for chunk in chunks[1:]]
        try:
            done = list(work(chunks[0]))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        for chunk, future in zip(chunks[1:], futures):
            try:
                result = future.result()
            except Exception:  # the copy died (BrokenProcessPool), or its result could not come back
                result = None
            done += result if result is not None else work(chunk)
    return done


def share_count(count: int, min_share: int) -> int:
    """How many processes share ``count`` items: one per usable CPU, each given ``min_share`` at
    the least; one where a copy of this process is not safe (the module's docstring says when)."""
    if count < 2 * min_share or not _forkable():
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, count // min_share))


def _forkable() -> bool:
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and threading.active_count() == 1
        and not any(name in sys.modules for name in _NOT_FORKABLE)
    )


def _share(work: Callable[[list[Item]], list[Any]], chunk: list[Item]) -> list[Any] | None:
    """A copy's share; None where it failed, for the parent to do again and raise as it raises."""
    try:
        return list(work(chunk))
    except Exception:
        return None

"""The CPUs a shape point's task measures on: its GPU's share of the node's cores, its own.

Ray counts CPUs but does not place a task on any: two point tasks on one host of two GPUs each
asked for half its CPUs, and ran on all of them. ONNX Runtime's thread pool in each (one thread
per physical core, pinned by ONNX Runtime itself) then met the other's on every core, and both
points were flagged busy (measured: docs/results/cluster.md, 'Why a worker per GPU and a CPU share
per point'). So a point's task claims one of the node's shares — as many as
the node has GPUs, each a set of whole physical cores with all their hardware threads — for as
long as it measures, and runs there (``environment.running_on``); what it starts meanwhile
(trtexec, compiling processes) inherits it, and ONNX Runtime sizes its pool to it.

A share is claimed by a lock on a file of the node's cache (``flock``: the kernel lets it go when
the process ends, however it ends), so a killed task's share is free again at once, and no task
needs to know which GPU Ray gave it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.machine.environment import SYS_CPU, physical_cores


def shares(cpus: list[int], parts: int, sys_cpu: Path = SYS_CPU) -> list[tuple[int, ...]]:
    """``cpus`` in ``parts`` shares as even as whole cores allow, each of neighbouring cores (one
    socket where the count allows); where there are fewer cores than parts, of single CPUs."""
    cores = physical_cores(cpus, sys_cpu)
    if len(cores) < parts:
        cores = [(cpu,) for cpu in sorted(cpus)]
    if len(cores) < parts:
        return []
    return [tuple(cpu for core in cores[len(cores) * i // parts : len(cores) * (i + 1) // parts] for cpu in core) for i in range(parts)]


@contextlib.contextmanager
def claimed_share(parts: int, directory: Path) -> Iterator[tuple[int, ...] | None]:
    """One of the node's ``parts`` shares of this process's CPUs, held until the block ends: the
    first one no other process holds. None (run wherever the OS schedules) with one part, too few
    CPUs to share, or every share taken (Ray places at most one point task per GPU, so that means
    something beside the product measures here too)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    choices = shares(allowed, parts) if parts > 1 else []
    if choices:
        directory.mkdir(parents=True, exist_ok=True)
    for index, share in enumerate(choices):
        handle = open(directory / f"share-{parts}-{index}.lock", "w")  # noqa: SIM115 - held for the block
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        try:
            yield share
        finally:
            handle.close()  # releases the lock
        return
    yield None

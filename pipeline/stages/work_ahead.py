"""The builds' work ahead of their profiles (compiling at every shape point, say), in the background
while the run builds its other engines (pipeline/stages/runner.py starts and finishes it)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.running.errors import DeviceFault


class WorkAhead:
    """The builds' work ahead of their profiles (compiling at every shape point, say): each
    build's is handed over once its engine is written and goes on in the background, in one pool per
    kind, while the run builds the other engines; ``finish`` waits for all of it before the
    first profile, so nothing of it runs while anything is measured, and adds each engine's
    evidence to its build manifest. A failure there costs time only: each profile then
    prepares its own point.

    In a run whose profiles follow (``prepares``), the builds leave every point to it, their own
    too, and as the work finishes each point it is made ready for the point's profile
    (EngineRuntime.prepare_ahead): kept by the process that compiled it, which serves it to the
    profile (the pool stays open until ``close``, after the profiles), or else prepared in this
    process while it waits. The compilations run side by side instead of each build's in this
    process one after another, and the tracing each profile would start with is done while
    nothing is measured."""

    def __init__(self, reporter, prepares: bool = False, jobs: int | None = None):
        self.reporter = reporter
        self.prepares = prepares
        # How many jobs the run's builds may hand over in all (runner.jobs_ahead), told to each
        # pool as it opens (AheadPool.expect); None: not known.
        self.jobs = jobs
        # By kind (the pool's opener): the open pool and the (build stage, work) pairs handed to it.
        self._pools: dict = {}
        # By kind: the error that took its pool out of this run (it is not tried again).
        self._failed: dict = {}
        # Files the work reads that go once it is over (BuildStage: an engine's second name).
        self._discarded: list = []

    def discard_after(self, path) -> None:
        """Remove ``path`` once the work ahead is over: finished, or stopped."""
        self._discarded.append(path)

    def submit(self, stage, work) -> bool:
        """Start ``work`` of ``stage``'s engine in its kind's pool: whether it runs in the background
        (False, with a warning, when the pool failed; False too when the pool declined it, which its
        ``finish`` explains)."""
        try:
            if work.pool in self._failed:
                raise self._failed[work.pool]
            if work.pool not in self._pools:
                self._pools[work.pool] = (work.pool(), [])
                if self.jobs:
                    self._pools[work.pool][0].expect(self.jobs)
            pool, entries = self._pools[work.pool]
            started = pool.submit(work)
        except Exception as exc:  # only time is lost: each profile prepares its own point
            self._failed.setdefault(work.pool, exc)
            failed = self._pools.pop(work.pool, None)
            if failed is not None:  # what it started for earlier works must not run on into the profiles
                _close_quietly(failed[0])
            self.reporter.warn(
                f"nothing done ahead of profiles for {stage.engine.name} on {stage.toolchain}: {type(exc).__name__}: {exc}; "
                "each profile prepares its own point"
            )
            return False
        entries.append((stage, work))
        return started

    def finish(self, while_waiting: Callable[[], int] | None = None) -> None:
        """Wait for every pool's work, recording what it found; ``while_waiting``: what this process
        does first, while the work goes on, where there is work to wait for (in a run that
        profiles: its other engines prepared for their points; how many)."""
        if while_waiting is not None and self.prepares and self._pools:
            started = time.perf_counter()
            with self.reporter.working("profile", "engines ahead of their points"):
                count = while_waiting()
            if count:
                seconds = time.perf_counter() - started
                self.reporter.done(
                    "profile",
                    f"{count} engine{'s' if count > 1 else ''}",
                    seconds,
                    " prepared ahead of their points, beside the work ahead",
                )
        for pool, group in self._pools.values():
            names = ", ".join(f"{stage.engine.name} on {stage.toolchain}" for stage, _ in group)
            engines = f"{len(group)} engine{'s' if len(group) > 1 else ''}"
            with self.reporter.working("build", f"{engines} ahead of profiles"):
                self.reporter.step(names)
                started = time.perf_counter()
                try:
                    evidence, skipped = pool.finish(self.reporter.progress, self._prepare(group) if self.prepares else None)
                except DeviceFault:
                    raise  # a kernel faulted while a point was prepared ahead: this process is replaced
                except Exception as exc:
                    self.reporter.warn(
                        f"nothing done ahead of profiles for {names}: {type(exc).__name__}: {exc}; each profile prepares its own point"
                    )
                    continue
            for (stage, _), facts in zip(group, evidence):
                stage.record_ahead(facts)
            if skipped:
                self.reporter.skipped("build", engines, f"nothing done ahead of profiles for {names}: {skipped}")
            else:
                waited = time.perf_counter() - started
                said = f" ({pool.said()})" if pool.said() else ""
                self.reporter.done("build", engines, waited, f" of waiting, ahead of profiles{said}: {names}")
        self._discard()

    def _prepare(self, group: list):
        """What ``finish`` calls for each job done: the engine prepared at the job's point, here."""
        stages = {id(work): stage for stage, work in group}

        def prepare(work, job, served=None) -> None:
            stage = stages.get(id(work))
            if stage is None:
                return
            started = time.perf_counter()
            why = stage.runtime.prepare_ahead(work.engine_path, job.workload, served)
            point = getattr(job.workload, "shape", None)
            where = f"{stage.engine.name} on {stage.toolchain}" + (f" at {point}" if point else "")
            if why is not None:
                self.reporter.progress(f"not prepared ahead: {where}: {why}")
            elif getattr(served, "fault", None) is not None:  # pytorch.served.FaultedPoint
                self.reporter.progress(f"not prepared ahead: {where}: it faulted in the process that compiled it; its profile records it")
            elif served is not None:
                self.reporter.progress(f"{where} kept for its profile by the process that compiled it")
            else:
                self.reporter.progress(f"prepared {where} for its profile ({time.perf_counter() - started:.1f} s)")

        return prepare

    def close(self) -> None:
        """Stop whatever is still running or serving: the run's profiles are over, or it was
        interrupted or failed before them."""
        for pool, _ in self._pools.values():
            _close_quietly(pool)
        self._discard()

    def _discard(self) -> None:
        for path in self._discarded:
            path.unlink(missing_ok=True)
        self._discarded.clear()


def room_on_the_gpu() -> Callable[[], str | None]:
    """Whether another engine may be prepared ahead of its point on the GPU measured on, asked
    before each: None while AHEAD_FREE_GPU of its memory is free (or there is no GPU, or NVML
    cannot say), else why not."""
    from pipeline.machine.environment import gpu_memory_free, measuring_gpu
    from pipeline.runtimes.base import too_little_to_keep

    gpu = measuring_gpu()

    def room() -> str | None:
        memory = gpu_memory_free(gpu["uuid"]) if gpu else None
        return None if memory is None else too_little_to_keep(*memory)

    return room


def _close_quietly(pool) -> None:
    try:
        pool.close()
    except Exception:  # stopping must not hide the error that got us here
        pass

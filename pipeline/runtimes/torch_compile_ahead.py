"""torch.compile at every shape point of every compiled engine of a run, side by side in
processes of their own, ahead of the profiles.

A compiled toolchain specialises its graph to each shape point (``dynamic = false``), and Inductor
takes about half a minute to compile ModernBERT-base at one point in one dtype: most of a sweep's
time when the points are compiled one after another as they are profiled. Compiling is mostly
single-threaded Python, so once the engines are built their points are compiled at once, in a
few processes, and the results left in Inductor's on-disk caches (FXGraphCache,
AOTAutogradCache). Those caches "avoid recompilation across process boundaries when it encounters
the same graph with the same Tensor input shapes (and the same configuration)" (PyTorch's Compile
Time Caching Configuration recipe,
docs.pytorch.org/tutorials/recipes/torch_compile_caching_configuration_tutorial.html). A point's
profile then compiles by tracing with Dynamo and finding the rest there; its manifest's
``inductor_cache_hits`` says it did. Each process prepares exactly as the profile will (same
inputs, same settings), which is what makes the graphs the same. Starting a process (a new
interpreter, torch, the model, a CUDA context) cost about a minute on the lent H100, so all the
engines' points share one set of processes rather than each engine starting its own.

A point that fails here (out of memory, a refusal) is left to its profile, which records the
reason for that point as it always did; nothing here decides anything about the engine.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# At most this many processes compile at once: each holds a CUDA context, the model and one
# inference's memory, and Inductor's own compile workers.
MAX_PROCESSES = 8
# Seconds a compiling process has to end after an interruption before it is killed.
STOP_GRACE_S = 5


def processes_for(points: int, cpus: int, gpu_free_bytes: int | None, model_bytes: int) -> int:
    """How many processes compile ``points`` shape points at once: one per point, two CPUs each (the
    compiler's Python and its kernel-compiling workers), and room on the GPU for each process's model
    twice over (weights, inputs, one inference) plus a CUDA context of about 1 GiB."""
    by_cpus = cpus // 2
    by_gpu = gpu_free_bytes // (2 * model_bytes + (1 << 30)) if gpu_free_bytes is not None else by_cpus
    return max(0, min(points, by_cpus, by_gpu, MAX_PROCESSES))


@dataclass(frozen=True)
class CompileJob:
    """One engine compiled at one shape point: what a compiling process needs to prepare it as its
    profile will."""

    toolchain: str
    spec: Any  # the toolchain's ToolchainSpec
    workspace_root: Path
    engine_path: Path
    workload: Any  # the point's ReferenceBatch


def compile_together(works: list, progress: Callable[[str], None]) -> tuple[list[dict[str, Any]], str | None]:
    """Every point of every engine in ``works`` (AheadWork whose jobs are CompileJobs), compiled in
    one set of processes: each process starts once (a new interpreter, torch, a CUDA context) and
    compiles a run of consecutive points, engine by engine (one engine's, where the counts allow). The build manifest's evidence for each work, in order,
    and why nothing was compiled where nothing was."""
    jobs = [job for work in works for job in work.jobs]
    gpu_free = _gpu_free_bytes()
    largest = max(job.engine_path.stat().st_size for job in jobs)
    processes = processes_for(len(jobs), usable_cpus(), gpu_free, largest)
    if processes < 2:
        why = "too few CPUs or too little free GPU memory to compile the points side by side; each profile compiles its own"
        return [{"compiler": {"compiled_ahead": {"skipped": why}}} for _ in works], why
    facts, outcomes = compile_ahead(jobs, processes, progress)
    evidence = []
    for work in works:
        points = {job.workload.shape: outcomes[(str(job.engine_path), job.workload.shape)] for job in work.jobs}
        evidence.append({"compiler": {"compiled_ahead": {**facts, "engines": len(works), "points": points}}})
    return evidence, None


def _gpu_free_bytes() -> int | None:
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


def compile_ahead(
    jobs: list[CompileJob], processes: int, progress: Callable[[str], None]
) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """``jobs`` in ``processes`` new interpreters: how the processes ran, and what each job's
    compilation took or why it did not happen, by (engine file, shape point)."""
    spawn = multiprocessing.get_context("spawn")  # a new interpreter: CUDA cannot be forked
    results = spawn.Queue()
    threads = max(1, usable_cpus() // processes)
    # Consecutive jobs to each process: the jobs come engine by engine, so a process reads few
    # models (it keeps the last one it prepared) and compiles a run of that engine's points.
    size, extra = divmod(len(jobs), processes)
    shares, start = [], 0
    for i in range(processes):
        end = start + size + (1 if i < extra else 0)
        shares.append(jobs[start:end])
        start = end
    children = [
        spawn.Process(target=_compile_points, args=(results, share, threads), name=f"pipeline-compile-{i}", daemon=True)
        for i, share in enumerate(shares)
    ]
    started = time.perf_counter()
    outcomes: dict[tuple[str, str], Any] = {}
    try:
        for child in children:
            child.start()
        progress(f"compiling {len(jobs)} shape points in {processes} processes")
        while len(outcomes) < len(jobs):
            try:
                engine, shape, outcome = results.get(timeout=1.0)
            except queue.Empty:
                if all(not child.is_alive() for child in children) and results.empty():
                    break  # a process ended without saying what became of its points
                continue
            outcomes[(engine, shape)] = outcome
            progress(f"compiled {len(outcomes)} of {len(jobs)} shape points ({Path(engine).stem} at {shape}: {_words(outcome)})")
    finally:
        for child in children:
            if child.is_alive() and len(outcomes) < len(jobs):
                child.terminate()
            child.join(STOP_GRACE_S)
            if child.is_alive():
                child.kill()
                child.join()
    for child, share in zip(children, shares):
        for job in share:
            outcomes.setdefault(
                (str(job.engine_path), job.workload.shape),
                {"error": f"its process ended with exit status {child.exitcode} before compiling it"},
            )
    facts = {"processes": processes, "compile_threads": threads, "wall_s": round(time.perf_counter() - started, 3)}
    return facts, outcomes


def _words(outcome: dict[str, Any]) -> str:
    return f"{outcome['compile_s']:.0f} s" if "compile_s" in outcome else "left to its profile"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _compile_points(results, jobs: list[CompileJob], threads: int) -> None:
    """In a new interpreter: prepare each job's engine at its point, as its profile will, and say
    how each went. A toolchain's runtime keeps the model it last read, so a run of one engine's
    points reads it once; each point compiles its own graph."""
    # Inductor compiles kernels in a pool of workers, one per CPU by default: shared out here, so
    # the processes together use the machine's CPUs, not each all of them. (Read when torch is
    # first imported, which is below; not part of the cache's key.)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    from pipeline.errors import PipelineError
    from pipeline.reporting import Reporter
    from pipeline.runtimes import create_runtime

    runtimes: dict[str, Any] = {}
    for job in jobs:
        try:
            if job.toolchain not in runtimes:
                runtimes[job.toolchain] = create_runtime(job.toolchain, job.spec, Reporter(), job.workspace_root)
            prepared = runtimes[job.toolchain].load(job.engine_path, job.workload)
            outcome = {key: prepared.facts[key] for key in ("compile_s", "graphs", "inductor_cache_hits") if key in prepared.facts}
        except PipelineError as exc:
            outcome = {"error": exc.message}
        except Exception as exc:  # recorded for the point: its profile compiles it and says why it fails
            outcome = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
        results.put((str(job.engine_path), job.workload.shape, outcome))

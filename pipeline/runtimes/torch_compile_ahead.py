"""torch.compile at every shape point of an engine, side by side in processes of their own, ahead
of the profile.

A compiled toolchain specialises its graph to each shape point (``dynamic = false``), and Inductor
takes about half a minute to compile ModernBERT-base at one point in one dtype: most of a sweep's
time when the points are compiled one after another as they are profiled. Compiling is mostly
single-threaded Python, so the build compiles the points at once, one process each, and leaves
the results in Inductor's on-disk caches (FXGraphCache, AOTAutogradCache). Those caches "avoid
recompilation across process boundaries when it encounters the same graph with the same Tensor
input shapes (and the same configuration)" (PyTorch's Compile Time Caching Configuration recipe,
docs.pytorch.org/tutorials/recipes/torch_compile_caching_configuration_tutorial.html). A point's
profile then compiles by tracing with Dynamo and finding the rest there; its manifest's
``inductor_cache_hits`` says it did. Each process prepares exactly as the profile will (same
inputs, same settings), which is what makes the graphs the same.

A point that fails here (out of memory, a refusal) is left to its profile, which records the
reason for that point as it always did; nothing here decides anything about the engine.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable
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


def compile_ahead(
    toolchain: str, spec, workspace_root: Path, engine_path: Path, workloads: list, processes: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Compile ``engine_path`` at each of ``workloads``' shape points in ``processes`` new
    interpreters; what each point's compilation took, or why it did not happen, by point."""
    spawn = multiprocessing.get_context("spawn")  # a new interpreter: CUDA cannot be forked
    results = spawn.Queue()
    threads = max(1, usable_cpus() // processes)
    shares = [workloads[i::processes] for i in range(processes)]
    children = [
        spawn.Process(
            target=_compile_points,
            args=(results, toolchain, spec, workspace_root, engine_path, share, threads),
            name=f"pipeline-compile-{i}",
            daemon=True,
        )
        for i, share in enumerate(shares)
    ]
    started = time.perf_counter()
    points: dict[str, Any] = {}
    try:
        for child in children:
            child.start()
        progress(f"compiling at {len(workloads)} shape points in {processes} processes")
        while len(points) < len(workloads):
            try:
                shape, outcome = results.get(timeout=1.0)
            except queue.Empty:
                if all(not child.is_alive() for child in children) and results.empty():
                    break  # a process ended without saying what became of its points
                continue
            points[shape] = outcome
            progress(f"compiled at {len(points)} of {len(workloads)} shape points ({shape}: {_words(outcome)})")
    finally:
        for child in children:
            if child.is_alive() and len(points) < len(workloads):
                child.terminate()
            child.join(STOP_GRACE_S)
            if child.is_alive():
                child.kill()
                child.join()
    for child, share in zip(children, shares):
        for workload in share:
            points.setdefault(workload.shape, {"error": f"its process ended with exit status {child.exitcode} before compiling it"})
    return {"processes": processes, "compile_threads": threads, "wall_s": round(time.perf_counter() - started, 3), "points": points}


def _words(outcome: dict[str, Any]) -> str:
    return f"{outcome['compile_s']:.0f} s" if "compile_s" in outcome else "left to its profile"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _compile_points(results, toolchain: str, spec, workspace_root: Path, engine_path: Path, workloads: list, threads: int) -> None:
    """In a new interpreter: prepare the engine at each of ``workloads``' points, as its profile
    will, and say how each went. The model is read once; each point compiles its own graph."""
    # Inductor compiles kernels in a pool of workers, one per CPU by default: shared out here, so
    # the processes together use the machine's CPUs, not each all of them. (Read when torch is
    # first imported, which is below; not part of the cache's key.)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    from pipeline.errors import PipelineError
    from pipeline.reporting import Reporter
    from pipeline.runtimes import create_runtime

    runtime = create_runtime(toolchain, spec, Reporter(), workspace_root)
    for workload in workloads:
        try:
            prepared = runtime.load(engine_path, workload)
            outcome = {key: prepared.facts[key] for key in ("compile_s", "graphs", "inductor_cache_hits") if key in prepared.facts}
        except PipelineError as exc:
            outcome = {"error": exc.message}
        except Exception as exc:  # recorded for the point: its profile compiles it and says why it fails
            outcome = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
        results.put((workload.shape, outcome))

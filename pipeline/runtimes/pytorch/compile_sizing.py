"""How many processes compile a run's shape points side by side (compile_ahead.py), and how many
kernel-compiling workers each is given: one process per graph to compile, so that every graph is
compiled in one wave, as far as the machine's CPUs, its host memory and the GPU's free memory allow.

Why one wave: a point that waits for a process to come free adds a whole compilation to the run
(ModernBERT-base, 12 graphs in 8 processes on the lent 16-vCPU H200: 22–36 s a point, 90.7 s from
the first point handed over to the last compiled; docs/results/sweeps.md, 'Each graph compiled
once'). Twelve processes at once compile each point more slowly than eight on those CPUs (24 points
in two waves of 12 ended only 0–12 s sooner than in three of 8), so one wave of 12 is estimated
to end some 20–30 s before two of 8, not twice as fast; not yet measured there. The
processes still start only when there is a point for them (CompilePool.submit): started with the
run instead, they slowed the export by 40 % and more and gained nothing.

The bounds, each a pure rule here (``processes_for``) read from the machine where the pool is sized:

- **CPUs.** A point's compilation is mostly one thread of Python (Dynamo's tracing, AOTAutograd,
  Inductor's lowering and code generation); the kernels it generates are compiled by Inductor's
  workers (TORCHINDUCTOR_COMPILE_THREADS) while that thread waits for them, or by the thread itself
  with one. So a process needs about one CPU. Two are kept out: one for the run's own process,
  which goes on exporting, building and preparing the eager and CUDA-graph engines beside the
  compilations (38 s of it in the seed matrix), and one for the rest (the system, the kernel
  compiles that overlap). 14 processes on 16 CPUs; 2 on 4; none on 2, where each profile compiles
  its own point (``CompilePool.finish`` says so).
- **Kernel-compiling workers** (``compile_threads``): the CPUs shared out among the processes
  planned (the graphs the run says it may hand over, CompilePool.expect, within the bounds here),
  so that together they never ask for more workers than there are CPUs: one (each process
  compiles its kernels itself, and starts no workers) once there are more processes than half the
  CPUs, more for a run of few graphs. Before this, 2 CPUs a process and 8 processes at most: 12
  graphs in two waves.
- **Host memory.** A process holds the interpreter with torch and the compiler (about 0.5 GiB on
  a CPU with the tests' tiny MLP: 473 MiB at its peak, 690 MiB with two workers), CUDA's libraries
  on a GPU machine, the model read from its engine file and the compiler's graphs of it:
  2–3 GB for ModernBERT-base. Assumed: 1.5 GiB and four times the engine file (2.7 GiB for
  ModernBERT-base in bf16). MemAvailable (or a cgroup's limit) at the first hand-over bounds
  them: one process too many is the kernel's OOM killer, which ends a process outright (the pool
  then leaves its point to its profile, but the time is lost). Where MemAvailable reads low (a
  virtual machine whose memory grows as it is used), fewer start: a second wave, not a kill.
- **GPU memory.** Each process holds a CUDA context (about 1 GiB) and its model twice over
  (weights, inputs, one inference) on the GPU; the free memory at the first hand-over bounds them.
- **At most MAX_PROCESSES**: the processes stay through the profiles, serving the points they
  kept, and each keeps its CUDA context on the measured GPU all the while (0.5–1 GiB): sixteen
  hold at most a ninth of an H200's 143 GB, a fifth of an 80 GB H100's, and are more than the
  largest run measured compiles at once (12 graphs).
"""

from __future__ import annotations

import os

GIB = 1 << 30
# CPUs kept out of the pool: the run's own process, and the rest of the machine.
CPUS_KEPT = 2
# A compiling process's host memory: this, and the engine file's size this many times over.
HOST_BASE_BYTES = 3 * GIB // 2
HOST_MODEL_TIMES = 4
# A CUDA context's GPU memory, beside twice the model's, for each process.
GPU_CONTEXT_BYTES = GIB
MAX_PROCESSES = 16


def processes_for(graphs: int, cpus: int, gpu_free_bytes: int | None, host_free_bytes: int | None, model_bytes: int) -> int:
    """How many processes compile ``graphs`` graphs at once (the module's docstring says why each
    bound): one per graph, bounded by the CPUs, the host's and the GPU's free memory (None: not
    known, no bound) for a model of ``model_bytes``, and MAX_PROCESSES."""
    bounds = [graphs, cpus - CPUS_KEPT, MAX_PROCESSES]
    if host_free_bytes is not None:
        bounds.append(host_free_bytes // (HOST_BASE_BYTES + HOST_MODEL_TIMES * model_bytes))
    if gpu_free_bytes is not None:
        bounds.append(gpu_free_bytes // (2 * model_bytes + GPU_CONTEXT_BYTES))
    return max(0, min(bounds))


def compile_threads(cpus: int, processes: int) -> int:
    """Inductor's kernel-compiling workers for each of ``processes`` processes: the CPUs shared out
    among them, at least one (compiled in the process itself)."""
    return max(1, cpus // max(processes, 1))


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpu_free_bytes() -> int | None:
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


def host_free_bytes() -> int | None:
    from pipeline.machine.environment import host_memory_available

    return host_memory_available()

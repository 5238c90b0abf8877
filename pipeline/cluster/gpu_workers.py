"""One long-lived worker per GPU, so that a GPU's work is done one job after another in one
process, as a local run does it all in one.

A Ray task gets a fresh worker process (a GPU task must: an idle process keeping its CUDA context
would sit beside the next measurement on that GPU), and a fresh process imports PyTorch, loads the
model and prepares every engine again before its work, several times what the same work costs in
a process that keeps them (measured: docs/results/cluster.md, 'Why a worker per GPU and a CPU
share per point'). So the driver hands a GPU type's work to Ray actors
(``worker.GpuWorker``), one per GPU of the type at most, each holding its GPU and its share of the
node's CPUs for as long as work of its type is still to come, and handed one job at a time, so the
jobs still spread over the GPUs as they free up:

* every shape point timed on the type;
* where every build for the type is built where it is timed (EngineRuntime.builds_where_timed:
  PyTorch's eager, CUDA graph and dynamic engines), those builds, and the exports of the engines
  built there — so the model one job loads is the next job's (pipeline/cluster/plan.py decides).

An idle worker is kept while a job of its type waits to start, unless a task (a job on a process of
its own: a TensorRT build, a compiled engine's) waits for a node's resources, which idle workers
then give back; one whose call fails (its node or process lost, or a kernel faulted in it) is
ended and forgotten, and its job goes to another — run again whole, as a task's would be.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.cluster.connection import gpus_of

# A task not started this long after it was sent is taken to wait for resources that idle workers
# hold, which they then give back (a task that fits starts within a tick of the driver's).
TASK_WAIT_S = 2.0


class GpuWorkers:
    def __init__(self, cluster):
        self.cluster = cluster
        self.idle: dict[str, list[Any]] = {}
        self.count: dict[str, int] = {}
        self.busy: dict[int, tuple[str, Any]] = {}  # id(job) → (GPU type, its actor)
        # The engines each worker has exported, built or timed (by id of its handle): a job goes to
        # the idle worker that has the most of its engines in memory already.
        self.engines_of: dict[Any, set[str]] = {}

    def gpus(self, gpu_type: str) -> int:
        """The GPUs of ``gpu_type`` the cluster's alive nodes have."""
        return int(sum(gpus_of(node.resources, gpu_type) or 1.0 for node in self.cluster.nodes_with(gpu_type)))

    def take(self, job, gpu_type: str, options: dict[str, Any]):
        """The idle worker of the type that knows most of ``job``'s engines, a new one while the
        type has GPUs without one, else None (the job waits)."""
        import ray

        from pipeline.cluster.worker import GpuWorker

        engines = {member.engine.name for member in job.members}
        idle = self.idle.setdefault(gpu_type, [])
        if idle:
            actor = max(idle, key=lambda a: len(engines & self.engines_of.get(id(a), set())))
            idle.remove(actor)
        elif self.count.get(gpu_type, 0) < self.gpus(gpu_type):
            remote = ray.remote(max_restarts=0, max_task_retries=0)(GpuWorker)
            actor = remote.options(**options).remote()
            self.count[gpu_type] = self.count.get(gpu_type, 0) + 1
        else:
            return None
        self.engines_of.setdefault(id(actor), set()).update(engines)
        self.busy[id(job)] = (gpu_type, actor)
        return actor

    def runs(self, job) -> bool:
        """Whether ``job`` is out on one of the workers (not a task of its own)."""
        return id(job) in self.busy

    def give_back(self, job) -> None:
        """``job`` is done: its worker waits for the next."""
        if id(job) in self.busy:
            gpu_type, actor = self.busy.pop(id(job))
            self.idle.setdefault(gpu_type, []).append(actor)

    def lose(self, job) -> bool:
        """``job``'s worker failed or must stop (cancelled): end it, and never hand it a job
        again. Whether ``job`` had one."""
        if id(job) not in self.busy:
            return False
        gpu_type, actor = self.busy.pop(id(job))
        self._end(gpu_type, actor)
        return True

    def release_idle(self, jobs, worker_for) -> None:
        """End the idle workers of every GPU type no job still to start goes to (``worker_for``
        says where a job goes), and every idle worker while a task waits for resources: one not
        started TASK_WAIT_S after it was sent. The builds and exports that are tasks get the GPUs
        and CPUs back."""
        now = time.monotonic()
        to_come = {worker_for(job) for job in jobs if job.state == "waiting"}
        tasks_waiting = any(job.state == "queued" and not self.runs(job) and now - job.submitted_at > TASK_WAIT_S for job in jobs)
        for gpu_type, idle in self.idle.items():
            if tasks_waiting or gpu_type not in to_come:
                while idle:
                    self._end(gpu_type, idle.pop())

    def close(self) -> None:
        for gpu_type, idle in self.idle.items():
            while idle:
                self._end(gpu_type, idle.pop())
        for gpu_type, actor in list(self.busy.values()):
            self._end(gpu_type, actor)
        self.busy.clear()

    def _end(self, gpu_type: str, actor) -> None:
        import ray

        self.count[gpu_type] = max(0, self.count.get(gpu_type, 0) - 1)
        self.engines_of.pop(id(actor), None)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone with its node: nothing to end
            pass

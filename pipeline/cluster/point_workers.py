"""One long-lived worker per GPU for a run's shape points, so that a GPU's points are timed one
after another in one process, as a local run times them.

A point's Ray task gets a fresh worker process (a GPU task must: an idle process keeping its CUDA
context would sit beside the next measurement on that GPU), and a fresh process imports PyTorch,
loads the model and prepares every engine again before its rounds: 46–85 s a point on two H200s,
against about 22 s in one process that keeps its prepared engines (docs/cluster.md). So the
driver times a GPU type's points on Ray actors (``worker.PointWorker``), one per GPU of the type
at most, each holding its GPU and its share of the node's CPUs for as long as points are ready
for it, and handed one point at a time, so the points still spread over the GPUs as they free up.

An actor left idle while no point of its type is ready is ended, so builds and exports get the
GPU back; one whose call fails (its node or process lost) is ended and forgotten, and its point
goes to another — run again whole, as a task's would be.
"""

from __future__ import annotations

from typing import Any

from pipeline.cluster.connection import gpus_of


class PointWorkers:
    def __init__(self, cluster):
        self.cluster = cluster
        self.idle: dict[str, list[Any]] = {}
        self.count: dict[str, int] = {}
        self.busy: dict[int, tuple[str, Any]] = {}  # id(job) → (GPU type, its actor)

    def gpus(self, gpu_type: str) -> int:
        """The GPUs of ``gpu_type`` the cluster's alive nodes have."""
        return int(sum(gpus_of(node.resources, gpu_type) or 1.0 for node in self.cluster.nodes_with(gpu_type)))

    def take(self, job, gpu_type: str, options: dict[str, Any]):
        """An idle worker of the type for ``job``, a new one while the type has GPUs without one,
        else None (the point waits)."""
        import ray

        from pipeline.cluster.worker import PointWorker

        idle = self.idle.setdefault(gpu_type, [])
        if idle:
            actor = idle.pop()
        elif self.count.get(gpu_type, 0) < self.gpus(gpu_type):
            remote = ray.remote(max_restarts=0, max_task_retries=0)(PointWorker)
            actor = remote.options(**options).remote()
            self.count[gpu_type] = self.count.get(gpu_type, 0) + 1
        else:
            return None
        self.busy[id(job)] = (gpu_type, actor)
        return actor

    def give_back(self, job) -> None:
        """``job``'s point is done: its worker waits for the next."""
        if id(job) in self.busy:
            gpu_type, actor = self.busy.pop(id(job))
            self.idle.setdefault(gpu_type, []).append(actor)

    def lose(self, job) -> bool:
        """``job``'s worker failed or must stop (cancelled): end it, and never hand it a point
        again. Whether ``job`` had one."""
        if id(job) not in self.busy:
            return False
        gpu_type, actor = self.busy.pop(id(job))
        self._end(gpu_type, actor)
        return True

    def release_idle(self, jobs) -> None:
        """End the idle workers of every GPU type none of whose points is ready (a point waiting
        for a worker), freeing their GPUs for the builds and exports still to come."""
        wanted = {job.placed_by for job in jobs if job.stage == "profile" and job.state == "waiting" and job.placed_by}
        for gpu_type, idle in self.idle.items():
            if gpu_type not in wanted:
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
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone with its node: nothing to end
            pass

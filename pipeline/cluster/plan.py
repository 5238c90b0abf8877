"""What a cluster run does and where: one job per stage of each engine for each target (a GPU type,
or none), grouped in chains that wait on each other; where each job's task may run (Ray's
options); and whether a job is current in the driver's workspace, so nothing current is sent.
The driver (pipeline/cluster/scheduler.py) runs the plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog import EngineRef
from pipeline.cluster.connection import Cluster, Node, placement_resources
from pipeline.errors import EnvironmentMissing, PipelineError, UsageError
from pipeline.stages.base import RunContext
from pipeline.stages.runner import builds_of, shapes_to_profile, stage_for

# Precisions whose export needs a CUDA GPU (ModelOpt's MXFP8/NVFP4 quantizers).
CUDA_EXPORTS = ("mxfp8", "nvfp4")


@dataclass
class Job:
    """One stage of one engine for one target, as the driver tracks it."""

    stage: str
    engine: EngineRef
    toolchain: str | None = None
    gpu_type: str | None = None  # the output folder's GPU type
    # The shape point of a profile (models with several), and of a build (static models).
    shape: str | None = None
    state: str = "waiting"  # waiting · queued · running · done · unchanged · skipped · failed · cancelled
    placed_by: str | None = None
    node: Node | None = None
    attempts: int = 0
    seconds: float = 0.0
    error: PipelineError | None = None
    note: str = ""
    handle: Any = None  # the task's ObjectRefGenerator while it is out

    @property
    def target(self) -> str:
        where = self.toolchain or "export"
        where = f"{where}@{self.gpu_type}" if self.gpu_type else where
        return f"{where} at {self.shape}" if self.shape else where

    @property
    def finished(self) -> bool:
        return self.state in ("done", "unchanged", "skipped", "failed", "cancelled")

    @property
    def usable(self) -> bool:
        """Later stages may go on from here."""
        return self.state in ("done", "unchanged", "skipped")


@dataclass
class Chain:
    """One engine's stages for one toolchain target, after its export."""

    export: Job
    stages: list[Job] = field(default_factory=list)


class ClusterPlan:
    def __init__(
        self,
        ctx: RunContext,
        cluster: Cluster,
        engines: list[EngineRef],
        toolchain: str | None,
        until: str,
        gpu_types: tuple[str, ...] = (),
    ):
        self.ctx, self.cluster, self.engines, self.toolchain, self.until = ctx, cluster, engines, toolchain, until
        self.reporter = ctx.reporter
        self.runtime = None
        if toolchain is not None:
            from pipeline.runtimes import get_runtime

            self.runtime = get_runtime(ctx, toolchain)
        self.targets = self._targets(gpu_types)
        self.exports: dict[EngineRef, Job] = {}
        self.chains: list[Chain] = []

    # --- the jobs ------------------------------------------------------------------------------

    def _targets(self, requested: tuple[str, ...]) -> list[str | None]:
        """The GPU types this toolchain's engines are built and timed for (None: no GPU type)."""
        have = self.cluster.gpu_types
        missing = [t for t in requested if t not in have]
        if missing:
            raise UsageError(
                f"no node of the cluster has {', '.join(missing)}; its GPU types are: {', '.join(have) or 'none'}.",
                hint="start a node with that GPU (or one declaring it: `ray start … --resources '{\"gpu_type:NAME\": 1}'`), "
                "or pick from the types above with --gpu",
            )
        if self.runtime is None or self.runtime.placement != "gpu":
            if requested and self.runtime is not None:
                self.reporter.warn(
                    f"--gpu chooses the GPU types of toolchains built per GPU (trtexec, PyTorch); {self.toolchain} "
                    f"({self.runtime.placement.replace('-', ' ')}) makes one engine, placed as docs/cluster.md says"
                )
            return [None]
        chosen = list(requested) or [t for t in have if self.runtime.supports_gpu(self._capability(t))]
        return chosen or [None]

    def _capability(self, gpu_type: str) -> str | None:
        from pipeline.cluster.gpus import compute_capability

        for node in self.cluster.nodes_with(gpu_type):
            for gpu in node.gpus:
                if gpu.get("compute_capability"):
                    return gpu["compute_capability"]
        return compute_capability(gpu_type, self.ctx.catalog)

    def plan(self) -> list[Job]:
        for engine in self.engines:
            export = self.exports.setdefault(engine, Job("export", engine))
            if self.toolchain is None:
                continue
            builds, points = builds_of(self.ctx, engine), shapes_to_profile(self.ctx, engine)
            for target in self.targets:
                for built in builds:  # one engine; or, for a static model, one per shape point
                    stages = [Job("build", engine, self.toolchain, target, built)]
                    if self.until == "profile":
                        measured = [built] if built is not None else points
                        stages += [Job("profile", engine, self.toolchain, target, shape) for shape in measured]
                    self.chains.append(Chain(export, stages))
        return self.jobs()

    def jobs(self) -> list[Job]:
        return list(self.exports.values()) + [job for chain in self.chains for job in chain.stages]

    # --- the driver's view of its workspace ------------------------------------------------------

    def _stage(self, job: Job):
        ctx = RunContext(
            catalog=self.ctx.catalog,
            workspace=self.ctx.workspace,
            reporter=self.reporter,
            force=self.ctx.force,
            runtimes=self.ctx.runtimes,
            gpu_type=job.gpu_type,
        )
        return stage_for(ctx, job.stage, job.engine, job.toolchain, job.shape)

    def up_to_date(self, job: Job) -> bool:
        """A record with these parameters, its inputs and outputs intact: nothing to send."""
        if self.ctx.force:
            return False
        stage = self._stage(job)
        manifest = stage.load_manifest()
        previous = manifest.stage(job.stage) if manifest else None
        if previous is None or previous.status == "failed":
            return False
        try:
            if _normalised(previous.params) != _normalised(stage.params()):
                return False
        except PipelineError:
            return False
        workspace = self.ctx.workspace
        return all(workspace.is_intact(a) for a in [*previous.inputs, *previous.outputs])

    def export_needed(self, engine: EngineRef) -> bool:
        # As in a local run: a variant the toolchain cannot run is recorded as skipped without an export.
        if self.runtime is None:
            return True
        return self.runtime.unsupported_reason(self.ctx.catalog.variant(engine.variant)) is None

    # --- placement -----------------------------------------------------------------------------

    def placement(self, job: Job) -> tuple[dict[str, Any], str | None]:
        """Ray options for the job's task, and the GPU type it is placed by."""
        nodes = self.cluster.nodes
        options: dict[str, Any] = {"num_cpus": 1}
        if job.stage == "profile":
            # A measurement wants its node to itself: as many CPUs as the smallest node has.
            options["num_cpus"] = max(1.0, min((n.cpus for n in nodes if n.cpus > 0), default=1.0))
        gpu_type = None
        if job.stage == "export":
            if self.ctx.catalog.variant(job.engine.variant).precision in CUDA_EXPORTS:
                if not any(n.resources.get("GPU") for n in nodes):
                    raise EnvironmentMissing(
                        f"exporting {job.engine.name} needs a CUDA GPU, and no node of the cluster has one (Ray's GPU resource).",
                        hint="add a GPU node to the cluster, or export it on a GPU machine and run again",
                    )
                options["num_gpus"] = 1
        elif self.runtime.placement == "gpu" and job.gpu_type is not None:
            gpu_type = job.gpu_type
        elif self.runtime.placement == "ahead-of-time" and job.stage == "profile":
            gpu_type = next((t for t in self.cluster.gpu_types if self.runtime.supports_gpu(self._capability(t))), None)
        if gpu_type is not None:
            node = self.cluster.nodes_with(gpu_type)[0]
            options["resources"] = placement_resources(node.resources, gpu_type)
            if node.resources.get("GPU"):
                options["num_gpus"] = 1
        return options, gpu_type

    def feasible(self, job: Job) -> bool:
        if job.placed_by is None:
            return bool(self.cluster.nodes)
        return bool(self.cluster.nodes_with(job.placed_by))


def _normalised(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)

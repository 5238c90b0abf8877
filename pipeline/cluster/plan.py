"""What a cluster run does and where: one job per export, per build of each engine for each target
(a GPU type, or none), and per shape point of each model for each GPU type — the point's engines,
every toolchain's, timed together in rounds on one GPU as a local run times them; each job waits
for the jobs it needs (a build for its export, a point for its engines' builds). Where each job's
task may run (Ray's options), and whether a job is current in the driver's workspace, so nothing
current is sent. The driver (pipeline/cluster/scheduler.py) runs the plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog import EngineRef
from pipeline.cluster.connection import Cluster, Node, gpus_of, placement_resources
from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError
from pipeline.stages.base import RunContext, RunRequest
from pipeline.stages.runner import builds_of, shapes_to_profile, stage_for

# Precisions whose export needs a CUDA GPU (ModelOpt's MXFP8/NVFP4 quantizers).
CUDA_EXPORTS = ("mxfp8", "nvfp4")
# The share of a GPU a build asks for where its toolchain's builds may share one
# (EngineRuntime.builds_share_gpu): this many at once on a GPU no point holds.
BUILDS_A_GPU = 4


@dataclass(frozen=True)
class Member:
    """One engine's stage in a job: the export, a build, or one of the profiles a point's job times."""

    engine: EngineRef
    toolchain: str | None = None
    gpu_type: str | None = None  # the output folder's GPU type (engines/<toolchain>@<gpu>/)
    # The shape point of a profile (models with several), and of a build (static models).
    shape: str | None = None


@dataclass
class Job:
    """One task of the run, as the driver tracks it: an export, a build, or a shape point's profiles."""

    stage: str  # "export" | "build" | "profile"
    members: list[Member]
    # The jobs this one waits for: a build its export, a point its engines' builds.
    after: list[Job] = field(default_factory=list)
    # The GPU type a point's task goes to (its GPU members' type), None: any node.
    placed_on: str | None = None
    state: str = "waiting"  # waiting · queued · running · done · unchanged · skipped · failed · cancelled
    placed_by: str | None = None
    node: Node | None = None
    attempts: int = 0
    seconds: float = 0.0
    error: PipelineError | None = None
    # The members' own failures, where the job ran but some of its engines did not (a point).
    failures: list[tuple[Member, PipelineError]] = field(default_factory=list)
    # Kernels that faulted on the GPU, each recorded for its member, and how many times the job went
    # on in a fresh process after one (pipeline/running/faults.py).
    faults: list[tuple[Member, PipelineError]] = field(default_factory=list)
    replaced: int = 0
    note: str = ""
    handle: Any = None  # the task's ObjectRefGenerator while it is out
    submitted_at: float = 0.0  # time.monotonic() when it was last sent

    @property
    def engine(self) -> EngineRef:
        return self.members[0].engine

    @property
    def toolchain(self) -> str | None:
        return self.members[0].toolchain

    @property
    def gpu_type(self) -> str | None:
        return self.members[0].gpu_type

    @property
    def shape(self) -> str | None:
        return self.members[0].shape

    @property
    def name(self) -> str:
        """What the live view calls it: the engine, or for a point the model and its engines' count."""
        if self.stage == "profile" and len(self.members) > 1:
            return f"{self.engine.model} ({len(self.members)} engines)"
        return self.engine.name

    @property
    def target(self) -> str:
        if self.stage == "profile" and len(self.members) > 1:
            where = ", ".join(dict.fromkeys(m.toolchain for m in self.members if m.toolchain))
            on = f" on {self.placed_on}" if self.placed_on else ""
            return f"{where} at {self.shape}{on}" if self.shape else f"{where}{on}"
        where = self.toolchain or "export"
        where = f"{where}@{self.gpu_type}" if self.gpu_type else where
        return f"{where} at {self.shape}" if self.shape else where

    @property
    def finished(self) -> bool:
        return self.state in ("done", "unchanged", "skipped", "failed", "cancelled")

    @property
    def usable(self) -> bool:
        """Jobs waiting for it may go on from here."""
        return self.state in ("done", "unchanged", "skipped")


class ClusterPlan:
    def __init__(self, ctx: RunContext, cluster: Cluster, request: RunRequest):
        self.ctx, self.cluster, self.engines, self.until = ctx, cluster, request.engines, request.until
        self.toolchains = list(request.toolchains or [])
        self.reporter = ctx.reporter
        # What each toolchain builds for is settled here, once for every node (the catalog the
        # driver sends with each task, and checks its records against): a toolchain that would
        # build for the building machine's GPU builds for the cluster's GPUs instead.
        capabilities = tuple(self._capability(t) for t in cluster.gpu_types)
        specs = {name: ctx.catalog.toolchain(name).for_gpus(capabilities) for name in self.toolchains}
        for name, spec in specs.items():
            if spec is not ctx.catalog.toolchain(name):
                ctx.runtimes.pop(name, None)  # one made before, for the targets before, is made again
        ctx.catalog = ctx.catalog.model_copy(update={"toolchains": {**ctx.catalog.toolchains, **specs}})
        from pipeline.runtimes import get_runtime

        self.runtimes = {toolchain: get_runtime(ctx, toolchain) for toolchain in self.toolchains}
        self.targets = {toolchain: self._targets(toolchain, request.gpu_types) for toolchain in self.toolchains}
        self.exports: dict[EngineRef, Job] = {}
        self._jobs: list[Job] = []
        # The GPU types whose builds are all built where they are timed: their builds, and the
        # exports of the engines built there, go to the type's GPU workers with its points.
        self.built_on_workers: set[str] = set()
        self._export_on: dict[EngineRef, str] = {}

    # --- the jobs ------------------------------------------------------------------------------

    def _targets(self, toolchain: str, requested: tuple[str, ...]) -> list[str | None]:
        """The GPU types this toolchain's engines are built and timed for (None: no GPU type)."""
        have = self.cluster.gpu_types
        missing = [t for t in requested if t not in have]
        if missing:
            raise UsageError(
                f"no node of the cluster has {', '.join(missing)}; its GPU types are: {', '.join(have) or 'none'}.",
                hint="start a node with that GPU (or one declaring it: `ray start … --resources '{\"gpu_type:NAME\": 1}'`), "
                "or pick from the types above with --gpu",
            )
        runtime = self.runtimes[toolchain]
        if runtime.placement != "gpu":
            if requested:
                self.reporter.warn(
                    f"--gpu chooses the GPU types of toolchains built per GPU (trtexec, PyTorch); {toolchain} "
                    f"({runtime.placement.replace('-', ' ')}) makes one engine, placed as docs/cluster.md says"
                )
            return [None]
        chosen = list(requested) or [t for t in have if runtime.supports_gpu(self._capability(t))]
        return chosen or [None]

    def _capability(self, gpu_type: str) -> str | None:
        from pipeline.cluster.gpus import compute_capability

        for node in self.cluster.nodes_with(gpu_type):
            for gpu in node.gpus:
                if gpu.get("compute_capability"):
                    return gpu["compute_capability"]
        return compute_capability(gpu_type, self.ctx.catalog)

    def plan(self) -> list[Job]:
        """Exports, builds, then one job per shape point: the point's engines of every toolchain
        and variant, on one GPU of the type they are timed for."""
        points: dict[tuple[str, str | None, str | None], Job] = {}
        for engine in self.engines:
            export = self.exports.setdefault(engine, Job("export", [Member(engine)]))
            for toolchain in self.toolchains:
                shapes = shapes_to_profile(self.ctx, engine)
                for target in self.targets[toolchain]:
                    for built in builds_of(self.ctx, engine):  # one engine; or, for a static model, one per point
                        build = Job("build", [Member(engine, toolchain, target, built)], after=[export])
                        self._jobs.append(build)
                        if self.until != "profile":
                            continue
                        for shape in [built] if built is not None else shapes:
                            member = Member(engine, toolchain, target, shape)
                            placed_on = self._timed_on(toolchain, target)
                            point = points.setdefault((engine.model, shape, placed_on), Job("profile", [], placed_on=placed_on))
                            point.members.append(member)
                            point.after.append(build)
        # The longest builds first, so that a GPU's shares go to them before short ones: Ray
        # dispatches the tasks of one scheduling class (function and resource shape: the builds of
        # one GPU type) first in, first out (ray-project/ray#5851, fair queueing between classes).
        self._jobs.sort(key=lambda job: not self.runtimes[job.toolchain].builds_long)
        self._place_builds_on_workers()
        self._jobs += self._one_job_a_point(points)
        return self.jobs()

    def _place_builds_on_workers(self) -> None:
        """Which GPU types' builds and exports go to their GPU workers (pipeline/cluster/gpu_workers.py):
        those every build for which is built where it is timed. A type with any other build
        (a TensorRT builder's, a compiled engine's compiling its points in processes of its own)
        keeps every build a task of its own, so that none waits for a worker to let go of a GPU."""
        on_gpus = [job for job in self._jobs if self.runtimes[job.toolchain].placement == "gpu" and job.gpu_type is not None]
        types = {job.gpu_type for job in on_gpus}
        self.built_on_workers = {
            gpu_type
            for gpu_type in types
            if all(self.runtimes[job.toolchain].builds_where_timed for job in on_gpus if job.gpu_type == gpu_type)
        }
        needs_cuda = {e for e in self.exports if self.ctx.catalog.variant(e.variant).precision in CUDA_EXPORTS}
        for job in on_gpus:
            gpu_type = job.gpu_type
            if gpu_type not in self.built_on_workers or job.engine in self._export_on:
                continue
            # A quantizer that needs CUDA needs a GPU of Ray's, not a declared type alone.
            if job.engine in needs_cuda and not any(node.resources.get("GPU") for node in self.cluster.nodes_with(gpu_type)):
                continue
            self._export_on[job.engine] = gpu_type

    def worker_for(self, job: Job) -> str | None:
        """The GPU type whose GPU worker runs ``job``, or None: a task of its own."""
        if job.stage == "profile":
            return job.placed_on
        if job.stage == "build":
            on_gpu = self.runtimes[job.toolchain].placement == "gpu"
            return job.gpu_type if on_gpu and job.gpu_type in self.built_on_workers else None
        return self._export_on.get(job.engine)

    def _timed_on(self, toolchain: str, target: str | None) -> str | None:
        """The GPU type a toolchain's engine is timed on: its target; for an engine built ahead of
        time, a GPU type it runs on; None for one that needs no GPU."""
        runtime = self.runtimes[toolchain]
        if runtime.placement == "gpu":
            return target
        if runtime.placement == "ahead-of-time":
            return next((t for t in self.cluster.gpu_types if runtime.supports_gpu(self._capability(t))), None)
        return None

    @staticmethod
    def _one_job_a_point(points: dict[tuple[str, str | None, str | None], Job]) -> list[Job]:
        """The engines that need no GPU (ONNX Runtime on the CPU) join their point's job on the first
        GPU type it has, as a local run times every engine of a point together."""
        for (model, shape, placed_on), job in list(points.items()):
            if placed_on is not None:
                continue
            on_a_gpu = next((other for (m, s, t), other in points.items() if m == model and s == shape and t is not None), None)
            if on_a_gpu is not None:
                on_a_gpu.members += job.members
                on_a_gpu.after += job.after
                del points[(model, shape, placed_on)]
        return list(points.values())

    def jobs(self) -> list[Job]:
        return list(self.exports.values()) + self._jobs

    # --- the driver's view of its workspace ------------------------------------------------------

    def stage(self, job: Job, member: Member):
        ctx = RunContext(
            catalog=self.ctx.catalog,
            workspace=self.ctx.workspace,
            reporter=self.reporter,
            force=self.ctx.force,
            runtimes=self.ctx.runtimes,
            gpu_type=member.gpu_type,
            exports_write_onnx=self.ctx.exports_write_onnx,
        )
        return stage_for(ctx, job.stage, member.engine, member.toolchain, member.shape)

    def up_to_date(self, job: Job) -> bool:
        """Every member has a record with these parameters, its inputs and outputs intact: nothing to send."""
        if self.ctx.force:
            return False
        return all(self._member_current(job, member) for member in job.members)

    def _member_current(self, job: Job, member: Member) -> bool:
        stage = self.stage(job, member)
        manifest = stage.load_manifest()
        previous = manifest.stage(job.stage) if manifest else None
        if previous is None or previous.status == "failed":
            return False
        if job.stage == "export" and previous.status == "faulted" and previous.fault is not None and previous.fault.shape is not None:
            return False  # an export that faulted at a point goes on without it (stages/export.py)
        try:
            if _normalised(previous.params) != _normalised(stage.params()):
                return False
        except PipelineError:
            return False
        workspace = self.ctx.workspace
        return all(workspace.is_intact(a) for a in [*previous.inputs, *previous.outputs])

    def kept_faults(self, job: Job) -> list[tuple[Member, PipelineError]]:
        """The members of an up-to-date job whose kept result is a fault: an error of this run too,
        as on one machine (stages/base.py), until --force."""
        faults = []
        for member in job.members:
            manifest = self.stage(job, member).load_manifest()
            record = manifest.stage(job.stage) if manifest else None
            if record is not None and record.status == "faulted":
                faults.append((member, PipelineError(f"{record.reason} (recorded earlier; `--force` tries again)")))
        return faults

    def export_needed(self, engine: EngineRef) -> bool:
        # As in a local run: a variant no toolchain of the run can make is recorded as skipped without an export.
        if not self.toolchains:
            return True
        variant = self.ctx.catalog.variant(engine.variant)
        return any(runtime.unsupported_reason(variant) is None for runtime in self.runtimes.values())

    # --- placement -----------------------------------------------------------------------------

    def placement(self, job: Job) -> tuple[dict[str, Any], str | None]:
        """Ray options for the job's task, and the GPU type it is placed by."""
        nodes = self.cluster.nodes
        options: dict[str, Any] = {"num_cpus": 1}
        gpu_type, share = None, 1.0
        if job.stage == "export":
            # Ray starts a task of one CPU with OMP_NUM_THREADS=1 (ray/_private/utils.py,
            # set_omp_num_threads_if_unset): PyTorch's CPU work (the FP32 references on a node
            # without a GPU) would run on one thread. An export asks for a GPU's share of the
            # smallest node.
            options["num_cpus"] = self._gpu_share_of_cpus()
            if self.ctx.catalog.variant(job.engine.variant).precision in CUDA_EXPORTS:
                if not any(n.resources.get("GPU") for n in nodes):
                    raise EnvironmentMissing(
                        f"exporting {job.engine.name} needs a CUDA GPU, and no node of the cluster has one (Ray's GPU resource).",
                        hint="add a GPU node to the cluster, or export it on a GPU machine and run again",
                    )
                options["num_gpus"] = 1
            elif any(n.resources.get("GPU") for n in nodes):
                # It computes its references on a GPU where it sees one, and Ray hides no GPU from
                # a task that asks for none (ray/_private/utils.py, set_visible_accelerator_ids):
                # asked for like a PyTorch build, it never runs on a GPU a point is measuring on.
                options["num_gpus"] = 1 / BUILDS_A_GPU
            return options, None
        if job.stage == "profile":
            return self.worker_options(job.placed_on), job.placed_on
        if self.runtimes[job.toolchain].placement == "gpu":
            gpu_type = job.gpu_type
            if self.runtimes[job.toolchain].builds_share_gpu:
                share = 1 / BUILDS_A_GPU
        return self._on_gpu_type(options, gpu_type, share), gpu_type

    def worker_options(self, gpu_type: str | None) -> dict[str, Any]:
        """Ray options for a shape point's process on ``gpu_type`` (a GPU worker's): the whole GPU
        and its share of the node's CPUs; for a point that needs no GPU, a whole node's CPUs."""
        return self._on_gpu_type({"num_cpus": self._measurement_cpus(gpu_type)}, gpu_type, 1.0)

    def _on_gpu_type(self, options: dict[str, Any], gpu_type: str | None, share: float) -> dict[str, Any]:
        """``options`` with ``share`` of a GPU of ``gpu_type`` (none for None), and PyTorch's
        threads for that type."""
        if gpu_type is not None:
            node = self.cluster.nodes_with(gpu_type)[0]
            options["resources"] = placement_resources(node.resources, gpu_type, share)
            if node.resources.get("GPU"):
                options["num_gpus"] = share
        options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(self._threads(gpu_type))}}
        return options

    def _threads(self, gpu_type: str | None) -> int:
        """PyTorch's threads in a build's or a point's task of ``gpu_type``: as many as a point's
        CPUs, in every one of them. Ray would set OMP_NUM_THREADS from each task's own CPUs — one
        for a build — and Inductor's cache key holds the thread count wherever a graph has CPU code
        (torch/_inductor/codecache.py, cpp_runtime_thread_count): a point's graphs compiled ahead in
        a build's processes were not found by the point (every point compiled again, on a CPU-only
        Ray cluster of this machine)."""
        return int(self._measurement_cpus(gpu_type))

    def _gpu_share_of_cpus(self) -> float:
        """A GPU's share of the smallest node's CPUs (all of them for a node without one)."""
        shares = [n.cpus / max(1.0, gpus_of(n.resources)) for n in self.cluster.nodes if n.cpus > 0]
        return max(1.0, min(shares, default=1.0))

    def _measurement_cpus(self, gpu_type: str | None) -> float:
        """The CPUs a point's task asks for, so that nothing else runs beside a measurement: a
        whole node (the smallest) for a point that needs no GPU; for one on a GPU type, that GPU's
        share of its node's CPUs (the smallest node of the type), so a node's GPUs each time a
        point at once — on two H200s of one host, a point each, not one after the other."""
        if gpu_type is None:
            return max(1.0, min((n.cpus for n in self.cluster.nodes if n.cpus > 0), default=1.0))
        shares = [n.cpus / max(1.0, gpus_of(n.resources, gpu_type)) for n in self.cluster.nodes_with(gpu_type)]
        return max(1.0, min((share for share in shares if share > 0), default=1.0))

    def feasible(self, job: Job) -> bool:
        if job.placed_by is None:
            return bool(self.cluster.nodes)
        return bool(self.cluster.nodes_with(job.placed_by))


def _normalised(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)

"""The driver of a cluster run: the engine matrix as Ray tasks, each stage on a node that can run it.

For each engine the export runs once, on any node (a node with a CUDA GPU for MXFP8/NVFP4); then,
per target, the build and the profile. Where a toolchain's engines belong to a GPU (trtexec,
PyTorch), the target is a GPU type: both stages run on a node of that type and the outputs go to
engines/<toolchain>@<gpu>/. Ahead-of-time builds (TensorRT-RTX) run anywhere and are timed on a
GPU they target where the cluster has one. CPU runtimes (ONNX Runtime) run anywhere.

Before a stage is dispatched the driver checks its own workspace, the way a local run does: a
record with the same parameters whose inputs and outputs are intact is up to date and nothing is
sent (the tools' versions on the node are recorded, not re-checked: `--force` re-runs). Results
are written into the workspace as each task finishes (files, then the manifest, each atomically),
so an interrupted run keeps everything finished and nothing half-written looks valid.

Faults: a task whose node or worker dies is retried on another node that can run it, at most
MAX_ATTEMPTS times; a compiler's refusal or a user error is recorded or reported, never retried.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.catalog import EngineRef
from pipeline.cluster.connection import Cluster, Node, placement_resources
from pipeline.cluster.transfer import DriverBlobs
from pipeline.errors import EnvironmentMissing, PipelineError, UsageError
from pipeline.stages.base import RunContext
from pipeline.stages.runner import RunSummary, builds_of, shapes_to_profile, stage_for

# Attempts per task when its node or worker is lost (the first run included).
MAX_ATTEMPTS = 3
# Precisions whose export needs a CUDA GPU (ModelOpt's MXFP8/NVFP4 quantizers).
CUDA_EXPORTS = ("mxfp8", "nvfp4")
# How often the live view updates while tasks are out, and how often the head and the queued
# tasks' feasibility are checked, in seconds; after HEAD_MISSES checks without an answer from the
# head the run stops (Ray would end the driver itself after about a minute, without a word).
TICK_S = 0.5
CHECK_EVERY_S = 5.0
HEAD_MISSES = 3


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


class ClusterRun:
    def __init__(
        self,
        ctx: RunContext,
        cluster: Cluster,
        engines: list[EngineRef],
        toolchain: str | None,
        until: str,
        gpu_types: tuple[str, ...] = (),
        verbose: bool = False,
    ):
        self.ctx = ctx
        self.cluster = cluster
        self.engines = engines
        self.toolchain = toolchain
        self.until = until
        self.verbose = verbose
        self.reporter = ctx.reporter
        self.blobs = DriverBlobs(ctx.workspace.root)
        self.runtime = None
        if toolchain is not None:
            from pipeline.runtimes import get_runtime

            self.runtime = get_runtime(ctx, toolchain)
        self.targets = self._targets(gpu_types)
        self.exports: dict[EngineRef, Job] = {}
        self.chains: list[Chain] = []
        self.dispatched = 0
        self.bytes_back = 0
        self.bytes_fetched = 0
        self.started = time.monotonic()
        self.head_misses = 0  # checks in a row the head did not answer

    # --- planning ------------------------------------------------------------------------------

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

    def request(self, job: Job):
        from pipeline.cluster.worker import StageRequest
        from pipeline.manifest import read_manifest

        workspace = self.ctx.workspace
        files, manifests = {}, {}

        def send_manifest(path, keep: tuple[str, ...]):
            if not path.is_file():
                return None
            # The stage being run and those after it are left out: the node runs it afresh.
            manifest = read_manifest(path)
            manifest = manifest.model_copy(update={name: None for name in ("build", "profile") if name not in keep})
            manifests[workspace.relative(path)] = manifest.model_dump_json(indent=2)
            return manifest

        if job.stage != "export":
            export = send_manifest(workspace.export_manifest_path(job.engine), keep=("export",))
            keep = ("export",) if job.stage == "build" else ("export", "build")
            # The manifest holding the engine's build: its own, or a static engine's of its point.
            built_at = job.shape if self.ctx.catalog.model(job.engine.model).static else None
            own = send_manifest(workspace.manifest_path(job.toolchain, job.engine, job.gpu_type, built_at), keep=keep)
            records = [export.export if export else None] + ([own.build] if own is not None and job.stage == "profile" else [])
            for record in records:
                for artifact in record.outputs if record is not None else []:
                    if workspace.is_intact(artifact):
                        files[artifact.sha256 + artifact.path] = self.blobs.file(artifact.path, artifact.sha256, artifact.size_bytes)
        return StageRequest(
            stage=job.stage,
            engine=job.engine,
            toolchain=job.toolchain,
            gpu_type=job.gpu_type,
            shape=job.shape,
            placed_by=job.placed_by,
            catalog=self.ctx.catalog,
            files=list(files.values()),
            manifests=manifests,
            known=frozenset(self.known),
            force=self.ctx.force,
            verbose=self.verbose,
        )

    @functools.cached_property
    def known(self) -> dict[str, Path]:
        """Contents the driver already holds, by sha256 (the hash cache makes this cheap on a re-run);
        a task sends back only what is not here."""
        known: dict[str, Path] = {}
        for folder in (self.ctx.workspace.models_dir, self.ctx.workspace.engines_dir):
            for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
                if path.is_file() and not path.name.startswith("."):
                    known.setdefault(self.ctx.workspace.hashes.sha256(path), path)
        return known

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

    # --- running -------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        import ray

        from pipeline.cluster.worker import run_stage

        options, job.placed_by = self.placement(job)
        # A task on a GPU ends its worker process with it: an idle worker keeping its CUDA context
        # (and memory) would sit beside the next measurement on that GPU (seen on an H100).
        max_calls = 1 if options.get("num_gpus") else 0
        remote = ray.remote(num_returns="streaming", max_retries=0, max_calls=max_calls)(run_stage)
        job.handle = remote.options(**options).remote(self.request(job))
        job.attempts += 1
        job.state = "queued"
        self.dispatched += 1

    def advance(self) -> None:
        """Start whatever can start: exports first, then each chain's next stage."""
        for engine, job in self.exports.items():
            if job.state != "waiting":
                continue
            if self.toolchain is not None and not self.export_needed(engine):
                job.state, job.note = "skipped", "not needed"
            elif self.up_to_date(job):
                job.state = "unchanged"
                self.reporter.unchanged("export", engine.name)
            else:
                self._try_submit(job)
        for chain in self.chains:
            if not chain.export.finished:
                continue
            for position, job in enumerate(chain.stages):
                if job.finished:
                    continue
                if job.state != "waiting":
                    break
                before = chain.export if position == 0 else chain.stages[position - 1]
                if not before.usable and not (before is chain.export and before.note == "not needed"):
                    job.state = "cancelled"
                    job.note = f"{before.stage} {before.state}"
                    continue
                if self.up_to_date(job):
                    job.state = "unchanged"
                    self.reporter.unchanged(job.stage, f"{job.engine.name} {job.target}")
                    continue
                self._try_submit(job)
                break

    def _try_submit(self, job: Job) -> None:
        try:
            self.submit(job)
        except PipelineError as exc:
            self._fail(job, exc)

    def _fail(self, job: Job, exc: PipelineError) -> None:
        job.state, job.error, job.handle = "failed", exc, None
        self.reporter.console.print(f"[red]{'failed':<9}[/] {job.stage:<8} {job.engine.name} {job.target}: {exc.message}")

    def running(self) -> list[Job]:
        return [job for job in self.jobs() if job.handle is not None]

    def run(self) -> RunSummary:
        import contextlib

        self.plan()
        self.reporter.info(
            f"cluster  {self.cluster.address}: {len(self.cluster.nodes)} node(s) — " + "; ".join(n.label() for n in self.cluster.nodes)
        )
        console = self.reporter.console
        # In a terminal, one line under the log keeps the counts and the elapsed time current.
        live = console.status(self._status_text()) if console.is_terminal else contextlib.nullcontext()
        try:
            with live as status:
                self._loop(status)
        except KeyboardInterrupt:
            self.cancel()
            raise
        return self.summary()

    def _loop(self, status) -> None:
        import ray

        self.advance()
        last_check = time.monotonic()
        while self.running():
            handles = {job.handle: job for job in self.running()}
            ready, _ = ray.wait(list(handles), num_returns=1, timeout=TICK_S)
            for handle in ready:
                self._receive(handles[handle])
            if time.monotonic() - last_check > CHECK_EVERY_S:
                self._check_head()
                self._check_stuck()
                last_check = time.monotonic()
            self.advance()
            if status is not None:
                status.update(self._status_text())

    def _status_text(self) -> str:
        counts: dict[str, int] = {}
        for job in self.jobs():
            counts[job.state] = counts.get(job.state, 0) + 1
        finished = sum(counts.get(state, 0) for state in ("done", "unchanged", "skipped"))
        return (
            f"{counts.get('running', 0)} running · {counts.get('queued', 0)} queued · {counts.get('waiting', 0)} waiting · "
            f"{finished} finished · {counts.get('failed', 0)} failed · {_clock(time.monotonic() - self.started)}"
        )

    def _check_head(self) -> None:
        """Ray ends a driver whose head stays unreachable for a minute, with no word about why; a
        lost head is noticed here first and said plainly. Finished results are already written."""
        if self.cluster.address == "local":
            return
        from pipeline.cluster.connection import head_reachable

        if head_reachable(self.cluster.address):
            self.head_misses = 0
            return
        self.head_misses += 1
        if self.head_misses >= HEAD_MISSES:
            finished = sum(1 for job in self.jobs() if job.state in ("done", "unchanged", "skipped"))
            raise EnvironmentMissing(
                f"lost the Ray cluster's head at {self.cluster.address}: it has not answered for {HEAD_MISSES * CHECK_EVERY_S:.0f}s. "
                f"{finished} of {len(self.jobs())} stages had finished; their results are in the workspace.",
                hint="restart the head (`ray start --head …`) and its workers, then run the same command: finished stages are not run again",
            )

    def _receive(self, job: Job) -> None:
        import ray

        try:
            ref = next(job.handle)
            kind, payload = ray.get(ref)
        except StopIteration:
            return
        except Exception as exc:  # the node or worker died, or the task raised: Ray's own errors
            self._lost(job, exc)
            return
        if kind == "started":
            job.state = "running"
            job.node = self.cluster.node(payload) or Node(payload, "?", {})
            self.reporter.console.print(f"[cyan]running[/]   {job.stage:<8} {job.engine.name} {job.target} on {job.node.label()}")
            return
        self._finish(job, payload)

    def _lost(self, job: Job, exc: Exception) -> None:
        from ray import exceptions

        if isinstance(exc, exceptions.TaskCancelledError):
            job.state, job.handle = "cancelled", None
            return
        if isinstance(exc, exceptions.RayTaskError):
            # A bug inside the task: report it as such (with Ray's traceback under -v), never retried.
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            self._fail(
                job,
                PipelineError(
                    f"internal error on node {job.node.label() if job.node else '?'}: {first}",
                    hint="this is a bug in the pipeline; -v shows the traceback",
                ),
            )
            if self.verbose:
                self.reporter.info(str(exc))
            return
        where = job.node.label() if job.node else "its node"
        self.cluster.refresh()
        reason = f"{type(exc).__name__} on {where}"
        if job.attempts >= MAX_ATTEMPTS:
            self._fail(
                job,
                PipelineError(
                    f"lost {job.attempts} times ({reason}); giving up.",
                    hint="`ray status` on the head shows the nodes; the other engines' results are kept",
                ),
            )
            return
        if not self.feasible(job):
            self._fail(
                job,
                EnvironmentMissing(
                    f"its node was lost ({reason}) and no other node has {job.placed_by}.",
                    hint="start another node of that type and run again: finished results are kept",
                ),
            )
            return
        self.reporter.warn(
            f"{job.stage} {job.engine.name} {job.target}: {reason}; retrying on another node (attempt {job.attempts + 1} of {MAX_ATTEMPTS})"
        )
        job.handle, job.node = None, None
        self._try_submit(job)

    def _check_stuck(self) -> None:
        """A queued task no alive node can take (its GPU type's last node is gone) would wait forever."""
        import ray

        queued = [job for job in self.running() if job.state == "queued"]
        if not queued:
            return
        self.cluster.refresh()
        for job in queued:
            if not self.feasible(job):
                ray.cancel(job.handle, force=True)
                self._fail(
                    job,
                    EnvironmentMissing(
                        f"no node of the cluster has {job.placed_by} any more.", hint="start a node of that type and run again"
                    ),
                )

    def _finish(self, job: Job, result) -> None:
        from pipeline.manifest import read_manifest

        job.handle = None
        job.seconds = result.seconds
        self.bytes_fetched += result.bytes_fetched
        if result.messages.strip():
            for line in result.messages.rstrip().splitlines():
                self.reporter.console.print(
                    f"          [dim]{job.node.label() if job.node else ''} │[/] {line}", markup=True, highlight=False
                )
        if result.manifest_text is not None:
            try:
                self._write(result)
                read_manifest(self.ctx.workspace.root / result.manifest_path)  # what was written is valid
            except PipelineError as exc:
                self._fail(job, exc)
                return
        if result.status == "error" or result.status == "failed":
            message, hint, code = result.error
            error = (
                EnvironmentMissing
                if code == EnvironmentMissing.exit_code
                else UsageError
                if code == UsageError.exit_code
                else PipelineError
            )(message, hint)
            self._fail(job, error)
            return
        job.state = result.status
        where = job.node.label() if job.node else result.node_id[:8]
        self.reporter.console.print(
            f"[green]{job.state:<9}[/] {job.stage:<8} {job.engine.name} {job.target} in {result.seconds:.1f}s on {where}"
        )

    def _write(self, result) -> None:
        """The task's files, then its manifest, each atomically: a crash between leaves files a
        re-run finds unrecorded (and replaces), never a manifest naming files that are not there."""
        from pipeline.artifacts import atomic_output, atomic_write_text, write_failed

        root = self.ctx.workspace.root
        for output in result.outputs:
            target = root / output.path
            if output.chunks is None:
                if target.is_file() and self.ctx.workspace.hashes.sha256(target) == output.sha256:
                    continue
                source = self.known.get(output.sha256)
                if source is None or not source.is_file():
                    raise PipelineError(f"the node kept {output.path} back as known here, and no file here has its content.")
                chunks = [source.read_bytes()]
            else:
                chunks = output.chunks
            with atomic_output(target) as tmp:
                try:
                    with open(tmp, "wb") as handle:
                        for chunk in chunks:
                            handle.write(chunk)
                except OSError as exc:
                    raise write_failed(target, exc) from exc
            self.bytes_back += output.size_bytes if output.chunks is not None else 0
            self.known[output.sha256] = target
        atomic_write_text(root / result.manifest_path, result.manifest_text)
        self.ctx.workspace.hashes.save()

    def cancel(self) -> None:
        import ray

        for job in self.running():
            try:
                ray.cancel(job.handle, force=True)
            except Exception:  # already finished or its node is gone: nothing left to stop
                pass
            job.state, job.handle = "cancelled", None

    def _print_table(self) -> None:
        from rich.table import Table

        ran = [job for job in self.jobs() if job.state not in ("unchanged",) or self.verbose]
        if not ran:
            return
        table = Table(title="cluster run", title_justify="left", box=None, pad_edge=False)
        for column in ("engine", "stage", "toolchain", "node", "result", "seconds", "tries"):
            # Names are never cut short: a narrow terminal wraps them instead.
            table.add_column(column, justify="right" if column in ("seconds", "tries") else "left", overflow="fold")
        for job in ran:
            result = job.state + (f" ({job.note})" if job.note else "")
            table.add_row(
                job.engine.name,
                job.stage,
                job.target,
                job.node.label() if job.node else "–",
                result,
                f"{job.seconds:.1f}" if job.seconds else "–",
                str(job.attempts or "–"),
            )
        self.reporter.console.print(table)

    def summary(self) -> RunSummary:
        summary = RunSummary()
        failures: dict[str, PipelineError] = {}
        for job in self.jobs():
            if job.state == "failed":
                failures.setdefault(f"{job.engine.name} ({job.stage} {job.target})", job.error)
        for engine in self.engines:
            if not any(name.startswith(engine.name + " ") for name in failures):
                summary.succeeded.append(engine.name)
        summary.failed = [(name, self.toolchain, error) for name, error in failures.items()]
        counts: dict[str, int] = {}
        for job in self.jobs():
            counts[job.state] = counts.get(job.state, 0) + 1
        elapsed = time.monotonic() - self.started
        self._print_table()
        self.reporter.info(
            f"summary  {self.dispatched} task(s) dispatched in {elapsed:.1f}s — "
            + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            + f"; over the network: nodes fetched {_size(self.bytes_fetched)} of the {_size(self.blobs.bytes_put)} offered, "
            f"and sent back {_size(self.bytes_back)}"
        )
        return summary


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _normalised(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def drive(
    ctx: RunContext,
    address: str,
    engines: list[EngineRef],
    toolchain: str | None,
    until: str,
    gpu_types: tuple[str, ...] = (),
    verbose: bool = False,
) -> RunSummary:
    """Join the cluster, check its nodes, run the matrix (in the Ray driver process)."""
    from pipeline.cluster.connection import connect, disconnect, probe

    cluster = connect(address, verbose)
    try:
        probe(cluster)
        return ClusterRun(ctx, cluster, engines, toolchain, until, gpu_types, verbose).run()
    finally:
        disconnect()

"""One stage of one engine, run on a Ray node in a scratch workspace of its own.

The driver sends the stage's inputs (files by content, manifests as text); the node rebuilds the
slice of the workspace the stage reads, runs the very same Stage class a local run uses, and hands
back the manifest it wrote and the files it made. Nothing on the node outlives the task but its
content-addressed cache (pipeline/cluster/transfer.py), so two drivers sharing a cluster never see
each other's workspaces.

The task is a Ray streaming generator: its first item says which node it started on (the driver's
live view), then each time it starts measuring (a point's rounds), its last is the :class:`StageResult`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import queue
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.catalog import Catalog
from pipeline.cluster.plan import Member
from pipeline.cluster.transfer import FileRef, NodeBlobs, OutputFile, node_cache_dir, read_chunks
from pipeline.models import finished_writing


@dataclass
class StageRequest:
    stage: str  # "export" | "build" | "profile"
    # The engines the task runs the stage for: one, or a shape point's every engine (a profile).
    members: list[Member]
    placed_by: str | None  # the GPU type the task was placed by, recorded with the node
    catalog: Catalog
    files: list[FileRef]
    manifests: dict[str, str]  # workspace-relative path → JSON text
    known: frozenset[str]  # sha256 of contents the driver already holds
    force: bool = False
    verbose: bool = False
    exports_write_onnx: bool = True  # RunContext's: whether the run's exports write the ONNX


@dataclass
class MemberResult:
    """What one engine's stage recorded on the node, or the error that stopped it."""

    # "done" | "skipped" | "out_of_memory" | "failed" (recorded refusal) | "faulted" (a recorded
    # fault) | "error" (nothing recorded)
    status: str
    manifest_path: str | None = None
    manifest_text: str | None = None
    error: tuple[str, str | None, int] | None = None  # message, hint, exit code


@dataclass
class StageResult:
    node_id: str
    status: str  # "done" when the task ran its members (each says how it went); "error": it could not
    members: list[MemberResult] = field(default_factory=list)
    outputs: list[OutputFile] = field(default_factory=list)
    error: tuple[str, str | None, int] | None = None  # the task's own error (message, hint, exit code)
    messages: str = ""
    seconds: float = 0.0
    bytes_fetched: int = 0
    # A kernel faulted on the GPU in the process that ran the task: its CUDA context is unusable, so
    # the driver ends that process (a GPU worker) and hands what it did not finish to a fresh one.
    poisoned: bool = False


def run_stage(request: StageRequest, session: WorkerSession | None = None):
    """The Ray task (a streaming generator): where it started, when it starts measuring, then
    what it did. The stage runs in a thread of its own so that the task can say when its rounds
    begin while they run; a cancelled task's worker is killed (the driver cancels with force, or
    kills the GPU's worker), so nothing of it runs on."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    yield ("started", node_id)
    said: queue.Queue = queue.Queue()
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["result"] = execute(request, node_id, on_measuring=said.put, session=session)
        except BaseException as exc:  # a bug: raised again below, for Ray to report as the task's error
            outcome["error"] = exc
        finally:
            said.put(None)

    # A GPU worker runs every job in its one thread (WorkerSession.thread); a task, in one of its own.
    thread = session.thread if session is not None else concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pipeline-stage")
    running = thread.submit(work)
    while (text := said.get()) is not None:
        yield ("measuring", text)
    running.result()
    if session is None:
        thread.shutdown()
    if "error" in outcome:
        raise outcome["error"]
    yield ("result", outcome["result"])


class WorkerSession:
    """What a GPU's worker keeps from one job to the next (an export, a build, a shape point):
    its workspace (the engine files stay where the runtimes loaded them from), the runtimes with
    the engines they prepared (a model loaded once, a compiled engine traced once and specialised
    again at each point from Inductor's cache, as in the one process of a local run), and its
    share of the node's CPUs, claimed once and held until the worker ends."""

    def __init__(self):
        # One thread for all the worker's jobs: torch.compile's CUDA graph trees
        # (mode="reduce-overhead") are kept per thread (torch/_inductor/cudagraph_trees.py), and a
        # point prepared in a thread of its own failed with an AssertionError at every point after
        # a worker's first (two H200s).
        self.thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline-points")
        self._scratch: Path | None = None
        self.runtimes: dict = {}
        self.blobs = NodeBlobs()
        self.cpus: tuple[int, ...] | None = None
        self._held = contextlib.ExitStack()
        self._claimed = False

    def scratch(self) -> Path:
        """The worker's workspace, made for its first point and kept for the others."""
        if self._scratch is None:
            self._scratch = _scratch_dir()
        return self._scratch

    def claim_share(self, gpus: int) -> tuple[int, ...] | None:
        from pipeline.cluster.cpu_share import claimed_share

        if not self._claimed:
            self.cpus = self._held.enter_context(claimed_share(gpus, node_cache_dir() / "cpu-shares"))
            self._claimed = True
        return self.cpus


class GpuWorker:
    """A Ray actor that holds one GPU for a run and does the jobs the driver hands it, one after
    another, in one process (pipeline/cluster/gpu_workers.py): the GPU's shape points, and the
    builds and exports made where they are timed: a task per job would pay for a fresh process each
    time — importing PyTorch, loading the model, tracing every compiled engine (measured:
    docs/results/cluster.md, 'Why a worker per GPU and a CPU share per point')."""

    def __init__(self):
        self.session = WorkerSession()

    def run(self, request: StageRequest):
        yield from run_stage(request, self.session)


def execute(request: StageRequest, node_id: str, on_measuring=None, session: WorkerSession | None = None) -> StageResult:
    from rich.console import Console

    from pipeline.running.errors import DeviceFault, PipelineError
    from pipeline.running.reporting import Reporter

    class TaskReporter(Reporter):
        def measuring(self, text: str) -> None:
            super().measuring(text)
            if on_measuring is not None:
                on_measuring(text)

    started = time.perf_counter()
    buffer = io.StringIO()
    reporter = TaskReporter(request.verbose, console=Console(file=buffer, width=200, no_color=True, highlight=False, soft_wrap=True))
    blobs = session.blobs if session is not None else NodeBlobs()
    fetched_before = blobs.bytes_fetched
    result = StageResult(node_id=node_id, status="error")
    try:
        scratch = session.scratch() if session is not None else _scratch_dir()
    except OSError as exc:
        result.error = (
            f"node {node_id[:8]} could not create a scratch workspace in {node_cache_dir()}: {exc.strerror or exc}.",
            "free space on that node, or set PIPELINE_CACHE_DIR there",
            1,
        )
        return result
    try:
        for ref in request.files:
            blobs.materialize(ref, scratch / ref.path)
        for path, text in request.manifests.items():
            (scratch / path).parent.mkdir(parents=True, exist_ok=True)
            (scratch / path).write_text(text)
        node = _cluster_node(node_id, request.placed_by)
        with _measuring_share(request, node, session) as cpus:
            node = node.model_copy(update={"cpus": cpus, "worker_pid": os.getpid()})
            stages = [_stage(request, member, scratch, reporter, node, session) for member in request.members]
            for toolchain in dict.fromkeys(member.toolchain for member in request.members if member.toolchain is not None):
                from pipeline.runtimes import get_runtime

                get_runtime(stages[0].ctx, toolchain).check_usable()
            outcomes = _run(request.stage, stages)
        for stage, outcome in zip(stages, outcomes):
            result.members.append(_member_result(stage, request.stage, outcome, scratch, blobs, request.known, result.outputs))
        result.status = "done"
        result.poisoned = any(isinstance(outcome, DeviceFault) or outcome is NOT_MEASURED for outcome in outcomes)
    except PipelineError as exc:
        result.status, result.error = "error", (exc.message, exc.hint, exc.exit_code)
    except OSError as exc:  # the node's disk filled up, a permission: the node's problem, said so
        result.status = "error"
        result.error = (
            f"node {node_id[:8]}: {exc.strerror or exc} ({getattr(exc, 'filename', '') or ''}).",
            "free space on that node (its cache: PIPELINE_CACHE_DIR)",
            1,
        )
    finally:
        if session is None:  # a GPU worker's stays, for its next job
            finished_writing()  # a model's weights still being cached there would make it again
            shutil.rmtree(scratch, ignore_errors=True)
    result.messages = buffer.getvalue()
    result.seconds = time.perf_counter() - started
    result.bytes_fetched = blobs.bytes_fetched - fetched_before
    return result


def _run(name: str, stages: list) -> list:
    """Each stage's record, or the error that stopped it: a shape point's profiles measured
    together, as a local run measures them (pipeline/stages/point.py); an export or a build alone."""
    from pipeline.running.errors import DeviceFault, PipelineError

    if name == "profile":
        from pipeline.stages.point import profile_point

        try:
            recorded = profile_point(stages)
        except DeviceFault as fault:  # recorded for its engine; the others are measured in a fresh process
            return [fault if _faulted_here(stage) else NOT_MEASURED for stage in stages]
        return [recorded[stage] for stage in stages]
    try:
        return [stages[0].run()]
    except PipelineError as exc:
        return [exc]


# What a point's engine comes to when another engine of the point faulted first: nothing recorded,
# measured again in a fresh process.
NOT_MEASURED = object()


def _faulted_here(stage) -> bool:
    """Whether ``stage`` recorded the fault that ended its point's measurement in this process."""
    record = stage.load_manifest().stage(stage.name) if stage.manifest_path().is_file() else None
    return record is not None and record.status == "faulted" and (str(stage.manifest_path()), stage.name) in stage.ctx.done


@contextlib.contextmanager
def _measuring_share(request: StageRequest, node, session: WorkerSession | None = None):
    """A shape point's task on a GPU runs on its GPU's share of the node's cores, so that points
    measured at once on one host's GPUs do not meet on a CPU (pipeline/cluster/cpu_share.py); the
    CPUs it ran on, or None where it ran wherever the OS put it. A GPU worker claims its share at
    its first job, whatever it is, and keeps it; each job's thread runs there (and the processes
    it starts: a build's compiler's)."""
    from pipeline.cluster.connection import gpus_of
    from pipeline.cluster.cpu_share import claimed_share
    from pipeline.machine.environment import running_on

    on_a_gpu = request.placed_by and (request.stage == "profile" or session is not None)
    gpus = int(gpus_of(node.resources, request.placed_by)) if on_a_gpu else 0
    if session is not None:
        cpus = session.claim_share(gpus)
        with running_on(cpus):
            yield cpus
        return
    with claimed_share(gpus, node_cache_dir() / "cpu-shares") as cpus, running_on(cpus):
        yield cpus


def _member_result(stage, name: str, outcome, scratch: Path, blobs: NodeBlobs, known: frozenset[str], outputs: list) -> MemberResult:
    """What the driver is sent of one engine's stage: its manifest and the files it made (those the
    driver does not hold already, in chunks), or its error."""
    from pipeline.manifest import read_manifest
    from pipeline.running.errors import DeviceFault, PipelineError, RefusedByTool

    if outcome is NOT_MEASURED:
        member = MemberResult(status="not_measured")
    elif isinstance(outcome, DeviceFault):  # recorded in its manifest, which goes back with the error
        member = MemberResult(status="faulted", error=(outcome.message, outcome.hint, outcome.exit_code))
    elif isinstance(outcome, PipelineError):
        recorded = isinstance(outcome, RefusedByTool) and outcome.outcome is not None
        member = MemberResult(status="failed" if recorded else "error", error=(outcome.message, outcome.hint, outcome.exit_code))
    else:
        member = MemberResult(status=outcome.status)
    path = stage.manifest_path()
    if member.status not in ("error", "not_measured") and path.is_file():
        member.manifest_path = stage.ctx.workspace.relative(path)
        member.manifest_text = path.read_text()
        record = read_manifest(path).stage(name)
        for artifact in record.outputs if record else []:
            file = scratch / artifact.path
            blobs.keep(file, artifact.sha256)
            chunks = None if artifact.sha256 in known else read_chunks(file)
            outputs.append(OutputFile(artifact.path, artifact.sha256, artifact.size_bytes, chunks))
    return member


def _stage(request: StageRequest, member: Member, scratch: Path, reporter, node, session: WorkerSession | None = None):
    from pipeline.stages.base import RunContext
    from pipeline.stages.runner import stage_for
    from pipeline.workspace import Workspace

    catalog = request.catalog.model_copy(update={"root": scratch})
    ctx = RunContext(
        catalog=catalog,
        workspace=Workspace(scratch),
        reporter=reporter,
        force=request.force,
        gpu_type=member.gpu_type,
        cluster_node=node,
        exports_write_onnx=request.exports_write_onnx,
    )
    if session is not None:  # the runtimes, and the engines they prepared, of the worker's earlier points
        for runtime in session.runtimes.values():
            runtime.reporter = reporter
        ctx.runtimes = session.runtimes
    return stage_for(ctx, request.stage, member.engine, member.toolchain, member.shape)


def _cluster_node(node_id: str, placed_by: str | None):
    import ray

    from pipeline.cluster.connection import compute_resources
    from pipeline.manifest import ClusterNode

    info = next((n for n in ray.nodes() if n["NodeID"] == node_id), {})
    resources = compute_resources(info.get("Resources") or {})
    return ClusterNode(ray_node_id=node_id, address=info.get("NodeManagerAddress", "?"), gpu_type=placed_by, resources=resources)


def _scratch_dir() -> Path:
    """A fresh workspace for one task; those of tasks whose process is gone (a cancelled or killed
    task) are removed first."""
    work = node_cache_dir() / "work"
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("task-*"):
        with contextlib.suppress(ValueError, IndexError):
            pid = int(old.name.split("-")[1])
            if not _alive(pid):
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"task-{os.getpid()}-", dir=work))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

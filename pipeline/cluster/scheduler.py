"""The driver of a cluster run: the engine matrix as Ray tasks, each on a node that can run it.

For each engine the export runs once, on any node (a node with a CUDA GPU for MXFP8/NVFP4); then,
per toolchain and target, the build; then, per model, shape point and GPU type, one job that
measures every engine of the point together in rounds, as a local run does, on its GPU's worker
(pipeline/cluster/gpu_workers.py), which also builds and exports what is built where it is timed
(pipeline/cluster/plan.py says which jobs there are and where). Where a toolchain's engines belong
to a GPU (trtexec, PyTorch), the target is a GPU type and the outputs go to engines/<toolchain>@<gpu>/.
Ahead-of-time builds (TensorRT-RTX) and CPU runtimes (ONNX Runtime) build anywhere; the first are
timed on a GPU they target, the second with their point's engines.

Before a task is dispatched the driver checks its own workspace, the way a local run does: a
record with the same parameters whose inputs and outputs are intact is up to date and nothing is
sent (the tools' versions on the node are recorded, not re-checked: `--force` re-runs). Results
are written into the workspace as each task finishes (files, then the manifests, each atomically),
so an interrupted run keeps everything finished and nothing half-written looks valid.

Faults: a task whose node or worker dies is retried whole on another node that can run it, at most
MAX_ATTEMPTS times; a compiler's refusal or a user error is recorded or reported, never retried. A
kernel that faults on the GPU is recorded for its point on the node, and what its process did not
finish goes to a fresh one (pipeline/running/faults.py): the process itself can run nothing more.
"""

from __future__ import annotations

import contextlib
import time

from rich.markup import escape

from pipeline.cluster.connection import Cluster, Node
from pipeline.cluster.gpu_workers import GpuWorkers
from pipeline.cluster.host_holds import HostHolds
from pipeline.cluster.plan import ClusterPlan, Job
from pipeline.cluster.requests import JobRequests
from pipeline.cluster.run_report import member_target, run_summary
from pipeline.cluster.transfer import DriverBlobs, write_result
from pipeline.cluster.worker import run_stage
from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError
from pipeline.stages.base import RunContext, RunRequest
from pipeline.stages.runner import RunSummary

# Attempts per task when its node or worker is lost (the first run included).
MAX_ATTEMPTS = 3
# How often the live view updates while tasks are out, and how often the head and the queued
# tasks' feasibility are checked, in seconds; after HEAD_MISSES checks without an answer from the
# head the run stops (Ray would end the driver itself after about a minute, without a word).
TICK_S = 0.5
CHECK_EVERY_S = 5.0
HEAD_MISSES = 3


class DriverDisconnected(Exception):
    """The driver's connection to Ray broke mid-run: where Ray does not end a driver whose node (the
    head, usually) went away, its next call raises OSError on the dead socket ("Broken pipe").
    Said as a driver Ray ended is said (cluster/supervisor.py), not as a bug."""


@contextlib.contextmanager
def _ray_connection():
    """Around a call into Ray's core worker: an OSError there is the connection, not this code."""
    try:
        yield
    except OSError as exc:
        raise DriverDisconnected(f"its connection to Ray broke: {type(exc).__name__}: {exc}") from exc


class ClusterRun:
    def __init__(self, ctx: RunContext, cluster: Cluster, request: RunRequest, verbose: bool = False):
        self.ctx = ctx
        self.cluster = cluster
        self.engines = request.engines
        self.toolchains = list(request.toolchains or [])
        self.until = request.until
        self.verbose = verbose
        self.reporter = ctx.reporter
        self.blobs = DriverBlobs(ctx.workspace.root)
        # What runs where: the jobs, their targets and placement, whether each is current.
        self.matrix = ClusterPlan(ctx, cluster, request)
        self.dispatched = 0
        self.bytes_back = 0
        self.bytes_fetched = 0
        self.started = time.monotonic()
        self.head_misses = 0  # checks in a row the head did not answer
        self.workers = GpuWorkers(cluster)  # each GPU's worker, while work of its type is to come
        self.requests = JobRequests(ctx, self.blobs, verbose)  # what a node is sent for a job
        self.holds = HostHolds()  # how the points held their hosts, said at the end

    # --- running -------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        import ray

        on = self.matrix.worker_for(job)
        if on is not None:  # a GPU's work one job after another, in its worker's one process
            job.placed_by = on
            worker = self.workers.take(job, on, self.matrix.worker_options(on))
            if worker is None:
                job.state = "waiting"  # every GPU of its type is busy: the next free one takes it
                return
            request = self.requests.request(job)
            with _ray_connection():
                job.handle = worker.run.options(num_returns="streaming").remote(request)
        else:
            options, job.placed_by = self.matrix.placement(job)
            # A task on a GPU ends its process with it: an idle one keeping its CUDA context (and
            # memory) would sit beside the next measurement on that GPU (seen on an H100). So does
            # an export wherever it runs: it runs the user's model, and a process whose kernel
            # faulted (or whose module broke its own state) must not take the export's rest.
            max_calls = 1 if options.get("num_gpus") or job.stage == "export" else 0
            remote = ray.remote(num_returns="streaming", max_retries=0, max_calls=max_calls)(run_stage)
            request = self.requests.request(job)
            with _ray_connection():
                job.handle = remote.options(**options).remote(request)
        job.attempts += 1
        job.state, job.submitted_at = "queued", time.monotonic()
        self.dispatched += 1

    def advance(self) -> None:
        """Start whatever can start: exports first, then each job whose jobs before it finished."""
        for engine, job in self.matrix.exports.items():
            if job.state != "waiting":
                continue
            if self.toolchains and not self.matrix.export_needed(engine):
                job.state, job.note = "skipped", "not needed"
            elif self.matrix.up_to_date(job):
                job.state = "unchanged"
                self.reporter.unchanged("export", engine.name)
            else:
                self._try_submit(job)
        for job in self.matrix.jobs():
            if job.stage == "export" or job.state != "waiting" or not all(before.finished for before in job.after):
                continue
            if job.stage == "profile":
                self._drop_unbuilt(job)
                if not job.members:
                    continue
            elif not any(before.usable or before.note == "not needed" for before in job.after):
                job.state, job.note = "cancelled", f"{job.after[0].stage} {job.after[0].state}"
                continue
            if self.matrix.up_to_date(job):
                job.state = "unchanged"
                self.reporter.unchanged(job.stage, f"{job.name} {job.target}")
                job.faults = self.matrix.kept_faults(job)
                for member, error in job.faults:
                    self.reporter.console.print(
                        f"[red]{'faulted':<9}[/] {job.stage:<8} {member.engine.name} {member_target(member)}: {error.message}"
                    )
                continue
            self._try_submit(job)
        self.workers.release_idle(self.matrix.jobs(), self.matrix.worker_for)

    @staticmethod
    def _drop_unbuilt(job: Job) -> None:
        """A point's engines whose build did not finish usable are left out of its rounds (their
        build's failure is reported already); a point left with none is cancelled."""
        kept = [(member, build) for member, build in zip(job.members, job.after) if build.usable]
        if len(kept) < len(job.members):
            dropped = [build for build in job.after if not build.usable]
            job.note = f"{len(dropped)} engine(s) not built"
            job.members, job.after = [member for member, _ in kept], [build for _, build in kept]
        if not job.members:
            job.state = "cancelled"

    def _try_submit(self, job: Job) -> None:
        try:
            self.submit(job)
        except PipelineError as exc:
            self._fail(job, exc)

    def _fail(self, job: Job, exc: PipelineError) -> None:
        job.state, job.error, job.handle = "failed", exc, None
        self.reporter.console.print(f"[red]{'failed':<9}[/] {job.stage:<8} {job.name} {job.target}: {exc.message}")

    def running(self) -> list[Job]:
        return [job for job in self.matrix.jobs() if job.handle is not None]

    def run(self) -> RunSummary:
        self.matrix.plan()
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
        finally:
            self.workers.close()
        return self.summary()

    def _loop(self, status) -> None:
        import ray

        self.advance()
        last_check = time.monotonic()
        while self.running():
            handles = {job.handle: job for job in self.running()}
            with _ray_connection():
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
        for job in self.matrix.jobs():
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
            finished = sum(1 for job in self.matrix.jobs() if job.state in ("done", "unchanged", "skipped"))
            raise EnvironmentMissing(
                f"lost the Ray cluster's head at {self.cluster.address}: it has not answered for {HEAD_MISSES * CHECK_EVERY_S:.0f}s. "
                f"{finished} of {len(self.matrix.jobs())} stages had finished; their results are in the workspace.",
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
            self.reporter.console.print(f"[cyan]running[/]   {job.stage:<8} {job.name} {job.target} on {job.node.label()}")
            return
        if kind == "measuring":  # a point's rounds began (or a repeat of them): said, so a user knows the GPU is in use
            where = job.node.label() if job.node else "?"
            self.reporter.console.print(f"[cyan]measuring[/] {job.stage:<8} {job.name} {job.target} on {where}: {escape(payload)}")
            return
        self._finish(job, payload)

    def _lost(self, job: Job, exc: Exception) -> None:
        from ray import exceptions

        self.workers.lose(job)  # a GPU worker that failed a job is never handed another
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
        if not self.matrix.feasible(job):
            self._fail(
                job,
                EnvironmentMissing(
                    f"its node was lost ({reason}) and no other node has {job.placed_by}.",
                    hint="start another node of that type and run again: finished results are kept",
                ),
            )
            return
        self.reporter.warn(
            f"{job.stage} {job.name} {job.target}: {reason}; retrying on another node (attempt {job.attempts + 1} of {MAX_ATTEMPTS})"
        )
        job.handle, job.node = None, None
        self._try_submit(job)

    def _check_stuck(self) -> None:
        """A queued task no alive node can take (its GPU type's last node is gone) would wait forever."""
        queued = [job for job in self.running() if job.state == "queued"]
        if not queued:
            return
        self.cluster.refresh()
        for job in queued:
            if not self.matrix.feasible(job):
                self._stop(job)
                self._fail(
                    job,
                    EnvironmentMissing(
                        f"no node of the cluster has {job.placed_by} any more.", hint="start a node of that type and run again"
                    ),
                )

    def _finish(self, job: Job, result) -> None:
        from pipeline.manifest import read_manifest

        if getattr(result, "poisoned", False):
            self.workers.lose(job)  # a kernel faulted in its process: it can run nothing more
        else:
            self.workers.give_back(job)
        job.handle = None
        job.seconds = result.seconds
        self.bytes_fetched += result.bytes_fetched
        if result.messages.strip():
            for line in result.messages.rstrip().splitlines():
                self.reporter.console.print(
                    f"          [dim]{job.node.label() if job.node else ''} │[/] {line}", markup=True, highlight=False
                )
        if result.status == "error":
            self._fail(job, _error_of(result.error))
            return
        try:
            self.bytes_back += write_result(self.ctx.workspace, result, self.requests.known)
            # What was written is valid.
            written = [read_manifest(self.ctx.workspace.root / m.manifest_path) for m in result.members if m.manifest_path is not None]
        except PipelineError as exc:
            self._fail(job, exc)
            return
        if getattr(result, "poisoned", False) and self._go_on_after_fault(job, result):
            return
        job.failures = [(member, _error_of(outcome.error)) for member, outcome in zip(job.members, result.members) if outcome.error]
        job.failures += [
            (member, PipelineError("not measured: a kernel faulted in its process, too many times", hint="run the same command again"))
            for member, outcome in zip(job.members, result.members)
            if outcome.status == "not_measured"
        ]
        for member, error in job.failures:
            self.reporter.console.print(
                f"[red]{'failed':<9}[/] {job.stage:<8} {member.engine.name} {member_target(member)}: {error.message}"
            )
        statuses = [outcome.status for outcome in result.members]
        if len(job.failures) == len(job.members):
            job.state, job.error = "failed", job.failures[0][1]
            return
        job.state = "skipped" if all(status == "skipped" for status in statuses) else "done"
        if job.stage == "profile" and job.state == "done" and job.node is not None:
            self.holds.note(job.node, written)
        where = job.node.label() if job.node else result.node_id[:8]
        self.reporter.console.print(f"[green]{job.state:<9}[/] {job.stage:<8} {job.name} {job.target} in {result.seconds:.1f}s on {where}")

    def _go_on_after_fault(self, job: Job, result) -> bool:
        """A kernel faulted in the process that ran ``job`` (its faults are recorded and written
        above): what that process did not finish goes to a fresh one — a point's other engines, or
        the export without the point that faulted (pipeline/running/faults.py). Whether it went."""
        from pipeline.launchers.restart import MAX_REPLACEMENTS

        outcomes = list(zip(job.members, result.members))
        faulted = [(member, _error_of(outcome.error)) for member, outcome in outcomes if outcome.status == "faulted"]
        job.faults.extend(faulted)
        for member, error in faulted:
            self.reporter.console.print(
                f"[red]{'faulted':<9}[/] {job.stage:<8} {member.engine.name} {member_target(member)}: {error.message}"
            )
        rest = list(job.members) if job.stage == "export" and faulted else [m for m, o in outcomes if o.status == "not_measured"]
        if not rest or job.replaced >= MAX_REPLACEMENTS:
            return False
        job.replaced += 1
        job.members, job.handle, job.node, job.failures = rest, None, None, []
        self.reporter.warn(f"{job.stage} {job.name} {job.target}: going on in a fresh process (a kernel faulted in the last one)")
        self._try_submit(job)
        return True

    def cancel(self) -> None:
        for job in self.running():
            try:
                self._stop(job)
            except Exception:  # already finished or its node is gone: nothing left to stop
                pass
            job.state, job.handle = "cancelled", None

    def _stop(self, job: Job) -> None:
        """A running job's GPU worker is ended, and the job with it; a running task is cancelled."""
        import ray

        if not self.workers.lose(job):
            ray.cancel(job.handle, force=True)

    def summary(self) -> RunSummary:
        """What the run did, job by job and in all (pipeline/cluster/run_report.py)."""
        return run_summary(self)


def _error_of(error: tuple[str, str | None, int]) -> PipelineError:
    """A node's error (message, hint, exit code) as the error type its exit code stands for."""
    message, hint, code = error
    kind = EnvironmentMissing if code == EnvironmentMissing.exit_code else UsageError if code == UsageError.exit_code else PipelineError
    return kind(message, hint)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def drive(ctx: RunContext, address: str, request: RunRequest, verbose: bool = False) -> RunSummary:
    """Join the cluster, check its nodes, run the matrix (in the Ray driver process)."""
    from pipeline.cluster.connection import connect, disconnect, probe

    cluster = connect(address, verbose)
    try:
        probe(cluster)
        return ClusterRun(ctx, cluster, request, verbose).run()
    finally:
        disconnect()

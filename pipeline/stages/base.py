"""What every stage shares: fingerprints, skip-if-unchanged, timing and manifest writing.

A stage's fingerprint is a hash of its parameters, the content of its inputs and the identity of
the toolchain that runs it. When the manifest already holds a record with the same fingerprint and
its outputs are intact on disk, the stage does no work. When a stage does run, the records of the
stages after it are dropped, so a manifest never pairs a new engine with an old measurement.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from pipeline.catalog import Catalog, EngineRef
from pipeline.machine.environment import capture_environment
from pipeline.manifest import Artifact, EngineManifest, FaultFacts, OutOfMemoryFacts, StageRecord, read_manifest
from pipeline.models import ModelSource, model_source
from pipeline.running.errors import DeviceFault, OutOfMemory, PipelineError, RefusedByTool
from pipeline.running.reporting import Reporter
from pipeline.workspace import Workspace

STAGE_ORDER = ("export", "build", "profile")
# The statuses of work that ended without an engine or a number but is a result all the same, kept
# like a measurement until --force: it did not fit in memory, or a kernel faulted on the GPU.
KEPT_OUTCOMES = ("out_of_memory", "faulted")


@dataclass(frozen=True)
class RunRequest:
    """What a run is asked, wherever it runs (a launcher: this process, or a Ray cluster): every
    stage up to ``until`` of ``engines`` on ``toolchains`` (None: the export alone), timed on GPUs of
    ``gpu_types`` where a cluster has several (none: where each toolchain builds for)."""

    engines: list[EngineRef]
    toolchains: list[str] | None
    until: str
    gpu_types: tuple[str, ...] = ()


@dataclass
class RunContext:
    """Everything a stage needs besides its own configuration."""

    catalog: Catalog
    workspace: Workspace
    reporter: Reporter = field(default_factory=Reporter)
    force: bool = False
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    # Engine runtimes created during this run, by toolchain name (see pipeline.runtimes).
    runtimes: dict = field(default_factory=dict)
    # The GPU type a cluster run builds and times for (pipeline/cluster/); None on a local run.
    gpu_type: str | None = None
    # The Ray node running this stage, recorded in the manifest's environment (cluster runs).
    cluster_node: Any = None
    # While a run builds its engines: where each build hands over its work ahead of its profiles,
    # to be done in the background (work_ahead.WorkAhead). None: each build does its own, then and there.
    ahead: Any = None
    # Whether this run's exports write the ONNX: only a toolchain that compiles or runs the ONNX
    # reads it (EngineRuntime.reads_onnx); a run of PyTorch toolchains alone skips writing and
    # checking it (set where the run's toolchains are chosen: runner.onnx_read_by), and a later
    # run that reads it exports again.
    exports_write_onnx: bool = True
    # The stages this run has already done, by (manifest, stage): `--force` redoes each once, not
    # once per toolchain that needs it (an export is every toolchain's first stage).
    done: set = field(default_factory=set)
    # The stages this run has said were unchanged, likewise: said once, not once per toolchain.
    said_unchanged: set = field(default_factory=set)
    # What ran out of memory in this run, as (where, the error): results, said with a WARNING each
    # and summed up when the run ends (pipeline/stages/runner.py); the run still exits 0 for them.
    out_of_memory: list = field(default_factory=list)
    # The stages that ended with their result in this run (done now, or unchanged from before), by
    # name: a run whose every stage of its last kind ran out of memory produced nothing, and says so.
    produced: set = field(default_factory=set)


@dataclass
class StageOutcome:
    """What a stage's run_impl hands back to the base class to record."""

    outputs: list[Artifact]
    details: Any = None
    command: list[str] | None = None
    note: str = ""
    # The seconds the progress line reports when the work was done before the stage ran (a
    # profile's share of its point's rounds); None: the stage's own time.
    seconds: float | None = None


class Stage(ABC):
    name: ClassVar[str]

    def __init__(self, ctx: RunContext, engine: EngineRef, toolchain: str | None = None):
        self.ctx = ctx
        self.engine = engine
        self.toolchain = toolchain
        self.model_spec = ctx.catalog.model(engine.model)
        self.variant_spec = ctx.catalog.variant(engine.variant)

    def model_source(self) -> ModelSource:
        """The PyTorch model this engine comes from."""
        return model_source(self.engine.model, self.model_spec, self.ctx.workspace.root)

    # --- what subclasses describe -----------------------------------------------------------

    @abstractmethod
    def manifest_path(self) -> Path: ...

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Settings that change the output; part of the fingerprint and recorded."""

    def inputs(self) -> list[Artifact]:
        """Upstream artefacts this stage reads; their hashes are part of the fingerprint."""
        return []

    def identity(self) -> dict[str, Any]:
        """The tools that do the work (versions, image digests); part of the fingerprint."""
        return {}

    def skip_reason(self) -> str | None:
        """A reason this stage cannot run here; the stage is then recorded as skipped."""
        return None

    def cannot_redo_here(self) -> str | None:
        """Why this machine could not do this stage's work at all (an NVFP4 export without CUDA),
        though it may still take what another machine did: then an intact earlier result with the
        same settings and inputs, made with other tool versions, is kept rather than failing."""
        return None

    @abstractmethod
    def run_impl(self, inputs: list[Artifact]) -> StageOutcome: ...

    # --- the common work ---------------------------------------------------------------------

    def fingerprint(self, params: dict[str, Any], inputs: list[Artifact], skip_reason: str | None = None) -> str:
        payload: dict[str, Any] = {"stage": self.name, "params": params}
        if skip_reason is not None:
            # A skip depends only on why; asking the tools for their identity (Docker, images)
            # would fail on exactly the machines that cannot run the stage.
            payload["skipped"] = skip_reason
        else:
            payload["inputs"] = [(a.role, a.sha256) for a in inputs]
            payload["identity"] = self.identity()
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()

    def load_manifest(self) -> EngineManifest | None:
        try:
            return read_manifest(self.manifest_path())
        except FileNotFoundError:
            return None
        except Exception as exc:  # an unreadable or outdated manifest is rebuilt, not fatal
            self.ctx.reporter.warn(f"{exc}; it will be rewritten")
            return None

    def new_manifest(self) -> EngineManifest:
        return EngineManifest(
            engine=self.engine.name,
            model=self.engine.model,
            variant=self.engine.variant,
            precision=self.variant_spec.precision,
            sparsity=self.variant_spec.sparsity,
            toolchain=self.toolchain,
            gpu_type=self.ctx.gpu_type if self.toolchain else None,
            environment=self.environment(),
        )

    def environment(self):
        environment = capture_environment()
        if self.ctx.cluster_node is not None:
            environment = environment.model_copy(update={"cluster_node": self.ctx.cluster_node})
        return environment

    def is_current(self) -> bool:
        """Whether the manifest already holds this stage's result for these settings, inputs and
        tools (then ``run`` does no work). False also where the inputs are missing: running says why."""
        try:
            manifest = read_manifest(self.manifest_path())  # unreadable: not current (run warns)
            reason = self.skip_reason()
            inputs = [] if reason else self.inputs()
            return self._reusable(manifest.stage(self.name) if manifest else None, self.fingerprint(self.params(), inputs, reason))
        except Exception:  # a missing engine, say: the run will name it
            return False

    def kept_outcome(self) -> bool:
        """Whether this stage's current result is one without a number, kept until --force (out of
        memory, a fault)."""
        if not self.is_current():
            return False
        manifest = self.load_manifest()
        record = manifest.stage(self.name) if manifest is not None else None
        return record is not None and record.status in KEPT_OUTCOMES

    def _reusable(self, previous: StageRecord | None, fingerprint: str, force: bool = False) -> bool:
        return (
            previous is not None
            and not (self._forced() or force)
            and previous.status != "failed"  # a refusal is evidence, not a result to reuse: try again
            and previous.fingerprint == fingerprint
            and all(self.ctx.workspace.is_intact(a) for a in previous.outputs)
        )

    def _forced(self) -> bool:
        """Whether --force asks for this stage's work: once in a run."""
        return self.ctx.force and (str(self.manifest_path()), self.name) not in self.ctx.done

    def run(self, force: bool = False, **given) -> StageRecord:
        """Do the stage's work and record it, unless it is current (``force``: do it anyway, as
        --force does for every stage). ``given``: work its caller did for it, handed to run_impl
        (a profile's measurement, made with its shape point's other engines)."""
        reporter = self.ctx.reporter
        manifest = self.load_manifest()
        previous = manifest.stage(self.name) if manifest else None
        reason = self.skip_reason()
        inputs = [] if reason else self.inputs()
        params = self.params()
        fingerprint = self.fingerprint(params, inputs, reason)

        if self._reusable(previous, fingerprint, force):
            said = (str(self.manifest_path()), self.name)
            if previous.status == "faulted":  # an error of every run that finds it, until --force
                self._kept_outcome(previous, found_now=False)
            if said not in self.ctx.said_unchanged and said not in self.ctx.done:  # once a run, if not done in it
                self.ctx.said_unchanged.add(said)
                if previous.status not in KEPT_OUTCOMES:
                    reporter.unchanged(self.name, self.progress_label)
                else:
                    self._kept_outcome(previous, found_now=False)
            if previous.status == "done":
                self.ctx.produced.add(self.name)
            self.ctx.workspace.hashes.save()
            return previous
        kept = None if force else self._made_elsewhere(manifest, previous, params, inputs, reason)
        if kept is not None:
            reporter.warn(kept)
            self.ctx.workspace.hashes.save()
            return previous

        started = time.perf_counter()
        refused = None
        if reason:
            outcome = StageOutcome(outputs=[])
        else:
            try:
                with reporter.working(self.name, self.progress_label):
                    outcome = self.run_impl(inputs, **given)
            except RefusedByTool as exc:
                if exc.outcome is None and not isinstance(exc, OutOfMemory | DeviceFault):
                    raise
                refused, outcome = exc, exc.outcome or StageOutcome(outputs=[])
        elapsed = time.perf_counter() - started

        record = StageRecord(
            stage=self.name,
            status=_status_of(refused) if refused else "skipped" if reason else "done",
            reason=refused.message if refused else reason,
            fingerprint=fingerprint,
            finished_at=datetime.now(timezone.utc),
            duration_s=round(elapsed, 4),
            inputs=inputs,
            outputs=outcome.outputs,
            command=outcome.command,
            params=params,
            details=outcome.details,
            out_of_memory=OutOfMemoryFacts(**refused.facts) if isinstance(refused, OutOfMemory) else None,
            fault=FaultFacts(**refused.facts) if isinstance(refused, DeviceFault) else None,
        )
        self.save(manifest, record)
        self.ctx.done.add((str(self.manifest_path()), self.name))
        if isinstance(refused, OutOfMemory):
            self._kept_outcome(record, found_now=True)
            if refused.hint:
                reporter.info(f"TIP {refused.hint}")
            return record  # a result: the other points and engines go on, and the run exits 0 for it
        if isinstance(refused, DeviceFault) and self.toolchain:  # named for its engine, toolchain and point
            raise DeviceFault(f"{self.progress_label}: {refused.message}", refused.hint, facts=refused.facts) from refused
        if refused:
            raise refused  # recorded; the runner reports it and goes on with the other engines
        if reason:
            reporter.skipped(self.name, self.progress_label, reason)
        else:
            self.ctx.produced.add(self.name)
            # Work done before the stage ran for it (the rounds a profile shared) is what its line reports.
            reporter.done(self.name, self.progress_label, elapsed if outcome.seconds is None else outcome.seconds, outcome.note)
        return record

    def _kept_outcome(self, record: StageRecord, found_now: bool) -> None:
        """Say a result without a number — out of memory, a fault — whether this run found it or an
        earlier one did (then it is kept until --force, like a measurement). Out of memory is a
        WARNING, counted for the run's summary; a fault an earlier run recorded is an error of this
        run too (one this run found is raised by ``run``, to replace the process it poisoned)."""
        earlier = "" if found_now else " (recorded earlier; `--force` tries again)"
        if record.status == "faulted":
            if not found_now:
                raise PipelineError(
                    f"{record.reason}{earlier}",
                    hint="the other points and toolchains were measured; that point alone with CUDA_LAUNCH_BLOCKING=1 shows the kernel's call stack",
                )
            return
        self.ctx.reporter.warn(f"{self.progress_label}: {record.reason}{earlier}")
        self.ctx.out_of_memory.append((self.progress_label, record.reason))

    @property
    def progress_label(self) -> str:
        """What a progress line is about: "modernbert_bf16 on torch-compile at 2x512"."""
        label = self.engine.name
        if self.toolchain:
            label += f" on {self.toolchain}"
        shape = getattr(self, "shape", None)
        return label + (f" at {shape}" if shape else "")

    def _made_elsewhere(self, manifest, previous: StageRecord | None, params, inputs, skip_reason) -> str | None:
        """The warning that keeps ``previous`` when only the tools' versions changed and this
        machine cannot redo the work (the export of a GPU machine, built here ahead of time)."""
        if previous is None or self._forced() or previous.status != "done" or skip_reason is not None:
            return None
        if not all(self.ctx.workspace.is_intact(a) for a in previous.outputs):
            return None

        def same(a, b) -> bool:
            return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)

        if not same(previous.params, params) or [(a.role, a.sha256) for a in previous.inputs] != [(a.role, a.sha256) for a in inputs]:
            return None
        why = self.cannot_redo_here()
        if why is None:
            return None
        there = manifest.environment.packages if manifest is not None else {}
        changed = [
            f"{name} {there[name]} there, {version or 'none'} here"
            for name, version in self.identity().items()
            if there.get(name) != version and name in there
        ]
        made = f"made on {manifest.environment.hostname}" if manifest is not None else "made elsewhere"
        return (
            f"{self.engine.name}: kept the {self.name} {made}" + (f" ({'; '.join(changed)})" if changed else " with other tool versions")
            + f": this machine cannot redo it ({why.rstrip('.')}). `--force` would try, and fail."
        )  # fmt: skip

    def save(self, manifest: EngineManifest | None, record: StageRecord) -> None:
        manifest = manifest or self.new_manifest()
        updates: dict[str, Any] = {
            self.name: record,
            "environment": self.environment(),
            "precision": self.variant_spec.precision,
            "sparsity": self.variant_spec.sparsity,
        }
        for later in STAGE_ORDER[STAGE_ORDER.index(self.name) + 1 :]:
            updates[later] = None
        updates.update(self.extra_manifest_fields())
        manifest = manifest.model_copy(update=updates)
        manifest.write(self.manifest_path())
        self.ctx.workspace.hashes.save()

    def extra_manifest_fields(self) -> dict[str, Any]:
        return {}


def _status_of(refused: RefusedByTool) -> str:
    """The status a refusal is recorded with."""
    if isinstance(refused, OutOfMemory):
        return "out_of_memory"
    if isinstance(refused, DeviceFault):
        return "faulted"
    return "failed"

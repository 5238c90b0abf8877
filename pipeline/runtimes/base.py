"""The small interface every engine runtime implements: build an engine, then time it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from pipeline.catalog import ProfileSettings, ToolchainSpec, VariantSpec
from pipeline.measuring.accuracy import ReferenceBatch
from pipeline.measuring.rounds import PreparedEngine
from pipeline.measuring.serving import THREADS, ServedRun, StartAt
from pipeline.models import ModelSource, PointShapes
from pipeline.running.reporting import Reporter

# The share of the GPU's memory that must stay free for anything to be kept prepared ahead of its
# point's profile: a compiled point by the process that compiled it (pytorch/compile_ahead.py) or by
# the run's process (EngineRuntime.prepare_ahead), the run's other engines while it waits
# (pipeline/stages/point.py, prepare_points_ahead). What is kept holds memory until its point, and
# a point's profile would run out sooner than alone.
AHEAD_FREE_GPU = 0.25


def too_little_to_keep(free: int, total: int) -> str | None:
    """Why nothing more may be kept prepared ahead with ``free`` of ``total`` bytes of the GPU's
    memory free (under AHEAD_FREE_GPU of it), or None where there is room."""
    if free >= AHEAD_FREE_GPU * total:
        return None
    return f"{free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB GPU memory free"


@dataclass
class BuildResult:
    # None when the tool refused the input and wrote no engine (see RefusedByTool).
    engine_path: Path | None
    settings: dict[str, Any] = field(default_factory=dict)
    command: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    # Other files written beside the engine (logs, layer info); recorded as artefacts.
    sidecars: dict[str, Path] = field(default_factory=dict)
    # Extra evidence for the manifest's BuildDetails (image, digest, parsed trtexec output).
    evidence: dict[str, Any] = field(default_factory=dict)


class AheadPool(ABC):
    """Where the works ahead of profiles of one kind are done side by side (compiling processes,
    say), in the background: each build hands its work over as soon as it has written its engine
    (or as it ends) and the run goes on
    building; before the first profile, the run waits for all of it."""

    def expect(self, jobs: int) -> None:  # noqa: B027 — optional: a pool that sizes itself by it reads it
        """Told, before the first work, how many jobs the builds may hand over in all: at most that
        many (jobs that turn out to share their work count too)."""

    @abstractmethod
    def submit(self, work: AheadWork) -> bool:
        """Start ``work`` beside what is under way; it runs while the caller goes on. False when
        this pool will not do it (too few CPUs, say: ``finish`` says why)."""

    @abstractmethod
    def finish(
        self, progress: Callable[[str], None], done: Callable[[AheadWork, Any, Any], None] | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Wait for every submitted work: each one's evidence for its build manifest, in the
        order submitted, and why none was done where none was (None when it was). ``done(work,
        job, served)`` is called, in this process, for each job as soon as it has been done well,
        while the others go on; ``served``: what the pool keeps of the job's result and serves to
        its profile (a compiled point, EngineRuntime.prepare_ahead), else None. A pool that serves
        something stays open after ``finish``, until ``close``; one that serves nothing has ended."""

    @abstractmethod
    def close(self) -> None:
        """Stop whatever is still running or serving (the run ended, or was interrupted); safe
        after ``finish``."""

    def said(self) -> str:
        """What the work came to, in a few words for the run's output, once finished ("" for nothing to say)."""
        return ""


@dataclass(frozen=True)
class AheadWork:
    """One engine's work ahead of its profiles (EngineRuntime.ahead_work): ``jobs`` done in an
    AheadPool that ``pool`` opens (one per kind in a run, shared by the engines of that kind),
    the evidence merged into the build manifest's BuildDetails by key. Whatever fails there is
    left to the point's profile, which records it for its point."""

    engine_path: Path
    jobs: list
    pool: Callable[[], AheadPool]
    # What it does, for the build's line: "compiling at 6 shape points".
    doing: str = "work ahead of its profiles"


@dataclass
class ProfileResult:
    per_iteration_ms: list[float]
    total_walltime_s: float
    device: str
    command: list[str] | None = None
    sidecars: dict[str, Path] = field(default_factory=dict)
    metric: str = "host latency"
    # The runtime's own throughput figure when it has one (trtexec's qps), else 1000 / mean.
    throughput_qps: float | None = None
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_takes(cls, said: dict[str, Any], times_ms: list[float], elapsed_s: float) -> ProfileResult:
        """The result of an in-process engine's timed runs, with what it ``said`` of how it ran
        (PreparedEngine.evidence())."""
        return cls(
            per_iteration_ms=times_ms,
            total_walltime_s=elapsed_s,
            device=said["device"],
            metric=said["metric"],
            command=said.get("command"),
            sidecars=said.get("sidecars", {}),
            warnings=said.get("warnings", []),
            evidence=said.get("evidence", {}),
        )


@dataclass
class ReferenceRun:
    """An engine run on the reference batch (pipeline/measuring/accuracy.py), for its accuracy."""

    # Output tensors by name, as arrays.
    outputs: dict[str, Any]
    # How it was run, for the manifest ("onnxruntime 1.32.0 CPUExecutionProvider, in-process").
    checked_by: str
    # The tool's own accuracy verdict by tensor name, where it has one (trtexec 11.1).
    tool: dict[str, Any] = field(default_factory=dict)
    sidecars: dict[str, Path] = field(default_factory=dict)


@dataclass
class ToolchainStatus:
    """Whether a toolchain is here and usable, for `pipeline toolchains list` and `doctor`."""

    # Everything it needs is fetched (image pulled, environment created); None: cannot tell.
    present: bool | None
    # It can build and time engines on this machine as it is.
    usable: bool
    detail: str
    # What pins it exactly (an image digest, the installed wheels), when there is such a thing.
    pin: str | None = None


class NoEvidence(BaseModel):
    """The evidence of a runtime that records none of its own: every fact it gives is a core field."""

    model_config = ConfigDict(extra="forbid")


def checked_evidence(runtime: EngineRuntime, evidence: dict[str, Any], details: type[BaseModel]) -> dict[str, Any]:
    """``evidence`` for a build's or profile's details (``details``, pipeline/manifest/schema.py): what
    the core schema names as it is, the rest — the runtime's own — checked against the model its
    runtime owns (EngineRuntime.Evidence) and kept as that model writes it. A key the runtime's
    model does not name is an error in the runtime, not a new field in the manifest."""
    core = {key: value for key, value in evidence.items() if key in details.model_fields}
    own = {key: value for key, value in evidence.items() if key not in details.model_fields}
    return {**core, **runtime.Evidence.model_validate(own).model_dump(mode="json", exclude_unset=True)}


class WorksAhead:
    """What a backend fills only if its builds leave work for later that is faster done for every
    shape point at once, in the background (the torch backend's compiling at each point,
    pipeline/runtimes/pytorch/): by default, none. The stages ask every runtime, never its kind."""

    #: Set by the build stage while a build runs (None otherwise): a runtime whose build goes on
    #: working on the engine once it has written it (a compiled engine prepared at its first
    #: point) calls it with the file then, so that the work ahead (compiling the other points)
    #: starts beside the rest of the build, not after it.
    engine_written: Callable[[Path], None] | None = None
    #: Set by the build stage in a run whose profiles follow (False otherwise): the build may leave
    #: the point it would prepare itself to its work ahead as well, where the run's process then
    #: prepares every point as the work finishes it (``prepare_ahead``).
    leave_build_point_ahead: bool = False

    @property
    def builds_where_timed(self) -> bool:
        """Whether a cluster run builds it on the GPU's worker that then times its shape points
        (pipeline/cluster/gpu_workers.py): its build prepares the engine in the building process
        (the model loaded, a graph compiled or captured), which later profiles in that process use
        again, and it has no work to spread over processes of its own (``ahead_work``)."""
        return False

    @property
    def builds_long(self) -> bool:
        """Whether its builds take longer than other toolchains' of the same placement, by work
        that grows with the model's shape points (compiling at each): a cluster starts them first,
        so that the longest builds do not wait for a GPU's share behind short ones."""
        return False

    def ahead_work(self, engine_path: Path, workloads: list[ReferenceBatch]) -> AheadWork | None:
        """Work each shape point's profile would start with (compiling for the point) that is
        faster done for every point at once, beside other engines' such work, in the background
        while the run builds the rest (AheadPool); None where there is none."""
        return None

    def expect_ahead_work(self) -> None:  # noqa: B027 — optional: most kinds have no work ahead
        """Told as a run starts that its builds will hand work ahead over (``ahead_work``): start
        now, in the background, what that work is slow to start with."""

    def prepare_ahead(self, engine_path: Path, workload: ReferenceBatch | None, served=None) -> str | None:
        """Prepare the engine at a point its work ahead has just finished, for that point's profile
        to find it so — in this process, or, ``served``, kept by the pool that did the work, which
        serves it to the profile (AheadPool.finish); called while the run waits for the rest of the
        work. Why it was not, where it was not (the profile then prepares it as it always does)."""
        return "nothing to prepare ahead"


class EngineRuntime(WorksAhead, ABC):
    """One toolchain's way of turning ONNX into something that runs, and of timing it: what every
    backend fills (its work ahead, if any, is WorksAhead's)."""

    #: The catalog ``kind`` this class implements.
    kind: ClassVar[str]
    #: What the runtime is called where a report names it beside its version (the build manifest's
    #: runtime_version): "TensorRT", "ONNX Runtime". None: the kind names it (runtimes.product_of).
    product: ClassVar[str | None] = None
    #: The catalog settings of this kind.
    Spec: ClassVar[type[ToolchainSpec]]
    #: Its own record of a build or a profile, kept in the manifest beside the core fields under
    #: the model's keys (checked_evidence); the core and the reports never read it.
    Evidence: ClassVar[type[BaseModel]] = NoEvidence
    #: File suffix of the engines it writes.
    engine_suffix: ClassVar[str]
    #: Where a cluster run places this kind's work (pipeline/cluster/scheduler.py): "gpu" — built
    #: and timed on a node of the GPU type it targets, one result per type; "ahead-of-time" — built
    #: on any node, timed on a GPU it targets; "anywhere" — a CPU runtime, one result.
    placement: ClassVar[str] = "gpu"
    #: Whether a cluster run may put several of its builds on one GPU at once ("gpu" placement).
    #: Never beside a measurement: a shape point holds its GPU whole. False where the build times
    #: its choices on the GPU (a TensorRT builder's tactics), which a neighbour would skew.
    builds_share_gpu: ClassVar[bool] = False
    #: Whether the engine is timed inside the pipeline's own process (InProcessRuntime), rather
    #: than in a tool's process of its own. Either is timed in rounds beside the shape point's
    #: other engines (pipeline/measuring/rounds.py); a tool's engine with none beside it is one whole
    #: measurement by the tool.
    measures_in_this_process: ClassVar[bool] = False
    #: Whether its engines are made from the exported ONNX. Those that start from the PyTorch
    #: model itself still run a model the exporter refused (its export then writes no ONNX).
    reads_onnx: ClassVar[bool] = True

    def __init__(self, name: str, spec: ToolchainSpec, reporter: Reporter, workspace_root: Path, force: bool = False):
        self.name = name
        self.spec = spec
        self.reporter = reporter
        self.workspace_root = Path(workspace_root)
        # --force: try builds the preflight would refuse.
        self.force = force

    @property
    @abstractmethod
    def version(self) -> str: ...

    def supports_gpu(self, compute_capability: str | None) -> bool:
        """Whether this toolchain's engines run on a GPU of this compute capability (None: unknown),
        for choosing a cluster's GPU types to build and time on."""
        return True

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Everything about the runtime that changes what a build produces."""

    @abstractmethod
    def describe(self) -> str:
        """What this toolchain provides, in a few words (listings, doctor)."""

    @abstractmethod
    def status(self) -> ToolchainStatus: ...

    @classmethod
    def machine_check(cls) -> tuple[str, bool, str] | None:
        """What this kind finds on the machine whatever the catalog names (for `pipeline doctor`):
        (what, found, detail), or None when there is nothing to say."""
        return None

    def pull(self) -> None:
        """Fetch what the toolchain needs (an image, an environment); `pipeline toolchains pull`."""
        self.reporter.info(f"nothing to pull for {self.name}: {self.describe()}")

    def pin(self) -> dict[str, Any] | None:
        """What `pipeline toolchains lock` records for this toolchain; None: nothing to pin."""
        return None

    def check_usable(self) -> None:  # noqa: B027 — optional: most kinds are usable wherever they import
        """Raise EnvironmentMissing when this machine cannot use the toolchain at all."""

    def unsupported_reason(self, variant: VariantSpec) -> str | None:
        """Why this runtime cannot build ``variant`` here, or None."""
        return None

    def unsupported_model(self, source: ModelSource) -> str | None:
        """Why this runtime cannot build engines of this model at all, or None."""
        return None

    def cannot_profile_reason(self, build_settings: dict[str, Any]) -> str | None:
        """Why an engine it built (with these settings) cannot be timed on this machine, or None."""
        return None

    def sidecar(self, engine_path: Path, suffix: str) -> Path:
        """A file beside the engine, named after it (``vit_fp16.build.log``), also while the build
        writes the engine under a temporary name (``.vit_fp16.engine.<random>.tmp``)."""
        name = engine_path.name
        if name.startswith(".") and name.endswith(".tmp"):
            name = name[1:].rsplit(".", 2)[0]
        stem = name[: -len(self.engine_suffix)] if name.endswith(self.engine_suffix) else name
        return engine_path.parent / f"{stem}{suffix}"

    @abstractmethod
    def build(self, onnx_path: Path | None, engine_path: Path, variant: VariantSpec, source: ModelSource) -> BuildResult:
        """Write the engine to ``engine_path`` (the caller makes that write atomic).

        ``onnx_path`` is the exported graph, ``source`` the PyTorch model it was exported from:
        compilers read the first, runtimes that run PyTorch itself (``reads_onnx`` False) start
        from the second, and get None where the exporter refused the model."""

    def profile(self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None = None) -> ProfileResult:
        """One whole measurement of the engine by the tool that times it in a process of its own.
        ``workload`` is what to feed at a shape point (its inputs' shapes and seeded values), for
        models measured at several; None: the engine's one fixed shape. A runtime whose engines run
        in this process has none: the measurement protocol times what it prepares."""
        raise NotImplementedError(f"{type(self).__name__} runs its engines in this process: prepare them instead")

    def short_run(
        self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None = None, layers: bool = False
    ) -> ProfileResult:
        """One short timed run in the tool's process, a take of the rounds (ToolTakes): ``profile``
        within ``settings``' bounds; the per-layer profile (a separate run after the timed ones)
        only with ``layers`` — once per point, not every take."""
        return self.profile(engine_path, settings, workload)

    def prepare(self, engine_path: Path, workload: ReferenceBatch | None = None) -> PreparedEngine:
        """The engine ready for the rounds beside the shape point's other engines: here, each take is
        a short run of the tool (ToolTakes); a runtime that runs engines in this process loads them."""
        return ToolTakes(self, engine_path, workload)

    def run_reference(self, engine_path: Path, reference: ReferenceBatch) -> ReferenceRun | None:
        """Run the engine once on the reference batch; None when this runtime cannot feed an engine
        given inputs (the profile then records that its accuracy was not checked)."""
        return None

    def serve(self, engine: PreparedEngine, streams: int, seconds: float, start_at: StartAt = None) -> ServedRun:
        """``engine`` (what ``prepare`` gave) serving ``streams`` concurrent streams, each its own
        inputs, for ``seconds`` after they start together (at ``start_at`` of time.time(), where
        given, or at the instant it returns once the streams are warmed: streams in other processes
        start then too): pipeline/measuring/serving.py. A runtime that cannot says why
        (ServedRun.cannot); by default, none can."""
        return ServedRun.cannot(streams, THREADS, f"the {self.kind} runtime {self.serves_no_streams}")

    #: Why it serves no concurrent streams, where it does not (``serve`` not filled), in words
    #: after "the <kind> runtime".
    serves_no_streams: ClassVar[str] = "does not serve concurrent streams"

    #: Why its streams are also served by N processes, each its own interpreter and copy of the
    #: engine, started together (pipeline/stages/serving.py): threads of one process cannot serve
    #: them side by side (PyTorch's Python holds the GIL between kernel launches). None: threads do.
    serves_in_processes: ClassVar[str | None] = None

    #: Whether a count's serving may be split into takes served in rounds with the point's other
    #: engines (``[profile] serve_rounds``, pipeline/stages/serving.py); false where a take is a
    #: whole run of a tool, which would load the engine again for each.
    serves_in_rounds: ClassVar[bool] = True

    @abstractmethod
    def describe_build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> list[str]:
        """The exact work ``build`` would do, for --dry-run."""

    @abstractmethod
    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload: PointShapes | None = None) -> list[str]:
        """The exact work ``profile`` would do (at a shape point's input shapes), for --dry-run."""


class InProcessRuntime(EngineRuntime):
    """A runtime that runs its engines in the pipeline's own process (PyTorch, ONNX Runtime): it
    prepares an engine, and the measurement protocol (pipeline/measuring/rounds.py) times it — in rounds
    beside the shape point's other engines, or alone as a group of one (pipeline/stages/point.py)."""

    measures_in_this_process = True

    @abstractmethod
    def prepare(self, engine_path: Path, workload: ReferenceBatch | None = None) -> PreparedEngine:
        """The engine loaded, compiled or captured, and warmed: ready for its takes."""


class ToolTakes:
    """An engine that a tool times in a process of its own (trtexec, the TensorRT-RTX driver),
    measured in rounds: each take is one short run of the tool — warm-up for the take's length,
    then at least the take's runs and milliseconds, each run timed by the tool on the GPU — so its
    takes interleave with the other engines' as theirs do with each other. The tool's start
    (loading the engine) is outside what it times."""

    #: Most of a take is the tool starting, the GPU idle: its clock is read only while it is busy.
    clock_while_busy = True

    def __init__(self, runtime: EngineRuntime, engine_path: Path, workload: ReferenceBatch | None):
        self.runtime, self.engine_path, self.workload = runtime, engine_path, workload
        self.timing = "GPU compute time"
        # The first take's run (it also made the per-layer profile) and the last one's.
        self.first: ProfileResult | None = None
        self.last: ProfileResult | None = None

    def take(self, runs: int, min_ms: float) -> list[float]:
        # The warm-up is the in-process takes' untimed run, made as long as the take: the tool's
        # start left the GPU idle, and its clocks come back up there, not in a timed run.
        bounds = ProfileSettings(warmup_ms=min_ms, iterations=runs, duration_s=min_ms / 1000.0)
        self.last = self.runtime.short_run(self.engine_path, bounds, self.workload, layers=self.first is None)
        self.first = self.first or self.last
        self.timing = self.last.metric
        return self.last.per_iteration_ms

    def evidence(self) -> dict[str, Any]:
        """What the last take's run said, with its command and files (its log, its exported times),
        and the per-layer profile the first take made."""
        first, last = self.first, self.last
        if first is None or last is None:
            return {"device": "not run", "metric": self.timing}
        return {
            "device": last.device,
            "metric": last.metric,
            "warnings": last.warnings,
            "evidence": _merged(first.evidence, last.evidence),
            "command": last.command,
            "sidecars": {**first.sidecars, **last.sidecars},
        }


def _merged(older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    """``older`` updated by ``newer``, nested dictionaries key by key."""
    out = dict(older)
    for key, value in newer.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def rounds_words(settings: ProfileSettings) -> str:
    """How an engine that runs in this process is timed, for --dry-run."""
    return (
        f"timed in rounds beside the shape point's other engines: each a take of ≥{settings.take_runs} runs and "
        f"≥{settings.take_ms:g} ms, in a seeded random order, until decided (≥{settings.min_rounds} rounds) or {settings.budget_s:g} s"
    )

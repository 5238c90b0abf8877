"""The one manifest schema: what each stage did, with which inputs, on which machine.

A manifest is the evidence behind every number the pipeline reports. ``compare`` and every later
report read manifests only; they never re-measure. Files are written atomically and validated on
read, so a manifest on disk is always complete.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr

from pipeline.catalog import ProfileSettings, ShapeSizes
from pipeline.catalog.shape import written
from pipeline.measuring.records import RoundsRecord
from pipeline.measuring.serving import ServedRecord
from pipeline.measuring.stats import LatencyStats
from pipeline.running.files import atomic_write_text

# Bump when a field changes meaning or a reader would misread an old file. 2: the core schema
# names no tool — a runtime's own evidence sits beside the core fields under its own keys, in the
# model its runtime owns; the facts reports read from it (the GPU's memory, the per-layer times)
# are core fields (docs/outputs.md says what changed).
# 3: a stage's work that did not fit in memory is a result of its own (status "out_of_memory",
# with OutOfMemoryFacts), and so is a kernel that faulted on the GPU (status "faulted", with
# FaultFacts); an export records the shape points whose FP32 reference did not fit
# (ExportDetails.references_out_of_memory) and those made a few samples at a time.
# 4: each take of a set of rounds records how much slower the host's CPUs ran than alone
# (Take.host_slowdown) with who slowed it (host_others_cpus, host_throttled), and the rounds what
# that is against and how they held the host
# (RoundsRecord.host_alone_probe_ms, host_alone_from, host_held: pipeline/measuring/host_speed.py,
# pipeline/measuring/host_rounds.py).
# 5: each set of rounds records the engines that left it out of the running, and after how many
# rounds (RoundsRecord.raced_out: racing, pipeline/measuring/stopping.py); each profile what preparing its
# engine at its point cost (ProfileDetails.preparation_s).
# 6: a build records the node a TensorRT ONNX parser refused (BuildDetails.parser_failure) and
# what `pipeline reduce` made of the failure (BuildDetails.reduced); an export what constant
# folding did to its graph (ExportDetails.sanitized).
# 7: each set of rounds records the least length of a round its takes were lengthened to fill
# (RoundsRecord.round_ms: pipeline/measuring/pace.py, take_length); each profile whether its
# engine was prepared and checked ahead of its point (ProfileDetails.prepared_ahead).
SCHEMA_VERSION = 7
# Versions read: a version-1 manifest is lifted as it is read (pipeline/manifest/versions.py); a
# version-2 to 6 one reads as 7 unchanged (3 to 7 only add).
READS = (1, 2, 3, 4, 5, 6, 7)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Artifact(_Model):
    """A file a stage read or wrote, pinned by content."""

    role: str
    path: str  # relative to the workspace root, POSIX separators
    sha256: str
    size_bytes: int


class GpuInfo(_Model):
    name: str
    driver: str | None = None
    compute_capability: str | None = None
    memory_mib: int | None = None


class ClusterNode(_Model):
    """The Ray node a stage ran on, for stages a cluster run dispatched (pipeline/cluster/)."""

    ray_node_id: str
    address: str
    # The GPU type the task was placed by (a Ray accelerator or `gpu_type:` resource), if any.
    gpu_type: str | None = None
    # Every GPU type and custom resource the node advertises.
    resources: dict[str, float] = {}
    # The CPUs a shape point's task measured on: its GPU's share of the node's cores
    # (pipeline/cluster/cpu_share.py); None where it ran wherever the OS put it.
    cpus: tuple[int, ...] | None = None
    # The node's process that ran the stage: a point's engines, measured together, share it, and a
    # GPU's jobs share their worker's (pipeline/cluster/gpu_workers.py).
    worker_pid: int | None = None


class Environment(_Model):
    """The machine and software a stage ran on."""

    hostname: str
    os: str
    python: str
    cpu: str
    cpu_count: int
    gpus: list[GpuInfo] = []
    packages: dict[str, str] = {}
    git_commit: str | None = None
    git_dirty: bool | None = None
    pipeline_version: str
    # Set when a cluster run dispatched the stage to a Ray node; None on a local run.
    cluster_node: ClusterNode | None = None


class ParityCheck(_Model):
    """The exported ONNX, run in ONNX Runtime, against PyTorch on the same random input."""

    reference: str
    # ONNX Runtime's execution provider that ran the graph (None in manifests written before it was recorded).
    provider: str | None = None
    # How many samples of the batch were run (None in manifests written before this was recorded).
    samples: int | None = None
    max_abs_error: float
    cosine_similarity: float
    max_abs_error_limit: float
    cosine_similarity_floor: float
    passed: bool


class OutOfMemoryFacts(_Model):
    """What ran out where a stage's work did not fit: recorded as that engine's (or shape point's)
    result, while the others go on."""

    # "GPU" or "host".
    memory: Literal["GPU", "host"]
    # The work that ran out ("preparing bf16/torch-eager", "the FP32 reference"); None where not said.
    during: str | None = None
    # What the allocation that failed asked for, where the allocator says (PyTorch does).
    requested_bytes: int | None = None
    # The GPU's free and total memory after the attempt, and its name (GPU memory only).
    free_bytes: int | None = None
    total_bytes: int | None = None
    gpu: str | None = None


class FaultFacts(_Model):
    """A kernel that faulted on the GPU: CUDA's own words and the call it was pinned to (every call
    is synchronised, so the call that launched the kernel is the one that sees the error)."""

    error: str
    during: str | None = None
    # The shape point it faulted at, where the stage's work spans several (an export's).
    shape: str | None = None
    # An export's faults found in earlier processes of the run, by shape point (CUDA's words): those
    # points stay out of its references while it goes on.
    earlier: dict[str, str] = {}


class ExportDetails(_Model):
    kind: Literal["export"] = "export"
    # The timm architecture, for timm models; `source` says what any model is.
    timm_model: str | None = None
    source: str | None = None
    weights: str  # "random-init (seed N)" or "checkpoint <path>"
    # The shape and floating type of the first input as traced (the model's one shape, or its
    # smallest shape point).
    input_shape: list[int]
    input_dtype: str
    # Every input of the graph: name, dims (sizes, or names of dynamic axes), dtype, kind.
    inputs: list[dict[str, Any]] = []
    output: str | None = None
    # The shape points ("2x512") the reference and parity cover; empty for a model of one shape.
    shape_points: list[str] = []
    # Which exporter wrote the graph (torch.export-based, TorchScript, ModelOpt's).
    exporter: str | None = None
    # Why no ONNX was written: the exporter's own reason for refusing the model. The references
    # are written all the same, and the toolchains that run the PyTorch model still build it.
    onnx_refused: str | None = None
    # Why no ONNX was written though the exporter could have: no toolchain of the run reads it
    # (PyTorch toolchains alone). The references are written; a run that reads it exports again.
    onnx_skipped: str | None = None
    opset: int
    # Set when the graph was traced at this smaller batch with a dynamic batch axis, then pinned
    # to input_shape's batch (CPU traces of quantized models; see pipeline/stages/quantize.py).
    traced_batch: int | None = None
    precision: str
    sparsity: str | None = None
    quantization: dict[str, Any] | None = None
    # 2:4 sparsification: method, per-layer sparsity in PyTorch, and the check of the ONNX weights.
    sparsification: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None
    # The variant's PyTorch outputs against the dense FP32 model's (cosine, max error, top-1): the
    # accuracy proxy, for engines that never ran.
    accuracy: dict[str, Any] | None = None
    # The reference batch every engine of this variant is checked on: its description and the
    # input and FP32-output files (name, path, shape, dtype), see pipeline/measuring/accuracy.py.
    reference: dict[str, Any] | None = None
    # The shape points whose FP32 reference did not fit in memory, even a sample at a time: their
    # engines are still built and measured, their accuracy there said to be unchecked and why.
    references_out_of_memory: dict[str, OutOfMemoryFacts] = {}
    # The shape points whose FP32 reference (or the variant's outputs for parity) was made a few
    # samples at a time because the whole batch did not fit: how many samples at a time.
    references_in_parts: dict[str, int] = {}
    # The shape points where the FP32 model faulted on the GPU (CUDA's words): left out of the
    # references, their engines measured with their accuracy unchecked.
    references_faulted: dict[str, str] = {}
    # The worst of the shape points' checks, when there are several (parity_by_shape).
    parity: ParityCheck | None = None
    parity_by_shape: dict[str, ParityCheck] = {}
    # Why the ONNX could not be run in ONNX Runtime (TensorRT-only operators).
    parity_skipped: str | None = None
    # Constant folding before TensorRT reads the graph (pipeline/graph/sanitize.py): the tool, the
    # nodes before and after, the ops folded away and the seconds, and `parity: "unchecked: <why>"`
    # where ONNX Runtime could not check the folded graph; or why it was not done (`skipped`: a
    # graph with TensorRT's own TRT_* quantization ops, --no-sanitize).
    sanitized: dict[str, Any] | None = None
    onnx_ops: dict[str, int] = {}
    # Opset, initializer data types, size.
    onnx_audit: dict[str, Any] = {}
    # FLOPs of one forward at each shape point, as the model itself counts them (a python model's
    # factory `flops`): the report's TFLOP/s at points, where the ONNX graph's count has no shapes.
    flops_by_shape: dict[str, float] = {}
    # Wall time of each part of the export (import, quantize, onnx_export, parity, …).
    timings_s: dict[str, float] = {}


class LayerTime(_Model):
    """One layer of a per-layer profile, whichever tool made it: its time over the profiled runs,
    per run (the median where the tool gives it), and its share of the whole."""

    name: str
    total_ms: float
    average_ms: float
    median_ms: float | None = None
    percent: float


# A runtime's own evidence (trtexec's log and exports, a compiler's facts, how PyTorch ran) sits
# beside a build's or profile's core fields under its own keys, checked on writing against the
# model its runtime module owns (EngineRuntime.Evidence); the core and the reports read none of it.
_WITH_TOOL_EVIDENCE = ConfigDict(extra="allow")
# Those keys, as the runtimes' registry tells them (pipeline.runtimes.load_catalog): on reading, a
# key in a build's or profile's details that neither the core nor any runtime names was written by
# a newer version. None until told: every key is taken.
_tool_evidence_keys: frozenset[str] | None = None


def know_tool_evidence(keys) -> None:
    """The keys runtimes keep their own evidence under (every EngineRuntime.Evidence's fields)."""
    global _tool_evidence_keys
    _tool_evidence_keys = frozenset(keys)


class BuildDetails(_Model):
    model_config = _WITH_TOOL_EVIDENCE
    kind: Literal["build"] = "build"
    runtime: str
    runtime_version: str
    settings: dict[str, Any] = {}
    notes: list[str] = []
    # Layers whose precision differs from the variant's (a TensorRT build's layer information).
    precision_audit: dict[str, Any] | None = None
    # The node a TensorRT ONNX parser refused (trtexec's or TensorRT-RTX's, as its log says it:
    # pipeline/trtexec/onnx_parser.py): its number, op, name, output, the check and its words.
    parser_failure: dict[str, Any] | None = None
    # The smallest graph that still fails the same way, from `pipeline reduce` (pipeline/graph/reduce.py):
    # its file, the nodes before and after, the failure kept, the iterations and the time.
    reduced: dict[str, Any] | None = None
    # The floor a `pipeline plan` set, checked on this engine (pipeline/precision/built.py): per
    # metric the plan's figure and bound beside this engine's on the plan's confirmation samples.
    plan_check: dict[str, Any] | None = None


class ProfileDetails(_Model):
    model_config = _WITH_TOOL_EVIDENCE
    kind: Literal["profile"] = "profile"
    settings: ProfileSettings
    batch_size: int
    device: str
    # What per_iteration_ms measures: "host latency" (ONNX Runtime) or "GPU compute time" (trtexec).
    metric: str = "host latency"
    iterations: int
    total_walltime_s: float
    latency_ms: LatencyStats
    # Runs a second: the work done over the time it took (1000 / the runs' mean, or the tool's own
    # throughput), not 1000 / the median — stalled runs lower it.
    throughput_qps: float
    # Samples per second: images, sequences for token inputs, or samples of another model's inputs
    # (sample_unit: "img", "seq" or "sample").
    images_per_s: float
    sample_unit: str = "img"
    # Each input's shape as measured (name → dims), and the tokens per second of sequence models.
    input_shapes: dict[str, list[int]] = {}
    tokens_per_s: float | None = None
    # Kept so reports can test significance (bootstrap) and draw CDFs without re-measuring.
    per_iteration_ms: list[float]
    # With [profile] repeats > 1: each measurement's median and the coefficient of variation
    # across them.
    repeat_medians_ms: list[float] = []
    repeat_cv: float | None = None
    # How many measurements per_iteration_ms and latency_ms pool (their runs together); None in
    # manifests written before repeats were pooled, whose figures are the last measurement's.
    repeats_pooled: int | None = None
    # Earlier takes of the repeats, discarded because their medians disagreed beyond the catalog's
    # max_repeat_cv: each take's medians. stable is False when the last take disagreed too.
    retaken_medians_ms: list[list[float]] = []
    # Whether the retakes ran in a new process that loaded the engine afresh (runtimes that time
    # inside the pipeline's own process); None where nothing was retaken or the runtime's every
    # measurement is a process of its own (trtexec, the TensorRT-RTX driver).
    retaken_in_fresh_process: bool | None = None
    stable: bool | None = None
    # Engines are timed in rounds beside the shape point's other engines (pipeline/measuring/rounds.py):
    # each measurement's takes, round by round, and the group it was in, from which reports pair
    # engines round by round. Empty for a trtexec or TensorRT-RTX engine measured alone (one whole
    # run of its tool) and in manifests written before rounds.
    rounds: list[RoundsRecord] = []
    # The machine's load when the measurement started and ended: load average and CPU count, and
    # per GPU its utilisation, clocks and the other processes using it (pipeline/machine/environment.py);
    # "during": what was seen while each measurement ran (pipeline/measuring/machine_watch.py).
    machine_load: dict[str, Any] | None = None
    warnings: list[str] = []
    # The GPU it was timed on, by name, when the runtime knows it (for the roofline's peaks).
    gpu: str | None = None
    # Which GPU of the machine the shape point was measured on, as nvidia-smi numbers it: index,
    # UUID and name (the first CUDA_VISIBLE_DEVICES names); None without a GPU.
    gpu_device: dict[str, Any] | None = None
    # What the timing included, where the runtime has such settings: cuda_graph, data_transfers,
    # spin_wait (trtexec; the same meaning on every release). Rows compared side by side that were
    # measured under different settings are flagged by `pipeline compare`.
    measured_with: dict[str, bool] = {}
    # The GPU memory the engine ran in, where its runtime says, and what that counts ("peak
    # allocated by PyTorch", "TensorRT execution context").
    gpu_memory_mib: float | None = None
    gpu_memory_counts: str | None = None
    # Per-layer times, where the runtime profiles layers (a separate run after the timed ones).
    layer_times: list[LayerTime] = []
    # The engine's own outputs on the reference batch against the FP32 model's (AccuracyFigures),
    # or why they were not checked.
    accuracy: dict[str, Any] | None = None
    accuracy_skipped: str | None = None
    # Seconds this engine's point spent on it before its rounds, in this process: "prepare" (load,
    # compile, capture: the runtime's prepare) and "check" (its outputs on the reference batch
    # against FP32). Empty for a tool's engine measured alone and in manifests written before.
    preparation_s: dict[str, float] = {}
    # Whether that preparation and check were done ahead of its point, while the run waited for its
    # compilations (pipeline/stages/point.py, prepare_points_ahead): preparation_s is what they
    # cost then, not at the point.
    prepared_ahead: bool = False
    # Its serving after the rounds, one record a stream count and way of serving (threads,
    # processes, a tool's streams; docs/streams.md): inferences/s over the streams' common span,
    # each request's latency with its percentiles' intervals, or why it was not measured. Empty
    # where [profile] streams is [1] and in manifests written before (an addition inside schema 7).
    streams: list[ServedRecord] = []


StageDetails = Annotated[ExportDetails | BuildDetails | ProfileDetails, Field(discriminator="kind")]


class StageRecord(_Model):
    stage: Literal["export", "build", "profile"]
    # "failed": the tool ran and refused the input (a compiler rejecting the network); its outputs
    # are the tool's log, never an engine. "out_of_memory": the work did not fit (out_of_memory says
    # what ran out), a result kept like a measurement until --force. "faulted": a kernel faulted on
    # the GPU (fault says how). Failures of the machine (no GPU, a crash) are not recorded.
    status: Literal["done", "skipped", "failed", "out_of_memory", "faulted"]
    # Why the stage did not run ("skipped", e.g. a precision the runtime cannot execute), or the
    # tool's own reason for refusing ("failed").
    reason: str | None = None
    fingerprint: str
    finished_at: datetime
    duration_s: float
    inputs: list[Artifact] = []
    outputs: list[Artifact] = []
    # The exact argv of an outside tool the stage ran (trtexec), if any.
    command: list[str] | None = None
    params: dict[str, Any] = {}
    details: StageDetails | None = None
    out_of_memory: OutOfMemoryFacts | None = None
    fault: FaultFacts | None = None


def _shape_point(value: Any) -> Any:
    """A shape point as the pipeline writes it ("2x512"), also as reports print it ("2×512": a
    hand edit copied from a report reads the same)."""
    # "static" too: the one shape of a graph without dynamic axes. Kept as text (the file's form),
    # the label its sizes write back.
    return ShapeSizes.parse(written(value)).label if isinstance(value, str) else value


class EngineManifest(_Model):
    schema_version: int = SCHEMA_VERSION
    engine: str
    model: str
    variant: str
    precision: str
    sparsity: str | None = None
    # None for the toolchain-independent export manifest.
    toolchain: str | None = None
    # The GPU type this engine was built and timed for on a cluster (`--gpu`, or every GPU type the
    # cluster has); its outputs then live under engines/<toolchain>@<gpu>/. None on a local run.
    gpu_type: str | None = None
    # The shape point this manifest's profile is at ("2x512"), for models measured at several;
    # None for a model of one shape, and for the engine's own manifest (export and build).
    shape: Annotated[str | None, BeforeValidator(_shape_point)] = None
    environment: Environment
    export: StageRecord | None = None
    build: StageRecord | None = None
    profile: StageRecord | None = None
    # Where it was read from (a path, or ref:path in git), for errors about its contents.
    _source: str | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # Two manifests are equal when their contents are, wherever each was read from.
        return isinstance(other, EngineManifest) and self.model_dump() == other.model_dump()

    __hash__ = None  # mutable, like every pydantic model

    def stage(self, name: str) -> StageRecord | None:
        return getattr(self, name)

    def write(self, path: Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=2) + "\n")


def unknown_evidence(manifest: EngineManifest) -> list[str]:
    """The keys of a build's or profile's details that no runtime names (none until told)."""
    if _tool_evidence_keys is None:
        return []
    unknown = []
    for name in ("build", "profile"):
        record = getattr(manifest, name)
        extra = (record.details.model_extra or {}) if record is not None and record.details is not None else {}
        unknown += [f"{name}.details.{key}" for key in extra if key not in _tool_evidence_keys]
    return unknown

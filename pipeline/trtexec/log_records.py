"""What a trtexec log says, as records: the performance summaries, the device, errors, the trace's
averages, the per-layer profile, each tensor's shapes, and the log as a whole (TrtexecLog), which
pipeline/trtexec/log.py fills from the text.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

from pipeline.manifest import LayerTime

# Performance-summary labels → the names used in JSON. Every other label is kept under its own.
SUMMARY_FIELDS = {
    "Latency": "latency_ms",
    "Enqueue Time": "enqueue_ms",
    "H2D Latency": "h2d_ms",
    "GPU Compute Time": "gpu_compute_ms",
    "D2H Latency": "d2h_ms",
}


# Summary labels with one number (qps, s) rather than statistics, and where each is kept.
TOTAL_FIELDS = {
    "Throughput": "throughput_qps",
    "Total Host Walltime": "total_host_walltime_s",
    "Total GPU Compute Time": "total_gpu_compute_s",
}


class TimingSummary(BaseModel):
    """One line of trtexec's performance summary, in milliseconds."""

    min: float | None = None
    max: float | None = None
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    # Percentiles other than 90/95/99 (from --percentile=…), keyed by their label ("p50").
    other: dict[str, float] = {}


class DeviceInfo(BaseModel):
    name: str | None = None
    compute_capability: str | None = None
    sms: int | None = None
    memory_mib: int | None = None
    uuid: str | None = None


class TrtexecError(BaseModel):
    code: int | None = None
    message: str


class TraceAverage(BaseModel):
    runs: int
    gpu_ms: float
    host_ms: float
    enqueue_ms: float | None = None


class LayerProfile(BaseModel):
    iterations: int | None = None
    layers: list[LayerTime] = []
    total: LayerTime | None = None
    layout: Literal["name-first (8.x)", "name-last (10.x)"] | None = None


class ProfileShapes(BaseModel):
    """An input's range in one optimization profile, as trtexec prints dimensions ("1x128")."""

    min: str
    opt: str
    max: str


class TensorShapes(BaseModel):
    """What one input or output of the engine was built for and ran at."""

    name: str
    io: Literal["input", "output"] = "input"
    # Per optimization profile: the range it was built for (--minShapes/--optShapes/--maxShapes).
    profiles: dict[int, ProfileShapes] = {}
    # The shape inference ran at (--shapes, or what trtexec chose).
    inference: str | None = None
    # trtexec's own choice for a dynamic input given no shapes ("Automatically overriding shape to").
    automatic: str | None = None
    # The buffer the run used, and its type where trtexec says (10.x).
    binding: str | None = None
    dtype: str | None = None
    # Whether its profiles or inference shape were read from the command in trtexec's `&&&&`
    # banner, because no other line of the text states them (an options echo cut away).
    from_command_line: bool = False

    @computed_field
    @property
    def ran_at(self) -> str | None:
        """The shape of the run: an input's inference shape, else its binding, else trtexec's choice."""
        return self.binding if self.io == "output" else (self.inference or self.binding or self.automatic)


class SummaryFigures(BaseModel):
    """The figures of trtexec's performance summary."""

    throughput_qps: float | None = None
    latency_ms: TimingSummary | None = None
    gpu_compute_ms: TimingSummary | None = None
    enqueue_ms: TimingSummary | None = None
    h2d_ms: TimingSummary | None = None
    d2h_ms: TimingSummary | None = None
    # Summary lines with other labels, kept as printed.
    other_summaries: dict[str, TimingSummary] = {}
    total_host_walltime_s: float | None = None
    total_gpu_compute_s: float | None = None


class PerformanceSummary(SummaryFigures):
    """One run's performance summary. A text can hold several (a sweep grepped into one file)."""

    # What introduced it: the banner's command, or the free-standing line before it ("--- infStreams=2").
    label: str | None = None

    def has(self, label: str) -> bool:
        """Whether this summary already holds the line of that label."""
        field = SUMMARY_FIELDS.get(label) or TOTAL_FIELDS.get(label)
        return getattr(self, field) is not None if field else label in self.other_summaries

    @property
    def empty(self) -> bool:
        return not any(self.has(label) for label in (*SUMMARY_FIELDS, *TOTAL_FIELDS)) and not self.other_summaries


class TrtexecLog(SummaryFigures):
    trt_version: str | None = None
    version_code: str | None = None  # as in the banner: "v101601"
    build_tag: str | None = None  # "b11"
    command: str | None = None
    status: Literal["PASSED", "FAILED", "WAIVED"] | None = None
    options: dict[str, dict[str, str]] = {}
    device: DeviceInfo = Field(default_factory=DeviceInfo)
    # Every performance summary in the text, in order; the summary figures of the log itself
    # (SummaryFigures) are the last one's.
    summaries: list[PerformanceSummary] = []
    warnings: list[str] = []
    # Flags trtexec warned are deprecated ("--useCudaGraph is deprecated. CUDA graph is now …").
    deprecated_flags: list[str] = []
    errors: list[TrtexecError] = []
    trace: list[TraceAverage] = []
    trace_lines_omitted: int = 0
    profile: LayerProfile | None = None
    # Every input's shapes (and the outputs' bindings), in the order the log names them.
    tensors: list[TensorShapes] = []
    # Facts read from other lines: engine size, build time, memory.
    facts: dict[str, str] = {}

    def tensor(self, name: str, io: str = "input") -> TensorShapes:
        """The tensor of that name, added when first named."""
        for tensor in self.tensors:
            if tensor.name == name and tensor.io == io:
                return tensor
        tensor = TensorShapes(name=name, io=io)
        self.tensors.append(tensor)
        return tensor

    @property
    def finished(self) -> bool:
        return self.status is not None

    @property
    def has_summary(self) -> bool:
        return any(
            value is not None for value in (self.throughput_qps, self.latency_ms, self.gpu_compute_ms, self.total_host_walltime_s)
        ) or bool(self.other_summaries)


def decode_version(code: str) -> str:
    """Banner code → release: 101601 → 10.16.1, 100300 → 10.3.0, 8510 → 8.5.10, 8601 → 8.6.1."""
    number = int(code)
    if number >= 100000:  # TensorRT 10+: major*10000 + minor*100 + patch
        return f"{number // 10000}.{(number // 100) % 100}.{number % 100}"
    return f"{number // 1000}.{(number // 100) % 10}.{number % 100}"  # 8.x: major*1000 + minor*100 + patch

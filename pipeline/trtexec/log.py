"""Parse a trtexec log (stdout) into a :class:`TrtexecLog`.

Real logs are messy, and the parser is checked against recorded ones from TensorRT 8.5 to 10.16:
trailing spaces may or may not be stripped, some lines have no ``[date] [I]`` prefix (ONNX node
dumps, ``Layers:`` dumps, error continuations), 10.x prints ``... Omitting N lines`` inside the
trace, layer names carry control characters, and the per-layer profile table changed layout
between 8.x (name first) and 10.x (name last). Unknown lines are ignored, never fatal.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from pipeline.errors import PipelineError
from pipeline.trtexec.command_shapes import read_command_shapes
from pipeline.trtexec.text import log_lines, read_text

# "[date] [I] message", also pasted as "[I] message" and indented (inside a list, a quote).
_PREFIX = re.compile(r"^\s*(?:\[(?P<stamp>[^\]]*)\]\s*)?\[(?P<severity>[VIWEF])\] ?(?P<message>.*)$")
_BANNER = re.compile(
    r"^&&&& (?P<status>RUNNING|PASSED|FAILED|WAIVED) TensorRT\.trtexec \[TensorRT v(?P<code>\d+)\]"
    r"(?: \[(?P<build>b\d+)\])? # (?P<command>.*)$"
)
_SECTION = re.compile(r"^=== (?P<name>.+?) ===$")
# The "=" is optional: chat and markdown renderers eat it ("min 2.01 ms, max 4.5 ms").
_STAT = re.compile(r"(?<![\w(])(?P<label>min|max|mean|median|percentile\((?P<pct>[\d.]+)%\))\s*=?\s*(?P<value>[-+\d.eE]+|inf|nan)\s*ms\b")
_TRACE = re.compile(
    r"^Average on (?P<runs>\d+) runs - GPU latency: (?P<gpu>[\d.eE+-]+) ms - Host latency: (?P<host>[\d.eE+-]+) ms"
    r"(?: \(enqueue (?P<enqueue>[\d.eE+-]+) ms\))?"
)
_OMITTING = re.compile(r"^\.\.\. Omitting (?P<count>\d+) lines")
_PROFILE_HEADER = re.compile(r"^=== Profile \((?P<iterations>\d+) iterations ?\) ===$")
_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_ROW_NAME_LAST = re.compile(rf"^\s*(?P<numbers>(?:{_NUMBER}\s+){{3,4}})(?P<name>\S.*?)\s*$")
_ROW_NAME_FIRST = re.compile(rf"^\s*(?P<name>\S.*?)\s+(?P<numbers>(?:{_NUMBER}\s+){{2,3}}{_NUMBER})\s*$")
# Every wording trtexec has used: 8.x "--workspace flag has been deprecated by --memPoolSize flag",
# 10.x "--plugins flag has been deprecated, use --staticPlugins flag instead.", 10.x/11.x
# "--useCudaGraph is deprecated. CUDA graph is now enabled by default. …".
_DEPRECATED_FLAG = re.compile(r"^(--[A-Za-z0-9]+)(?:=\S*)?(?: flag)? (?:is|has been) deprecated\b")
# "Error Code 4: …" (TensorRT's error recorder) or "Error[4]: …" (trtexec's own prefix).
_ERROR_CODE = re.compile(r"Error(?: Code |\[)(?P<code>\d+)\]?: ?(?P<message>.*)")
_PARSER_ERROR = re.compile(r"^\[(?P<code>\d+)\] (?P<message>.+)$")
# Each input's shapes, in every wording trtexec has printed them (samples/common/sampleOptions.cpp
# and sampleEngines.cpp of the TensorRT OSS release): the options echo, one line per input
# ("Input build shape: x=1x3+2x3+4x3" in 8.x, "Input build shape (profile 0): x=…" in 10.x; the
# plural "… shapes: model" when none were given), what the builder and the context were told, and
# the bindings created for the run ("Created input binding for x with dimensions 32x128" in 8.x,
# "Input binding for x with dimensions 1x1x28x28 and type fp32 is created." in 10.x).
_BUILD_SHAPE = re.compile(
    r"^Input build shape(?: \(profile (?P<profile>\d+)\))?\s*:\s*(?P<name>.+)=(?P<min>[\dx]*)\+(?P<opt>[\dx]*)\+(?P<max>[\dx]*)$"
)
_INFERENCE_SHAPE = re.compile(r"^Input inference shape(?: \(profile \d+\))?\s*:\s*(?P<name>.+)=(?P<dims>[\dx]*)$")
_PROFILE_SET = re.compile(
    r"^Set shape of input tensor (?P<name>.+) for optimization profile (?P<profile>\d+) to: MIN=(?P<min>\S*) OPT=(?P<opt>\S*) MAX=(?P<max>\S*)$"
)
_CONTEXT_SET = re.compile(r"^Set shape of input tensor (?P<name>.+) to: (?P<dims>\S*)$")
_BINDING = re.compile(
    r"^(?:Created (?P<io8>input|output) binding for (?P<name8>.+) with dimensions (?P<dims8>\S*)"
    r"|(?P<io>Input|Output) binding for (?P<name>.+) with dimensions (?P<dims>\S*)(?: and type (?P<dtype>\S+))? is created\.)$"
)
_AUTOMATIC_SHAPE = re.compile(
    r"^Dynamic dimensions required for input: (?P<name>.+), but no shapes were provided\. Automatically overriding shape to: (?P<dims>\S+)$"
)

# Performance-summary labels → the names used in JSON. Every other label is kept under its own.
SUMMARY_FIELDS = {
    "Latency": "latency_ms",
    "Enqueue Time": "enqueue_ms",
    "H2D Latency": "h2d_ms",
    "GPU Compute Time": "gpu_compute_ms",
    "D2H Latency": "d2h_ms",
}


# Summary labels with one number (qps, s) rather than statistics, and where each is kept.
_TOTAL_FIELDS = {
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


class LayerTime(BaseModel):
    name: str
    total_ms: float
    average_ms: float
    median_ms: float | None = None
    percent: float


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
        field = SUMMARY_FIELDS.get(label) or _TOTAL_FIELDS.get(label)
        return getattr(self, field) is not None if field else label in self.other_summaries

    @property
    def empty(self) -> bool:
        return not any(self.has(label) for label in (*SUMMARY_FIELDS, *_TOTAL_FIELDS)) and not self.other_summaries


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


def _summary(text: str) -> TimingSummary:
    summary = TimingSummary()
    other = {}
    for match in _STAT.finditer(text):
        value = float(match.group("value"))
        pct = match.group("pct")
        if pct is None:
            setattr(summary, match.group("label"), value)
        else:
            key = "p" + pct.rstrip("0").rstrip(".") if "." in pct else "p" + pct
            if key in ("p90", "p95", "p99"):
                setattr(summary, key, value)
            else:
                other[key] = value
    summary.other = other
    return summary


def _floats(text: str) -> list[float]:
    return [float(v) for v in re.findall(_NUMBER, text)]


_FACTS = (
    ("engine_size", re.compile(r"^(?:\[TRT\] )?Loaded engine size: (.+)$")),
    ("engine_built_in", re.compile(r"^Engine built in (.+)$")),
    ("engine_deserialized_in", re.compile(r"^Engine deserialized in (.+)$")),
    ("created_engine_size", re.compile(r"^Created engine with size: (.+)$")),
    ("device_memory_size", re.compile(r"^Created execution context with device memory size: (.+)$")),
)


def parse_log(text: str) -> TrtexecLog:
    """Every fact the text holds. Lines are recognised by their content: with or without the
    ``[date] [I]`` prefix, indented or not, CRLF or LF, so a pasted fragment reads like a whole log."""
    log = TrtexecLog()
    section: str | None = None
    in_summary = False
    summary = PerformanceSummary()
    label: str | None = None  # what introduces the next summary
    profile: LayerProfile | None = None
    profile_layout: str | None = None
    last_error: TrtexecError | None = None
    in_node_dump = False
    last_warning_index: int | None = None
    prefixed_lines = 0

    def start_summary() -> PerformanceSummary:
        nonlocal summary
        if not summary.empty:
            log.summaries.append(summary)
            summary = PerformanceSummary()
        summary.label = label
        return summary

    def summary_line(text: str, any_label: bool) -> bool:
        """Put a summary line into the current summary, starting a new one when it already has
        that line (the next run of a sweep)."""
        nonlocal summary
        name = text.partition(":")[0].strip()
        if summary.has(name):
            start_summary()
        elif summary.empty:
            summary.label = label
        return _summary_line(summary, text, any_label)

    for raw in trtexec_lines(text):
        line = raw.rstrip()
        banner = _BANNER.match(line.strip())
        if banner:
            log.version_code = "v" + banner.group("code")
            log.build_tag = banner.group("build")
            log.command = banner.group("command").strip()
            label = log.command
            if log.trt_version is None:
                log.trt_version = decode_version(banner.group("code"))
            if banner.group("status") != "RUNNING":
                log.status = banner.group("status")
            last_error = None
            continue

        prefixed = _PREFIX.match(line)
        if prefixed:
            prefixed_lines += 1
            severity, message = prefixed.group("severity"), prefixed.group("message")
        elif in_node_dump:
            continue  # the ONNX node an error is about, printed as protobuf text
        elif last_error is not None and line.strip() and _continues(last_error.message, line.strip()):
            # The rest of an error message ("[6] creator && …", or a message that wraps).
            detail = _PARSER_ERROR.match(line.strip())
            if detail:
                last_error.code = int(detail.group("code"))
                last_error.message = f"{last_error.message} {detail.group('message')}".strip()
            else:
                last_error.message = f"{last_error.message} {line.strip()}"
            continue
        else:
            # A line without a prefix is read like an [I] line: pasted text loses its prefixes.
            severity, message = "I", line
        stripped = message.strip()

        if severity == "E":
            if stripped.startswith("[TRT] ModelImporter.cpp") and "--- " in stripped:
                in_node_dump = "--- Begin node ---" in stripped
                continue  # node dump delimiters
            coded = _ERROR_CODE.search(stripped)
            error = TrtexecError(code=int(coded.group("code")) if coded else None, message=stripped)
            log.errors.append(error)
            last_error = error
            continue
        last_error = None
        in_node_dump = False

        if severity == "W":
            if message.startswith("  ") and last_warning_index is not None:
                log.warnings[last_warning_index] += " " + stripped  # continuation of "* …" advice
            else:
                log.warnings.append(stripped)
                last_warning_index = len(log.warnings) - 1
                automatic = _AUTOMATIC_SHAPE.match(stripped)
                if automatic:
                    log.tensor(automatic.group("name")).automatic = automatic.group("dims")
                deprecated = _DEPRECATED_FLAG.match(stripped)
                if deprecated and deprecated.group(1) not in log.deprecated_flags:
                    log.deprecated_flags.append(deprecated.group(1))
            continue
        last_warning_index = None

        header = _PROFILE_HEADER.match(stripped)
        if header:
            profile = LayerProfile(iterations=int(header.group("iterations")))
            log.profile = profile
            profile_layout = None
            section, in_summary = None, False
            continue
        if profile is not None:
            if not stripped:
                profile = None  # a blank line ends the table
                continue
            if profile_layout is None:
                profile_layout = "name-first (8.x)" if stripped.startswith("Layer") else "name-last (10.x)"
                profile.layout = profile_layout
                continue
            row = _profile_row(message, profile_layout)
            if row is None:
                profile = None  # not a row: the table ended without its blank line (a grepped text)
            elif row.name == "Total":
                profile.total = row
                continue
            else:
                profile.layers.append(row)
                continue

        sect = _SECTION.match(stripped)
        if sect:
            name = sect.group("name")
            in_summary = name == "Performance summary"
            if in_summary:
                start_summary()
            section = None if in_summary else name
            if section and (section.endswith("Options") or section == "Device Information"):
                log.options.setdefault(section, {})
            continue

        if in_summary:
            if not summary_line(stripped, any_label=True):
                in_summary = bool(stripped)
            continue
        if _is_summary_line(stripped):
            summary_line(stripped, any_label=False)  # outside its section: pasted without the header
            continue

        trace = _TRACE.match(stripped)
        if trace:
            log.trace.append(
                TraceAverage(
                    runs=int(trace.group("runs")),
                    gpu_ms=float(trace.group("gpu")),
                    host_ms=float(trace.group("host")),
                    enqueue_ms=float(trace.group("enqueue")) if trace.group("enqueue") else None,
                )
            )
            continue
        omitted = _OMITTING.match(stripped)
        if omitted:
            log.trace_lines_omitted += int(omitted.group("count"))
            continue

        if severity == "I" and _shape_line(log, stripped):
            continue
        if stripped.startswith("TensorRT version:"):
            log.trt_version = stripped.split(":", 1)[1].strip()
            continue
        if section == "Device Information" or stripped.startswith(("Selected Device", "Compute Capability")):
            _device_line(log.device, stripped)
        if severity == "I" and section in log.options and ":" in stripped and not stripped.startswith("[TRT]"):
            key, value = stripped.split(":", 1)
            log.options[section][key.strip()] = value.strip()
            continue
        if not stripped:
            section = None
            continue
        for name, pattern in _FACTS:
            fact = pattern.match(stripped)
            if fact:
                log.facts[name] = fact.group(1).strip()
                break
        else:
            if not prefixed and len(stripped) <= 120:
                label = stripped  # a free-standing line: what a grepped sweep writes before each run

    if not summary.empty:
        log.summaries.append(summary)
    if log.command:
        _shapes_from_command(log, log.command)
    if log.summaries:
        last = log.summaries[-1]
        for field in SummaryFigures.model_fields:
            setattr(log, field, getattr(last, field))
    if not (prefixed_lines or log.command or log.summaries or log.trace or log.profile or log.options):
        raise PipelineError(
            "this does not look like trtexec output: no `&&&&` banner, no `[I]`/`[W]`/`[E]` lines and no performance summary.",
            hint="pass the file trtexec printed to stdout (e.g. `trtexec … | tee build.log`)",
        )
    if len(log.summaries) > 1:
        named = "; ".join(f"{index}: {s.label or 'unlabelled'}" for index, s in enumerate(log.summaries, 1))
        log.warnings.append(
            f"the text holds {len(log.summaries)} runs' performance summaries ({named}): each is under `summaries`, "
            "the top-level figures are the last one's"
        )
    if log.status is None and log.command is not None:
        log.warnings.append("the log ends before trtexec finished (no PASSED/FAILED line): truncated or killed")
    if log.status is None and not log.has_summary:
        log.warnings.append(NOTHING_TO_REPORT)
    return log


def _shapes_from_command(log: TrtexecLog, command: str) -> None:
    """Each input's profiles and inference shape from the command trtexec echoed, where no other
    line of the text states them."""
    shapes = read_command_shapes(command, log.trt_version)
    for name in dict.fromkeys([*shapes.profiles, *shapes.inference]):
        tensor = log.tensor(name)
        for index, (low, opt, high) in shapes.profiles.get(name, {}).items():
            if index not in tensor.profiles:
                tensor.profiles[index] = ProfileShapes(min=low, opt=opt, max=high)
                tensor.from_command_line = True
        if tensor.inference is None and name in shapes.inference:
            tensor.inference = shapes.inference[name]
            tensor.from_command_line = True


# Where a trtexec line starts inside a longer one: its banner, or a severity tag with or without
# the date trtexec writes before it ("[07/07/2026-02:11:26] [I] ").
_LINE_START = re.compile(
    r"&&&& (?:RUNNING|PASSED|FAILED|WAIVED) TensorRT\.trtexec\b|\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[VIWEF]\]|\[[VIWEF]\] "
)
# Lines trtexec prints without a severity tag, which may follow a separator in a joined log.
# (A "[6] …" line is the detail of a parser error.)
_UNTAGGED_START = re.compile(r"=== |Layer\(|Name: |Bindings:|--- |Average on \d|\.\.\. Omitting |\[\d+\] ")
# Characters a line's own text ends with, never a separator's first.
_LINE_END_CHARACTERS = re.compile(r"^[\w)\]}.%'\"]+")


def trtexec_lines(text: str) -> list[str]:
    """The text's lines as trtexec printed them: split at line feeds, a log pasted onto one line
    split again at its separator, a wrapper's prefix before every line taken off, text before
    trtexec's own time stamp on a line taken off, and summary lines run together split apart."""
    lines = _without_wrapper_prefix([piece for line in log_lines(text) for piece in _split_joined(line)])
    return [piece for line in lines for piece in _split_summaries(_from_time_stamp(line))]


# trtexec's own time stamp and severity tag ("[12/03/2025-10:11:12] [E] "): distinctive enough to
# tell where its line starts after foreign text.
_DATED_TAG = re.compile(r"\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[VIWEF]\]")
_SUMMARY_LABEL = "|".join(re.escape(label) for label in sorted([*SUMMARY_FIELDS, *_TOTAL_FIELDS], key=len, reverse=True))
# Where a summary line run onto the one before it starts: after the unit that ends a summary line's
# figures, a summary label and its colon, or a severity tag (with or without its time stamp).
_SUMMARY_JOIN = re.compile(rf"(?:(?<=\bms)|(?<=\bs)|(?<=\bqps))\s+(?=(?:{_SUMMARY_LABEL}):|(?:\[[^\]]*\]\s*)?\[[VIWEF]\] )")


def _from_time_stamp(line: str) -> str:
    """A line that does not start as trtexec's do but holds trtexec's dated tag (a markdown list
    item, "* build step: failed [12/03/2025-10:11:12] [E] Error[3]: …"), from that tag on."""
    stripped = line.lstrip()
    if _PREFIX.match(stripped) or _BANNER.match(stripped):
        return line
    found = _DATED_TAG.search(line)
    return line[found.start() :] if found else line


def _split_summaries(line: str) -> list[str]:
    """A performance-summary line with the lines after it run onto it (their line feeds lost in a
    paste: "… D2H Latency: … ms Total Host Walltime: 3.0 s [W] * Throughput may be …"), as its lines."""
    tagged = _PREFIX.match(line)
    message = tagged.group("message") if tagged else line.strip()
    if message.partition(":")[0].strip() not in (*SUMMARY_FIELDS, *_TOTAL_FIELDS):
        return [line]
    return _SUMMARY_JOIN.split(line)


def _split_joined(line: str) -> list[str]:
    """A line holding several trtexec lines, joined by a separator (" / ", " | ", a literal "\\n"),
    as its lines. The separator is what comes before every line start; the line is split there,
    and at the separator where an untagged trtexec line (a layer, a section header) follows.
    A line with fewer than three line starts is left alone."""
    starts = [match.start() for match in _LINE_START.finditer(line)]
    if len(starts) < 3:
        return [line]
    separator = _common_suffix([line[begin:end] for begin, end in zip(starts, starts[1:])])
    end_of_line = _LINE_END_CHARACTERS.match(separator)
    if end_of_line:
        separator = separator[end_of_line.end() :]
    if not separator.strip():  # joined by nothing but spaces: split only where a tagged line starts
        return [line[begin:end] for begin, end in zip([0, *starts[1:]], [*starts[1:], len(line)])]
    head = line[: starts[0]]
    # Untagged lines before the first tagged one ("--- infStreams=1 / [date] [I] …"), unless what
    # comes first is a prefix of the first line itself.
    first = 0 if not head.endswith(separator) else starts[0]
    pieces = _split_untagged(head[: -len(separator)], separator) if first else []
    for begin, end in zip([first, *starts[1:]], [*starts[1:], len(line) + len(separator)]):
        pieces += _split_untagged(line[begin : end - len(separator)], separator)
    return [piece for piece in pieces if piece.strip()]


def _split_untagged(piece: str, separator: str) -> list[str]:
    """A piece between two tagged lines, split where the separator comes before an untagged line."""
    parts = piece.split(separator)
    joined = [parts[0]]
    for part in parts[1:]:
        if not part.strip() or _UNTAGGED_START.match(part.lstrip()):
            joined.append(part)  # an empty line, or an untagged trtexec line
        else:
            joined[-1] += separator + part  # the separator's text belongs to the line
    return joined


def _common_suffix(texts: list[str]) -> str:
    shortest = min(texts, key=len)
    length = 0
    while length < len(shortest) and all(text[len(text) - length - 1] == shortest[len(shortest) - length - 1] for text in texts):
        length += 1
    return shortest[len(shortest) - length :]


def _without_wrapper_prefix(lines: list[str]) -> list[str]:
    """``lines`` without the prefix a wrapper put before each of them ("[INFO] ", "bench | ", a
    time stamp of its own): the text before trtexec's tag or banner, the same on nearly every
    tagged line (digits may differ), taken off every line that starts with it."""
    prefixes = [line[: match.start()] for line in lines if (match := _LINE_START.search(line))]
    if len(prefixes) < 3:
        return lines
    shapes = Counter(re.sub(r"\d+", "0", prefix) for prefix in prefixes)
    shape, count = shapes.most_common(1)[0]
    if not shape.strip() or count < 0.9 * len(prefixes):
        return lines
    pattern = re.compile("".join(r"\d+" if part == "0" else re.escape(part) for part in re.split(r"(0)", shape) if part))
    return [line[match.end() :] if (match := pattern.match(line)) else line for line in lines]


def _continues(message: str, line: str) -> bool:
    """Whether an unprefixed line goes on with the error before it: a parser's "[6] …" detail, or
    a message left open (ending in ":" or with a bracket not yet closed)."""
    if _PARSER_ERROR.match(line):
        return True
    open_brackets = message.count("(") - message.count(")") + message.count("[") - message.count("]")
    return message.endswith(":") or open_brackets > 0


NOTHING_TO_REPORT = "no performance summary and no PASSED/FAILED line: there is nothing to report from this text"


def _shape_line(log: TrtexecLog, text: str) -> bool:
    """Record an input's or output's shapes from this line; False when it names none."""
    found = _BUILD_SHAPE.match(text) or _PROFILE_SET.match(text)
    if found:
        profile = int(found.group("profile") or 0)
        shapes = ProfileShapes(min=found.group("min"), opt=found.group("opt"), max=found.group("max"))
        log.tensor(found.group("name").strip()).profiles[profile] = shapes
        return True
    found = _INFERENCE_SHAPE.match(text) or _CONTEXT_SET.match(text)
    if found:
        log.tensor(found.group("name").strip()).inference = found.group("dims")
        return True
    found = _BINDING.match(text)
    if found:
        if found.group("name8") is not None:
            tensor = log.tensor(found.group("name8"), found.group("io8"))
            tensor.binding = found.group("dims8")
        else:
            tensor = log.tensor(found.group("name"), found.group("io").lower())
            tensor.binding, tensor.dtype = found.group("dims"), found.group("dtype") or tensor.dtype
        return True
    return False


def _is_summary_line(text: str) -> bool:
    """A performance-summary line wherever it stands: a known label and its numbers."""
    label, colon, rest = text.partition(":")
    if not colon:
        return False
    label = label.strip()
    if label in SUMMARY_FIELDS:
        return _STAT.search(rest) is not None
    return label in _TOTAL_FIELDS and bool(re.match(rf"\s*{_NUMBER}\s*(qps|s)\b", rest))


def _summary_line(summary: PerformanceSummary, text: str, any_label: bool) -> bool:
    """Read one summary line into ``summary``; labels other than trtexec's own only inside the
    summary section (``any_label``)."""
    if not text or ":" not in text:
        return False
    label, rest = (part.strip() for part in text.split(":", 1))
    if label in _TOTAL_FIELDS:
        values = _floats(rest)
        if not values:
            return False
        setattr(summary, _TOTAL_FIELDS[label], values[0])
    elif _STAT.search(rest) and (any_label or label in SUMMARY_FIELDS):
        if label in SUMMARY_FIELDS:
            setattr(summary, SUMMARY_FIELDS[label], _summary(rest))
        else:
            summary.other_summaries[label] = _summary(rest)
    else:
        return False
    return True


def _device_line(device: DeviceInfo, text: str) -> None:
    if ":" not in text:
        return
    key, value = (part.strip() for part in text.split(":", 1))
    if key == "Selected Device":
        device.name = value
    elif key == "Compute Capability":
        device.compute_capability = value
    elif key == "SMs" and value.isdigit():
        device.sms = int(value)
    elif key == "Device Global Memory":
        numbers = _floats(value)
        device.memory_mib = int(numbers[0]) if numbers else None
    elif key == "Selected Device UUID":
        device.uuid = value


def _profile_row(message: str, layout: str) -> LayerTime | None:
    pattern = _ROW_NAME_LAST if layout == "name-last (10.x)" else _ROW_NAME_FIRST
    match = pattern.match(message)
    if not match:
        return None
    numbers = [float(v) for v in match.group("numbers").split()]
    if len(numbers) == 4:
        total, average, median, percent = numbers
    else:  # tables without a median column (before 8.5)
        total, average, percent = numbers
        median = None
    return LayerTime(name=match.group("name").strip(), total_ms=total, average_ms=average, median_ms=median, percent=percent)


def read_log(path: Path) -> TrtexecLog:
    try:
        text = read_text(path)
    except OSError as exc:
        raise PipelineError(f"cannot read trtexec log {path}: {exc.strerror or exc}.") from exc
    return parse_log(text)

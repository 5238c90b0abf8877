"""Parse a trtexec log (stdout) into a :class:`TrtexecLog`.

Real logs are messy, and the parser is checked against recorded ones from TensorRT 8.5 to 10.16:
trailing spaces may or may not be stripped, some lines have no ``[date] [I]`` prefix (ONNX node
dumps, ``Layers:`` dumps, error continuations), 10.x prints ``... Omitting N lines`` inside the
trace, layer names carry control characters, and the per-layer profile table changed layout
between 8.x (name first) and 10.x (name last). Unknown lines are ignored, never fatal.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.manifest import LayerTime
from pipeline.running.errors import PipelineError
from pipeline.trtexec.command_shapes import read_command_shapes
from pipeline.trtexec.log_lines import BANNER, PREFIX, trtexec_lines
from pipeline.trtexec.log_records import (
    SUMMARY_FIELDS,
    TOTAL_FIELDS,
    DeviceInfo,
    LayerProfile,
    PerformanceSummary,
    ProfileShapes,
    SummaryFigures,
    TimingSummary,
    TraceAverage,
    TrtexecError,
    TrtexecLog,
    decode_version,
)
from pipeline.trtexec.text import read_text

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
    reader = _LogReader()
    for raw in trtexec_lines(text):
        reader.read(raw.rstrip())
    return reader.finish()


class _LogReader:
    """Reads a log line by line: where it is (a section, the summary, the per-layer profile, an
    error that goes on) decides what a line means."""

    def __init__(self):
        self.log = TrtexecLog()
        self.section: str | None = None
        self.in_summary = False
        self.summary = PerformanceSummary()
        self.label: str | None = None  # what introduces the next summary
        self.profile: LayerProfile | None = None
        self.profile_layout: str | None = None
        self.last_error: TrtexecError | None = None
        self.in_node_dump = False
        self.last_warning_index: int | None = None
        self.prefixed_lines = 0

    def read(self, line: str) -> None:
        banner = BANNER.match(line.strip())
        if banner:
            self._banner(banner)
            return
        prefixed = PREFIX.match(line)
        if prefixed:
            self.prefixed_lines += 1
            severity, message = prefixed.group("severity"), prefixed.group("message")
        elif self.in_node_dump:
            return  # the ONNX node an error is about, printed as protobuf text
        elif self.last_error is not None and line.strip() and _continues(self.last_error.message, line.strip()):
            self._error_continues(line.strip())
            return
        else:
            # A line without a prefix is read like an [I] line: pasted text loses its prefixes.
            severity, message = "I", line
        stripped = message.strip()
        if severity == "E":
            self._error(stripped)
            return
        self.last_error = None
        self.in_node_dump = False
        if severity == "W":
            self._warning(message, stripped)
            return
        self.last_warning_index = None
        if self._profile_line(message, stripped) or self._section_line(stripped) or self._summary_or_trace(stripped):
            return
        self._info(severity, stripped, bool(prefixed))

    def _banner(self, banner) -> None:
        log = self.log
        log.version_code = "v" + banner.group("code")
        log.build_tag = banner.group("build")
        log.command = banner.group("command").strip()
        self.label = log.command
        if log.trt_version is None:
            log.trt_version = decode_version(banner.group("code"))
        if banner.group("status") != "RUNNING":
            log.status = banner.group("status")
        self.last_error = None

    def _error_continues(self, text: str) -> None:
        """The rest of an error message ("[6] creator && …", or a message that wraps)."""
        detail = _PARSER_ERROR.match(text)
        if detail:
            self.last_error.code = int(detail.group("code"))
            self.last_error.message = f"{self.last_error.message} {detail.group('message')}".strip()
        else:
            self.last_error.message = f"{self.last_error.message} {text}"

    def _error(self, stripped: str) -> None:
        if stripped.startswith("[TRT] ModelImporter.cpp") and "--- " in stripped:
            self.in_node_dump = "--- Begin node ---" in stripped
            return  # node dump delimiters
        coded = _ERROR_CODE.search(stripped)
        error = TrtexecError(code=int(coded.group("code")) if coded else None, message=stripped)
        self.log.errors.append(error)
        self.last_error = error

    def _warning(self, message: str, stripped: str) -> None:
        log = self.log
        if message.startswith("  ") and self.last_warning_index is not None:
            log.warnings[self.last_warning_index] += " " + stripped  # continuation of "* …" advice
            return
        log.warnings.append(stripped)
        self.last_warning_index = len(log.warnings) - 1
        automatic = _AUTOMATIC_SHAPE.match(stripped)
        if automatic:
            log.tensor(automatic.group("name")).automatic = automatic.group("dims")
        deprecated = _DEPRECATED_FLAG.match(stripped)
        if deprecated and deprecated.group(1) not in log.deprecated_flags:
            log.deprecated_flags.append(deprecated.group(1))

    def _profile_line(self, message: str, stripped: str) -> bool:
        """The per-layer profile's header or one of its rows; False where the line is neither."""
        header = _PROFILE_HEADER.match(stripped)
        if header:
            self.profile = LayerProfile(iterations=int(header.group("iterations")))
            self.log.profile = self.profile
            self.profile_layout = None
            self.section, self.in_summary = None, False
            return True
        if self.profile is None:
            return False
        if not stripped:
            self.profile = None  # a blank line ends the table
            return True
        if self.profile_layout is None:
            self.profile_layout = "name-first (8.x)" if stripped.startswith("Layer") else "name-last (10.x)"
            self.profile.layout = self.profile_layout
            return True
        row = _profile_row(message, self.profile_layout)
        if row is None:
            self.profile = None  # not a row: the table ended without its blank line (a grepped text)
            return False
        if row.name == "Total":
            self.profile.total = row
        else:
            self.profile.layers.append(row)
        return True

    def _section_line(self, stripped: str) -> bool:
        sect = _SECTION.match(stripped)
        if not sect:
            return False
        name = sect.group("name")
        self.in_summary = name == "Performance summary"
        if self.in_summary:
            self._start_summary()
        self.section = None if self.in_summary else name
        if self.section and (self.section.endswith("Options") or self.section == "Device Information"):
            self.log.options.setdefault(self.section, {})
        return True

    def _summary_or_trace(self, stripped: str) -> bool:
        """A line of the performance summary (in its section, or pasted without the header), or of
        the trace's averages; False where the line is none of them."""
        if self.in_summary:
            if not self._summary_line(stripped, any_label=True):
                self.in_summary = bool(stripped)
            return True
        if _is_summary_line(stripped):
            self._summary_line(stripped, any_label=False)  # outside its section: pasted without the header
            return True
        trace = _TRACE.match(stripped)
        if trace:
            self.log.trace.append(
                TraceAverage(
                    runs=int(trace.group("runs")),
                    gpu_ms=float(trace.group("gpu")),
                    host_ms=float(trace.group("host")),
                    enqueue_ms=float(trace.group("enqueue")) if trace.group("enqueue") else None,
                )
            )
            return True
        omitted = _OMITTING.match(stripped)
        if omitted:
            self.log.trace_lines_omitted += int(omitted.group("count"))
            return True
        return False

    def _info(self, severity: str, stripped: str, prefixed: bool) -> None:
        """Shapes, the release, device information, an options section's settings, or a fact."""
        log = self.log
        if severity == "I" and _shape_line(log, stripped):
            return
        if stripped.startswith("TensorRT version:"):
            log.trt_version = stripped.split(":", 1)[1].strip()
            return
        if self.section == "Device Information" or stripped.startswith(("Selected Device", "Compute Capability")):
            _device_line(log.device, stripped)
        if severity == "I" and self.section in log.options and ":" in stripped and not stripped.startswith("[TRT]"):
            key, value = stripped.split(":", 1)
            log.options[self.section][key.strip()] = value.strip()
            return
        if not stripped:
            self.section = None
            return
        for name, pattern in _FACTS:
            fact = pattern.match(stripped)
            if fact:
                log.facts[name] = fact.group(1).strip()
                return
        if not prefixed and len(stripped) <= 120:
            self.label = stripped  # a free-standing line: what a grepped sweep writes before each run

    def _start_summary(self) -> PerformanceSummary:
        if not self.summary.empty:
            self.log.summaries.append(self.summary)
            self.summary = PerformanceSummary()
        self.summary.label = self.label
        return self.summary

    def _summary_line(self, text: str, any_label: bool) -> bool:
        """Put a summary line into the current summary, starting a new one when it already has
        that line (the next run of a sweep)."""
        name = text.partition(":")[0].strip()
        if self.summary.has(name):
            self._start_summary()
        elif self.summary.empty:
            self.summary.label = self.label
        return _summary_line(self.summary, text, any_label)

    def finish(self) -> TrtexecLog:
        log = self.log
        if not self.summary.empty:
            log.summaries.append(self.summary)
        if log.command:
            _shapes_from_command(log, log.command)
        if log.summaries:
            last = log.summaries[-1]
            for field in SummaryFigures.model_fields:
                setattr(log, field, getattr(last, field))
        if not (self.prefixed_lines or log.command or log.summaries or log.trace or log.profile or log.options):
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
    return label in TOTAL_FIELDS and bool(re.match(rf"\s*{_NUMBER}\s*(qps|s)\b", rest))


def _summary_line(summary: PerformanceSummary, text: str, any_label: bool) -> bool:
    """Read one summary line into ``summary``; labels other than trtexec's own only inside the
    summary section (``any_label``)."""
    if not text or ":" not in text:
        return False
    label, rest = (part.strip() for part in text.split(":", 1))
    if label in TOTAL_FIELDS:
        values = _floats(rest)
        if not values:
            return False
        setattr(summary, TOTAL_FIELDS[label], values[0])
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

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

from pipeline.running.errors import PipelineError
from pipeline.trtexec.command_shapes import read_command_shapes
from pipeline.trtexec.log_facts import device_line, is_summary_line, profile_row, shape_line, summary_line
from pipeline.trtexec.log_lines import BANNER, PREFIX, trtexec_lines
from pipeline.trtexec.log_records import (
    LayerProfile,
    PerformanceSummary,
    ProfileShapes,
    SummaryFigures,
    TraceAverage,
    TrtexecError,
    TrtexecLog,
    decode_version,
)
from pipeline.trtexec.text import read_text

_SECTION = re.compile(r"^=== (?P<name>.+?) ===$")
_TRACE = re.compile(
    r"^Average on (?P<runs>\d+) runs - GPU latency: (?P<gpu>[\d.eE+-]+) ms - Host latency: (?P<host>[\d.eE+-]+) ms"
    r"(?: \(enqueue (?P<enqueue>[\d.eE+-]+) ms\))?"
)
_OMITTING = re.compile(r"^\.\.\. Omitting (?P<count>\d+) lines")
_PROFILE_HEADER = re.compile(r"^=== Profile \((?P<iterations>\d+) iterations ?\) ===$")
# Every wording trtexec has used: 8.x "--workspace flag has been deprecated by --memPoolSize flag",
# 10.x "--plugins flag has been deprecated, use --staticPlugins flag instead.", 10.x/11.x
# "--useCudaGraph is deprecated. CUDA graph is now enabled by default. …".
_DEPRECATED_FLAG = re.compile(r"^(--[A-Za-z0-9]+)(?:=\S*)?(?: flag)? (?:is|has been) deprecated\b")
# "Error Code 4: …" (TensorRT's error recorder) or "Error[4]: …" (trtexec's own prefix).
_ERROR_CODE = re.compile(r"Error(?: Code |\[)(?P<code>\d+)\]?: ?(?P<message>.*)")
_PARSER_ERROR = re.compile(r"^\[(?P<code>\d+)\] (?P<message>.+)$")
_AUTOMATIC_SHAPE = re.compile(
    r"^Dynamic dimensions required for input: (?P<name>.+), but no shapes were provided\. Automatically overriding shape to: (?P<dims>\S+)$"
)


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
        row = profile_row(message, self.profile_layout)
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
        if is_summary_line(stripped):
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
        if severity == "I" and shape_line(log, stripped):
            return
        if stripped.startswith("TensorRT version:"):
            log.trt_version = stripped.split(":", 1)[1].strip()
            return
        if self.section == "Device Information" or stripped.startswith(("Selected Device", "Compute Capability")):
            device_line(log.device, stripped)
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
        return summary_line(self.summary, text, any_label)

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


def read_log(path: Path) -> TrtexecLog:
    try:
        text = read_text(path)
    except OSError as exc:
        raise PipelineError(f"cannot read trtexec log {path}: {exc.strerror or exc}.") from exc
    return parse_log(text)

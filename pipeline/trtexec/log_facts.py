"""What one line of a trtexec log states, in every wording trtexec has printed it: an input's or
output's shapes, a figure of the performance summary, the device, a row of the per-layer profile.
pipeline/trtexec/log.py reads the log line by line and asks these."""

from __future__ import annotations

import re

from pipeline.manifest import LayerTime
from pipeline.trtexec.log_records import (
    SUMMARY_FIELDS,
    TOTAL_FIELDS,
    DeviceInfo,
    PerformanceSummary,
    ProfileShapes,
    TimingSummary,
    TrtexecLog,
)

# The "=" is optional: chat and markdown renderers eat it ("min 2.01 ms, max 4.5 ms").
STAT = re.compile(r"(?<![\w(])(?P<label>min|max|mean|median|percentile\((?P<pct>[\d.]+)%\))\s*=?\s*(?P<value>[-+\d.eE]+|inf|nan)\s*ms\b")
NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
ROW_NAME_LAST = re.compile(rf"^\s*(?P<numbers>(?:{NUMBER}\s+){{3,4}})(?P<name>\S.*?)\s*$")
ROW_NAME_FIRST = re.compile(rf"^\s*(?P<name>\S.*?)\s+(?P<numbers>(?:{NUMBER}\s+){{2,3}}{NUMBER})\s*$")
# Each input's shapes, in every wording trtexec has printed them (samples/common/sampleOptions.cpp
# and sampleEngines.cpp of the TensorRT OSS release): the options echo, one line per input
# ("Input build shape: x=1x3+2x3+4x3" in 8.x, "Input build shape (profile 0): x=…" in 10.x; the
# plural "… shapes: model" when none were given), what the builder and the context were told, and
# the bindings created for the run ("Created input binding for x with dimensions 32x128" in 8.x,
# "Input binding for x with dimensions 1x1x28x28 and type fp32 is created." in 10.x).
BUILD_SHAPE = re.compile(
    r"^Input build shape(?: \(profile (?P<profile>\d+)\))?\s*:\s*(?P<name>.+)=(?P<min>[\dx]*)\+(?P<opt>[\dx]*)\+(?P<max>[\dx]*)$"
)
INFERENCE_SHAPE = re.compile(r"^Input inference shape(?: \(profile \d+\))?\s*:\s*(?P<name>.+)=(?P<dims>[\dx]*)$")
PROFILE_SET = re.compile(
    r"^Set shape of input tensor (?P<name>.+) for optimization profile (?P<profile>\d+) to: MIN=(?P<min>\S*) OPT=(?P<opt>\S*) MAX=(?P<max>\S*)$"
)
CONTEXT_SET = re.compile(r"^Set shape of input tensor (?P<name>.+) to: (?P<dims>\S*)$")
BINDING = re.compile(
    r"^(?:Created (?P<io8>input|output) binding for (?P<name8>.+) with dimensions (?P<dims8>\S*)"
    r"|(?P<io>Input|Output) binding for (?P<name>.+) with dimensions (?P<dims>\S*)(?: and type (?P<dtype>\S+))? is created\.)$"
)


def timing_summary(text: str) -> TimingSummary:
    summary = TimingSummary()
    other = {}
    for match in STAT.finditer(text):
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


def floats(text: str) -> list[float]:
    return [float(v) for v in re.findall(NUMBER, text)]


def shape_line(log: TrtexecLog, text: str) -> bool:
    """Record an input's or output's shapes from this line; False when it names none."""
    found = BUILD_SHAPE.match(text) or PROFILE_SET.match(text)
    if found:
        profile = int(found.group("profile") or 0)
        shapes = ProfileShapes(min=found.group("min"), opt=found.group("opt"), max=found.group("max"))
        log.tensor(found.group("name").strip()).profiles[profile] = shapes
        return True
    found = INFERENCE_SHAPE.match(text) or CONTEXT_SET.match(text)
    if found:
        log.tensor(found.group("name").strip()).inference = found.group("dims")
        return True
    found = BINDING.match(text)
    if found:
        if found.group("name8") is not None:
            tensor = log.tensor(found.group("name8"), found.group("io8"))
            tensor.binding = found.group("dims8")
        else:
            tensor = log.tensor(found.group("name"), found.group("io").lower())
            tensor.binding, tensor.dtype = found.group("dims"), found.group("dtype") or tensor.dtype
        return True
    return False


def is_summary_line(text: str) -> bool:
    """A performance-summary line wherever it stands: a known label and its numbers."""
    label, colon, rest = text.partition(":")
    if not colon:
        return False
    label = label.strip()
    if label in SUMMARY_FIELDS:
        return STAT.search(rest) is not None
    return label in TOTAL_FIELDS and bool(re.match(rf"\s*{NUMBER}\s*(qps|s)\b", rest))


def summary_line(summary: PerformanceSummary, text: str, any_label: bool) -> bool:
    """Read one summary line into ``summary``; labels other than trtexec's own only inside the
    summary section (``any_label``)."""
    if not text or ":" not in text:
        return False
    label, rest = (part.strip() for part in text.split(":", 1))
    if label in TOTAL_FIELDS:
        values = floats(rest)
        if not values:
            return False
        setattr(summary, TOTAL_FIELDS[label], values[0])
    elif STAT.search(rest) and (any_label or label in SUMMARY_FIELDS):
        if label in SUMMARY_FIELDS:
            setattr(summary, SUMMARY_FIELDS[label], timing_summary(rest))
        else:
            summary.other_summaries[label] = timing_summary(rest)
    else:
        return False
    return True


def device_line(device: DeviceInfo, text: str) -> None:
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
        numbers = floats(value)
        device.memory_mib = int(numbers[0]) if numbers else None
    elif key == "Selected Device UUID":
        device.uuid = value


def profile_row(message: str, layout: str) -> LayerTime | None:
    pattern = ROW_NAME_LAST if layout == "name-last (10.x)" else ROW_NAME_FIRST
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

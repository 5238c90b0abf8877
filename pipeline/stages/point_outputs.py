"""The export's model runs at each shape point, where a point may not fit.

The export runs the FP32 model at every shape point (the reference every engine is checked on) and
the variant at the parity points. A point whose batch does not fit in memory is run a few samples at
a time — every sample's output is its own, so the reference is the same — and one that does not fit
even a sample at a time is a result: its engines are still built and measured there, their
accuracy said to be unchecked and why. A kernel that faults at a point is named for that point
(pipeline/running/faults.py); the export then goes on in a fresh process without that point's reference.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.measuring.out_of_memory import out_of_memory_as_error
from pipeline.running.errors import DeviceFault, OutOfMemory


class PointOutputs:
    """Runs ``forward`` on each point's inputs, in parts where the whole batch does not fit; what
    did not fit at all (label → OutOfMemoryFacts' fields) and what ran in parts (label → samples a
    part) are kept for the export's record."""

    def __init__(self, reporter, doing: str):
        self.reporter, self.doing = reporter, doing
        self.out_of_memory: dict[str | None, dict[str, Any]] = {}
        self.messages: dict[str | None, str] = {}
        self.in_parts: dict[str | None, int] = {}

    def run(self, label: str | None, feeds: tuple, forward, what: str):
        """``forward(feeds)`` at point ``label`` (a CPU tensor), or None where it did not fit even a
        sample at a time. ``what``: the output's name in messages ("the FP32 reference")."""
        samples = int(feeds[0].shape[0]) if feeds and hasattr(feeds[0], "shape") and feeds[0].dim() else 1
        splittable = label is not None and all(hasattr(t, "shape") and t.dim() and t.shape[0] == samples for t in feeds)
        part = samples
        while True:
            try:
                return self._in_parts(label, feeds, forward, part, samples, what)
            except OutOfMemory as exc:
                if label is None:
                    raise  # a model of one shape: the export's own result
                if not splittable or part == 1:
                    self.out_of_memory[label] = {**exc.facts, "during": f"{self.doing}: {what}"}
                    self.messages[label] = exc.message
                    return None
                part = (part + 1) // 2  # half as many samples at a time, down to one
                self.reporter.progress(f"{what} at {label}: {part} sample{'s' if part > 1 else ''} at a time (the batch did not fit)")
            except DeviceFault as exc:
                exc.facts["shape"] = label
                raise

    def _in_parts(self, label, feeds: tuple, forward, part: int, samples: int, what: str):
        import torch

        outputs = []
        for start in range(0, samples, part):
            piece = tuple(t[start : start + part] for t in feeds) if part < samples else feeds
            with out_of_memory_as_error(part, f"{self.doing}: {what}", shape=label):
                outputs.append(forward(piece))
        if part < samples:
            self.in_parts[label] = part
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def parity_points(points, setting: str) -> list:
    """The labels of the shape points parity is checked at: the smallest and the largest
    (`parity_points = "ends"`, where the graph's axes are stretched furthest apart), or all."""
    if setting == "all" or len(points) <= 2:
        return [point.label for point in points]

    def sizes(point):
        return [size for _, size in point.axes]

    return [min(points, key=sizes).label, max(points, key=sizes).label]


def faulted_points(stage) -> dict[str, str]:
    """The shape points where the model faulted on the GPU in an earlier process of this run, or an
    earlier run with the same settings (label → CUDA's words): left out of the export's references,
    their engines measured with their accuracy unchecked. --force tries them again."""
    record = stage.load_manifest().export if stage.manifest_path().exists() else None
    if stage._forced() or record is None or record.status != "faulted" or record.fault is None:
        return {}
    if record.params != json.loads(json.dumps(stage.params(), default=str)):
        return {}  # the model or its settings changed: every point is tried again
    return {**record.fault.earlier, **({record.fault.shape: record.fault.error} if record.fault.shape else {})}

"""What trtexec writes about an engine's outputs, for the accuracy check of the trtexec toolchains:
the file of --exportOutput read into arrays (nan and inf as they are), and trtexec 11.1's own check,
its ``Accuracy loss for tensor`` lines. The figures themselves are the core's
(pipeline/measuring/accuracy.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline.catalog.shape import tensor_dims
from pipeline.running.errors import PipelineError

_NONFINITE = re.compile(r"(?<![\w.\"])(-?)(nan|inf)(?![\w\"])", re.I)
ACCURACY_LINE = re.compile(
    r"Accuracy loss for tensor (?P<name>.+?) \((?P<algorithm>\w+)\): (?P<loss>\S+)(?: \[FAIL: >= threshold (?P<threshold>\S+)\])?"
)


def read_trtexec_outputs(path: Path) -> dict[str, Any]:
    """The file of trtexec's --exportOutput: name → array (shape from its "dimensions")."""
    import numpy as np

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PipelineError(
            f"cannot read trtexec's output file {path}: {exc.strerror or exc}.", hint="profile the engine again (--force)"
        ) from exc
    # trtexec prints non-finite floats as nan/inf, which JSON does not have.
    text = _NONFINITE.sub(lambda m: "NaN" if m.group(2).lower() == "nan" else m.group(1) + "Infinity", text)
    try:
        entries = json.loads(text)
        outputs = {}
        for entry in entries:
            shape = tensor_dims(entry["dimensions"])
            outputs[entry["name"]] = np.asarray(entry["values"], dtype=np.float32).reshape(shape)
        return outputs
    except (ValueError, KeyError, TypeError) as exc:
        raise PipelineError(
            f"{path} is not a trtexec --exportOutput file: {exc}.",
            hint="a run cut short writes a partial file: profile the engine again (--force)",
        ) from exc


def parse_accuracy_lines(text: str) -> dict[str, dict[str, Any]]:
    """trtexec 11.1's own check: ``Accuracy loss for tensor <name> (<algorithm>): <loss>`` with
    `` [FAIL: >= threshold <t>]`` when it failed; by tensor name."""
    found = {}
    for line in text.splitlines():
        match = ACCURACY_LINE.search(line)
        if match:
            try:
                loss = float(match.group("loss"))
            except ValueError:
                loss = float("nan")
            found[match.group("name").strip("'")] = {
                "algorithm": match.group("algorithm"),
                "loss": loss,
                "failed": match.group("threshold") is not None,
                "threshold": float(match.group("threshold")) if match.group("threshold") else None,
            }
    return found

"""The user's own evaluation data and metric, as Python functions: ``FILE.py:FUNCTION``.

* **A data hook** (``--eval-data``, ``[evaluation] data``) takes no arguments and yields batches,
  each the model's inputs — one tensor, a tuple of them in the model's input order — or a dict
  whose ``"inputs"`` is that, with anything else the metric needs beside it (``"labels"``). Numpy
  arrays are taken as tensors. The batches are shuffled (seeded) and dealt whole to the search and
  to the confirmation, so each sees batches the other never does.
* **A metric hook** (``--metric``, ``[evaluation] metric``) is called once per batch as
  ``FUNCTION(outputs, batch)`` — the model's output tensor (float32, on the CPU) and the batch as the
  data hook yielded it, or, for images of ``--eval-dir``, ``{"inputs": (images,), "labels": tensor}``
  — and returns one number, higher better. A variant's figure is the mean over its samples (each
  batch weighted by its size), beside the FP32 model's on the same batches: what ``--max-drop
  metric=0.005`` and ``--floor metric=0.8`` hold.

What goes wrong in the user's code is a user error naming the hook and what it did, never a
traceback of ours.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.running.errors import UsageError
from pipeline.running.user_code import import_file, said

HOOK_FORM = "FILE.py:FUNCTION, e.g. eval_data.py:batches"


def load_hook(spec: str, option: str, root: Path | None = None) -> Callable:
    """The function ``spec`` names (``FILE.py:FUNCTION``, FILE relative to ``root`` or the current
    folder); a user error saying what is wrong otherwise."""
    file, _, name = str(spec).rpartition(":")
    if not file or not name.isidentifier() or not file.endswith(".py"):
        raise UsageError(f"{option} {spec!r} names no Python function.", hint=f"give {HOOK_FORM}")
    path = Path(file).expanduser()
    if not path.is_absolute() and root is not None and not path.is_file():
        path = root / path
    if not path.is_file():
        raise UsageError(f"{option} {spec!r}: no file {path}.", hint=f"give {HOOK_FORM}, the file's path relative to this folder")
    module = import_file(path, lambda what, hint: UsageError(f"{option} {spec!r}: {what}.", hint=hint))
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_") and v.__module__ == module.__name__
        )
        raise UsageError(
            f"{option} {spec!r}: {path} has no function {name}.",
            hint=f"its functions: {', '.join(found)}" if found else f"define {name} in {path}",
        )
    return function


@dataclass
class HookBatch:
    """One batch of a data hook: the model's inputs, and the batch as yielded (for the metric)."""

    inputs: tuple
    given: Any

    @property
    def samples(self) -> int:
        return int(self.inputs[0].shape[0]) if getattr(self.inputs[0], "dim", lambda: 0)() else 1


def drawn_batches(hook: Callable, spec: str, samples: int, seed: int) -> tuple[list[HookBatch], list[HookBatch]]:
    """The search's and the confirmation's batches: what the hook yields until there are
    2 × ``samples`` samples, shuffled with ``seed`` and dealt whole, ``samples`` or more each."""
    needed = 2 * samples
    batches: list[HookBatch] = []
    try:
        for number, item in enumerate(hook()):
            batches.append(_batch(item, spec, number))
            if sum(b.samples for b in batches) >= needed and len(batches) >= 2:
                break
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"--eval-data {spec!r} raised {said(exc)} after {len(batches)} batch(es).",
            hint="call it on its own (`for batch in FUNCTION(): ...`) to see where",
        ) from exc
    total = sum(b.samples for b in batches)
    if total < needed or len(batches) < 2:
        raise UsageError(
            f"--eval-data {spec!r} yielded {total} samples in {len(batches)} batch(es); the search and its confirmation need "
            f"{needed} ({samples} each, --samples) in at least two batches, dealt whole so that the confirmation sees samples the "
            "search never did.",
            hint=f"yield more, or smaller, batches, or pass --samples {max(1, total // 2)} or fewer",
        )
    order = list(range(len(batches)))
    random.Random(seed).shuffle(order)
    search: list[HookBatch] = []
    confirm: list[HookBatch] = []
    for index in order:
        (search if sum(b.samples for b in search) < samples else confirm).append(batches[index])
    if sum(b.samples for b in confirm) < samples:
        raise UsageError(
            f"--eval-data {spec!r}: its batches of {sorted({b.samples for b in batches})} samples cannot be dealt into "
            f"{samples} for the search and {samples} others for the confirmation.",
            hint="yield smaller batches, or pass a smaller --samples",
        )
    return search, confirm


def _batch(item, spec: str, number: int) -> HookBatch:
    import torch

    inputs = item.get("inputs") if isinstance(item, dict) else item
    if isinstance(inputs, (torch.Tensor,)) or _is_array(inputs):
        inputs = (inputs,)
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, tuple) or not inputs or not all(isinstance(t, torch.Tensor) or _is_array(t) for t in inputs):
        raise UsageError(
            f"--eval-data {spec!r}: batch {number} is a {type(item).__name__}, not the model's inputs.",
            hint='yield a tensor, a tuple of tensors in the model\'s input order, or {"inputs": ..., "labels": ...}',
        )
    inputs = tuple(t if isinstance(t, torch.Tensor) else torch.from_numpy(t) for t in inputs)
    return HookBatch(inputs, item)


def _is_array(value) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def metric_of(metric: Callable, spec: str, outputs: list, given: list) -> float:
    """The metric over batches: each batch's value weighted by its samples."""
    values: list[float] = []
    sizes: list[int] = []
    for output, batch in zip(outputs, given):
        try:
            value = metric(output, batch)
        except Exception as exc:
            raise UsageError(
                f"--metric {spec!r} raised {said(exc)} on a batch of {output.shape[0]} outputs.",
                hint="it is called as FUNCTION(outputs, batch): outputs the model's output tensor, batch as the data yielded it",
            ) from exc
        number = _number(value)
        if number is None:
            raise UsageError(
                f"--metric {spec!r} returned {_shown(value)}, not a number.",
                hint="return one finite number per batch, higher better (a 0-d tensor or a float)",
            )
        values.append(number)
        sizes.append(output.shape[0])
    return float(weighted_mean(values, sizes))


def weighted_mean(values, sizes):
    """The mean over samples of a figure given per batch, each batch weighted by its samples: the
    metric over a set, and over each bootstrap resample of its batches (numpy arrays whose last
    axis is the batches)."""
    import numpy as np

    values, sizes = np.asarray(values, dtype=float), np.asarray(sizes, dtype=float)
    return (values * sizes).sum(-1) / sizes.sum(-1)


def _number(value) -> float | None:
    if hasattr(value, "item") and getattr(value, "numel", lambda: getattr(value, "size", 1))() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""A model created once in a run and copied for each stage that needs it (ModelSource.created).

The export of each variant and the build of each PyTorch engine start from the same model: the
catalog's weights in FP32 on the CPU. Creating it again for each is the same work each time —
initialising ModernBERT-base's 149M random weights took 0.7–1.0 s on the lent H200's host (the
exports' ``create_model`` in docs/results/records/), before every export and every build, twelve
times in the seed matrix; on a two-core machine 1.9 s, where a deep copy took 0.3–0.7 s. So the first stage to create a
model keeps it, and each one after it gets a deep copy, with the random generator left as creating
it would leave it (a stage that draws inputs next draws the same ones).

One model is kept at a time, only where it takes at most a quarter of the host's available memory,
and only while the files it is read from are unchanged; the runner forgets it once the builds are
over (``forget``), so that it holds no memory through the profiles.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

# The host memory a kept model may take: this share of what is available when it is created.
HOST_SHARE = 4
# Where the host's available memory cannot be read: the largest model kept.
UNKNOWN_HOST_BYTES = 4 << 30

_kept: tuple[tuple, Any, Any] | None = None  # (key, model, the random generator's state after creating it)


def created(source) -> Any:
    """``source.create()``'s model: a copy of the one kept, where it is ``source``'s; else created,
    and kept where it fits."""
    global _kept
    import torch

    try:
        key = _key(source)
    except Exception:  # a file it names is missing, say: creating it says so
        return source.create()
    if _kept is not None and _kept[0] == key:
        try:
            model = copy.deepcopy(_kept[1])
        except Exception:  # a user's module that cannot be copied: created, as before
            _kept = None
        else:
            # Creating seeds every device's generator (torch.manual_seed) and then draws the weights
            # from the CPU's: both as it would leave them.
            torch.manual_seed(source.spec.seed)
            torch.set_rng_state(_kept[2])
            return model
    model = source.create()
    _kept = (key, model, torch.get_rng_state()) if _fits(model) else None
    # What the stage then does to its model (a cast, a move to the GPU) leaves the kept one as created.
    return model if _kept is None else copy.deepcopy(model)


def forget() -> None:
    """Let the kept model go (the runner, once the builds are over)."""
    global _kept
    _kept = None


def _key(source) -> tuple:
    files = [path for path in (*source.input_files(), source.checkpoint_path()) if path is not None]
    return (
        type(source).__qualname__,
        source.name,
        json.dumps(source.spec.model_dump(mode="json"), sort_keys=True),
        str(source.workspace_root),
        tuple(_stamp(Path(path)) for path in files),
    )


def _stamp(path: Path) -> tuple:
    try:
        stat = path.stat()
    except OSError:
        return (str(path), None)
    return (str(path), stat.st_mtime_ns, stat.st_size)


def _fits(model) -> bool:
    from pipeline.machine.environment import host_memory_available

    tensors = [*getattr(model, "parameters", list)(), *getattr(model, "buffers", list)()]
    size = sum(t.numel() * t.element_size() for t in tensors)
    available = host_memory_available()
    return size <= (UNKNOWN_HOST_BYTES if available is None else available // HOST_SHARE)

"""Running out of GPU or host memory — PyTorch's OutOfMemoryError, its CPU allocator's refusal,
Python's MemoryError — as a user error that names the batch or shape point and what is left of the
GPU, not a crash; wherever a model runs in this process: the export and its references, the
accuracy analyses of the precision tools, and the PyTorch toolchain. torch is never imported here:
it is read from sys.modules where it is already loaded."""

from __future__ import annotations

import re
import sys

from pipeline.catalog.shape import shown
from pipeline.running.errors import OutOfMemory, PipelineError
from pipeline.running.faults import as_fault, synchronised


def is_out_of_memory(kind: type[BaseException], exc: BaseException | None) -> str | None:
    """ "GPU" or "host" when this exception is PyTorch (or Python) running out of memory, else None.
    Decided without importing torch, so a Ctrl-C in the middle of its import passes untouched."""
    if not issubclass(kind, (MemoryError, RuntimeError)):
        return None
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(kind, torch.cuda.OutOfMemoryError):
        return "GPU"
    # PyTorch's CPU allocator raises RuntimeError("… DefaultCPUAllocator: can't allocate memory …").
    if issubclass(kind, MemoryError) or "can't allocate memory" in str(exc):
        return "host"
    return None


class out_of_memory_as_error:
    """Running out of GPU or host memory as a user error naming the batch or shape (and the GPU's
    free memory), not a crash; the pipeline goes on with the other engines. ``doing`` says what
    ran out ("exporting vit_fp16"); ``shape`` names a shape point ("4x4096") instead of the batch."""

    def __init__(self, batch_size: int | None = None, doing: str | None = None, shape: str | None = None):
        self.batch_size, self.doing, self.shape = batch_size, doing, shape

    @property
    def at(self) -> str:
        return f"shape {shown(self.shape)}" if self.shape else f"batch size {self.batch_size}"

    @property
    def smaller(self) -> str:
        return "measure smaller shape points (`shapes` in pipeline.toml)" if self.shape else "lower the model's batch_size in pipeline.toml"

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, traceback):
        # The call's GPU work waited for, so that a kernel it launched that faults is seen here, in
        # the call that launched it (pipeline/running/faults.py), and named for this point.
        doing = " ".join(part for part in (self.doing, f"at {self.at}") if part)
        if kind is None:
            synchronised(doing)
            return False
        fault = as_fault(exc, doing) if not isinstance(exc, PipelineError) else None
        if fault is not None:
            raise fault from exc
        where = is_out_of_memory(kind, exc)
        if where is None:
            return False
        # The frames of the failed attempt hold its tensors: let them go before the memory is read,
        # and before the error is kept as the point's result while the other engines run.
        exc.__traceback__ = None
        doing = f" {self.doing}" if self.doing else ""
        facts = {"memory": where, "during": self.doing, "requested_bytes": requested_bytes(str(exc))}
        if where == "host":
            raise OutOfMemory(
                f"out of host memory{doing} at {self.at}.",
                hint=f"{self.smaller}, or free memory",
                facts=facts,
            ) from exc
        free, total, gpu = gpu_memory_left()
        facts.update(free_bytes=free, total_bytes=total, gpu=gpu)
        left = f": {free / 2**20:,.0f} MiB free of {total / 2**20:,.0f} MiB on {gpu} after the attempt" if free is not None else ""
        raise OutOfMemory(
            f"out of GPU memory{doing} at {self.at}{left}.",
            hint=f"{self.smaller}, or free the GPU (nvidia-smi lists what holds it)",
            facts=facts,
        ) from exc


# PyTorch's caching allocator says what it asked for: "Tried to allocate 3.00 GiB" (c10/cuda/CUDACachingAllocator.cpp).
_REQUESTED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(B|KiB|MiB|GiB|TiB|bytes)")
_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def requested_bytes(message: str) -> int | None:
    """The bytes an allocation that ran out asked for, where the allocator's message says."""
    found = _REQUESTED.search(message)
    return round(float(found.group(1)) * _UNITS[found.group(2)]) if found else None


def gpu_memory_left() -> tuple[int | None, int | None, str | None]:
    """(free, total, the GPU's name) after an attempt ran out, its cached blocks returned first;
    Nones where CUDA cannot say (no CUDA build, or its context is gone)."""
    torch = sys.modules.get("torch")
    try:
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        return int(free), int(total), torch.cuda.get_device_name()
    except Exception:  # what ran out is the point's result; what is left is a detail
        return None, None, None

"""Memory, for the PyTorch toolchain and the export: what an engine holds on the GPU while it runs,
and running out of GPU or host memory as a user error that names the shape, not a crash."""

from __future__ import annotations

import sys

from pipeline.errors import OutOfMemory


def gpu_memory(torch, prepared) -> dict[str, float]:
    """What this engine holds in GPU memory while it runs: its weights and buffers, and the most
    one inference allocates beyond what was allocated before it. Several engines of a shape point
    live in one process while they are timed, so the process's own peak would be all of theirs."""
    resident = sum(t.numel() * t.element_size() for t in [*prepared.model.parameters(), *prepared.model.buffers()] if t.is_cuda)
    with out_of_memory_as_error(prepared.batch_size, shape=prepared.shape):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        prepared.run()
        torch.cuda.synchronize()
    one_run = torch.cuda.max_memory_allocated() - before
    return {
        "allocated": round((resident + one_run) / 2**20, 1),
        "weights": round(resident / 2**20, 1),
        "one_inference": round(one_run / 2**20, 1),
    }


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
        return f"shape {self.shape.replace('x', '×')}" if self.shape else f"batch size {self.batch_size}"

    @property
    def smaller(self) -> str:
        return "measure smaller shape points (`shapes` in pipeline.toml)" if self.shape else "lower the model's batch_size in pipeline.toml"

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, traceback):
        where = is_out_of_memory(kind, exc) if kind is not None else None
        if where is None:
            return False
        doing = f" {self.doing}" if self.doing else ""
        if where == "host":
            raise OutOfMemory(
                f"out of host memory{doing} at {self.at}.",
                hint=f"{self.smaller}, or free memory",
            ) from exc
        torch = sys.modules["torch"]
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        raise OutOfMemory(
            f"out of GPU memory{doing} at {self.at}: {free / 2**20:,.0f} MiB free of {total / 2**20:,.0f} MiB "
            f"on {torch.cuda.get_device_name()} after the attempt.",
            hint=f"{self.smaller}, or free the GPU (nvidia-smi lists what holds it)",
        ) from exc

"""GPU memory, for the PyTorch toolchain: what an engine holds on the GPU while it runs. (Running out
of it is a user error for every model run in this process: pipeline/measuring/out_of_memory.py.)"""

from __future__ import annotations

from pipeline.measuring.out_of_memory import out_of_memory_as_error


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

"""An MLP whose kernel faults past a sequence length, but only in a process that compiles points ahead
of the profiles (pipeline/runtimes/pytorch/compile_ahead.py, processes named "pipeline-compile-N"):
CUDA's own words for a device-side assert, raised while the compiled model runs, and from then on
every call in that process fails the same way (a sticky error: its context is unusable until it
ends). The run's own process never faults, so what it prepares itself is measured."""

import multiprocessing

import torch

# Set once the "kernel" faulted in this process: CUDA's context stays broken.
_poisoned = False
DEVICE_SIDE_ASSERT = (
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


@torch.compiler.disable
def _kernel(x: torch.Tensor, longest: int) -> torch.Tensor:
    """Run as it is, outside the compiled graphs (a graph break), each time the compiled model runs."""
    global _poisoned
    if multiprocessing.current_process().name.startswith("pipeline-compile-") and (_poisoned or x.shape[1] > longest):
        _poisoned = True
        raise RuntimeError(DEVICE_SIDE_ASSERT)
    return x


class FaultingWhenCompiled(torch.nn.Module):
    def __init__(self, features: int, longest: int):
        super().__init__()
        self.up = torch.nn.Linear(features, 2 * features)
        self.down = torch.nn.Linear(2 * features, features)
        self.longest = longest

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(_kernel(x, self.longest))))


def make(table):
    config = table["config"]
    module = FaultingWhenCompiled(config.get("features", 8), config["longest"])
    return module, [{"name": "x", "shape": ["batch", "sequence", config.get("features", 8)]}]

"""An MLP whose kernel faults past a sequence length, as a user's module indexing past a table does on
CUDA: CUDA's own words for a device-side assert, and from then on every call in the process fails
the same way (a sticky error: the context is unusable until the process ends). A fresh process
starts clean. Tracing for export is left alone, as a real model's is."""

import multiprocessing

import torch

# Set once the "kernel" faulted in this process: CUDA's context stays broken.
_poisoned = False
# Calls at a length past the table in this process, for a fault that comes only after some.
_long_calls = 0
DEVICE_SIDE_ASSERT = (
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


class Faulting(torch.nn.Module):
    def __init__(self, features: int, longest: int, calls_before_fault: int = 0, only_in_repeats: bool = False):
        super().__init__()
        self.calls_before_fault = calls_before_fault
        # Faulting only in the processes that repeat a measurement (`--repeat`), as a fault that
        # depends on how the process came to be (a race, a stale cache) does.
        self.only_in_repeats = only_in_repeats
        self.up = torch.nn.Linear(features, 2 * features)
        self.down = torch.nn.Linear(2 * features, features)
        self.longest = longest

    def forward(self, x):
        global _poisoned, _long_calls
        repeating = multiprocessing.current_process().name == "pipeline-repeat"
        if not torch.compiler.is_compiling() and (repeating or not self.only_in_repeats):
            _long_calls += x.shape[1] > self.longest
            if _poisoned or _long_calls > self.calls_before_fault:
                _poisoned = True
                raise torch.AcceleratorError(DEVICE_SIDE_ASSERT) if hasattr(torch, "AcceleratorError") else RuntimeError(DEVICE_SIDE_ASSERT)
        return self.down(torch.nn.functional.gelu(self.up(x)))


def make(table):
    config = table["config"]
    module = Faulting(config.get("features", 8), config["longest"], config.get("calls_before_fault", 0), config.get("only_in_repeats", False))
    return module, [{"name": "x", "shape": ["batch", "sequence", config.get("features", 8)]}]

"""An MLP that stalls past a sequence length, but only in a process that compiles points ahead of the
profiles (pipeline/runtimes/pytorch/compile_ahead.py, processes named "pipeline-compile-N"): it
writes its process's name and pid to the file ``marker`` names, then waits, mid-preparation, for
whatever the test does to it (a SIGKILL, as the kernel's OOM killer sends). The run's own process
never stalls, so what it prepares itself is measured."""

import multiprocessing
import os
import time
from pathlib import Path

import torch


@torch.compiler.disable
def _stall(x: torch.Tensor, longest: int, marker: str) -> torch.Tensor:
    """Run as it is, outside the compiled graphs (a graph break), each time the compiled model runs."""
    name = multiprocessing.current_process().name
    if name.startswith("pipeline-compile-") and x.shape[1] > longest:
        Path(marker).write_text(f"{name} {os.getpid()}")
        time.sleep(600)
    return x


class StallingWhenCompiled(torch.nn.Module):
    def __init__(self, features: int, longest: int, marker: str):
        super().__init__()
        self.up = torch.nn.Linear(features, 2 * features)
        self.down = torch.nn.Linear(2 * features, features)
        self.longest, self.marker = longest, marker

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(_stall(x, self.longest, self.marker))))


def make(table):
    config = table["config"]
    module = StallingWhenCompiled(config.get("features", 8), config["longest"], config["marker"])
    return module, [{"name": "x", "shape": ["batch", "sequence", config.get("features", 8)]}]

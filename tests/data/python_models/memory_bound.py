"""An MLP that runs out of GPU memory past a budget of elements, as a model too large for the GPU at
its larger shape points does: PyTorch's own OutOfMemoryError, raised where a real allocation would
fail (in the forward, at run time). Tracing for export is left alone, as a real model's is."""

import torch


class MemoryBound(torch.nn.Module):
    def __init__(self, features: int, budget: int):
        super().__init__()
        self.up = torch.nn.Linear(features, 2 * features)
        self.down = torch.nn.Linear(2 * features, features)
        self.budget = budget

    def forward(self, x):
        # The budget in samples × positions; each sample's output is its own, as in any batch.
        if not torch.compiler.is_compiling() and x.shape[0] * x.shape[1] > self.budget:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB "
                f"of which 1.12 GiB is free. (a stand-in: {x.shape[0]}×{x.shape[1]} is past the budget of {self.budget})"
            )
        return self.down(torch.nn.functional.gelu(self.up(x)))


def make(table):
    config = table["config"]
    module = MemoryBound(config.get("features", 16), config["budget"])
    return module, [{"name": "x", "shape": ["batch", "sequence", config.get("features", 16)]}]

"""A two-layer MLP over a sequence of feature vectors: the smallest module of the python family."""

import torch


class MLP(torch.nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.up = torch.nn.Linear(features, hidden)
        self.down = torch.nn.Linear(hidden, features)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def make(table):
    features = table["config"].get("features", 16)
    module = MLP(features, table["config"].get("hidden", 32))
    return module, [{"name": "x", "shape": ["batch", "sequence", features]}]

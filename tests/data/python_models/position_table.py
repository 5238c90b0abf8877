"""A table of learned positions, indexed by position: a point longer than the table indexes past it,
which on CUDA is a device-side assert (an Embedding's index kernel asserts its bounds), as a user's
module sized for shorter inputs does."""

import torch


class PositionTable(torch.nn.Module):
    def __init__(self, features: int, positions: int):
        super().__init__()
        self.positions = torch.nn.Embedding(positions, features)
        self.mix = torch.nn.Linear(features, features)

    def forward(self, x):
        index = torch.arange(x.shape[1], device=x.device)
        return self.mix(x + self.positions(index))


def make(table):
    config = table["config"]
    features = config.get("features", 8)
    return PositionTable(features, config["positions"]), [{"name": "x", "shape": ["batch", "sequence", features]}]

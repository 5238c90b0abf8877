"""A block that branches on its data: it rescales its output when the output grows too large. PyTorch
runs it; torch.export cannot trace a Python branch on a tensor's value, so it has no ONNX."""

import torch


class Gated(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        y = self.linear(x)
        if y.abs().max() > 100.0:  # a branch on the data: export refuses it
            y = y / 100.0
        return y


def make(table):
    features = table["config"].get("features", 16)
    return Gated(features), [{"name": "x", "shape": ["batch", "sequence", features]}]

"""Two linear layers with a graph break between them (a print Dynamo cannot trace): torch.compile
runs it in two graphs, and a toolchain with fullgraph = true refuses it."""

import torch


class Broken(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.first = torch.nn.Linear(features, features)
        self.second = torch.nn.Linear(features, features)

    def forward(self, x):
        hidden = self.first(x)
        torch._dynamo.graph_break()
        return self.second(hidden)


def make(table):
    features = table["config"].get("features", 64)
    return Broken(features), [{"name": "x", "shape": ["batch", "sequence", features]}]

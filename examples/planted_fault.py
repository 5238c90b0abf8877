"""A small classifier with a planted quantization fault, for `pipeline sensitivity` and `plan`
(docs/precision.md; the catalog's `planted_fault` model, and the tests').

Five Linear layers (fc1 … fc4, head). Before the layer named by ``config.fault``, a few input
channels are scaled up a thousand times and that layer's weights for them scaled down as much:
the FP32 model computes exactly what it would without the scaling, but per-tensor INT8 of that
layer's input spends its whole range on those channels and rounds every other one to zero.
"""

import torch

WIDTH = 128
LAYERS = ("fc1", "fc2", "fc3", "fc4")
LOUD_CHANNELS = 4
GAIN = 1000.0


class PlantedFault(torch.nn.Module):
    def __init__(self, fault: str, inputs: int = 64, classes: int = 10):
        super().__init__()
        widths = [inputs] + [WIDTH] * len(LAYERS)
        for name, (width_in, width_out) in zip(LAYERS, zip(widths, widths[1:])):
            setattr(self, name, torch.nn.Linear(width_in, width_out))
        self.head = torch.nn.Linear(WIDTH, classes)
        # He initialisation and small biases: the input's signal reaches the output at every depth
        # (PyTorch's default lets a random network's biases drown it).
        for module in self.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                torch.nn.init.normal_(module.bias, std=0.02)
        self.fault = fault
        layer = getattr(self, fault)
        scale = torch.ones(layer.in_features)
        scale[:LOUD_CHANNELS] = GAIN
        self.register_buffer("loud", scale)
        with torch.no_grad():
            layer.weight[:, :LOUD_CHANNELS] /= GAIN

    def forward(self, x):
        for name in (*LAYERS, "head"):
            if name == self.fault:
                x = x * self.loud
            x = getattr(self, name)(x)
            if name != "head":
                x = torch.nn.functional.gelu(x)
        return x


def make(table):
    config = {"fault": "fc2", **table.get("config", {})}
    return PlantedFault(**config), [{"name": "x", "shape": ["batch", 64]}]

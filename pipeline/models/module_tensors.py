"""A module's tensors by name, and a module made around tensors it did not allocate: how a model is
made again without initialising or copying its weights (a transformer's seeded weights read back
from the workspace's cache, a torch build's weights cast by the build before it)."""

from __future__ import annotations

from typing import Any


def tensors_by_name(model) -> dict[str, Any]:
    """Every parameter and buffer of ``model`` by its full name, tied ones under each name."""
    return {
        **{name: tensor.detach() for name, tensor in model.named_parameters(remove_duplicate=False)},
        **{name: tensor for name, tensor in model.named_buffers(remove_duplicate=False)},
    }


def fits(model, tensors: dict[str, Any]) -> bool:
    """Whether ``tensors`` holds each of ``model``'s parameters and buffers, by name, in its shape."""
    return all(name in tensors and tensors[name].shape == tensor.shape for name, tensor in tensors_by_name(model).items())


def adopt(model, tensors: dict[str, Any]) -> None:
    """Make ``model``'s parameters and buffers ``tensors`` (by full name), in their dtypes; a
    parameter tied to another stays tied (one new parameter for both)."""
    import torch

    made: dict[int, torch.nn.Parameter] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                if id(parameter) not in made:
                    made[id(parameter)] = torch.nn.Parameter(tensors[dot + name], requires_grad=parameter.requires_grad)
                module._parameters[name] = made[id(parameter)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = tensors[dot + name]

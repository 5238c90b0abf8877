"""The weights a transformer is made with: seeded (and the same tensors copied in when this
process made that model last), allocated but not initialised (its engine's state dict replaces
them), or read from a folder of weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The seeded weights of the last model initialised in this process, by class, config and seed: a
# run creates its transformer once for each export and each torch build (twelve times in the seed
# matrix, one after another in one process), and initialising ModernBERT-base's weights is most
# of each creation. One model's at a time, and none over KEPT_WEIGHTS_BYTES (a copy in host memory).
_last_seeded: dict[tuple, dict] = {}
KEPT_WEIGHTS_BYTES = 2 << 30


def seeded(cls, config, seed: int):
    """``cls(config)`` with the weights initialised after ``torch.manual_seed(seed)``: made here,
    or the same tensors copied in when this process made them last."""
    import torch

    key = seeded_key(cls, config, seed)
    kept = _last_seeded.get(key)
    if kept is not None:
        with no_init_weights():
            model = cls(config)
        with torch.no_grad():
            # Every parameter and every buffer, those left out of the state dict too: a class's
            # weight initialisation may also fill buffers it does not save (position ids).
            for name, tensor in tensors_of(model).items():
                tensor.copy_(kept[name])
        return model
    model = cls(config)
    tensors = tensors_of(model)
    _last_seeded.clear()
    if sum(t.numel() * t.element_size() for t in tensors.values()) <= KEPT_WEIGHTS_BYTES:
        _last_seeded[key] = {name: t.detach().clone() for name, t in tensors.items()}
    return model


def seeded_key(cls, config, seed: int) -> tuple:
    """What identifies the weights ``seeded`` makes: the same key, the same tensors."""
    return (cls.__module__, cls.__qualname__, config.to_json_string(use_diff=False), seed)


def tensors_of(model) -> dict[str, Any]:
    return {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}


def no_init_weights():
    """transformers' context in which a model's weights are allocated but not initialised."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights()


def has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))

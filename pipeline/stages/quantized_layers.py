"""Which layers of a model are quantized, which stay in high precision, and why.

A *layer* here is what ModelOpt puts quantizers on: a Linear layer or a convolution, and every other
module whose input ModelOpt quantizes (pooling, a LayerNorm: its ``QuantModuleRegistry``), named as
the model names its modules (``blocks.11.mlp.fc2``, ``maxpool``); ModelOpt names the quantizers after
it (``blocks.11.mlp.fc2.input_quantizer``). Every enabled quantizer belongs to a layer, so a variant
with every layer excluded is the unquantized model, exactly; a plan's exclusions can reach all of
them. Layers stay unquantized for three reasons, each recorded in the export's manifest with its
reason:

- by rule (block formats): convolutions, and the classifier head;
- by the model family: transformers and a user's module quantize their Linear layers only;
- by the catalog: ``exclude = [...]`` in a variant, module names or wildcards (fnmatch, ``*``
  crossing dots): ``"head"``, ``"blocks.11.mlp.fc2"``, ``"blocks.*.mlp.fc2"``. A name of a module
  that holds layers (``"blocks.11"``) keeps all of them.

The model that is quantized may wrap the catalog's (a transformer's first output, a user's
module's first tensor); names here are always the catalog model's own (``prefix_of`` maps them).
"""

from __future__ import annotations

import difflib
import fnmatch

from pipeline.running.errors import UsageError, require_module

BLOCK_FORMATS = {"mxfp8", "nvfp4"}
EXCLUDED_BY_CATALOG = "excluded by the catalog (exclude in [variants.{variant}])"


def _layer_kinds(linear_only: bool) -> tuple:
    import torch.nn as nn

    return (nn.Linear,) if linear_only else (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def quantizable_layers(model, linear_only: bool) -> list[str]:
    """The names of the layers quantization could act on, in the model's order: Linear layers and
    convolutions, and unless ``linear_only`` every other module ModelOpt puts an input quantizer on
    (a pooling's input is quantized too, and left out here it would stay quantized in a variant
    that excludes every layer)."""
    kinds = _layer_kinds(linear_only)
    registered = (lambda module: False) if linear_only else _quantized_by_modelopt()
    return [name for name, module in model.named_modules() if name and (isinstance(module, kinds) or registered(module))]


def weighted_layers(model, layers: list[str]) -> list[str]:
    """Those of ``layers`` with weights (Linear layers, convolutions): a variant with all of them
    unquantized quantizes no weight, whatever inputs it still quantizes."""
    kinds = _layer_kinds(False)
    modules = dict(model.named_modules())
    return [name for name in layers if isinstance(modules[name], kinds)]


def _quantized_by_modelopt():
    """Whether ModelOpt quantizes a module's input: a class its QuantModuleRegistry has a quantized
    form of, less those every preset turns off as a whole (BatchNorm, Embedding: the default
    exclusions each preset appends), so that a block named in ``exclude`` lists no layer that was
    never quantized."""
    # Its callers have loaded ModelOpt already, without its Hugging Face plugins (quantize.load_modelopt).
    registry = require_module("modelopt.torch.quantization.nn", purpose="Finding the layers to quantize").QuantModuleRegistry
    config = require_module("modelopt.torch.quantization.config", purpose="Finding the layers to quantize")
    off = {
        entry["parent_class"]
        for entry in getattr(config, "_default_disabled_quantizer_cfg", [])
        if entry.get("parent_class") and entry.get("quantizer_name") == "*" and entry.get("enable") is False
    }
    return lambda module: module in registry and registry.get_key(type(module)) not in off


def layers_to_rewrite(model, linear_only: bool) -> int:
    """How many layers quantization or 2:4 sparsity could act on: Linear layers, and convolutions
    unless ``linear_only``. Zero for a module of functions alone (an attention call)."""
    kinds = _layer_kinds(linear_only)
    return sum(isinstance(module, kinds) for module in model.modules())


def prefix_of(wrapper, model) -> str:
    """How ``wrapper`` names ``model``'s modules: "" when they are one, else "model." (its path)."""
    for name, module in wrapper.named_modules():
        if module is model:
            return f"{name}." if name else ""
    raise ValueError("the model is not inside the module that is quantized")


def resolve_exclude(model, patterns: tuple[str, ...], linear_only: bool, variant: str, model_name: str) -> dict[str, str]:
    """The layers ``exclude`` names (module names or wildcards), each with the catalog as its reason.

    A pattern that matches no layer is a user error naming the nearest layer names; so is a list
    that leaves no layer quantized (the engine would be the unquantized model under another name)."""
    if not patterns:
        return {}
    layers = quantizable_layers(model, linear_only)
    weighted = weighted_layers(model, layers)
    modules = [name for name, _ in model.named_modules() if name]
    reason = EXCLUDED_BY_CATALOG.format(variant=variant)
    excluded: dict[str, str] = {}
    for pattern in patterns:
        containers = [name for name in modules if fnmatch.fnmatchcase(name, pattern)]
        matched = [layer for layer in layers if any(layer == c or layer.startswith(c + ".") for c in containers)]
        if not matched:
            raise UsageError(
                f"exclude {pattern!r} in [variants.{variant}] matches no {'Linear' if linear_only else 'quantized'} layer of {model_name}.",
                hint=f"nearest layer names: {', '.join(nearest(pattern, layers))} (`pipeline sensitivity` lists them all)",
            )
        excluded.update(dict.fromkeys(matched, reason))
    if weighted and set(weighted) <= set(excluded):
        raise UsageError(
            f"exclude in [variants.{variant}] keeps every one of {model_name}'s {len(weighted)} quantizable layers unquantized, "
            "so the engine would be the unquantized model under another name.",
            hint="exclude fewer layers, or measure the model at fp32, fp16 or bf16",
        )
    return excluded


def nearest(name: str, candidates: list[str], count: int = 5) -> list[str]:
    close = difflib.get_close_matches(name, candidates, n=count, cutoff=0.3)
    return close or candidates[:count]


def plan_exclusions(model, precision: str, conv_policy: str) -> tuple[dict[str, str], dict[str, str]]:
    """Layers to leave unquantized by rule, and layers to quantize as FP8 instead, each with the reason."""
    import torch.nn as nn

    excluded: dict[str, str] = {}
    overridden: dict[str, str] = {}
    if precision not in BLOCK_FORMATS:
        return excluded, overridden
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            reason = (
                f"convolution: {precision} block quantization is for matrix multiplies, and ModelOpt cannot "
                "export a block-quantized convolution (kernel of unknown shape)"
            )
            if conv_policy == "fp8":
                overridden[name] = reason + "; quantized as FP8 instead"
            else:
                excluded[name] = reason
    head = classifier_head(model)
    if head is not None:
        excluded[head] = "classifier head: kept in higher precision, the last layer is the most sensitive to quantization"
    return excluded, overridden


def classifier_head(model) -> str | None:
    """The module producing the logits: timm's get_classifier(), else the last Linear layer."""
    import torch.nn as nn

    get_classifier = getattr(model, "get_classifier", None)
    if callable(get_classifier):
        head = get_classifier()
        for name, module in model.named_modules():
            if module is head and isinstance(module, nn.Linear):
                return name
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return linears[-1] if linears else None


def disable_outside_linear(model) -> dict[str, str]:
    """Turn off the quantizers ModelOpt's preset put on layers other than Linear (a transformer's
    LayerNorm inputs): TensorRT quantizes matrix multiplies, and the TorchScript export writes no
    Q/DQ for a LayerNorm's input, so the graph would not be the model that was calibrated."""
    import torch.nn as nn

    disabled = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            continue
        for child_name, child in module.named_children():
            if child_name.endswith("_quantizer") and getattr(child, "is_enabled", False):
                child.disable()
                disabled[name] = f"{type(module).__name__}: only Linear layers are quantized in this model"
    return disabled


def count_enabled_weight_quantizers(model) -> int:
    return sum(1 for name, module in model.named_modules() if name.endswith("weight_quantizer") and getattr(module, "is_enabled", False))


class LayerSwitches:
    """The quantizers of each quantized layer of a calibrated model, to turn layers on and off.

    Built after calibration: a layer is a module with at least one enabled quantizer of its own
    (weights, inputs). ``quantize_only(layers)`` leaves exactly those quantized; the calibrated
    ranges are untouched, so any set is the fully quantized model with the others excluded."""

    def __init__(self, quantized_model, prefix: str = ""):
        self._quantizers: dict[str, list] = {}
        for name, module in quantized_model.named_modules():
            own = [
                child
                for child_name, child in module.named_children()
                if child_name.endswith("_quantizer") and getattr(child, "is_enabled", False)
            ]
            if own and name.startswith(prefix):
                self._quantizers[name[len(prefix) :]] = own

    @property
    def layers(self) -> list[str]:
        return list(self._quantizers)

    def quantize_only(self, layers) -> None:
        wanted = set(layers)
        unknown = wanted - set(self._quantizers)
        if unknown:
            raise KeyError(f"not quantized layers: {sorted(unknown)}")
        for name, quantizers in self._quantizers.items():
            for quantizer in quantizers:
                quantizer.enable() if name in wanted else quantizer.disable()

    def quantize_all_but(self, layers) -> None:
        left_out = set(layers)
        self.quantize_only([name for name in self._quantizers if name not in left_out])

"""Sparsify stage: 2:4 structured sparsity with NVIDIA ModelOpt, verified in the exported ONNX.

``sparse_magnitude`` (default) keeps the two largest of every four weights; ``sparsegpt`` also
updates the remaining weights using calibration data. TensorRT only runs sparse kernels when
every group of four weights along the reduction axis holds at least two zeros, so the pattern is
checked in the ONNX that TensorRT will read, not only in PyTorch.
"""

from __future__ import annotations

from typing import Any

from pipeline.running.errors import PipelineError

METHODS = ("sparse_magnitude", "sparsegpt")
# Ops that sit between a weight initializer and the layer using it in exported graphs: casts, and
# the (de)quantize ops of every format (standard, trt::, TRT_MXFP8…, TRT_FP4…), input 0 the data.
_PASS_THROUGH = {"Cast", "Identity"}


def _passes_weight_through(op_type: str) -> bool:
    return op_type in _PASS_THROUGH or "quantize" in op_type.lower()


def sparsify_model(model, method: str, batches) -> tuple[Any, dict[str, Any]]:
    if method not in METHODS:
        raise PipelineError(f"unknown sparsity method {method!r}.", hint=f"use one of {', '.join(METHODS)}")
    from pipeline.stages.quantize import as_inputs, import_modelopt

    mts = import_modelopt("modelopt.torch.sparsity", purpose="2:4 sparsification")
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    config: dict[str, Any] = {}
    if method == "sparsegpt":
        loader = [as_inputs(b, device, dtype) for b in batches]
        # ModelOpt calls the model on what collect_func returns: the one tensor of a one-input model.
        config = {"data_loader": [b[0] if len(b) == 1 else b for b in loader], "collect_func": lambda batch: batch}
    model = mts.sparsify(model, method, config=config)
    model = mts.export(model)  # bake the masks into the weights
    feeding = None
    if batches:  # one sample shows which layers the output depends on, whatever the batch
        first = batches[0] if isinstance(batches[0], tuple) else (batches[0],)
        feeding = layers_feeding_output(model, as_inputs(tuple(tensor[:1] for tensor in first), device, dtype))
    layers = torch_sparsity(model, feeding)
    sparse = [name for name, layer in layers.items() if layer["pattern_2_4"]]
    if not sparse:
        raise PipelineError(
            "no layer of this model could be 2:4-sparsified (ModelOpt needs Linear/Conv layers whose input dimension is a multiple of 4).",
            hint="pick a dense variant for this model",
        )
    # What the ONNX must show: the sparse layers its forward uses. A layer the output does not
    # depend on (BERT's pooler, beside the last hidden state) is not in the exported graph.
    exported = [name for name in sparse if layers[name].get("feeds_output", True)]
    return model, {"tool": "nvidia-modelopt", "method": method, "layers": layers, "sparsified_layers": len(exported)}


def layers_feeding_output(model, inputs: tuple) -> set[str]:
    """The Linear/Conv layers the output of ``model`` on ``inputs`` depends on: those whose weight
    the autograd graph of one forward reaches. A layer that runs but feeds nothing returned
    (BERT's pooler, beside the last hidden state) is not among them, as exporters leave it out."""
    import torch
    import torch.nn as nn

    layers = {name: module.weight for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Conv2d))}
    wanted = {weight: weight.requires_grad for weight in layers.values()}
    reached: set[int] = set()
    try:
        for weight in wanted:
            weight.requires_grad_(True)
        with torch.enable_grad():
            output = model(*inputs)
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        pending = [t.grad_fn for t in outputs if getattr(t, "grad_fn", None) is not None]
        seen = set()
        while pending:
            node = pending.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf tensor
            if variable is not None:
                reached.add(id(variable))
            pending.extend(next_node for next_node, _ in node.next_functions)
    finally:
        for weight, required in wanted.items():
            weight.requires_grad_(required)
    return {name for name, weight in layers.items() if id(weight) in reached}


def torch_sparsity(model, feeding: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each Linear/Conv layer's zeros and 2:4 pattern; with ``feeding`` (layers_feeding_output),
    whether the output depends on it."""
    import torch.nn as nn

    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            weight = module.weight.detach().float().cpu().numpy()
            # Reduction axis: Linear [out, in] → 1; Conv [out, in, kh, kw] → 1.
            layers[name] = {
                "zero_fraction": float((weight == 0).mean()),
                "pattern_2_4": bool(has_2_4_pattern(weight, axis=1)),
            }
            if feeding is not None:
                layers[name]["feeds_output"] = name in feeding
    return layers


def has_2_4_pattern(weight, axis: int) -> bool:
    """At least two zeros in every group of four consecutive weights along ``axis``."""
    import numpy as np

    moved = np.moveaxis(np.asarray(weight, dtype=np.float32), axis, -1)
    if moved.shape[-1] % 4:
        return False
    groups = moved.reshape(-1, 4)
    return bool(((groups == 0).sum(axis=1) >= 2).all())


def onnx_sparsity(model) -> dict[str, Any]:
    """The 2:4 check on every MatMul/Gemm/Conv weight of an ONNX graph, as TensorRT will see it."""
    import numpy as np
    from onnx import numpy_helper

    initializers = {t.name: t for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    weights = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.input) < 2:
            continue
        name, transposed = node.input[1], False
        while name not in initializers and name in producers:
            producer = producers[name]
            if producer.op_type == "Transpose":
                transposed = not transposed
            elif not _passes_weight_through(producer.op_type):
                break
            name = producer.input[0]
        if name not in initializers:
            continue
        array = numpy_helper.to_array(initializers[name]).astype(np.float32)
        if node.op_type == "Conv":
            axis = 1  # [out, in, kh, kw]
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 1 if trans_b else 0
        else:
            axis = array.ndim - 2  # MatMul B: [..., K, N], K is reduced
        if transposed and array.ndim == 2:
            axis = 1 - axis
        if array.ndim < 2:
            continue
        weights[name] = {
            "op": node.op_type,
            "shape": list(array.shape),
            "zero_fraction": float((array == 0).mean()),
            "pattern_2_4": has_2_4_pattern(array, axis),
        }
    sparse = [w for w in weights.values() if w["pattern_2_4"]]
    total = sum(int(np.prod(w["shape"])) for w in weights.values())
    zeros = sum(w["zero_fraction"] * int(np.prod(w["shape"])) for w in weights.values())
    return {
        "weights_checked": len(weights),
        "weights_2_4": len(sparse),
        "total_zero_fraction": zeros / total if total else 0.0,
        "weights": weights,
    }

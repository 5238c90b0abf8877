"""Quantize stage: post-training quantization with NVIDIA ModelOpt on the PyTorch model.

The model is calibrated with ModelOpt's preset for the precision, and exported with ModelOpt's
ONNX exporter, which writes what TensorRT 10 builds from: Q/DQ nodes for INT8, FP8 weights with
TensorRT's Q/DQ ops for FP8, FP4 weights + DequantizeLinear for NVFP4, MXFP8 weights + dequantize
for MXFP8. INT8 with FP32 weights gets the same graph from ModelOpt's steps run directly, in a
quarter of the time (``_export_int8``).

Block formats (MXFP8, NVFP4) are applied only where TensorRT runs them: the matrix multiplies.
Layers are excluded by rule, not by name — convolutions (a ViT's patch embedding) and the
classifier head — and the manifest lists each exclusion with its reason. Convolutions can go to
FP8 instead (``conv_policy = "fp8"``).

MXFP8 and NVFP4 fake quantization needs CUDA. INT8 and FP8 run on the CPU; on a GPU they use
ModelOpt's pure-PyTorch kernels, because its CUDA kernels are compiled with nvcc the first time
they are used — a minute or more per precision on a fresh machine, for no gain at export size.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError, require_module
from pipeline.stages.fp4_graph import make_fp4_graph_consistent
from pipeline.stages.quantized_layers import (
    BLOCK_FORMATS,
    count_enabled_weight_quantizers,
    disable_outside_linear,
    plan_exclusions,
)

# ModelOpt's preset configuration for each precision (names from modelopt.torch.quantization).
PRESETS = {
    "int8": "INT8_DEFAULT_CFG",
    "fp8": "FP8_DEFAULT_CFG",
    "mxfp8": "MXFP8_DEFAULT_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
}
NEEDS_CUDA = BLOCK_FORMATS
# Q/DQ with FP8 (and FP4) types is defined from opset 19 on.
MIN_OPSET = {"fp8": 19, "mxfp8": 19, "nvfp4": 19}
# High-precision tensors (non-quantized layers, scales, biases) in FP16 for strongly typed
# TensorRT builds, except INT8: ModelOpt's FP16 INT8 graph is rejected by ONNX Runtime (a Cast type
# mismatch, seen with ONNX Runtime 1.31), and INT8 is the quantized variant ONNX Runtime runs.
# The quantized weights themselves are INT8/FP8/FP4 either way. NVFP4 gets its FP16 by tracing an
# FP16 model (see TRACED_HIGH_PRECISION), not by ModelOpt's conversion.
DEFAULT_WEIGHTS_DTYPE = {"int8": "fp32", "fp8": "fp16", "mxfp8": "fp16", "nvfp4": "fp16"}
# Precisions whose high-precision dtype is the dtype the model is traced in: the export stage
# converts the PyTorch model before calibrating it, and ModelOpt's exporter keeps the traced types.
# ModelOpt's own FP16 conversion of FP4 graphs (AutoCast) asks TensorRT's Python package for the
# shapes of the FP4 operators, and TensorRT is not something every machine that exports has.
TRACED_HIGH_PRECISION = {"nvfp4"}

FP8_OVERRIDE = {"num_bits": (4, 3), "axis": None}
# Tracing runs the model forward, and one batch-64 forward of ViT-B takes 4-5 s on the CPU (the
# lent H100's 16 cores). So CPU traces use this many samples with the batch axis left dynamic,
# and the export stage pins it back to the model's batch size.
CPU_TRACE_BATCH = 2


# ModelOpt imports its Hugging Face plugins whenever these packages are installed: seconds of
# import time (6 s on the lent H100) for plugins that never apply to timm models.
_HF_PLUGIN_PACKAGES = ("transformers", "peft", "diffusers", "megatron")


# What the export stage uses of ModelOpt. modelopt.torch.export is imported by ModelOpt itself
# during calibration; imported here first, its Hugging Face plugins stay unloaded too (they took
# 9 s of the first quantization in a process on the lent H100, where transformers is installed).
MODELOPT_MODULES = (
    "modelopt.torch.quantization",
    "modelopt.torch.sparsity",
    "modelopt.torch.export",
    "modelopt.torch._deploy.utils.torch_onnx",
)


def load_modelopt(purpose: str) -> None:
    """Import every ModelOpt module the export stage uses, once per process."""
    for module in MODELOPT_MODULES:
        import_modelopt(module, purpose=purpose)


def import_modelopt(module: str, purpose: str):
    """Import a ModelOpt module without loading its Hugging Face plugins (unless already loaded)."""
    import sys

    if module in sys.modules:
        return sys.modules[module]
    hidden = [name for name in _HF_PLUGIN_PACKAGES if name not in sys.modules]
    saved = {name: sys.modules.get(name) for name in hidden}
    for name in hidden:
        sys.modules[name] = None  # makes `import name` raise ModuleNotFoundError, which ModelOpt skips
    try:
        return require_module(module, purpose=purpose)
    finally:
        for name in hidden:
            if sys.modules.get(name) is None:
                del sys.modules[name]
            if saved[name] is not None:
                sys.modules[name] = saved[name]


def require_cuda_for(precision: str) -> None:
    import torch

    if precision in NEEDS_CUDA and not torch.cuda.is_available():
        raise EnvironmentMissing(
            f"{precision} quantization needs a CUDA GPU (ModelOpt's {precision} kernels are CUDA-only), and this machine has none.",
            hint="run this export on a machine with an NVIDIA GPU, or pick int8/fp8",
        )


def quantize_model(
    model,
    precision: str,
    batches,
    conv_policy: str = "exclude",
    progress=None,
    linear_only: bool = False,
    exclude: dict | None = None,
    prefix: str = "",
):
    """Calibrate ``model`` in place with ModelOpt; returns it and what the manifest records.
    ``progress`` (a text callback) hears each calibration batch. ``linear_only`` leaves every
    layer but the Linear ones unquantized (transformers: their LayerNorms and embeddings).
    ``exclude`` (layer name → reason) keeps those layers unquantized; names are the catalog model's,
    which ``model`` (a wrapper around it) calls ``prefix`` + name, and the manifest's are too."""
    import torch

    if precision not in PRESETS:
        raise PipelineError(f"no quantization preset for precision {precision!r}.", hint=f"known: {', '.join(PRESETS)}")
    require_cuda_for(precision)
    mtq = import_modelopt("modelopt.torch.quantization", purpose=f"{precision} quantization")
    _use_pytorch_kernels_for(precision)
    config = copy.deepcopy(getattr(mtq, PRESETS[precision]))
    excluded, overridden = plan_exclusions(model, precision, conv_policy)
    excluded.update({prefix + name: reason for name, reason in (exclude or {}).items()})
    # Later entries of quant_cfg win, so the rules go last.
    for name in overridden:
        config["quant_cfg"].append({"quantizer_name": f"{name}.*", "cfg": dict(FP8_OVERRIDE)})
    for name in excluded:
        config["quant_cfg"].append({"quantizer_name": f"{name}.*", "enable": False})
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype

    def forward_loop(m):
        with torch.no_grad():
            for number, batch in enumerate(batches, 1):
                if progress is not None:
                    progress(f"calibrating: batch {number} of {len(batches)}")
                m(*as_inputs(batch, device, dtype))

    model = mtq.quantize(model, config, forward_loop)
    if linear_only:
        excluded.update(disable_outside_linear(model))
    quantized = count_enabled_weight_quantizers(model)
    if not quantized:
        raise UsageError(
            f"{precision} quantization left no layer quantized ({len(excluded)} excluded: {', '.join(list(excluded)[:5])}…), so the "
            "engine would be the unquantized model under another name.",
            hint="exclude fewer layers, or measure the model at fp32, fp16 or bf16",
        )
    info: dict[str, Any] = {
        "tool": "nvidia-modelopt",
        "preset": PRESETS[precision],
        "excluded_layers": {name.removeprefix(prefix): reason for name, reason in excluded.items()},
        "fp8_layers": {name.removeprefix(prefix): reason for name, reason in overridden.items()},
        "quantized_layers": quantized,
    }
    return model, info


def as_inputs(batch, device, dtype) -> tuple:
    """A batch (one tensor, or a tuple of the model's inputs) on ``device``, its floating tensors
    in ``dtype``: token ids and attention masks keep their integer types."""
    tensors = batch if isinstance(batch, tuple) else (batch,)
    return tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in tensors)


def _use_pytorch_kernels_for(precision: str) -> None:
    """Skip the nvcc build of ModelOpt's INT8/FP8 CUDA kernels; ModelOpt falls back to PyTorch ops."""
    if precision not in ("int8", "fp8"):
        return
    from modelopt.torch.quantization import extensions

    # ModelOpt caches the loaded extension on these functions; None selects its PyTorch path.
    extensions.get_cuda_ext.extension = None
    extensions.get_cuda_ext_fp8.extension = None


@dataclass
class QuantizedExport:
    """How a quantized model was exported, for the manifest."""

    exporter: str
    # The batch traced when the graph's batch axis was left dynamic (a CPU trace, see
    # CPU_TRACE_BATCH); None when the graph has the sample's static shape.
    traced_batch: int | None


def export_quantized(model, args: tuple, path, opset: int, weights_dtype: str, precision: str, dynamic_axes=None) -> QuantizedExport:
    """Write ``model`` as ONNX with real low-precision weights and the ops TensorRT parses.

    ``args`` are the model's inputs in forward()'s order; ``dynamic_axes`` (input name → axis → name)
    the axes the graph keeps free, as the model family declares them. Without any, a CPU trace of
    a large batch keeps the batch free (CPU_TRACE_BATCH) and reports the batch it traced."""
    require_module("onnxconverter_common", purpose="Exporting quantized ONNX", extra="export")
    import_modelopt("modelopt.torch._deploy.utils.torch_onnx", purpose="Exporting quantized ONNX")
    from modelopt.torch.utils import standardize_named_model_args

    on_cuda = any(getattr(a, "is_cuda", False) for a in args)
    if precision == "int8" and on_cuda:
        # TorchScript tracing of ModelOpt's INT8 fake-quant model crashes the process (SIGSEGV)
        # on CUDA with torch 2.11 (seen on the lent H100); traced on the CPU it exports the same graph.
        model, args, on_cuda = model.cpu(), tuple(a.cpu() for a in args), False
    # ModelOpt names the graph's inputs after the forward() parameters, with this helper.
    named_args, _ = standardize_named_model_args(model, args)
    input_names = list(named_args)[: len(args)]
    traced_batch = None
    if dynamic_axes:
        dynamic_axes = {name: dict(axes) for name, axes in dynamic_axes.items()}
    else:
        dynamic_axes = {}
        if len(args) == 1 and not on_cuda and args[0].shape[0] > CPU_TRACE_BATCH:
            args = (args[0][:CPU_TRACE_BATCH],)
            traced_batch = CPU_TRACE_BATCH
            dynamic_axes = {input_names[0]: {0: "batch"}}
    if precision == "int8" and weights_dtype == "fp32":
        if sum(t.numel() * t.element_size() for t in model.state_dict().values()) >= PROTOBUF_LIMIT_BYTES:
            raise PipelineError(
                "the model's weights exceed 2 GB, the most one ONNX file holds; external weight files are not "
                "handled by this pipeline yet.",
            )
        _export_int8(model, args, path, opset, input_names, dynamic_axes)
        return QuantizedExport(INT8_EXPORTER, traced_batch)
    repairs = []
    if precision in TRACED_HIGH_PRECISION:
        repairs.append(lambda graph: make_fp4_graph_consistent(graph, weights_dtype))
    if precision in BLOCK_FORMATS and dynamic_axes:
        sizes = {name: args[input_names.index(name)].shape for name in dynamic_axes if name in input_names}
        repairs.append(lambda graph: fix_block_axes(graph, sizes, dynamic_axes))
    # "fp32" tells ModelOpt to convert nothing: the types are the traced model's.
    _export_with_modelopt(model, args, path, opset, "fp32" if precision in TRACED_HIGH_PRECISION else weights_dtype, dynamic_axes, repairs)
    return QuantizedExport(MODELOPT_EXPORTER, traced_batch)


PROTOBUF_LIMIT_BYTES = 2**31
MODELOPT_EXPORTER = "ModelOpt's ONNX exporter (get_onnx_bytes_and_metadata)"
INT8_EXPORTER = "torch.onnx.export (TorchScript) with ModelOpt's INT8 graph clean-up"


def _export_with_modelopt(model, args: tuple, path, opset: int, weights_dtype: str, dynamic_axes, repairs=()) -> None:
    from modelopt.torch._deploy.utils.torch_onnx import OnnxBytes, get_onnx_bytes_and_metadata

    with shape_inference_without_weights():
        onnx_bytes, _ = get_onnx_bytes_and_metadata(model, args, onnx_opset=opset, weights_dtype=weights_dtype, dynamic_axes=dynamic_axes)
    files = OnnxBytes.from_bytes(onnx_bytes).onnx_model
    if len(files) != 1:
        raise PipelineError(
            f"the quantized ONNX came with external data files ({', '.join(files)}), which this pipeline does not "
            "handle yet (the model exceeds 2 GB).",
        )
    data = next(iter(files.values()))
    if not repairs:
        path.write_bytes(data)
        return
    import onnx

    graph = onnx.load_from_string(data)
    for repair in repairs:
        repair(graph)
    onnx.save(graph, str(path))


def fix_block_axes(model, sizes: dict[str, tuple[int, ...]], dynamic_axes: dict[str, dict[int, str]]) -> int:
    """Write out the sizes a Reshape leaves as -1 where the graph fixes them; how many were.

    TensorRT needs the extent of the axis a block format quantizes along at build time ("The
    input extent in the blocked axis should be known at build time", TensorRT-RTX 1.7 on ModelOpt's
    NVFP4 and MXFP8 graphs of BERT). A transformer's attention output is reshaped to
    (batch, sequence, -1): with batch and sequence dynamic, the parser cannot tell that -1 is the
    hidden size. Shape inference can, once the inputs have sizes: the graph's sizes are inferred
    at the traced sizes and at other ones, and a -1 whose size is the same at both is that size.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    other = {}  # each dynamic axis at another size: 2n + 3 (n + 3 apart, so no small divisor maps both alike)
    for name, axes in dynamic_axes.items():
        for axis, label in axes.items():
            if name in sizes:
                other.setdefault(label, 2 * sizes[name][axis] + 3)

    def inferred(resize) -> dict[str, list[int | None]]:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        for node in copy.graph.node:
            if node.domain == "trt":  # TensorRT's own quantize ops: shape-preserving on their first output
                node.op_type, node.domain = "Identity", ""
                node.input[:], node.output[:] = node.input[:1], node.output[:1]
                del node.attribute[:]
        for tensor in copy.graph.input:
            for axis, dim in enumerate(tensor.type.tensor_type.shape.dim):
                if tensor.name in sizes:
                    dim.dim_value = resize(tensor.name, axis)
        del copy.graph.value_info[:]
        with shape_inference_without_weights():
            copy = onnx.shape_inference.infer_shapes(copy, data_prop=True)
        return {
            info.name: [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
            for info in [*copy.graph.value_info, *copy.graph.output]
        }

    labels = {(name, axis): label for name, axes in dynamic_axes.items() for axis, label in axes.items()}
    at_traced = inferred(lambda name, axis: sizes[name][axis])
    at_other = inferred(lambda name, axis: other[labels[(name, axis)]] if (name, axis) in labels else sizes[name][axis])
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    fixed, before = 0, {}  # the new constants, by the Concat they go before
    for node in list(graph.node):
        if node.op_type != "Reshape":
            continue
        shape = producers.get(node.input[1])
        first, second = at_traced.get(node.output[0]), at_other.get(node.output[0])
        if shape is None or shape.op_type != "Concat" or first is None or second is None:
            continue
        position = 0
        for slot, part in enumerate(shape.input):
            source = producers.get(part)
            length = (at_traced.get(part) or [None])[0]
            if source is not None and source.op_type == "Constant" and source.attribute[0].name == "value":
                value = numpy_helper.to_array(source.attribute[0].t).reshape(-1)
                known = [
                    first[position + k] if v == -1 and first[position + k] == second[position + k] else None for k, v in enumerate(value)
                ]
                if any(size is not None for size in known):
                    # A constant of this Reshape's own (the one it came from may be shared).
                    written = np.array([size if size is not None else v for size, v in zip(known, value)], dtype=value.dtype)
                    constant = onnx.helper.make_node(
                        "Constant",
                        [],
                        [f"{part}_sized_for_{node.name}"],
                        value=numpy_helper.from_array(written),
                        name=f"{source.name}_sized",
                    )
                    before.setdefault(shape.name, []).append(constant)
                    shape.input[slot] = constant.output[0]
                    fixed += sum(size is not None for size in known)
                position += value.size
            elif length is not None:
                position += length
            else:
                break  # a part of unknown length: the positions after it cannot be told
    if before:
        nodes = [new for node in graph.node for new in [*before.get(node.name, []), node]]
        del graph.node[:]
        graph.node.extend(nodes)
    return fixed


def _export_int8(model, args: tuple, path, opset: int, input_names: list[str], dynamic_axes) -> None:
    """The graph ModelOpt's exporter writes for INT8 with FP32 weights, without its overhead.

    For that case ModelOpt 0.47's exporter is the TorchScript export (its quantizers emit
    QuantizeLinear/DequantizeLinear) plus the clean-up steps below; its INT8 weight step is a no-op.
    Around them it serializes the graph to JSON, checks its size and infers shapes twice: most of
    the export of ViT-B, whose FP32 graph is 346 MB (20.9 s against 5-6 s this way, on the lent
    H100's CPU). tests/stages/test_quantize.py checks that both give the same graph, so a ModelOpt
    release that changes its INT8 export shows up there.
    """
    import onnx
    import onnx_graphsurgeon as gs
    import torch
    from modelopt.onnx.quantization.qdq_utils import replace_zero_scale_with_smallest_nonzero
    from modelopt.onnx.utils import remove_node_training_mode, remove_redundant_casts

    with torch.inference_mode():
        torch.onnx.export(
            model,
            args,
            str(path),
            input_names=input_names,
            opset_version=opset,
            dynamic_axes=dynamic_axes,
            dynamo=False,
        )
    graph = onnx.load(str(path))
    cleaned = gs.import_onnx(graph)
    cleaned.cleanup().toposort()
    graph = gs.export_onnx(cleaned)
    graph = remove_node_training_mode(graph, "BatchNormalization")
    with shape_inference_without_weights():
        graph = onnx.shape_inference.infer_shapes(graph)  # remove_redundant_casts looks up every tensor's type
    graph = remove_redundant_casts(graph)
    graph = replace_zero_scale_with_smallest_nonzero(graph)  # TensorRT needs positive scales
    graph.ir_version = 10  # as ModelOpt sets it: ONNX Runtime does not read IR version 11 yet
    onnx.save(graph, str(path))


# Ops that hand their input's data type through unchanged.
@contextmanager
def shape_inference_without_weights():
    """Within: ``onnx.shape_inference.infer_shapes`` runs on the graph without its weights' bytes.

    Inference copies the whole model through protobuf, and needs only the weights' shapes and types.
    ModelOpt's exporter runs it twice on the full graph: a third of an FP8 export of ViT-B (25 s
    against 16 s without, on a 2-core development machine). The result is the same model, byte
    for byte (tests/stages/test_quantize.py checks it). Small tensors keep their data: shape inference
    reads the values of shape constants.
    """
    import onnx.shape_inference

    original = onnx.shape_inference.infer_shapes

    def give_back(graph, weights: dict[str, bytes]) -> None:
        for tensor in graph.initializer:
            if tensor.name in weights:
                tensor.raw_data = weights[tensor.name]

    def infer_shapes(model, *args, **kwargs):
        weights = {t.name: t.raw_data for t in model.graph.initializer if len(t.raw_data) > SMALL_TENSOR_BYTES}
        for tensor in model.graph.initializer:
            if tensor.name in weights:
                tensor.ClearField("raw_data")
        try:
            inferred = original(model, *args, **kwargs)
        finally:
            give_back(model.graph, weights)
        give_back(inferred.graph, weights)
        return inferred

    # ModelOpt calls it through the module attribute, so replacing that for the duration of an
    # export reaches its calls (exports run one at a time, on one thread).
    onnx.shape_inference.infer_shapes = infer_shapes
    try:
        yield
    finally:
        onnx.shape_inference.infer_shapes = original


SMALL_TENSOR_BYTES = 4096


def accuracy_proxy(reference_outputs, outputs, precision: str, sparse: bool) -> dict[str, Any]:
    """How far the variant's PyTorch outputs (fake-quantized, sparsified) are from FP32's."""
    import torch

    ref = torch.cat([r.float().flatten(1) for r in reference_outputs])
    out = torch.cat([o.float().flatten(1) for o in outputs])
    # In float64: over millions of values a float32 cosine rounds above 1 (ModernBERT's NVFP4 read 1.0008).
    cosine = float(torch.nn.functional.cosine_similarity(ref.flatten().double(), out.flatten().double(), dim=0))
    per_sample = torch.nn.functional.cosine_similarity(ref, out, dim=1)
    # Top-1 agreement where the outputs are class scores (samples × classes), not hidden states.
    classes = reference_outputs[0].dim() == 2
    top1 = float((ref.argmax(dim=1) == out.argmax(dim=1)).float().mean()) if classes else None
    from pipeline.measuring.accuracy import accuracy_floor

    floor = accuracy_floor(precision, sparse)
    result = {
        "reference": "the dense FP32 PyTorch model on the same inputs",
        "samples": int(ref.shape[0]),
        "cosine_similarity": cosine,
        "min_sample_cosine_similarity": float(per_sample.min()),
        "max_abs_error": float((ref - out).abs().max()),
        "top1_agreement": top1,
        "cosine_floor": floor,
        "warning": None,
    }
    if cosine < floor:
        result["warning"] = (
            f"outputs drift from FP32: cosine similarity {cosine:.4f} is below {floor} for {precision}"
            + (" with 2:4 sparsity" if sparse else "")
            + (f" (top-1 agreement {top1:.0%})" if top1 is not None else "")
        )
    return result

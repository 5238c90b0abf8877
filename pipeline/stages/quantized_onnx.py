"""A calibrated, fake-quantized PyTorch model written as the ONNX TensorRT builds from: real
low-precision weights and the ops TensorRT parses, by ModelOpt's exporter — or, for INT8 with FP32
weights, ModelOpt's INT8 steps run directly on a TorchScript export, in a quarter of the time —
with the graph repairs the block formats need (pipeline/stages/quantize.py calibrates)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.running.errors import PipelineError, require_module
from pipeline.stages.fp4_graph import make_fp4_graph_consistent
from pipeline.stages.quantize import CPU_TRACE_BATCH, TRACED_HIGH_PRECISION, import_modelopt
from pipeline.stages.quantized_layers import BLOCK_FORMATS


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
        # on CUDA with torch 2.11 (docs/quantization.md, 'Export speed'); traced on the CPU it exports the same graph.
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
    the export of ViT-B, whose FP32 graph is 346 MB (measured: docs/quantization.md, 'Export
    speed'). tests/stages/test_quantize.py checks that both give the same graph, so a ModelOpt
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
# Tensors this small keep their data when shapes are inferred: shape constants among them.
SMALL_TENSOR_BYTES = 4096


@contextmanager
def shape_inference_without_weights():
    """Within: ``onnx.shape_inference.infer_shapes`` runs on the graph without its weights' bytes.

    Inference copies the whole model through protobuf, and needs only the weights' shapes and types.
    ModelOpt's exporter runs it twice on the full graph: a third of an FP8 export of ViT-B
    (measured: docs/quantization.md, 'Export speed'). The result is the same model, byte
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

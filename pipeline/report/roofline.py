"""How close an engine gets to the GPU's peak: FLOPs from the ONNX graph, peaks from datasheets.

FLOPs count the matrix work only — MatMul, Gemm and Conv (attention's two matrix products are
MatMuls) — at 2 FLOPs per multiply-add. That is nearly all of a ViT's arithmetic, and it is what
the tensor-core peaks describe.
"""

from __future__ import annotations

# Dense (non-sparse) tensor-core peaks in TFLOP/s, per precision.
# Sources: NVIDIA H100 datasheet (SXM5: FP16/BF16 989.4, FP8 1978.9, INT8 1978.9 TOPS, TF32 494.7;
# nvidia.com/en-us/data-center/h100), NVIDIA A100 datasheet (FP16 312, INT8 624 TOPS, TF32 156;
# nvidia.com/en-us/data-center/a100), NVIDIA L4 datasheet (FP16 121, FP8 242.5, INT8 242.5;
# nvidia.com/en-us/data-center/l4). The datasheets quote sparse figures at twice these.
GPU_PEAK_TFLOPS = {
    "NVIDIA H100 80GB HBM3": {"fp32": 494.7, "fp16": 989.4, "bf16": 989.4, "int8": 1978.9, "fp8": 1978.9},
    "NVIDIA H100 PCIe": {"fp32": 378.0, "fp16": 756.0, "bf16": 756.0, "int8": 1513.0, "fp8": 1513.0},
    "NVIDIA A100-SXM4-80GB": {"fp32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
    "NVIDIA A100-SXM4-40GB": {"fp32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
    "NVIDIA L4": {"fp32": 60.0, "fp16": 121.0, "bf16": 121.0, "int8": 242.5, "fp8": 242.5},
}
# The datasheets quote one "BF16 | FP16 Tensor Core" figure. fp32 above is TF32 tensor-core
# throughput, which TensorRT uses for FP32 by default (PyTorch only with tf32 = true).


def peak_tflops(gpu_name: str | None, precision: str) -> float | None:
    if not gpu_name:
        return None
    peaks = GPU_PEAK_TFLOPS.get(gpu_name.strip())
    return peaks.get(precision) if peaks else None


def matmul_flops(model) -> int | None:
    """FLOPs of MatMul/Gemm/Conv in an ONNX graph with static shapes; None when shapes are unknown."""
    import onnx

    try:
        # data_prop follows Shape→Gather→Concat→Reshape chains, which keep the batch dimension.
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # custom (trt::) ops without shape functions
        return None
    shapes: dict[str, list[int]] = {}
    for value in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
        shapes[value.name] = dims
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    total = 0
    for node in inferred.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        out = shapes.get(node.output[0])
        if not out or any(d is None for d in out):
            return None
        if node.op_type == "Conv":
            weight = shapes.get(node.input[1])
            if not weight or any(d is None for d in weight):
                return None
            # Conv weights are [out, in / groups, kh, kw]: each output sums over weight[1:] inputs.
            total += 2 * _prod(out) * _prod(weight[1:])
        else:
            a = shapes.get(node.input[0])
            if not a or a[-1] is None:
                return None
            k = a[-1]
            if node.op_type == "Gemm" and any(attr.name == "transA" and attr.i for attr in node.attribute):
                k = a[0]
            total += 2 * _prod(out) * k
    return total or None


def _prod(values) -> int:
    result = 1
    for v in values:
        result *= v
    return result

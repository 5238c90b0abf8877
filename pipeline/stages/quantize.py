"""Quantize stage: post-training quantization with NVIDIA ModelOpt on the PyTorch model.

The model is calibrated with ModelOpt's preset for the precision, and exported with ModelOpt's
ONNX exporter, which writes what TensorRT 10 builds from: Q/DQ nodes for INT8, FP8 weights with
TensorRT's Q/DQ ops for FP8, FP4 weights + DequantizeLinear for NVFP4, MXFP8 weights + dequantize
for MXFP8. INT8 with FP32 weights gets the same graph from ModelOpt's steps run directly, in a
quarter of the time (pipeline/stages/quantized_onnx.py).

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
from typing import Any

from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError, require_module
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
# Tracing runs the model forward, and one batch-64 forward of ViT-B takes 4-5 s on 16 CPU cores
# (docs/quantization.md, 'Export speed'). So CPU traces use this many samples with the batch axis left dynamic,
# and the export stage pins it back to the model's batch size.
CPU_TRACE_BATCH = 2


# ModelOpt imports its Hugging Face plugins whenever these packages are installed: seconds of
# import time for plugins that never apply to timm models.
_HF_PLUGIN_PACKAGES = ("transformers", "peft", "diffusers", "megatron")


# What the export stage uses of ModelOpt. modelopt.torch.export is imported by ModelOpt itself
# during calibration; imported here first, its Hugging Face plugins stay unloaded too (most of the
# first quantization in a process where transformers is installed: docs/quantization.md, 'Export speed').
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
    from pipeline.catalog.floor import accuracy_floor

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

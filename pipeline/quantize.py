"""Post-training quantization with NVIDIA ModelOpt on the PyTorch model (fake-quant → Q/DQ ONNX).

INT8 and FP8 fake quantization run on the CPU. MXFP8 and NVFP4 use ModelOpt kernels that need
CUDA, so they stop with a clear message on machines without a GPU.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import EnvironmentMissing, PipelineError, require_module

# ModelOpt's preset configuration for each precision (names from modelopt.torch.quantization).
PRESETS = {
    "int8": "INT8_DEFAULT_CFG",
    "fp8": "FP8_DEFAULT_CFG",
    "mxfp8": "MXFP8_DEFAULT_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
}
NEEDS_CUDA = {"mxfp8", "nvfp4"}
# Q/DQ with FP8 types is defined from opset 19 on.
MIN_OPSET = {"fp8": 19, "mxfp8": 19, "nvfp4": 19}


def quantize_model(model, precision: str, input_shape: tuple[int, ...], calib_batches: int, seed: int):
    """Calibrate ``model`` in place with ModelOpt; returns it and a description for the manifest."""
    import torch

    if precision not in PRESETS:
        raise PipelineError(f"no quantization preset for precision {precision!r}.", hint=f"known: {sorted(PRESETS)}")
    if precision in NEEDS_CUDA and not torch.cuda.is_available():
        raise EnvironmentMissing(
            f"{precision} quantization needs a CUDA GPU (ModelOpt's {precision} kernels are CUDA-only), "
            "and this machine has none.",
            hint="run this export on a machine with an NVIDIA GPU, or pick int8/fp8",
        )
    mtq = require_module("modelopt.torch.quantization", purpose=f"{precision} quantization")
    config = getattr(mtq, PRESETS[precision])
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    # Synthetic calibration: random images, so no dataset is needed. Stated in the manifest,
    # because ranges calibrated on noise are not those of real images.
    batches = [torch.randn(*input_shape, generator=generator).to(device=device, dtype=dtype) for _ in range(calib_batches)]

    def forward_loop(m):
        with torch.no_grad():
            for batch in batches:
                m(batch)

    model = mtq.quantize(model, config, forward_loop)
    info: dict[str, Any] = {
        "tool": "nvidia-modelopt",
        "preset": PRESETS[precision],
        "calibration": {"source": "synthetic (standard normal)", "batches": calib_batches, "batch_shape": list(input_shape)},
    }
    return model, info

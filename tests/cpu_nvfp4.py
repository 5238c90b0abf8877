"""NVFP4 (and MXFP8) exports on a machine without CUDA, for tests only.

ModelOpt's NVFP4 fake quantization is a CUDA kernel (Triton, or its CUDA extension), so the
product refuses NVFP4 without a GPU. The exported graph does not depend on that kernel: tracing
records ModelOpt's symbolic FP4 operators, and the FP4 weights are computed by its exporter in
PyTorch. To check on every CI run that the NVFP4 graph is one TensorRT's parser accepts, tests
replace the kernel with the same arithmetic in plain PyTorch (per-tensor FP32 scale, per-16-block
FP8 E4M3 scale, values rounded to the FP4 E2M1 grid). The accuracy numbers of such an export are
this stand-in's, not ModelOpt's; the graph is the one ModelOpt writes.
"""

from __future__ import annotations

import contextlib

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def fake_mxfp8(inputs, block_size):
    """MXFP8: E4M3 values, a power-of-two (E8M0) scale per block, rounded up so the block's
    largest value fits (the OCP MX rule)."""
    import torch

    if torch.jit.is_tracing():
        return inputs.clone()
    values = inputs.float().reshape(-1, block_size)
    amax = values.abs().amax(dim=1, keepdim=True).clamp(min=2**-126)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    quantized = (values / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
    return quantized.reshape(inputs.shape).to(inputs.dtype)


def fake_nvfp4(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
    import torch

    if (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (8, 4, 9, 8):
        return fake_mxfp8(inputs, block_size)
    if (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) != (4, 2, 8, 4):
        raise NotImplementedError("this stand-in only does NVFP4 (E2M1 values, E4M3 block scales) and MXFP8")
    if torch.jit.is_tracing():
        # Export only needs the shape: the graph records ModelOpt's symbolic FP4 operator instead.
        return inputs.clone()
    values = inputs.float().reshape(-1, block_size)
    per_tensor = amax.float().amax() / (6.0 * 448.0)
    per_block = (values.abs().amax(dim=1, keepdim=True) / 6.0 / per_tensor).clamp(2**-9, 448.0)
    scale = per_block.to(torch.float8_e4m3fn).float() * per_tensor
    scaled = (values / scale).clamp(-6.0, 6.0)
    grid = torch.tensor(E2M1_GRID)
    nearest = grid[(scaled.abs().unsqueeze(-1) - grid).abs().argmin(-1)]
    return (nearest * scaled.sign() * scale).reshape(inputs.shape).to(inputs.dtype)


@contextlib.contextmanager
def nvfp4_without_cuda(monkeypatch, mxfp8: bool = False):
    """Within: NVFP4 quantization (and MXFP8 with ``mxfp8``) runs on the CPU with the stand-in kernel."""
    import pipeline.stages.quantize
    from pipeline.stages.quantize import load_modelopt

    load_modelopt("NVFP4 test exports")
    from modelopt.torch.quantization import tensor_quant

    monkeypatch.setattr(tensor_quant, "dynamic_block_quantize_op", fake_nvfp4)
    # MXFP8 only where asked: the tests of a machine without CUDA expect it refused.
    monkeypatch.setattr(pipeline.stages.quantize, "NEEDS_CUDA", set() if mxfp8 else {"mxfp8"})
    yield

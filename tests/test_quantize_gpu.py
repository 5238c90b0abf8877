"""Quantization on a CUDA GPU: ViT-B (the catalog's `vit`) in MXFP8 and NVFP4, dense and 2:4 sparse,
and INT8, whose export takes a CPU detour on CUDA machines.

ModelOpt's MXFP8/NVFP4 fake quantization only runs on CUDA, so these tests need an NVIDIA GPU.
Export times are measured by scripts/benchmark_export.py, not asserted here.
"""

from __future__ import annotations

import shutil

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import REPO_ROOT, modelopt_onnx, quantized_test_vit

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA: MXFP8/NVFP4 fake quantization is CUDA-only, and INT8 takes another path there"),
]

ENGINES = ("vit_mxfp8", "vit_nvfp4", "vit_nvfp4_sparse", "vit_mxfp8_sparse", "vit_int8")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from pipeline.cli import main

    ws = tmp_path_factory.mktemp("gpu")
    shutil.copy(REPO_ROOT / "pipeline.toml", ws / "pipeline.toml")
    args = ["--catalog", str(ws / "pipeline.toml"), "export", "--calib-samples", "16"]
    for engine in ENGINES:
        args += ["--engine", engine]
    assert main(args) == 0
    return ws


def details(ws, engine):
    return read_manifest(ws / "manifests" / "export" / f"{engine}.json").export.details


def _ops(d) -> str:
    return " ".join(d.onnx_ops)


@pytest.mark.parametrize("engine", ["vit_nvfp4", "vit_nvfp4_sparse"])
def test_nvfp4_exports_fp4_weights_not_the_intermediate_qdq_op(exported, engine):
    d = details(exported, engine)
    assert d.onnx_audit["initializer_dtypes"].get("FLOAT4E2M1", 0) > 0, d.onnx_audit
    assert "TRT_FP4QDQ" not in _ops(d), d.onnx_ops
    assert "FP4" in _ops(d) or "DequantizeLinear" in d.onnx_ops, d.onnx_ops
    assert set(d.quantization["excluded_layers"]) == {"patch_embed.proj", "head"}
    assert d.input_shape == [64, 3, 224, 224]


@pytest.mark.parametrize("engine", ["vit_mxfp8", "vit_mxfp8_sparse"])
def test_mxfp8_exports_tensorrt_mxfp8_ops(exported, engine):
    d = details(exported, engine)
    assert "MXFP8" in _ops(d), d.onnx_ops
    assert set(d.quantization["excluded_layers"]) == {"patch_embed.proj", "head"}


@pytest.mark.parametrize("engine", ["vit_nvfp4_sparse", "vit_mxfp8_sparse"])
def test_sparse_block_formats_keep_the_2_4_pattern(exported, engine):
    s = details(exported, engine).sparsification
    assert s["sparsified_layers"] == 49  # 12 blocks × 4 Linear + the head
    assert s["onnx"]["weights_2_4"] >= s["sparsified_layers"] - 1  # the head is left unquantized but sparse


def test_accuracy_proxy_of_block_formats(exported):
    for engine in ENGINES:
        accuracy = details(exported, engine).accuracy
        assert accuracy["samples"] == 16 and 0.0 <= accuracy["top1_agreement"] <= 1.0
    assert details(exported, "vit_mxfp8").accuracy["cosine_similarity"] > 0.9


def test_int8_is_calibrated_on_the_gpu_and_traced_on_the_cpu_at_a_small_batch(exported):
    d = details(exported, "vit_int8")
    # Tracing ModelOpt's INT8 model on CUDA crashed the process; the CPU trace is cheap at batch 2.
    assert d.traced_batch == 2 and d.input_shape == [64, 3, 224, 224]
    assert d.parity.passed and d.parity.samples == 8
    assert d.onnx_ops["QuantizeLinear"] > 0 and d.onnx_ops["DequantizeLinear"] > 0
    assert d.onnx_audit["matmul_flops"] > 1e12  # ViT-B at batch 64 is over a TFLOP: the pinned shapes resolve


@pytest.mark.parametrize("precision", ["mxfp8", "nvfp4"])
def test_block_format_exports_are_unchanged_by_weightless_shape_inference(precision):
    """The shim around ModelOpt's exporter must give its exact output for the CUDA-only formats too."""
    from pipeline.quantize import DEFAULT_WEIGHTS_DTYPE, shape_inference_without_weights

    model = quantized_test_vit(precision, device="cuda")
    sample = torch.randn(2, 3, 160, 160, device="cuda")
    plain = modelopt_onnx(model, sample, 19, DEFAULT_WEIGHTS_DTYPE[precision])
    with shape_inference_without_weights():
        assert modelopt_onnx(model, sample, 19, DEFAULT_WEIGHTS_DTYPE[precision]) == plain

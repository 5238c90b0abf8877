"""Quantization on a CUDA GPU: ViT-B (the catalog's `vit`) in MXFP8 and NVFP4, dense and 2:4 sparse,
and INT8, whose export takes a CPU detour on CUDA machines.

ModelOpt's MXFP8/NVFP4 fake quantization only runs on CUDA, so these tests need an NVIDIA GPU.
Export times are measured by scripts/benchmark_export.py, not asserted here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import REPO_ROOT, modelopt_onnx, quantized_test_vit

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs an NVIDIA GPU with CUDA: MXFP8/NVFP4 fake quantization is CUDA-only, and INT8 takes another path there",
    ),
]

ENGINES = ("vit_mxfp8", "vit_nvfp4", "vit_nvfp4_sparse", "vit_mxfp8_sparse", "vit_int8")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from pipeline.cli import main

    # GPU_TEST_WORKSPACE keeps the exports between runs on one machine: unchanged ones are skipped.
    ws = Path(os.environ["GPU_TEST_WORKSPACE"]) if os.environ.get("GPU_TEST_WORKSPACE") else tmp_path_factory.mktemp("gpu")
    ws.mkdir(parents=True, exist_ok=True)
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
    from pipeline.stages.quantize import DEFAULT_WEIGHTS_DTYPE, TRACED_HIGH_PRECISION
    from pipeline.stages.quantized_onnx import shape_inference_without_weights

    # NVFP4's FP16 comes from the traced model; ModelOpt is asked to convert nothing ("fp32").
    weights_dtype = "fp32" if precision in TRACED_HIGH_PRECISION else DEFAULT_WEIGHTS_DTYPE[precision]
    model = quantized_test_vit(precision, device="cuda")
    sample = torch.randn(2, 3, 160, 160, device="cuda")
    plain = modelopt_onnx(model, sample, 19, weights_dtype)
    with shape_inference_without_weights():
        assert modelopt_onnx(model, sample, 19, weights_dtype) == plain


# --- the exports above, compiled by a real TensorRT compiler ----------------------------------


@pytest.fixture(scope="module")
def rtx(exported):
    """TensorRT-RTX 1.7 pulled into this workspace's cache (on a machine without the package
    index, point pip at carried wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR)."""
    from pipeline.cli import main

    if main(["--catalog", str(exported / "pipeline.toml"), "toolchains", "pull", "trt-rtx1.7"]) != 0:
        pytest.skip("TensorRT-RTX 1.7.1.116 could not be pulled here (see the output above)")
    return exported


@pytest.mark.rtx
@pytest.mark.parametrize(
    "engine, intended", [("vit_nvfp4", "fp4"), ("vit_nvfp4_sparse", "fp4"), ("vit_mxfp8", "fp8"), ("vit_mxfp8_sparse", "fp8")]
)
def test_block_format_exports_build_for_blackwell_sm120(rtx, engine, intended):
    from pipeline.cli import main

    args = ["--catalog", str(rtx / "pipeline.toml"), "build", "--engine", engine, "--toolchain", "trt-rtx1.7", "--arch", "sm120"]
    assert main(args + ["--calib-samples", "16"]) == 0  # the calibration `exported` used: no re-export
    build = read_manifest(rtx / "manifests" / "trt-rtx1.7" / f"{engine}.json").build
    assert build.status == "done" and build.details.settings["targets"] == ["sm120"]
    assert intended in build.details.precision_audit["types_seen"], build.details.precision_audit
    print(
        f"{engine}: built for sm120 in {build.duration_s:.1f} s, {build.outputs[0].size_bytes / 2**20:.1f} MiB, "
        f"layers {build.details.precision_audit['output_types']}"
    )


@pytest.mark.rtx
def test_this_gpu_refuses_tensorrt_rtx_engines_unless_it_is_an_rtx_class_gpu(rtx):
    """The profile stage's skip, and the list it names, against what the runtime itself says here."""
    import re
    import subprocess

    from pipeline.cli import main
    from pipeline.machine.environment import nvidia_gpus
    from pipeline.runtimes.tensorrt_rtx.runtime import RUNS_ON

    gpu = nvidia_gpus()[0]
    if gpu.compute_capability in RUNS_ON:
        pytest.skip(f"{gpu.name} runs TensorRT-RTX engines: the profile is timed, not skipped")
    assert (
        main(
            [
                "--catalog",
                str(rtx / "pipeline.toml"),
                "profile",
                "--engine",
                "vit_mxfp8",
                "--toolchain",
                "trt-rtx1.7",
                "--arch",
                "sm120",
                "--calib-samples",
                "16",
            ]
        )
        == 0
    )
    profile = read_manifest(rtx / "manifests" / "trt-rtx1.7" / "vit_mxfp8.json").profile
    assert profile.status == "skipped" and gpu.name in profile.reason and gpu.compute_capability in profile.reason
    # Asked anyway, the runtime refuses the engine and names the GPUs it runs on.
    from pipeline.running.cache import cache_dir
    from pipeline.runtimes.tensorrt_rtx.release import DRIVER, ReleaseEnvironment, cuda_flavour

    env = ReleaseEnvironment("1.7.1.116", cuda_flavour("auto"), cache_dir())
    result = rtx / "refused.json"
    subprocess.run(
        [str(env.python), "-I", str(DRIVER), "profile", str(result), "--engine", str(rtx / "engines" / "trt-rtx1.7" / "vit_mxfp8.engine")],
        check=True,
    )
    said = json.loads(result.read_text())
    print("runtime:", said["error"])
    assert said["ran"] is False and "cannot run on this GPU" in said["error"]
    # It names the engine's targets (an sm120 engine: 12.0), and says this GPU is not one it supports.
    listed = re.search(r"Supported compute capabilities: ([\d. ]+?)\.(?:\s|$)", said["error"]).group(1).split()
    assert listed == ["12.0"] and set(listed) <= set(RUNS_ON), listed
    assert "TensorRT-RTX does not support this compute capability" in said["error"]


@pytest.mark.rtx
def test_the_drivers_cuda_timing_replays_a_graph_on_this_gpu(rtx):
    """The driver's CUDA path (libcuda through ctypes, graph capture, event timing, trtexec's
    warm-up/iterations/duration rules) on a GPU that cannot run TensorRT-RTX engines itself."""
    import subprocess

    from pipeline.machine.environment import nvidia_gpus
    from pipeline.running.cache import cache_dir
    from pipeline.runtimes.tensorrt_rtx.release import DRIVER, ReleaseEnvironment, cuda_flavour

    env = ReleaseEnvironment("1.7.1.116", cuda_flavour("auto"), cache_dir())
    result = rtx / "cuda-check.json"
    subprocess.run(
        [str(env.python), "-I", str(DRIVER), "cuda-check", str(result), "--warmup-ms", "50", "--iterations", "200", "--duration-s", "0.5"],
        check=True,
    )
    said = json.loads(result.read_text())
    times = said["per_iteration_ms"]
    assert said["device"]["name"] == nvidia_gpus()[0].name
    assert len(times) >= 200 and said["walltime_s"] >= 0.5 and all(t > 0 for t in times)
    median = sorted(times)[len(times) // 2]
    print(f"memset of 64 MiB in a CUDA graph: median {median:.4f} ms over {len(times)} runs ({said['bytes'] / median / 1e6:.0f} GB/s)")

"""The sweep's edges on a real GPU: a point that runs out of GPU memory for real, and a kernel that
faults for real (a device-side assert) at one of two points, each costing that point alone.
Run by scripts/check_edges_gpu.sh on a GPU machine; they skip without one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import DATA, catalog_head, write_catalog
from tests.stages.test_edges import run_pipeline

torch = pytest.importorskip("torch", reason="needs torch with CUDA")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA: real out-of-memory and kernel faults"),
]

# The catalog head's default toolchain is defined; the runs name the torch ones (ONNX Runtime would
# run 4×70000 on the host, whose memory is not what is tested here).
TORCH_TOOLCHAINS = """
[toolchains.onnxruntime]
kind = "onnxruntime"

[toolchains.torch-eager]
kind = "torch"
backend = "eager"

[toolchains.torch-cudagraphs]
kind = "torch"
backend = "cudagraphs"
"""


def workspace(root: Path, module: str, config: str, shapes: str) -> Path:
    text = (
        catalog_head(["m"], ["fp32"])
        + f"""
[models.m]
python = "models-in/{module}:make"
config = {config}
shapes = {shapes}

[variants.fp32]
precision = "fp32"
"""
        + TORCH_TOOLCHAINS
    )
    path = write_catalog(root, text)
    (root / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / module, root / "models-in" / module)
    return path


def profile(root: Path, toolchain: str, shape: str):
    return read_manifest(root / "manifests" / toolchain / f"m_fp32@{shape}.json").profile


RUN = ("run", "--model", "m", "--toolchain", "torch-eager", "--toolchain", "torch-cudagraphs")


def test_a_point_that_does_not_fit_on_the_gpu_is_a_result(tmp_path):
    """70,000 positions: one sample's scores fit (about 40 GB at its peak on an 80 GB GPU), the batch
    of four does not. The FP32 reference is made a sample at a time; both engines run out at 4×70000,
    recorded with what PyTorch asked for; 1×1024 is measured; exit 0."""
    path = workspace(tmp_path, "self_attention_scores.py", "{ features = 8 }", '["1x1024", "4x70000"]')
    result = run_pipeline(path, *RUN)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for toolchain in ("torch-eager", "torch-cudagraphs"):
        assert profile(tmp_path, toolchain, "1x1024").status == "done"
        record = profile(tmp_path, toolchain, "4x70000")
        assert record.status == "out_of_memory" and record.out_of_memory.memory == "GPU"
        assert record.out_of_memory.requested_bytes and record.out_of_memory.total_bytes
    details = read_manifest(tmp_path / "manifests" / "export" / "m_fp32.json").export.details
    assert details.references_in_parts.get("4x70000") in (1, 2) or "4x70000" in details.references_out_of_memory


def test_a_device_side_assert_at_one_point_costs_that_point(tmp_path):
    """A table of 2048 positions indexed at 4096: CUDA's device-side assert, in the export's FP32
    reference first and then in each engine's preparation at 4×4096. Each is recorded for its point,
    the command goes on in fresh processes, 2×1024 is measured on both toolchains; exit 1 naming the
    point, no traceback."""
    path = workspace(tmp_path, "position_table.py", "{ features = 8, positions = 2048 }", '["2x1024", "4x4096"]')
    result = run_pipeline(path, *RUN)
    print(result.stdout, result.stderr)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "INTERNAL ERROR" not in result.stderr
    assert "faulted on the GPU exporting m_fp32: the FP32 reference at shape 4×4096" in result.stderr
    for toolchain in ("torch-eager", "torch-cudagraphs"):
        assert profile(tmp_path, toolchain, "2x1024").status == "done"
        faulted = profile(tmp_path, toolchain, "4x4096")
        assert faulted.status == "faulted" and "device-side assert" in faulted.fault.error
    assert "The answer" in result.stdout

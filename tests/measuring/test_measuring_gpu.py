"""Which GPU a shape point is measured on: the first CUDA_VISIBLE_DEVICES names (by index or UUID),
else GPU 0, as nvidia-smi numbers them — recorded in every profile's manifest, and handed to a
trtexec container so that its GPU 0 is that one too."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_CATALOG, write_catalog

TWO_GPUS = [["0", "GPU-aaaa1111-0000", "NVIDIA H100 80GB HBM3"], ["1", "GPU-bbbb2222-0000", "NVIDIA H100 80GB HBM3"]]


@pytest.fixture
def two_gpus(monkeypatch):
    from pipeline.machine import nvidia_smi

    monkeypatch.setattr(
        nvidia_smi, "query", lambda fields, what="gpu": [row[:3] for row in TWO_GPUS] if fields == "index,uuid,name" else []
    )


@pytest.mark.parametrize(
    ("visible", "index"),
    [(None, 0), ("1", 1), ("1,0", 1), ("GPU-bbbb2222-0000", 1), ("GPU-bbbb", 1), ("0", 0), ("7", None), ("", None)],
)
def test_the_gpu_measured_on_is_the_first_visible_one(two_gpus, monkeypatch, visible, index):
    from pipeline.machine.environment import measuring_gpu

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpu = measuring_gpu()
    assert (gpu["index"] if gpu else None) == index
    if gpu:
        assert gpu == {"index": index, "uuid": TWO_GPUS[index][1], "name": "NVIDIA H100 80GB HBM3"}


def test_without_a_gpu_none_is_recorded(monkeypatch):
    from pipeline.machine import nvidia_smi
    from pipeline.machine.environment import measuring_gpu

    monkeypatch.setattr(nvidia_smi, "query", lambda fields, what="gpu": [])
    assert measuring_gpu() is None


def test_every_profile_of_a_point_names_the_gpu_it_was_measured_on(two_gpus, monkeypatch, tmp_path, run_cli):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG)
    result = run_cli(catalog, "run", "--variant", "fp32", "--variant", "fp16")
    assert result.exit_code == 0, result.err
    for variant in ("fp32", "fp16"):
        details = json.loads((tmp_path / "ws" / "manifests" / "onnxruntime" / f"tiny_{variant}.json").read_text())["profile"]["details"]
        assert details["gpu_device"] == {"index": 1, "uuid": "GPU-bbbb2222-0000", "name": "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize(("visible", "request_ids", "count"), [("1", ["1"], 0), ("GPU-bbbb,0", ["GPU-bbbb", "0"], 0), (None, [], -1)])
def test_a_trtexec_container_gets_the_gpus_this_run_sees(monkeypatch, visible, request_ids, count):
    pytest.importorskip("docker.types", reason="the trtexec-container toolchain runs through the Docker SDK")
    import docker
    from pipeline.runtimes.tensorrt.docker import gpu_request

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    request = gpu_request(docker)
    assert request["DeviceIDs"] == request_ids and request["Count"] == count and request["Capabilities"] == [["gpu"]]

"""The trtexec-local toolchain: trtexec installed on this machine, run as a subprocess.

The `trtexec` here is the stand-in script (tests/standin/trtexec) replaying recorded TensorRT
10.14.1 output; it proves the subprocess plumbing, not TensorRT.
"""

from __future__ import annotations

import shutil

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, write_catalog
from tests.dockerd import STANDIN, standin_files


@pytest.fixture
def local_install(tmp_path, monkeypatch):
    def install(mode: str = "ok", timeout_s: float = 60):
        root = tmp_path / f"TensorRT-{mode}"
        (root / "bin").mkdir(parents=True)
        (root / "lib").mkdir()
        shutil.copy(STANDIN, root / "bin" / "trtexec")
        data = tmp_path / f"standin-{mode}"
        data.mkdir()
        for name, content in standin_files(mode).items():
            (data / name).write_bytes(content)
        monkeypatch.setenv("STANDIN_DIR", str(data))
        extra = f'\n[toolchains.local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ntrt_root = "{root}"\ngpus = "none"\ntimeout_s = {timeout_s}\n'
        return write_catalog(tmp_path / "ws", TINY_CATALOG + extra)

    return install


def test_local_build_and_profile(local_install, run_cli):
    catalog = local_install("ok")
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    manifest = read_manifest(catalog.parent / "manifests" / "local" / "tiny_fp32.json")
    assert manifest.build.command[0].endswith("/bin/trtexec")
    assert manifest.build.command[1] == f"--onnx={catalog.parent / 'models' / 'tiny' / 'fp32.onnx'}"
    assert manifest.build.details.trtexec["trt_version"] == "10.14.1"
    assert manifest.profile.details.metric == "GPU compute time"
    assert (catalog.parent / "engines" / "local" / "tiny_fp32.build.log").read_text().count("&&&& PASSED") == 1


def test_local_timeout_kills_trtexec(local_install, run_cli):
    catalog = local_install("slow", timeout_s=2)
    result = run_cli(catalog, "build", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 1
    assert "ran past its 2 s limit and was killed" in result.err
    assert not (catalog.parent / "engines" / "local" / "tiny_fp32.engine").exists()


def test_missing_local_install_is_an_environment_error(tmp_path, run_cli):
    extra = '\n[toolchains.local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ntrt_root = "/nonexistent/TensorRT"\ngpus = "none"\n'
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + extra)
    result = run_cli(catalog, "build", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 3
    assert "/nonexistent/TensorRT/bin/trtexec does not exist" in result.err

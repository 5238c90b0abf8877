"""What a user sees at the command line: help, errors with tips, exit codes."""

import subprocess
import sys

from tests.conftest import REPO_ROOT, TINY_CATALOG


def test_help_imports_no_heavy_dependency():
    code = (
        "import sys; from pipeline.cli import main; rc = main(['--help']); "
        "heavy = [m for m in ('torch', 'timm', 'onnxruntime', 'onnx', 'docker', 'pydantic') if m in sys.modules]; "
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0
    assert "export → build → profile → compare" in result.stdout
    assert "HEAVY []" in result.stdout


def test_every_command_has_help(run_cli, tiny_catalog):
    for command in ("models", "export", "build", "profile", "run", "compare", "doctor", "reduce"):
        result = run_cli(tiny_catalog, command, "--help")
        assert result.exit_code == 0, command
        assert "Usage: pipeline " + command in result.out


def test_by_names_every_ranking_in_its_help_and_refuses_others(run_cli, tiny_catalog):
    from pipeline.catalog.settings import RANKED_BY

    for command in ("profile", "run", "compare"):
        help_text = " ".join(run_cli(tiny_catalog, command, "--help").out.split())
        assert f"({', '.join(RANKED_BY[:-1])} or {RANKED_BY[-1]})" in help_text, command
    refused = run_cli(tiny_catalog, "compare", "--by", "fastest")
    assert refused.exit_code == 2 and "'fastest' is no ranking; use one of " + ", ".join(RANKED_BY) in refused.err


def test_unknown_engine_is_a_usage_error_with_a_suggestion(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "export", "--engine", "tiny_fp23")
    assert result.exit_code == 2
    assert "ERROR unknown engine 'tiny_fp23'." in result.err
    assert "TIP did you mean 'tiny_fp32'" in result.err
    assert "Traceback" not in result.err


def test_path_like_engine_name_is_refused(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "export", "--engine", "../../etc/passwd")
    assert result.exit_code == 2
    assert "is not allowed" in result.err
    assert not (tiny_catalog.parent / "models").exists()


def test_engine_and_model_selection_cannot_be_mixed(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "build", "--engine", "tiny_fp32", "--model", "tiny")
    assert result.exit_code == 2
    assert "--engine cannot be combined with --model/--variant" in result.err


def test_toolchains_and_trt_releases_make_one_sweep_each_named_once(run_cli, tiny_catalog):
    result = run_cli(
        tiny_catalog,
        "build",
        "--engine",
        "tiny_fp32",
        "--toolchain",
        "onnxruntime",
        "--trt",
        "10.14",
        "--toolchain",
        "onnxruntime",
        "--dry-run",
    )
    assert result.exit_code == 0, result.err
    headers = [line for line in result.out.splitlines() if line.startswith("# ")]
    assert headers == ["# onnxruntime", "# trt10.14"]
    trtexec = result.out.split("# trt10.14")[1]
    assert "trtexec" in trtexec and "trtexec" not in result.out.split("# trt10.14")[0]


def test_unknown_trt_version_lists_known_ones(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "profile", "--engine", "tiny_fp32", "--trt", "9.9")
    assert result.exit_code == 2
    assert "no toolchain provides TensorRT 9.9" in result.err
    assert "10.14.1" in result.err


def test_click_usage_errors_exit_2(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "compare", "--format", "xml")
    assert result.exit_code == 2
    assert "Invalid value for '--format'" in result.err


def test_compare_without_results_says_what_to_run(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "compare")
    assert result.exit_code == 1
    assert "ERROR no engine manifests" in result.err
    assert "TIP run `pipeline run`" in result.err


def test_models_lists_the_catalog(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "models")
    assert result.exit_code == 0
    for text in ("test_vit", "random init (seed 0)", "nvfp4", "2:4", "trt10.14", "tiny_fp32"):
        assert text in result.out


def test_dry_run_prints_the_plan_and_does_nothing(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "profile", "--engine", "tiny_fp16", "--engine", "tiny_nvfp4", "--dry-run")
    assert result.exit_code == 0
    assert "tiny_fp16: export → models/tiny/fp16.onnx" in result.out
    assert "optimise fp16.onnx (ORT_ENABLE_EXTENDED) → " in result.out
    assert "≥1 runs and ≥5 ms" in result.out
    assert "tiny_nvfp4: would be skipped: nvfp4 needs TensorRT" in result.out
    assert not (tiny_catalog.parent / "models").exists()
    planned = run_cli(tiny_catalog, "run", "--engine", "tiny_fp16", "--dry-run")  # run plans as profile does, and compares nothing
    assert planned.exit_code == 0 and "tiny_fp16: export → models/tiny/fp16.onnx" in planned.out and "The answer" not in planned.out
    assert not (tiny_catalog.parent / "models").exists()


def test_doctor_reports_the_embedded_runtime_as_usable(run_cli, tiny_catalog, monkeypatch):
    import json

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # no Docker Engine to reach
    result = run_cli(tiny_catalog, "doctor", "--json")
    assert result.exit_code == 0
    checks = {c["name"]: c for c in json.loads(result.out)}
    assert checks["toolchain onnxruntime"]["ok"] is True
    assert checks["package onnxruntime"]["ok"] is True
    # The tools the build's ONNX goes through (pipeline/graph/), by version.
    from importlib.metadata import version

    assert checks["package polygraphy"] == {"name": "package polygraphy", "ok": True, "detail": version("polygraphy")}
    assert "NVIDIA GPU" in checks and "Docker daemon" in checks and "toolchain trt10.14" in checks
    # What doctor says of a toolchain it cannot reach says what to do, not to run doctor.
    trt = checks["toolchain trt10.14"]
    assert trt["ok"] is False and "Docker is not reachable (start it, or set DOCKER_HOST)" in trt["detail"], trt
    assert "pipeline doctor" not in trt["detail"]


def test_doctor_names_the_torch_build_and_on_a_gpu_machine_what_installs_the_cuda_one(monkeypatch):
    import torch

    from pipeline.machine.environment import GpuInfo
    from pipeline.runtimes.doctor import check_torch_build

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    alone = check_torch_build(gpus=[])
    assert alone.ok and alone.detail == "torch 2.13.0+cpu: the CPU build"
    h200 = GpuInfo(name="NVIDIA H200", driver="580.159.04", compute_capability="9.0", memory_mib=143771)
    beside = check_torch_build(gpus=[h200])
    assert not beside.ok and "the CPU build, on a machine with an NVIDIA GPU (NVIDIA H200)" in beside.detail
    assert "--index-url https://download.pytorch.org/whl/cuXYZ" in beside.detail and "make setup TORCH_PACKAGES=" in beside.detail
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    cuda = check_torch_build(gpus=[h200])
    assert cuda.ok and cuda.detail == "torch 2.11.0+cu130: the CUDA 13.0 build"


def test_missing_dependencies_say_how_to_install_them():
    import pytest

    from pipeline.running.errors import EnvironmentMissing, require_module

    with pytest.raises(EnvironmentMissing) as optional:
        require_module("no_such_module_xyz", purpose="Exporting models")
    assert "Exporting models needs the Python package 'no_such_module_xyz'" in optional.value.message
    assert "pip install -e '.[export]'" in optional.value.hint
    with pytest.raises(EnvironmentMissing) as core:
        require_module("no_such_module_xyz", purpose="The onnxruntime toolchain", extra=None)
    assert "pip install -e ." in core.value.hint and "[" not in core.value.hint


def test_an_error_names_the_catalog_file_the_command_read(run_cli, tmp_path):
    """The stages point at a setting "in pipeline.toml"; a command given `--catalog bench.toml`
    is told of the file it read."""
    catalog = tmp_path / "ws" / "bench.toml"
    catalog.parent.mkdir()
    catalog.write_text(TINY_CATALOG.replace("opset = 17", "opset = 99", 1))
    result = run_cli(catalog, "export", "--engine", "tiny_fp32")
    assert result.exit_code == 2, result.err
    assert "opset = 99 (bench.toml)" in result.err and "set `opset` in bench.toml to at most" in result.err
    assert "pipeline.toml" not in result.err


def test_a_path_or_a_longer_name_holding_the_default_catalog_name_is_named_as_it_is(run_cli, tmp_path):
    """Only the default name standing alone is the catalog's: a path to a file of that name, or a
    name that holds it (ci-pipeline.toml, pipeline.toml.d), is shown as it is."""
    broken = tmp_path / "ci-pipeline.toml"
    broken.write_text("opset = = 17\n")
    result = run_cli(broken, "models")
    assert result.exit_code == 2 and f"{broken} is not valid TOML" in result.err, result.err
    missing = tmp_path / "pipeline.toml.d" / "bench.toml"
    result = run_cli(missing, "models")
    assert result.exit_code == 2 and f"catalog {missing} does not exist" in result.err, result.err


def test_a_native_crash_shows_where_python_was(tmp_path):
    """A native library that aborts the process (CUDA, Kineto, a compiler) leaves Python's stack of
    every thread on stderr, not only "Aborted"."""
    code = (
        "import os, signal, threading, time; from pipeline.cli import main; main(['--help']); "
        "threading.Thread(target=time.sleep, args=(30,), name='beside', daemon=True).start(); "
        "os.kill(os.getpid(), signal.SIGABRT)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == -6  # SIGABRT, as a C++ std::terminate ends it
    assert "Fatal Python error: Aborted" in result.stderr
    assert "Thread 0x" in result.stderr and "in <module>" in result.stderr  # each thread's stack

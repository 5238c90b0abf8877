"""TensorRT-RTX, for real: releases pulled from the package index, every ONNX this pipeline writes
compiled by a real TensorRT compiler on this CPU-only machine.

Tests marked ``rtx`` pull TensorRT-RTX 1.7.1.116 and 1.6.1.120 (about 100 MB each) into a cache
for the session. Without the package index they skip and say so; `.ci/run` sets
PIPELINE_REQUIRE_RTX=1, which turns that skip into a failure, so CI always builds for real.
The others need no TensorRT-RTX at all (usage errors, dry runs, how failures are reported).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from pipeline.machine.environment import nvidia_gpus
from pipeline.manifest import read_manifest
from pipeline.trtexec.layers import read_layer_info
from pipeline.workspace.artifacts import sha256_file
from tests.conftest import RTX_TOOLCHAINS, TINY_CATALOG, render_in_chromium, write_catalog

CPU_VARIANTS = ("fp32", "fp16", "bf16", "int8", "fp8", "fp16_sparse", "int8_sparse", "fp8_sparse")

# The shared test catalog (timm's test_vit as "tiny", which exports NVFP4 in a second on the CPU),
# with vit_tiny, the CPU-exportable variants it lacks, and the two TensorRT-RTX releases.
CATALOG = (
    TINY_CATALOG.replace("[models.tiny]", "[calibration]\nsamples = 8\nbatch_size = 4\n\n[models.tiny]")
    + """
[models.vit_tiny]
timm = "vit_tiny_patch16_224"
batch_size = 4

[variants.fp8]
precision = "fp8"
[variants.bf16]
precision = "bf16"
[variants.int8_sparse]
precision = "int8"
sparsity = "2:4"
[variants.fp8_sparse]
precision = "fp8"
sparsity = "2:4"
[variants.nvfp4_sparse]
precision = "nvfp4"
sparsity = "2:4"
[variants.nvfp4_fp32]
precision = "nvfp4"
weights_dtype = "fp32"
"""
    + RTX_TOOLCHAINS
)


def manifest(ws, toolchain, engine):
    return read_manifest(ws / "manifests" / toolchain / f"{engine}.json")


# --- with real TensorRT-RTX releases -------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(rtx_cache, tmp_path_factory):
    """vit_tiny exported once in every variant that exports without a GPU."""
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("rtx"), CATALOG)
    args = ["--catalog", str(catalog), "export", "--model", "vit_tiny"]
    for variant in CPU_VARIANTS:
        args += ["--variant", variant]
    assert main(args) == 0
    return catalog


@pytest.mark.rtx
def test_pull_gives_each_release_its_own_environment(rtx_cache, workspace, run_cli):
    from pipeline.runtimes.tensorrt_rtx.release import cuda_flavour

    cuda = cuda_flavour("auto")  # cu13 where there is no NVIDIA driver, as on CI
    for release in ("1.7.1.116", "1.6.1.120"):
        env = rtx_cache / "tensorrt-rtx" / f"{release}-{cuda}"
        facts = json.loads((env / "pipeline-env.json").read_text())
        assert facts["release"] == release and "SM120" in facts["targets"]
        assert facts["packages"] == [f"tensorrt-rtx-{cuda}-libs=={release}", f"tensorrt-rtx-{cuda}-bindings=={release}"]
        assert "include-system-site-packages = false" in (env / "pyvenv.cfg").read_text()
        assert not list(env.parent.glob(f".{env.name}.*"))  # no half-made environment left beside it
    listed = run_cli(workspace, "toolchains", "list")
    assert listed.exit_code == 0
    assert f"TensorRT-RTX 1.7.1.116 ({cuda})" in listed.out and f"TensorRT-RTX 1.6.1.120 ({cuda})" in listed.out
    again = run_cli(workspace, "toolchains", "pull", "trt-rtx1.7")
    assert again.exit_code == 0 and "already pulled" in again.err
    doctor = {check["name"]: check for check in json.loads(run_cli(workspace, "doctor", "--json").out)}
    assert doctor["TensorRT-RTX releases"]["ok"]
    assert f"1.6.1.120-{cuda}, 1.7.1.116-{cuda}" in doctor["TensorRT-RTX releases"]["detail"]
    assert doctor["toolchain trt-rtx1.7"]["ok"] and "runs its engines here:" in doctor["toolchain trt-rtx1.7"]["detail"]


@pytest.mark.rtx
def test_a_pull_ignores_a_pythonpath_that_already_holds_the_release(rtx_cache, workspace, run_cli, monkeypatch, tmp_path):
    # NGC containers and HPC module systems put packages on PYTHONPATH; pip then used to report the
    # release "already satisfied" and leave the new environment empty. An install location set
    # for pip (PIP_TARGET) must not redirect it either.
    from pipeline.runtimes.tensorrt_rtx.release import cuda_flavour

    cuda = cuda_flavour("auto")
    (site,) = (rtx_cache / "tensorrt-rtx" / f"1.7.1.116-{cuda}").glob("lib/python*/site-packages")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PIP_TARGET", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    result = run_cli(workspace, "toolchains", "pull", "trt-rtx1.7")
    assert result.exit_code == 0, result.err
    env = tmp_path / "cache" / "tensorrt-rtx" / f"1.7.1.116-{cuda}"
    assert list(env.glob("lib/python*/site-packages/tensorrt_rtx*")), "the release was not installed into its environment"
    assert json.loads((env / "pipeline-env.json").read_text())["release"] == "1.7.1.116"
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.rtx
def test_lock_pins_the_wheels_and_a_different_environment_is_warned_about(rtx_cache, workspace, run_cli):
    locked = run_cli(workspace, "toolchains", "lock", "trt-rtx1.7")
    assert locked.exit_code == 0, locked.err
    lock_path = workspace.parent / "toolchains.lock.json"
    entry = json.loads(lock_path.read_text())["toolchains"]["trt-rtx1.7"]
    libs = next(name for name in entry["wheels"] if name.endswith("_libs"))
    assert entry["pin"].startswith(entry["wheels"][libs]) and entry["wheels"][libs].startswith("sha256:")
    quiet = run_cli(workspace, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
    assert quiet.exit_code == 0 and "toolchains.lock.json" not in quiet.err
    entry["pin"] = "sha256:" + "0" * 64
    lock_path.write_text(json.dumps({"schema_version": 1, "toolchains": {"trt-rtx1.7": entry}}))
    try:
        warned = run_cli(workspace, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
        assert warned.exit_code == 0, warned.err
        assert "toolchains.lock.json pins sha256:0000" in warned.err
    finally:
        lock_path.unlink()


@pytest.mark.rtx
def test_every_cpu_exportable_variant_builds_for_sm89_and_sm120(workspace, run_cli):
    args = ["build", "--model", "vit_tiny", "--toolchain", "trt-rtx1.7", "--arch", "sm89", "--arch", "sm120"]
    for variant in CPU_VARIANTS:
        args += ["--variant", variant]
    result = run_cli(workspace, *args)
    assert result.exit_code == 0, result.err
    ws = workspace.parent
    for variant in CPU_VARIANTS:
        build = manifest(ws, "trt-rtx1.7", f"vit_tiny_{variant}").build
        assert build.status == "done"
        assert build.details.runtime == "tensorrt-rtx" and build.details.runtime_version == "1.7.1.116"
        assert build.details.settings["targets"] == ["sm89", "sm120"]
        assert build.details.settings["sparse_weights"] is variant.endswith("_sparse")
        assert build.details.compiler["release"] == "1.7.1.116" and build.details.compiler["errors"] == []
        engine = next(a for a in build.outputs if a.role == "engine")
        assert engine.sha256 == sha256_file(ws / engine.path) and engine.size_bytes > 1_000_000
        # The compiler's own layer dump says the variant's precision is really there.
        audit = build.details.precision_audit
        assert audit["layers"] > 100 and build.details.compiler["layers"] == audit["layers"]
        if variant != "fp32":
            assert audit["intended_found"] is True, (variant, audit)
        assert (ws / "engines" / "trt-rtx1.7" / f"vit_tiny_{variant}.layers.json").is_file()


@pytest.mark.rtx
def test_diff_of_fp16_and_fp8_builds_names_the_layers_fp8_changed(workspace, run_cli, tmp_path):
    """Two real TensorRT-RTX builds for SM89 (which this machine cannot run): layer types and
    precisions only, from each build's layer dump."""
    built = run_cli(
        workspace, "build", "--model", "vit_tiny", "--variant", "fp16", "--variant", "fp8", "--toolchain", "trt-rtx1.7", "--arch", "sm89"
    )
    assert built.exit_code == 0, built.err
    result = run_cli(workspace, "diff", "trt-rtx1.7/vit_tiny_fp16", "trt-rtx1.7/vit_tiny_fp8", "--format", "json")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    layers = read_layer_info(workspace.parent / "engines" / "trt-rtx1.7" / "vit_tiny_fp8.layers.json")
    fp8 = sum(1 for layer in layers.layers if layer.precision == "fp8")
    assert fp8 >= 12  # at least the twelve blocks' quantized MatMuls
    assert data["precision"][0] == f"B runs {fp8} layers in fp8, A none."
    assert data["b"]["precisions"]["fp8"] == fp8 and "fp8" not in data["a"]["precisions"]
    assert any("no per-layer times" in note for note in data["a"]["notes"])
    # The quantized GEMMs are found beside their fp16 counterparts through the ONNX nodes they implement.
    gemms = [r for r in data["rows"] if r["a"] and r["b"] and r["b_precision"] == "fp8" and r["a_precision"] == "fp16"]
    assert len(gemms) >= 12 and all("precision" in r["changed"] for r in gemms)
    assert data["counts"]["matched"] + data["counts"]["matched by ONNX nodes"] + data["counts"]["fused differently"] > 0
    shown = run_cli(workspace, "diff", "trt-rtx1.7/vit_tiny_fp16", "trt-rtx1.7/vit_tiny_fp8")
    assert f"B runs {fp8} layers in fp8, A none." in shown.out and "Every layer, A beside B" in shown.out
    assert "A = trt-rtx1.7/vit_tiny_fp16: TensorRT-RTX 1.7.1.116," in shown.out  # its own runtime, not "TensorRT 1.7.1.116"
    page = run_cli(workspace, "diff", "trt-rtx1.7/vit_tiny_fp16", "trt-rtx1.7/vit_tiny_fp8", "--format", "html")
    assert page.exit_code == 0
    dom = render_in_chromium(workspace.parent / "reports" / "diff.html", tmp_path).dom
    assert f"B runs {fp8} layers in fp8, A none." in dom and "<table" in dom


@pytest.mark.rtx
def test_fp8_for_sm80_is_refused_with_the_compilers_reason_and_recorded(workspace, run_cli):
    ok = run_cli(workspace, "build", "--engine", "vit_tiny_fp8", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
    assert ok.exit_code == 0, ok.err
    ws = workspace.parent
    engine = ws / "engines" / "trt-rtx1.7" / "vit_tiny_fp8.engine"
    assert engine.is_file()

    refused = run_cli(workspace, "build", "--engine", "vit_tiny_fp8", "--toolchain", "trt-rtx1.7", "--arch", "sm80")
    assert refused.exit_code == 1
    assert "ERROR TensorRT-RTX 1.7.1.116 refused to build models/vit_tiny/fp8.onnx for sm80" in refused.err
    assert "Cannot compile for target(s) sm80, because the model contains HW-specific datatypes: fp8_e4m3" in refused.err
    assert "TIP full log:" in refused.err
    build = manifest(ws, "trt-rtx1.7", "vit_tiny_fp8").build
    assert build.status == "failed" and "fp8_e4m3" in build.reason
    assert [a.role for a in build.outputs] == ["build_log"]
    assert build.details.settings["targets"] == ["sm80"]
    # The sm120 engine no longer matches what the manifest describes, so it is gone.
    assert not engine.exists() and not list(engine.parent.glob(".vit_tiny_fp8*"))


@pytest.mark.rtx
def test_bf16_for_turing_is_refused_for_its_data_type(workspace, run_cli):
    refused = run_cli(workspace, "build", "--engine", "vit_tiny_bf16", "--toolchain", "trt-rtx1.7", "--arch", "sm75")
    assert refused.exit_code == 1
    assert "Cannot compile for target(s) sm75, because the model contains HW-specific datatypes: b16" in refused.err
    assert manifest(workspace.parent, "trt-rtx1.7", "vit_tiny_bf16").build.status == "failed"


@pytest.mark.rtx
def test_two_releases_side_by_side_show_what_each_refused(workspace, run_cli):
    for toolchain in ("trt-rtx1.6", "trt-rtx1.7"):
        run_cli(
            workspace, "build", "--model", "vit_tiny", "--variant", "fp16", "--variant", "int8", "--toolchain", toolchain, "--arch", "sm120"
        )
    result = run_cli(workspace, "compare", "--toolchain", "trt-rtx1.6", "--toolchain", "trt-rtx1.7", "--format", "json")
    assert result.exit_code == 0, result.err
    rows = {(r["engine"], r["toolchain"]): r for r in json.loads(result.out)["rows"]}
    # Release 1.6 cannot compile vit_tiny's INT8 graph for SM120; 1.7 can.
    old, new = rows[("vit_tiny_int8", "trt-rtx1.6")], rows[("vit_tiny_int8", "trt-rtx1.7")]
    assert old["status"].startswith("build refused: TensorRT-RTX 1.6.1.120 refused to build models/vit_tiny/int8.onnx for sm120")
    assert "MyelinCheckException" in old["status"] and old["engine_mb"] is None
    assert new["engine_mb"] > 1 and new["build_s"] > 0 and new["status"] == "not profiled"
    for toolchain in ("trt-rtx1.6", "trt-rtx1.7"):
        fp16 = rows[("vit_tiny_fp16", toolchain)]
        assert fp16["engine_mb"] > 1 and fp16["build_s"] > 0 and fp16["audit"].startswith("ok: fp16")
    table = run_cli(workspace, "compare", "--toolchain", "trt-rtx1.6", "--toolchain", "trt-rtx1.7", "--format", "md")
    assert "| vit_tiny_int8 | trt-rtx1.6 |" in table.out and "MyelinCheckException" in table.out


@pytest.mark.rtx
@pytest.mark.skipif(bool(nvidia_gpus()), reason="checks the recorded skip of a machine without an NVIDIA GPU")
def test_profiling_without_a_gpu_that_runs_the_engine_is_a_recorded_skip(workspace, run_cli):
    result = run_cli(workspace, "run", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
    assert result.exit_code == 0, result.err
    profile = manifest(workspace.parent, "trt-rtx1.7", "vit_tiny_fp16").profile
    assert profile.status == "skipped"
    assert profile.reason == "no NVIDIA GPU here; TensorRT-RTX engines run on compute capability 7.5, 8.0, 8.6, 8.9, 12.0, 12.1"


@pytest.mark.rtx
@pytest.mark.parametrize("variant", ["nvfp4", "nvfp4_sparse", "nvfp4_fp32"])
def test_nvfp4_graphs_parse_and_build_for_sm120(workspace, run_cli, monkeypatch, variant):
    from tests.cpu_nvfp4 import nvfp4_without_cuda

    with nvfp4_without_cuda(monkeypatch):
        result = run_cli(workspace, "build", "--engine", f"tiny_{variant}", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
    assert result.exit_code == 0, result.err
    build = manifest(workspace.parent, "trt-rtx1.7", f"tiny_{variant}").build
    assert build.status == "done"
    assert build.details.precision_audit["intended_found"] is True  # FP4 layers in the engine
    assert build.details.settings["sparse_weights"] is variant.endswith("_sparse")


@pytest.mark.rtx
def test_modelopts_unrepaired_nvfp4_graph_is_refused_node_name_first(workspace, run_cli, monkeypatch):
    """What the repair in pipeline/stages/quantized_onnx.py is for: without it, TensorRT's parser says no."""
    import pipeline.stages.quantized_onnx
    from tests.cpu_nvfp4 import nvfp4_without_cuda

    monkeypatch.setattr(pipeline.stages.quantized_onnx, "make_fp4_graph_consistent", lambda graph, weights_dtype: 0)
    with nvfp4_without_cuda(monkeypatch):
        result = run_cli(workspace, "build", "--engine", "tiny_nvfp4_fp32", "--toolchain", "trt-rtx1.7", "--arch", "sm120", "--force")
    assert result.exit_code == 1
    err = " ".join(result.err.split())
    assert "ERROR TensorRT-RTX 1.7.1.116 could not parse models/tiny/nvfp4_fp32.onnx at node " in err
    assert '"/blocks/blocks.0/attn/qkv/Add" (Add → ' in err  # the node the log names, its op and output
    assert "ElementWiseOperation SUM must have same input types. But they are of types Float and Half" in err
    build = manifest(workspace.parent, "trt-rtx1.7", "tiny_nvfp4_fp32").build
    assert build.status == "failed" and build.details.compiler["parser_errors"][0]["node"] == "/blocks/blocks.0/attn/qkv/Add"
    assert build.details.parser_failure["node"] == "/blocks/blocks.0/attn/qkv/Add" and build.details.parser_failure["op_type"] == "Add"


@pytest.mark.rtx
def test_a_release_that_is_not_on_the_index_is_named_with_the_ones_that_are(rtx_cache, tmp_path, run_cli):
    catalog = write_catalog(tmp_path, CATALOG.replace('release = "1.6.1.120"', 'release = "1.6.9.999"'))
    result = run_cli(catalog, "toolchains", "pull", "trt-rtx1.6")
    assert result.exit_code == 2
    assert "ERROR TensorRT-RTX release 1.6.9.999 is not on the package index (tensorrt-rtx-cu13-libs==1.6.9.999)." in result.err
    assert "TIP releases there:" in result.err and "1.7.1.116" in result.err
    assert not (rtx_cache / "tensorrt-rtx" / "1.6.9.999-cu13").exists()


@pytest.mark.rtx
def test_a_broken_environment_is_refused_and_a_pull_repairs_it(rtx_cache, workspace, run_cli):
    env = rtx_cache / "tensorrt-rtx" / "1.6.1.120-cu13"
    (env / "pipeline-env.json").unlink()  # as an interrupted pull leaves it
    broken = run_cli(workspace, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.6", "--arch", "sm89")
    assert broken.exit_code == 3
    assert f"the environment of TensorRT-RTX 1.6.1.120 at {env} is incomplete" in broken.err
    assert "TIP run `pipeline toolchains pull trt-rtx1.6`" in broken.err
    repaired = run_cli(workspace, "toolchains", "pull", "trt-rtx1.6")
    assert repaired.exit_code == 0 and "creating it again" in repaired.err
    assert json.loads((env / "pipeline-env.json").read_text())["release"] == "1.6.1.120"
    built = run_cli(workspace, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.6", "--arch", "sm89")
    assert built.exit_code == 0, built.err


@pytest.mark.rtx
def test_ctrl_c_during_a_build_stops_the_compiler_and_leaves_no_engine(workspace, run_cli, monkeypatch):
    import types

    import pipeline.runtimes.process as process

    started = []

    class InterruptedPopen(subprocess.Popen):
        def wait(self, timeout=None):
            if timeout is not None and not started:
                started.append(self.pid)
                try:
                    super().wait(timeout=0.5)  # the compiler is under way
                except subprocess.TimeoutExpired:
                    pass
                raise KeyboardInterrupt
            return super().wait(timeout)

    # Only the pipeline's own child processes are interrupted, not every subprocess of the test.
    fake = types.SimpleNamespace(
        Popen=InterruptedPopen, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT, TimeoutExpired=subprocess.TimeoutExpired
    )
    monkeypatch.setattr(process, "subprocess", fake)
    before = manifest(workspace.parent, "trt-rtx1.7", "vit_tiny_fp32").build
    result = run_cli(workspace, "build", "--engine", "vit_tiny_fp32", "--toolchain", "trt-rtx1.7", "--arch", "sm86", "--force")
    assert result.exit_code == 130 and "interrupted" in result.err
    # The sm89+sm120 engine built earlier is still there and still what the manifest says;
    # the interrupted sm86 build left nothing, not even a partial file.
    after = manifest(workspace.parent, "trt-rtx1.7", "vit_tiny_fp32").build
    assert after == before and after.details.settings["targets"] == ["sm89", "sm120"]
    engine = next(a for a in after.outputs if a.role == "engine")
    assert sha256_file(workspace.parent / engine.path) == engine.sha256
    engines = workspace.parent / "engines" / "trt-rtx1.7"
    assert not [p.name for p in engines.iterdir() if p.name.startswith(".vit_tiny_fp32")]
    with pytest.raises(ProcessLookupError):
        os.kill(started[0], 0)  # the compiler's process is gone


# --- without TensorRT-RTX ------------------------------------------------------------------------


@pytest.fixture
def plain(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "empty-cache"))
    return write_catalog(tmp_path / "ws", CATALOG)


def test_dry_run_names_release_environment_and_targets_without_a_pulled_release(plain, run_cli, tmp_path):
    result = run_cli(
        plain, "build", "--engine", "vit_tiny_fp8_sparse", "--toolchain", "trt-rtx1.7", "--arch", "SM120", "--arch", "sm89", "--dry-run"
    )
    assert result.exit_code == 0, result.err
    assert "build: TensorRT-RTX 1.7.1.116 (cu13, not pulled yet): strongly typed, for sm120+sm89, 2:4 sparse weights" in result.out
    assert f"{tmp_path / 'empty-cache' / 'tensorrt-rtx' / '1.7.1.116-cu13' / 'bin' / 'python'} -I" in result.out
    assert "--arch SM120 --arch SM89 --sparse" in result.out
    assert not (tmp_path / "ws" / "models").exists()  # nothing ran


def test_an_architecture_the_compiler_does_not_know_is_a_usage_error(plain, run_cli):
    hopper = run_cli(plain, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm90")
    assert hopper.exit_code == 2
    assert "ERROR TensorRT-RTX cannot compile for 'sm90': its targets are sm75, sm80, sm86, sm89, sm120, sm121." in hopper.err
    assert "not datacenter parts such as Hopper" in hopper.err
    typo = run_cli(plain, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm12O")
    assert typo.exit_code == 2 and "did you mean 'sm120' or 'sm121'?" in typo.err
    other_kind = run_cli(plain, "build", "--engine", "vit_tiny_fp16", "--toolchain", "onnxruntime", "--arch", "sm120")
    assert other_kind.exit_code == 2 and "--arch does not apply to onnxruntime toolchains" in other_kind.err


def test_a_release_that_is_not_pulled_stops_the_run_with_the_command_that_pulls_it(plain, run_cli):
    result = run_cli(plain, "build", "--engine", "vit_tiny_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
    assert result.exit_code == 3
    assert "ERROR TensorRT-RTX 1.7.1.116 (cu13) is not pulled." in result.err
    assert "TIP run `pipeline toolchains pull trt-rtx1.7`" in result.err
    assert not (plain.parent / "manifests" / "trt-rtx1.7").exists()


def test_an_unreachable_package_index_is_a_missing_environment_and_leaves_nothing(plain, run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    result = run_cli(plain, "toolchains", "pull", "trt-rtx1.7")
    assert result.exit_code == 3, result.err
    assert (
        "ERROR could not download TensorRT-RTX 1.7.1.116: the package index is not reachable, or does not carry tensorrt-rtx-cu13-libs"
        in result.err
    )
    assert "TIP check the network or pip's index settings" in result.err
    releases = tmp_path / "empty-cache" / "tensorrt-rtx"
    assert [p.name for p in releases.iterdir()] == ["1.7.1.116-cu13.pull.log"]  # the log of what pip said, nothing else


def test_catalog_refuses_an_unknown_architecture_or_release_form(tmp_path):
    from pipeline.running.errors import UsageError
    from pipeline.runtimes import load_catalog

    bad = CATALOG.replace('release = "1.7.1.116"', 'release = "1.7"\narchs = ["sm90"]')
    with pytest.raises(UsageError) as info:
        load_catalog(write_catalog(tmp_path, bad))
    assert "toolchains.trt-rtx1.7.release: String should match pattern" in info.value.message
    assert "toolchains.trt-rtx1.7.archs.0: Input should be 'sm75', 'sm80', 'sm86', 'sm89', 'sm120' or 'sm121'" in info.value.message


def test_a_compiler_killed_mid_build_is_reported_as_such(tmp_path, monkeypatch):
    import pipeline.runtimes.process as process
    from pipeline.catalog import VariantSpec
    from pipeline.running.errors import PipelineError, RefusedByTool
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.tensorrt_rtx.runtime import TensorRtRtxRuntime, TensorRtRtxSpec

    def killed(argv, *, log_path, **_):
        log_path.write_text("[I] building …\n")
        return process.Finished(-signal.SIGKILL, "[I] building …\n")  # as the out-of-memory killer leaves it

    monkeypatch.setattr(process, "run_logged", killed)
    spec = TensorRtRtxSpec(kind="tensorrt-rtx", release="1.7.1.116", archs=("sm120",))
    runtime = TensorRtRtxRuntime("trt-rtx1.7", spec, Reporter(), tmp_path)
    from pipeline.models import model_source
    from pipeline.models.timm import TimmSpec

    source = model_source("tiny", TimmSpec(timm="test_vit", batch_size=2), tmp_path)
    with pytest.raises(PipelineError) as info:
        runtime.build(tmp_path / "model.onnx", tmp_path / "model.engine", VariantSpec(precision="fp16"), source=source)
    assert not isinstance(info.value, RefusedByTool)  # the machine's failure, not a fact about the model
    assert info.value.message == "TensorRT-RTX build was killed (out of memory, or stopped)."
    assert info.value.hint == f"log so far: {tmp_path / 'model.build.log'}"
    assert not (tmp_path / "model.build-result.json.partial").exists()


def test_a_compiler_that_crashed_is_a_failed_build_with_its_signal(tmp_path, monkeypatch):
    """A segmentation fault inside the compiler leaves no result: the build is recorded as failed,
    with the signal (the build stage records a RefusedByTool with its result)."""
    import pipeline.runtimes.process as process
    from pipeline.catalog import VariantSpec
    from pipeline.models import model_source
    from pipeline.models.timm import TimmSpec
    from pipeline.running.errors import ToolCrashed
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.tensorrt_rtx.runtime import TensorRtRtxRuntime, TensorRtRtxSpec

    def crashed(argv, *, log_path, **_):
        log_path.write_text("[I] building …\n")
        return process.Finished(-signal.SIGSEGV, "[I] building …\n")

    monkeypatch.setattr(process, "run_logged", crashed)
    spec = TensorRtRtxSpec(kind="tensorrt-rtx", release="1.7.1.116", archs=("sm120",))
    runtime = TensorRtRtxRuntime("trt-rtx1.7", spec, Reporter(), tmp_path)
    source = model_source("tiny", TimmSpec(timm="test_vit", batch_size=2), tmp_path)
    with pytest.raises(ToolCrashed) as info:
        runtime.build(tmp_path / "model.onnx", tmp_path / "model.engine", VariantSpec(precision="fp16"), source=source)
    assert info.value.message == "TensorRT-RTX 1.7.1.116 build crashed (SIGSEGV, exit status -11) without an error of its own"
    assert info.value.signal == "SIGSEGV" and info.value.result.evidence["compiler"]["crashed"] == {"signal": "SIGSEGV"}
    assert info.value.result.engine_path is None and info.value.result.sidecars == {"build_log": tmp_path / "model.build.log"}


def test_compiler_messages_lose_their_source_locations():
    from pipeline.runtimes.tensorrt_rtx.reports import tidy

    myelin = (
        "IBuilder::buildSerializedNetwork: Error Code 1: Myelin ([pass.cpp:1500: run_passes] Cannot compile for target(s) sm80, "
        "because the model contains HW-specific datatypes: fp8_e4m3. In compileGraph at /_src/optimizer/myelin/codeGenerator.cpp:2012)"
    )
    assert tidy(myelin) == (
        "IBuilder::buildSerializedNetwork: Error Code 1: Myelin (Cannot compile for target(s) sm80, because the model contains "
        "HW-specific datatypes: fp8_e4m3.)"
    )
    parser = (
        "Invalid Node - /blocks/blocks.0/attn/qkv/Add\nITensor::getDimensions: Error Code 4: API Usage Error (/blocks/blocks.0/attn/qkv/Add: "
        "ElementWiseOperation SUM must have same input types. But they are of types Float and Half. In validateTypes at "
        "/_src/optimizer/common/nodes/elementWiseNode.cpp:40)\n[checkMacros.cpp::catchCudaError::250] Error Code 1: Cuda Runtime "
        "(In catchCudaError at /_src/common/dispatch/checkMacros.cpp:250 (cudaError 35: CUDA driver version is insufficient))"
    )
    assert tidy(parser) == (
        "ITensor::getDimensions: Error Code 4: API Usage Error (/blocks/blocks.0/attn/qkv/Add: ElementWiseOperation SUM must have "
        "same input types. But they are of types Float and Half.)"
    )


def test_a_cache_dir_that_is_a_file_is_named_with_the_setting(plain, run_cli, tmp_path, monkeypatch):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache should be\n")
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(not_a_folder))
    result = run_cli(plain, "toolchains", "pull", "trt-rtx1.7")
    assert result.exit_code == 3
    assert f"cannot create the release's environment under {not_a_folder / 'tensorrt-rtx'}: Not a directory" in result.err
    assert f"PIPELINE_CACHE_DIR must name a directory this user can write (it names {not_a_folder})" in result.err
    assert "Traceback" not in result.err and not_a_folder.read_text().startswith("a file")

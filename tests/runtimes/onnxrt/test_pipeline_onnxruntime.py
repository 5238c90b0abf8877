"""The whole pipeline on the embedded runtime, for real: timm → ONNX → ONNX Runtime → manifests.

The model is timm's `test_vit` (a real ViT, 371k parameters) so each export takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, write_catalog


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One real run of fp32 + fp16 + int8 + nvfp4 (unsupported on ORT) shared by the tests below."""
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("demo"))
    code = main(["--catalog", str(catalog), "run", "--variant", "fp32", "--variant", "fp16", "--variant", "int8", "--variant", "nvfp4"])
    assert code == 0
    return catalog.parent


def test_every_manifest_validates_and_pins_its_artefacts_by_content(demo):
    for engine in ("tiny_fp32", "tiny_fp16", "tiny_int8"):
        manifest = read_manifest(demo / "manifests" / "onnxruntime" / f"{engine}.json")
        assert manifest.toolchain == "onnxruntime"
        for stage in (manifest.export, manifest.build, manifest.profile):
            assert stage is not None and stage.status == "done"
        artefacts = manifest.export.outputs + manifest.build.outputs
        assert {a.role for a in artefacts} == {"onnx", "reference_input", "reference_output", "engine"}
        for artefact in artefacts:
            path = demo / artefact.path
            assert artefact.sha256 == _sha256(path)
            assert artefact.size_bytes == path.stat().st_size
        assert manifest.build.inputs == [a for a in manifest.export.outputs if a.role == "onnx"]  # built from that ONNX
        assert manifest.environment.cpu_count >= 1
        assert "onnxruntime" in manifest.environment.packages


def test_every_engine_shows_its_own_accuracy_against_the_fp32_model(demo, run_cli, monkeypatch):
    floors = {"fp32": 0.9999, "fp16": 0.999, "int8": 0.99}
    for variant, floor in floors.items():
        details = read_manifest(demo / "manifests" / "onnxruntime" / f"tiny_{variant}.json").profile.details
        accuracy = details.accuracy
        assert accuracy["checked_by"].startswith("onnxruntime ") and accuracy["checked_by"].endswith(", in this process")
        assert accuracy["samples"] == 2 and accuracy["cosine_floor"] == floor
        assert accuracy["cosine_similarity"] >= floor and accuracy["top1_agreement"] == 1.0, (variant, accuracy)
    rows = {r["variant"]: r for r in json.loads(run_cli(demo / "pipeline.toml", "compare", "--format", "json").out)["rows"]}
    for variant in floors:
        assert rows[variant]["accuracy_source"] == "measured"
        assert rows[variant]["accuracy_cosine"] >= floors[variant] and rows[variant]["top1_agreement"] == 1.0
    monkeypatch.setenv("COLUMNS", "120")
    table = run_cli(demo / "pipeline.toml", "compare").out
    line = next(line for line in table.splitlines() if line.split()[:2] == ["int8", "onnxruntime"])
    assert f"{rows['int8']['accuracy_cosine']:.4f}" in line.split() and "100%" in line.split()
    gate = run_cli(demo / "pipeline.toml", "compare", "--fail-accuracy-below", "0.99", "--fail-accuracy-below", "top1=1")
    assert gate.exit_code == 0 and "3 of 3 engines pass" in gate.err


def test_an_engine_with_damaged_weights_shows_the_drop_and_fails_the_gate(demo, run_cli):
    """An exporter bug, simulated: the ONNX's weights change after the export recorded them."""
    import onnx
    from onnx import numpy_helper

    from pipeline.workspace import Workspace

    ws = demo.parent / "damaged"
    shutil.copytree(demo, ws)
    onnx_path = ws / "models" / "tiny" / "fp32.onnx"
    graph = onnx.load(str(onnx_path))
    for init in graph.graph.initializer:
        if init.name.startswith("head.") and len(init.dims) == 2:
            rng = np.random.default_rng(0)
            damaged = numpy_helper.to_array(init) + rng.normal(0, 0.5, tuple(init.dims)).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(damaged, init.name))
    onnx.save(graph, str(onnx_path))
    export_path = ws / "manifests" / "export" / "tiny_fp32.json"
    export = read_manifest(export_path)
    onnx_artifact = Workspace(ws).artifact("onnx", onnx_path)
    outputs = [onnx_artifact if a.role == "onnx" else a for a in export.export.outputs]
    export.export = export.export.model_copy(update={"outputs": outputs})
    export.write(export_path)

    result = run_cli(ws / "pipeline.toml", "run", "--variant", "fp32")
    assert result.exit_code == 0, result.err
    assert "WARNING tiny_fp32 on onnxruntime: cosine similarity to FP32" in result.err
    accuracy = read_manifest(ws / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details.accuracy
    assert accuracy["cosine_similarity"] < 0.5 and accuracy["top1_agreement"] < 1.0
    gate = run_cli(ws / "pipeline.toml", "compare", "--format", "json", "--fail-accuracy-below", "0.99")
    assert gate.exit_code == 1
    assert f"ERROR 1 accuracy check(s) failed: tiny_fp32 on onnxruntime: cosine {accuracy['cosine_similarity']:.4f} < 0.99." in gate.err
    assert "2 of 3 engines pass" in gate.err


def test_the_answer_is_held_to_the_catalogs_accuracy_floor_unless_the_command_names_one(demo, run_cli):
    ws = demo.parent / "floor"
    shutil.copytree(demo, ws)
    rows = {r["variant"]: r for r in json.loads(run_cli(ws / "pipeline.toml", "compare", "--format", "json").out)["rows"]}
    cosines = sorted(rows[v]["accuracy_cosine"] for v in ("fp32", "fp16", "int8"))
    # A floor between the least and the next most accurate engine: exactly one is left out.
    floor = (cosines[0] + cosines[1]) / 2
    least = next(v for v in ("fp32", "fp16", "int8") if rows[v]["accuracy_cosine"] == cosines[0])
    catalog = ws / "pipeline.toml"

    def verdict(*args, exit_code=0):
        """The verdict, and the variants it left out for their accuracy (not for a noisy machine)."""
        result = run_cli(catalog, "compare", "--format", "json", *args)
        assert result.exit_code == exit_code, result.err
        (only,) = json.loads(result.out)["verdicts"]
        return only, {left["variant"]: left["why"] for left in only["excluded"] if left["why"].startswith("below the accuracy floor")}

    plain, inaccurate = verdict()
    assert plain["accuracy_floor"] == {"thresholds": [], "source": "each precision's own check"} and not inaccurate

    catalog.write_text(f'accuracy_floor = "cos={floor:.9f}"\n' + catalog.read_text())
    held, inaccurate = verdict()
    assert held["accuracy_floor"] == {"thresholds": [{"metric": "cosine", "min": float(f"{floor:.9f}")}], "source": "pipeline.toml"}
    assert inaccurate == {least: f"below the accuracy floor: cosine {cosines[0]:.4f} < {float(f'{floor:.9f}'):g}"}
    assert held["fastest"]["variant"] != least and f"meeting cosine ≥ {float(f'{floor:.9f}'):g} (pipeline.toml)" in held["text"]

    # A model's own floor replaces the catalog's; the command's replaces both.
    text = catalog.read_text().replace("[models.tiny]\n", "[models.tiny]\naccuracy_floor = []\n", 1)
    assert text != catalog.read_text()
    catalog.write_text(text)
    cleared, inaccurate = verdict()
    assert cleared["accuracy_floor"]["source"] == "each precision's own check" and not inaccurate
    catalog.write_text(text.replace("accuracy_floor = []", 'accuracy_floor = ["cos=0.5", "top1=0.5"]'))
    own, inaccurate = verdict()
    assert own["accuracy_floor"]["source"] == "models.tiny in pipeline.toml" and len(own["accuracy_floor"]["thresholds"]) == 2
    assert not inaccurate
    given, inaccurate = verdict("--fail-accuracy-below", f"{floor:.9f}", exit_code=1)  # and it gates
    assert given["accuracy_floor"]["source"] == "--fail-accuracy-below" and list(inaccurate) == [least]

    catalog.write_text(text.replace("accuracy_floor = []", 'accuracy_floor = "cosine=1.5"'))
    bad = run_cli(catalog, "compare")
    assert bad.exit_code == 2 and "models.tiny.accuracy_floor: not an accuracy threshold" in bad.err


def test_an_export_this_machine_cannot_redo_is_kept_when_only_the_tools_versions_changed(demo, run_cli, monkeypatch):
    """An NVFP4 export made on a GPU machine, built ahead of time on one without CUDA: newer tools
    here must not turn the export into a failure the machine cannot recover from."""
    from pipeline.stages.export import ExportStage

    ws = demo.parent / "elsewhere"
    shutil.copytree(demo, ws)
    manifest = ws / "manifests" / "export" / "tiny_int8.json"
    before = read_manifest(manifest).export
    real_identity = ExportStage.identity
    monkeypatch.setattr(ExportStage, "identity", lambda self: {**real_identity(self), "torch": "0.0-other"})

    monkeypatch.setattr(ExportStage, "cannot_redo_here", lambda self: "int8 quantization needs a CUDA GPU, and this machine has none.")
    kept = run_cli(ws / "pipeline.toml", "build", "--variant", "int8")
    assert kept.exit_code == 0, kept.err
    assert "WARNING tiny_int8: kept the export made on" in kept.err and "0.0-other here" in kept.err
    assert "this machine cannot redo it (int8 quantization needs a CUDA GPU, and this machine has none)" in kept.err
    assert read_manifest(manifest).export.finished_at == before.finished_at

    # A machine that can redo it does: the tools changed, so the export is made again.
    monkeypatch.setattr(ExportStage, "cannot_redo_here", lambda self: None)
    redone = run_cli(ws / "pipeline.toml", "build", "--variant", "int8")
    assert redone.exit_code == 0, redone.err
    assert "kept the export" not in redone.err and read_manifest(manifest).export.finished_at > before.finished_at


def test_engine_outputs_named_unlike_the_onnx_are_a_clear_error(demo, run_cli, monkeypatch):
    from pipeline.runtimes.base import ReferenceRun
    from pipeline.runtimes.onnxrt.runtime import OnnxRuntimeRuntime

    ws = demo.parent / "renamed"
    shutil.copytree(demo, ws)
    monkeypatch.setattr(
        OnnxRuntimeRuntime, "run_reference", lambda self, path, ref: ReferenceRun({"output_0": np.zeros((2, 1000))}, "test")
    )
    result = run_cli(ws / "pipeline.toml", "profile", "--engine", "tiny_fp32", "--repeat", "2")
    assert result.exit_code == 1
    assert "ERROR tiny_fp32.onnx has outputs ['output_0']; the reference is for 'logits'." in result.err and "TIP" in result.err
    # The measurement was not recorded half-checked: the manifest keeps the earlier profile.
    assert read_manifest(ws / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details.repeat_medians_ms == []


def test_export_checked_the_onnx_against_pytorch(demo):
    for variant, dtype in (("fp32", "float32"), ("fp16", "float16"), ("int8", "float32")):
        export = read_manifest(demo / "manifests" / "export" / f"tiny_{variant}.json").export
        details = export.details
        assert details.parity.passed
        assert details.parity.cosine_similarity >= details.parity.cosine_similarity_floor
        assert details.parity.max_abs_error <= details.parity.max_abs_error_limit
        assert details.input_shape == [2, 3, 160, 160] and details.input_dtype == dtype
        assert details.weights == "random-init (seed 0)"
    int8 = read_manifest(demo / "manifests" / "export" / "tiny_int8.json").export.details
    assert int8.onnx_ops.get("QuantizeLinear", 0) > 0 and int8.onnx_ops.get("DequantizeLinear", 0) > 0
    assert int8.quantization["preset"] == "INT8_DEFAULT_CFG"
    assert int8.quantization["calibration"]["source"].startswith("synthetic")
    fp32 = read_manifest(demo / "manifests" / "export" / "tiny_fp32.json").export.details
    assert "QuantizeLinear" not in fp32.onnx_ops


def test_profile_obeys_the_trtexec_bounds_and_keeps_every_iteration(demo):
    profile = read_manifest(demo / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details
    settings = profile.settings
    assert profile.iterations >= settings.iterations
    assert profile.total_walltime_s >= settings.duration_s
    assert len(profile.per_iteration_ms) == profile.iterations == profile.latency_ms.count
    stats = profile.latency_ms
    assert stats.min <= stats.median <= stats.p99 <= stats.max
    assert min(profile.per_iteration_ms) == pytest.approx(stats.min, abs=1e-5)
    assert profile.throughput_qps == pytest.approx(1000.0 / stats.mean)
    assert profile.images_per_s == pytest.approx(profile.throughput_qps * 2)
    assert profile.device == "onnxruntime CPUExecutionProvider"


def test_profile_records_the_machines_load_around_the_measurement(demo):
    import os

    details = read_manifest(demo / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details
    for when in ("start", "end"):
        load = details.machine_load[when]
        assert load["cpu_count"] == os.cpu_count()
        assert len(load["load_average"]) == 3 and all(value >= 0 for value in load["load_average"])


def test_unsupported_variant_is_recorded_as_skipped_with_its_reason(demo):
    manifest = read_manifest(demo / "manifests" / "onnxruntime" / "tiny_nvfp4.json")
    assert manifest.build.status == "skipped" and "nvfp4 needs TensorRT" in manifest.build.reason
    assert manifest.profile.status == "skipped" and manifest.profile.reason.startswith("not built")
    assert not (demo / "models" / "tiny" / "nvfp4.onnx").exists()


def test_compare_renders_markdown_and_json_from_manifests(demo, run_cli):
    catalog = demo / "pipeline.toml"
    md = run_cli(catalog, "compare", "--format", "md")
    assert md.exit_code == 0
    assert md.out.startswith("## The answer: the fastest engine that meets the accuracy floor\n\n- tiny: ")
    assert "\n### tiny\n\n| engine | toolchain | median ms |" in md.out
    assert "| tiny_fp32 | onnxruntime |" in md.out and "1.00x vs fp32" in md.out
    assert "skipped: nvfp4 needs TensorRT" in md.out
    rows = json.loads(run_cli(catalog, "compare", "--format", "json").out)["rows"]
    by_variant = {r["variant"]: r for r in rows}
    fp32 = read_manifest(demo / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details
    # Timed in rounds: the median of its takes' medians, the figure its interval bounds.
    assert by_variant["fp32"]["median_ms"] == statistics.median(m for record in fp32.rounds for m in record.kept_medians_ms)
    low, high = by_variant["fp32"]["median_ci_ms"]
    assert low <= by_variant["fp32"]["median_ms"] <= high
    fp16 = by_variant["fp16"]
    assert fp16["speedup"] == pytest.approx(by_variant["fp32"]["median_ms"] / fp16["median_ms"])
    assert by_variant["nvfp4"]["median_ms"] is None
    out = demo / "reports" / "table.md"
    assert run_cli(catalog, "compare", "--format", "md", "--out", str(out)).exit_code == 0
    assert out.read_text() == md.out


def test_warm_rerun_does_no_work_and_imports_no_ml_framework(demo):
    catalog = demo / "pipeline.toml"
    # Every output, not the bookkeeping a run always touches (the hash cache, the workspace lock).
    before = {p: p.stat().st_mtime_ns for p in demo.rglob("*") if p.is_file() and p.name not in (".hash-cache.json", ".workspace.lock")}
    code = (
        "import sys; from pipeline.cli import main; "
        f"rc = main(['--catalog', {str(catalog)!r}, 'run', '--variant', 'fp32', '--variant', 'fp16', '--variant', 'int8', '--variant', 'nvfp4']); "
        "print('HEAVY', [m for m in ('torch', 'timm', 'modelopt', 'onnxruntime') if m in sys.modules]); sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("didn't change, skipping") == 3 * 3 + 2  # nvfp4: build + profile
    assert "HEAVY []" in result.stdout
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before


def test_changing_profile_settings_reprofiles_without_rebuilding(demo, run_cli):
    ws = demo.parent / "settings"
    import shutil

    shutil.copytree(demo, ws)
    catalog = ws / "pipeline.toml"
    catalog.write_text(catalog.read_text().replace("iterations = 5", "iterations = 7"))
    result = run_cli(catalog, "profile", "--engine", "tiny_fp32")
    assert result.exit_code == 0
    assert "export   tiny_fp32" in result.err and "build    tiny_fp32" in result.err
    lines = result.err.splitlines()
    assert "didn't change" in next(candidate for candidate in lines if candidate.startswith("export"))
    assert "didn't change" in next(candidate for candidate in lines if candidate.startswith("build"))
    assert "done" in next(candidate for candidate in lines if candidate.startswith("profile"))
    assert read_manifest(ws / "manifests" / "onnxruntime" / "tiny_fp32.json").profile.details.iterations >= 7


def test_a_tampered_onnx_is_re_exported_and_force_reruns(demo, run_cli):
    ws = demo.parent / "tampered"
    import shutil

    shutil.copytree(demo, ws)
    catalog = ws / "pipeline.toml"
    onnx_path = ws / "models" / "tiny" / "fp32.onnx"
    good = _sha256(onnx_path)
    onnx_path.write_bytes(b"not an onnx model")
    result = run_cli(catalog, "build", "--engine", "tiny_fp32")
    assert result.exit_code == 0
    assert [candidate.split()[0] for candidate in result.err.splitlines() if "done" in candidate] == ["export"]
    assert _sha256(onnx_path) == good  # same seed, same model: the export is reproducible
    # The build's input is identified by content, and the content is back to what it was built from.
    assert "didn't change" in next(candidate for candidate in result.err.splitlines() if candidate.startswith("build"))
    forced = run_cli(catalog, "export", "--engine", "tiny_fp32", "--force")
    assert forced.exit_code == 0 and "didn't change" not in forced.err


def test_full_disk_during_export_leaves_nothing_that_looks_valid(tiny_catalog, run_cli, monkeypatch):
    from pipeline.running import files

    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith(".onnx"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    result = run_cli(tiny_catalog, "export", "--engine", "tiny_fp32")
    assert result.exit_code == 1
    assert "ERROR could not write" in result.err and "No space left on device" in result.err
    assert "Traceback" not in result.err
    ws = tiny_catalog.parent
    assert list((ws / "models" / "tiny").iterdir()) == []  # no temp file, no partial ONNX
    assert not (ws / "manifests" / "export" / "tiny_fp32.json").exists()


def test_failed_parity_check_keeps_no_onnx(tiny_catalog, run_cli, monkeypatch):
    from pipeline.stages import export

    monkeypatch.setitem(export.PARITY_TOLERANCE, "fp32", (0.0, 1.1))  # impossible to meet
    result = run_cli(tiny_catalog, "export", "--engine", "tiny_fp32")
    assert result.exit_code == 1
    assert "does not match PyTorch" in result.err and "the ONNX was not kept" in result.err
    assert not (tiny_catalog.parent / "models" / "tiny" / "fp32.onnx").exists()


def test_missing_checkpoint_is_a_clear_error(tmp_path, run_cli):
    catalog = write_catalog(tmp_path, TINY_CATALOG.replace("batch_size = 2", 'batch_size = 2\ncheckpoint = "weights/missing.pth"'))
    result = run_cli(catalog, "export", "--engine", "tiny_fp32")
    assert result.exit_code == 1
    assert "ERROR checkpoint " in result.err and "weights/missing.pth for model 'tiny' does not exist" in result.err


def test_local_checkpoint_is_loaded_and_recorded(tmp_path, run_cli):
    from pipeline.models.torch_import import import_timm

    timm = import_timm()
    import torch

    model = timm.create_model("test_vit", pretrained=False)
    torch.nn.init.constant_(model.head.bias, 0.25)
    torch.save(model.state_dict(), tmp_path / "w.pth")
    catalog = write_catalog(tmp_path, TINY_CATALOG.replace("batch_size = 2", 'batch_size = 2\ncheckpoint = "w.pth"'))
    result = run_cli(catalog, "export", "--engine", "tiny_fp32")
    assert result.exit_code == 0, result.err
    details = read_manifest(tmp_path / "manifests" / "export" / "tiny_fp32.json").export.details
    assert details.weights.startswith("checkpoint w.pth (sha256 ")
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(tmp_path / "models" / "tiny" / "fp32.onnx")).graph
    biases = [numpy_helper.to_array(t) for t in graph.initializer if t.name == "head.bias"]
    assert biases and float(biases[0].mean()) == pytest.approx(0.25)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message shown on machines without CUDA")
def test_block_formats_need_a_gpu_and_say_so(tiny_catalog, run_cli):
    result = run_cli(tiny_catalog, "export", "--engine", "tiny_mxfp8")
    assert result.exit_code == 3
    assert "mxfp8 quantization needs a CUDA GPU" in result.err
    assert not (tiny_catalog.parent / "models" / "tiny" / "mxfp8.onnx").exists()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process that may run on two CPUs, to pin it to one")
def test_a_pinned_process_sizes_onnx_runtimes_thread_pool_to_its_own_cores(tmp_path):
    """Left to itself ONNX Runtime starts a thread per core of the machine and pins them across it,
    out of a process pinned to some CPUs (a cluster point's share, [profile] host_cpus)."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    from pipeline.machine.environment import running_on
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime
    from pipeline.runtimes.onnxrt.runtime import OnnxRuntimeSpec

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    runtime = create_runtime("onnxruntime", OnnxRuntimeSpec(kind="onnxruntime"), Reporter(), tmp_path)
    level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert runtime._session(path, level).get_session_options().intra_op_num_threads == 0  # ONNX Runtime's own choice
    with running_on((sorted(os.sched_getaffinity(0))[0],)):
        assert runtime._session(path, level).get_session_options().intra_op_num_threads == 1


def test_run_prints_the_comparison_of_the_models_it_ran_only(tmp_path, run_cli):
    """Another model measured in the workspace before is `pipeline compare`'s, not this run's."""
    text = TINY_CATALOG.replace("[variants.fp32]", '[models.other]\ntimm = "test_vit"\nbatch_size = 1\n\n[variants.fp32]', 1)
    catalog = write_catalog(tmp_path / "ws", text)
    assert run_cli(catalog, "run", "--engine", "other_fp32").exit_code == 0
    ran = run_cli(catalog, "run", "--engine", "tiny_fp32")
    assert ran.exit_code == 0 and "\ntiny: fastest is fp32 on onnxruntime" in ran.out
    assert "other" not in ran.out
    assert "other: " in run_cli(catalog, "compare").out

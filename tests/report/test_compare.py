"""Reports and the regression gate, on TensorRT manifests made from recorded trtexec output and on
real ONNX Runtime runs."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from datetime import datetime, timezone

import numpy as np
import pytest

from pipeline.manifest import Artifact, BuildDetails, EngineManifest, Environment, ExportDetails, ProfileDetails, StageRecord, read_manifest
from pipeline.measuring.stats import LatencyStats
from pipeline.runtimes.tensorrt.trtexec import context_memory_mib
from pipeline.trtexec.layers import read_layer_info
from pipeline.trtexec.log import read_log
from tests.conftest import SAMPLES, TINY_CATALOG, render_in_chromium, write_catalog

TRT_CATALOG = (
    TINY_CATALOG
    + """
[toolchains."trt10.16"]
kind = "trtexec-container"
trt = "10.16.0"
image = "nvcr.io/nvidia/tensorrt:example"
"""
)
# Two releases on the same GPU (RTX 6000 Ada), same command: a real release-to-release comparison.
RECORDED = {
    "trt10.14": SAMPLES / "trt10.14.1_rtx6000ada_onnx_build_and_run_default.txt",
    "trt10.16": SAMPLES / "trt10.16.0_rtx6000ada_onnx_saveEngine_build_and_run_enqueue_bound_warning.txt",
}


def _record(stage, details, outputs=(), duration=1.0):
    return StageRecord(
        stage=stage, status="done", fingerprint="0" * 64, finished_at=datetime.now(timezone.utc),
        duration_s=duration, outputs=list(outputs), details=details,
    )  # fmt: skip


def trt_manifest(toolchain: str, variant: str, scale: float = 1.0) -> EngineManifest:
    """A manifest as the pipeline writes it, from a recorded trtexec log (the core facts as the
    trtexec runtime derives them, its own evidence beside them).

    The per-iteration samples are the log's trace lines (GPU latency averaged over 10 runs each),
    the only per-iteration data the recorded logs hold.
    """
    log = read_log(RECORDED[toolchain])
    samples = [t.gpu_ms * scale for t in log.trace]
    stats = LatencyStats.from_values(samples)
    audit = read_layer_info(SAMPLES / "trt10.16.1_h100_exportLayerInfo_detailed.json").audit(variant)
    env = Environment(hostname="gpu-box", os="Linux", python="3.12", cpu="x86", cpu_count=16, pipeline_version="0")
    trtexec = json.loads(log.model_dump_json(exclude={"trace"}))
    # The per-layer table of a recorded --dumpProfile run of the same model on the same GPU.
    profiled = read_log(SAMPLES / "trt10.14.1_rtx6000ada_loadEngine_dumpProfile.txt")
    trtexec["profile"] = json.loads(profiled.profile.model_dump_json())
    engine = Artifact(role="engine", path=f"engines/{toolchain}/tiny_{variant}.engine", sha256="1" * 64, size_bytes=12 * 2**20)
    export = ExportDetails(
        timm_model="test_vit", weights="random-init (seed 0)", input_shape=[2, 3, 160, 160], input_dtype="float16",
        opset=17, precision=variant, onnx_audit={"matmul_flops": 150541312},
        accuracy={"cosine_similarity": 0.9995, "top1_agreement": 1.0} if variant != "fp32" else None,
    )  # fmt: skip
    return EngineManifest(
        engine=f"tiny_{variant}", model="tiny", variant=variant, precision=variant, toolchain=toolchain, environment=env,
        export=_record("export", export),
        build=_record("build", BuildDetails(runtime="trtexec-container", runtime_version=log.trt_version, trtexec=trtexec,
                                            precision_audit=audit.model_dump()), [engine], duration=8.1),
        profile=_record("profile", ProfileDetails(
            settings={"warmup_ms": 200, "iterations": 10, "duration_s": 3}, batch_size=2, device=f"TensorRT on {log.device.name}",
            metric="GPU compute time", iterations=stats.count, total_walltime_s=log.total_host_walltime_s, latency_ms=stats,
            throughput_qps=log.throughput_qps, images_per_s=log.throughput_qps * 2, per_iteration_ms=samples, trtexec=trtexec,
            gpu=log.device.name, gpu_memory_mib=context_memory_mib(log.facts.get("device_memory_size")),
            gpu_memory_counts="TensorRT execution context", layer_times=profiled.profile.layers)),
    )  # fmt: skip


@pytest.fixture
def trt_workspace(tmp_path):
    catalog = write_catalog(tmp_path / "ws", TRT_CATALOG)
    for toolchain in RECORDED:
        for variant, scale in (("fp32", 1.6), ("fp16", 1.0)):
            trt_manifest(toolchain, variant, scale).write(tmp_path / "ws" / "manifests" / toolchain / f"tiny_{variant}.json")
    return catalog


def test_tensorrt_releases_side_by_side(trt_workspace, run_cli):
    result = run_cli(trt_workspace, "compare", "--trt", "10.14", "--trt", "10.16", "--format", "json")
    assert result.exit_code == 0, result.err
    rows = {(r["variant"], r["toolchain"]): r for r in json.loads(result.out)["rows"]}
    old, new = rows[("fp16", "trt10.14")], rows[("fp16", "trt10.16")]
    assert old["status"] == "measured (GPU compute time)"
    log_14 = read_log(RECORDED["trt10.14"])
    assert old["median_ms"] == pytest.approx(float(np.median([t.gpu_ms for t in log_14.trace])))
    assert new["reference_toolchain"] == "trt10.14" and old["change_pct"] is None
    assert new["change_pct"] == pytest.approx((new["median_ms"] - old["median_ms"]) / old["median_ms"] * 100)
    assert new["change_significant"] is True  # 0.051 vs 0.029 ms over 400 samples each
    assert rows[("fp32", "trt10.14")]["speedup"] == pytest.approx(1 / 1.6)  # fp16 is the TensorRT baseline
    assert old["baseline"] == "fp16" and old["speedup"] == 1.0
    assert old["engine_mb"] == 12.0 and old["build_s"] == 8.1
    assert "silent fallback" in old["audit"]  # the recorded layer info is an FP32 engine
    assert old["gpu"] == "NVIDIA RTX 6000 Ada Generation" and old["peak_fraction"] is None  # not in the peak table
    assert old["achieved_tflops"] == pytest.approx(150541312 / (old["median_ms"] / 1000) / 1e12)


def test_markdown_csv_and_table_formats(trt_workspace, run_cli):
    md = run_cli(trt_workspace, "compare", "--format", "md").out
    assert md.startswith("## The answer: the fastest engine that meets the accuracy floor\n\n- tiny: fastest is ") and "\n### tiny\n" in md
    assert "| tiny_fp16 | trt10.16 |" in md and "vs trt10.14" in md
    rows = list(csv.DictReader(io.StringIO(run_cli(trt_workspace, "compare", "--format", "csv").out)))
    assert len(rows) == 4 and {r["toolchain"] for r in rows} == {"trt10.14", "trt10.16"}
    assert float(rows[0]["median_ms"]) > 0 and ".." in rows[0]["median_ci_ms"]
    table = run_cli(trt_workspace, "compare", "--models", "tiny", "--wide")
    assert "tiny_fp16" in table.out and "~ = within the runs' own spread" in table.out


def test_compare_leaves_the_garbage_collector_as_it_found_it(trt_workspace, run_cli, tmp_path):
    """compare pauses Python's cyclic collector while it builds (pipeline/report/compare.py); a
    command that goes on after it (`run` prints the comparison last, a test session goes on) gets
    it back as it was, after a compare that succeeded and after one that failed."""
    import gc

    empty = write_catalog(tmp_path / "empty", TRT_CATALOG)
    assert gc.isenabled()
    assert run_cli(trt_workspace, "compare", "--format", "json").exit_code == 0 and gc.isenabled()
    assert run_cli(empty, "compare").exit_code != 0 and gc.isenabled()
    gc.disable()
    try:
        assert run_cli(trt_workspace, "compare", "--format", "json").exit_code == 0 and not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_the_table_fits_the_terminal_with_every_number_whole(trt_workspace, run_cli, monkeypatch, width):
    rows = json.loads(run_cli(trt_workspace, "compare", "--format", "json").out)["rows"]
    monkeypatch.setenv("COLUMNS", str(width))
    out = run_cli(trt_workspace, "compare").out
    assert max(map(len, out.splitlines())) <= width
    assert "…" not in out
    for row in rows:
        line = next(candidate for candidate in out.splitlines() if candidate.split()[:2] == [row["variant"], row["toolchain"]])
        # A p99 its takes cannot bound is marked "?" (trtexec's one run: no takes at all).
        p99 = f"{row['p99_ms']:.3f}" + ("?" if row["p99_interval_ms"] is None else "")
        for number in (f"{row['median_ms']:.3f}", p99, f"{row['images_per_s']:.1f}", f"{row['speedup']:.2f}x"):
            assert number in line.split(), (width, number, line)
        if width >= 120:  # room for the CV and the change against the first toolchain too
            assert f"{row['cv'] * 100:.1f}%" in line.split()
    assert "speedup: against the fp16 variant of the same toolchain" in out
    assert "? = too few takes to bound the p99 (it needs 368;" in out
    assert "[1] measured (GPU compute time)" in out


@pytest.mark.parametrize("width", [60, 80, 120])
def test_long_reasons_wrap_inside_the_terminal_and_keep_every_word(trt_workspace, run_cli, monkeypatch, width):
    """A refusal's reason is long (the compiler's message); the table wraps it, and the notes under a
    compact table, within the width, and loses no word of it."""
    path = trt_workspace.parent / "manifests" / "trt10.16" / "tiny_fp32.json"
    manifest = read_manifest(path)
    reason = (
        "trtexec exited 1: [E] Error[4]: IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error "
        "(Network has dynamic or shape inputs, but no optimization profile has been defined.) and the "
        "engine_with_a_very_long_name_that_cannot_break_anywhere_at_all_in_any_terminal was not written"
    )
    manifest.build = manifest.build.model_copy(update={"status": "failed", "reason": reason})
    manifest.profile = None
    manifest.write(path)
    monkeypatch.setenv("COLUMNS", str(width))
    for args in ((), ("--columns", "median,status"), ("--columns", "audit,status")):
        out = run_cli(trt_workspace, "compare", *args).out
        if width >= 80:  # the compact set fits 80 columns; in fewer, lines are printed whole for the terminal to wrap
            assert max(map(len, out.splitlines())) <= width, (args, out)
        elif "audit,status" not in args:
            assert all(f"{m:.3f}" in out.split() for m in (0.046, 0.028, 0.050)), out
        words = " ".join(out.split())
        for word in reason.split():
            if len(word) < width - 20:  # a word longer than the status column is folded across lines
                assert word in words, (word, args)
    wide = run_cli(trt_workspace, "compare", "--wide").out
    assert "refused" not in wide.split() and "build refused: trtexec exited 1:" in " ".join(wide.split())


def test_wide_and_chosen_columns(trt_workspace, run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    wide = run_cli(trt_workspace, "compare", "--wide").out
    assert "vs FP32 cos" in wide and "layer audit" in wide and max(map(len, wide.splitlines())) > 80
    chosen = run_cli(trt_workspace, "compare", "--columns", "median,cv,build-s").out
    header = next(line for line in chosen.splitlines() if "median ms" in line)
    assert header.split() == ["variant", "toolchain", "median", "ms", "CV", "build", "s"]
    bad = run_cli(trt_workspace, "compare", "--columns", "median,latency")
    assert bad.exit_code == 2 and "unknown column(s) 'latency'" in bad.err and "median, p99" in bad.err


def test_a_busy_or_noisy_measurement_is_flagged(trt_workspace, run_cli, monkeypatch):
    path = trt_workspace.parent / "manifests" / "trt10.16" / "tiny_fp16.json"
    manifest = read_manifest(path)
    details = manifest.profile.details
    load = {
        "start": {"cpu_count": 2, "load_average": [4.1, 2.0, 1.0]},
        "end": {
            "cpu_count": 2,
            "load_average": [4.3, 2.1, 1.0],
            "gpu_processes": [{"pid": 4242, "name": "python3", "used_memory_mib": 900.0}],
        },
    }
    # The middle half of the runs spread over 25% of the median (as a CV: IQR / 1.349).
    median = details.latency_ms.median
    half_width = 0.25 * 1.349 * median / 2
    noisy = details.latency_ms.model_copy(update={"p25": median - half_width, "p75": median + half_width})
    manifest.profile = manifest.profile.model_copy(
        update={"details": details.model_copy(update={"machine_load": load, "latency_ms": noisy})}
    )
    manifest.write(path)
    rows = {(r["variant"], r["toolchain"]): r for r in json.loads(run_cli(trt_workspace, "compare", "--format", "json").out)["rows"]}
    assert rows[("fp16", "trt10.16")]["flags"] == [
        "noisy: interquartile CV 25.0% is above 10%",
        "busy machine: load average 4.1 on 2 CPUs at the start",
        "busy GPU: other processes used it at the end: python3 (pid 4242)",
    ]
    assert rows[("fp16", "trt10.14")]["flags"] == []
    monkeypatch.setenv("COLUMNS", "100")
    out = run_cli(trt_workspace, "compare").out
    line = next(candidate for candidate in out.splitlines() if candidate.split()[:2] == ["fp16", "trt10.16"])
    mark = line.split()[-1]
    assert line.split()[-2] == "busy" and f"{mark} measured (GPU compute time); noisy: interquartile CV 25.0%" in out
    relaxed = json.loads(run_cli(trt_workspace, "compare", "--format", "json", "--noisy-cv", "30").out)["rows"]
    assert not any(f.startswith("noisy") for r in relaxed for f in r["flags"])
    assert "busy machine: load average 4.1" in run_cli(trt_workspace, "compare", "--format", "md").out


def test_noise_is_judged_by_the_quartiles_and_by_the_cv_where_they_were_not_recorded(trt_workspace, run_cli):
    """A few stalled runs (CV 35%, quartiles 1% apart) leave the median alone: not noisy. A manifest
    written before the quartiles were recorded is judged by its CV."""
    path = trt_workspace.parent / "manifests" / "trt10.16" / "tiny_fp16.json"
    manifest = read_manifest(path)
    details = manifest.profile.details
    median = details.latency_ms.median
    stalled = details.latency_ms.model_copy(update={"cv": 0.35, "p25": median * 0.995, "p75": median * 1.005})
    manifest.profile = manifest.profile.model_copy(update={"details": details.model_copy(update={"latency_ms": stalled})})
    manifest.write(path)

    def flags() -> list[str]:
        rows = json.loads(run_cli(trt_workspace, "compare", "--format", "json").out)["rows"]
        return next(r["flags"] for r in rows if (r["variant"], r["toolchain"]) == ("fp16", "trt10.16"))

    assert flags() == []
    raw = json.loads(path.read_text())
    for key in ("p25", "p75"):
        del raw["profile"]["details"]["latency_ms"][key]
    path.write_text(json.dumps(raw))
    assert flags() == ["noisy: CV 35.0% is above 10%"]


def test_rows_measured_under_different_settings_are_flagged(trt_workspace, run_cli):
    for toolchain, graphs in (("trt10.14", True), ("trt10.16", False)):
        path = trt_workspace.parent / "manifests" / toolchain / "tiny_fp16.json"
        manifest = read_manifest(path)
        details = manifest.profile.details.model_copy(
            update={"measured_with": {"cuda_graph": graphs, "data_transfers": False, "spin_wait": True}}
        )
        manifest.profile = manifest.profile.model_copy(update={"details": details})
        manifest.write(path)
    result = run_cli(trt_workspace, "compare", "--trt", "10.14", "--trt", "10.16", "--format", "json")
    rows = {(r["variant"], r["toolchain"]): r for r in json.loads(result.out)["rows"]}
    assert "measured differently from trt10.14: cuda_graph off here, on there" in rows[("fp16", "trt10.16")]["flags"]
    assert "WARNING tiny_fp16 on trt10.16: measured differently from trt10.14" in result.err
    assert not any(f.startswith("measured differently") for f in rows[("fp32", "trt10.16")]["flags"])  # nothing recorded there


def test_piped_output_follows_columns(trt_workspace):
    import os
    import sys

    env = {**os.environ, "COLUMNS": "90"}
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(trt_workspace), "compare"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert max(map(len, out.splitlines())) <= 90 and "median ms" in out


def test_html_from_tensorrt_manifests_has_the_top_layers(trt_workspace, run_cli):
    result = run_cli(trt_workspace, "compare", "--format", "html", "--out", str(trt_workspace.parent / "r.html"))
    assert result.exit_code == 0
    text = (trt_workspace.parent / "r.html").read_text()
    assert 'alt="top layers of tiny_fp16 on trt10.16"' in text
    assert text.count("data:image/png;base64,") == 2 + 4  # bars, CDF, and one layer chart per engine
    assert "NVIDIA RTX 6000 Ada Generation" not in text or "gpu-box" in text


def test_differences_within_noise_are_marked(trt_workspace, run_cli, tmp_path):
    # The same release measured twice with a 0.2% difference: not a real change.
    manifests = trt_workspace.parent / "manifests"
    shutil.rmtree(manifests / "trt10.16")
    twin = trt_manifest("trt10.14", "fp16", 1.002).model_copy(update={"toolchain": "trt10.16"})
    twin.write(manifests / "trt10.16" / "tiny_fp16.json")
    rows = {
        r["toolchain"]: r for r in json.loads(run_cli(trt_workspace, "compare", "--format", "json").out)["rows"] if r["variant"] == "fp16"
    }
    assert rows["trt10.16"]["change_significant"] is False
    assert "~+0.2%" in run_cli(trt_workspace, "compare", "--format", "md").out


def test_gate_fails_on_a_slowdown_and_names_it(trt_workspace, run_cli, tmp_path):
    baseline = tmp_path / "baseline"
    shutil.copytree(trt_workspace.parent / "manifests", baseline)
    slower = trt_manifest("trt10.16", "fp16", 1.08)
    slower.write(trt_workspace.parent / "manifests" / "trt10.16" / "tiny_fp16.json")
    result = run_cli(trt_workspace, "compare", "--format", "md", "--baseline", str(baseline), "--fail-above", "5")
    assert result.exit_code == 1
    assert "REGRESSED" in result.err and "tiny_fp16" in result.err and "+8.0%" in result.err and "Regression gate" not in result.out
    assert "ERROR 1 engine(s) got slower than 5% beyond the noise: tiny_fp16 on trt10.16 (+8.0%)" in result.err
    lenient = run_cli(trt_workspace, "compare", "--format", "md", "--baseline", str(baseline), "--fail-above", "10")
    assert lenient.exit_code == 0 and "REGRESSED" not in lenient.err


def test_gate_passes_against_itself_and_rejects_an_empty_baseline(trt_workspace, run_cli, tmp_path):
    result = run_cli(trt_workspace, "compare", "--format", "md", "--baseline", str(trt_workspace.parent))
    assert result.exit_code == 0 and result.err.count("ok ") == 4
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = run_cli(trt_workspace, "compare", "--baseline", str(empty))
    assert bad.exit_code == 1 and "holds no engine manifests" in bad.err


def test_gate_reads_a_git_ref(trt_workspace, run_cli):
    ws = trt_workspace.parent

    def git(*args):
        subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "-f", "manifests")
    git("-c", "user.email=ci@example.invalid", "-c", "user.name=ci", "commit", "-qm", "results")
    trt_manifest("trt10.14", "fp32", 1.6 * 1.3).write(ws / "manifests" / "trt10.14" / "tiny_fp32.json")
    result = run_cli(trt_workspace, "compare", "--format", "md", "--baseline", "HEAD")
    assert result.exit_code == 1 and "tiny_fp32 on trt10.14 (+30.0%)" in result.err
    missing = run_cli(trt_workspace, "compare", "--baseline", "no-such-ref")
    assert missing.exit_code == 2 and "neither a directory nor a git ref" in missing.err


def test_the_gate_matches_engines_point_by_point_and_gates_only_what_it_can_trust():
    """Each shape point against its own; another batch, or a measurement the report leaves out of
    its answer (busy), is said and not gated; --model's choice holds for the gate too."""
    from pipeline.report.gates import regression_gate, render_gate

    def at(shape, scale=1.0, **update):
        manifest = trt_manifest("trt10.14", "fp16", scale).model_copy(update={"shape": shape})
        details = manifest.profile.details.model_copy(update=update)
        return manifest.model_copy(update={"profile": manifest.profile.model_copy(update={"details": details})})

    baseline = [at("2x16"), at("2x32", 4.0)]
    slower_small = regression_gate([at("2x16", 2.0), at("2x32", 4.0)], baseline, 5.0)
    assert [(r.shape, r.regressed) for r in slower_small] == [("2x16", True), ("2x32", False)]
    assert "REGRESSED          tiny_fp16 at 2×16" in render_gate(slower_small, 5.0)
    only_small = regression_gate([at("2x32", 4.0)], [at("2x16")], 5.0)  # no point in common: nothing set against another's
    assert only_small == []
    batch = regression_gate([at("2x16", 2.0, batch_size=4)], baseline, 5.0)
    assert not batch[0].regressed and batch[0].not_gated == "batch 2 then, 4 now"
    busy = {"start": {"load_average": [9.0, 9.0, 9.0], "cpu_count": 2}}
    untrusted = regression_gate([at("2x16", 2.0, machine_load=busy)], baseline, 5.0)
    assert not untrusted[0].regressed and untrusted[0].not_gated == "busy machine now", untrusted[0]
    assert regression_gate([at("2x16", 2.0)], baseline, 5.0, models=["other"]) == []


def test_the_gate_writes_to_stderr_and_refuses_a_threshold_without_a_baseline(trt_workspace, run_cli):
    gated = run_cli(trt_workspace, "compare", "--format", "json", "--baseline", str(trt_workspace.parent))
    assert gated.exit_code == 0 and json.loads(gated.out)["rows"] and "Regression gate" in gated.err
    forgot = run_cli(trt_workspace, "compare", "--fail-above", "5")
    assert forgot.exit_code == 2 and "--fail-above gates against a baseline, and none was given" in forgot.err


def test_the_gate_reads_a_git_ref_from_a_workspace_inside_a_repository(trt_workspace, run_cli):
    ws = trt_workspace.parent
    repo = ws.parent

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "-f", f"{ws.name}/manifests")
    git("-c", "user.email=ci@example.invalid", "-c", "user.name=ci", "commit", "-qm", "results")
    result = run_cli(trt_workspace, "compare", "--format", "md", "--baseline", "HEAD")
    assert result.exit_code == 0 and result.err.count("ok ") == 4, result.err


def test_a_baseline_manifest_compare_cannot_use_is_named_not_a_traceback(trt_workspace, run_cli, tmp_path):
    baseline = tmp_path / "baseline"
    shutil.copytree(trt_workspace.parent / "manifests", baseline)

    def edit(name, change):
        path = baseline / "trt10.16" / name
        document = json.loads(path.read_text())
        change(document["profile"]["details"])
        path.write_text(json.dumps(document))

    edit("tiny_fp16.json", lambda details: details.update(per_iteration_ms=[]) or details["latency_ms"].update(median=0.0))
    result = run_cli(trt_workspace, "compare", "--baseline", str(baseline))
    assert result.exit_code == 1 and "trt10.16/tiny_fp16.json holds a value compare cannot use" in result.err
    assert "Traceback" not in result.err


def test_the_gate_shows_the_medians_its_interval_is_of():
    """With six takes a side the gate's medians are the takes' (the row's in compare); with fewer
    its interval is of the runs, and so are the medians and change it shows: here the runs' median
    (one long fast take) and the takes' (two short slow ones) are 1.0 and 2.0 ms."""
    from pipeline.report.gates import regression_gate
    from tests.report.test_tail_bounds import rounds_record

    def timed(takes, scale):
        takes = [[run * scale for run in runs] for runs in takes]
        runs = [run for take in takes for run in take]
        manifest = trt_manifest("trt10.14", "fp16")
        update = {"per_iteration_ms": runs, "latency_ms": LatencyStats.from_values(runs), "rounds": [rounds_record(takes)]}
        details = manifest.profile.details.model_copy(update=update)
        return manifest.model_copy(update={"profile": manifest.profile.model_copy(update={"details": details})})

    few = [[1.0] * 200, [2.0] * 10, [2.0] * 10]
    (gated,) = regression_gate([timed(few, 1.1)], [timed(few, 1.0)], 5.0)
    assert gated.samples == "runs" and gated.baseline_ms == pytest.approx(1.0) and gated.current_ms == pytest.approx(1.1)
    assert gated.ci_low_ms <= gated.current_ms - gated.baseline_ms <= gated.ci_high_ms
    many = few + [[2.0] * 10] * 3
    (gated,) = regression_gate([timed(many, 1.1)], [timed(many, 1.0)], 5.0)
    assert gated.samples == "takes" and gated.baseline_ms == pytest.approx(2.0) and gated.current_ms == pytest.approx(2.2)


# --- on real ONNX Runtime runs ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ort_workspace(tmp_path_factory):
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("ort"), TINY_CATALOG.replace("duration_s = 0.05", "duration_s = 0.3"))
    assert main(["--catalog", str(catalog), "run", "--variant", "fp32", "--variant", "int8"]) == 0
    return catalog


def test_gate_on_real_manifests_fails_a_slowdown_and_passes_a_run_with_the_same_spread(ort_workspace, run_cli, tmp_path):
    # The workspace's manifests come from a real run; their latencies are replaced by draws from one
    # fixed distribution (10% spread), because this machine's own timings can double when it is busy.
    ws = ort_workspace.parent
    path = ws / "manifests" / "onnxruntime" / "tiny_fp32.json"
    measured = read_manifest(path)
    rng = np.random.default_rng(0)

    def write_latencies(values):
        # Nor what the machine did around the real run (a busy one is not gated), nor its rounds' takes.
        quiet = {"per_iteration_ms": values, "latency_ms": LatencyStats.from_values(values), "machine_load": {}, "rounds": []}
        details = measured.profile.details.model_copy(update=quiet)
        measured.model_copy(update={"profile": measured.profile.model_copy(update={"details": details})}).write(path)

    typical = list(1.5 * rng.lognormal(0.0, 0.1, 300))
    write_latencies(typical)
    baseline = tmp_path / "baseline"
    shutil.copytree(ws / "manifests", baseline)
    try:
        write_latencies([v * 1.5 for v in typical])
        failed = run_cli(ort_workspace, "compare", "--format", "md", "--baseline", str(baseline), "--fail-above", "5")
        assert failed.exit_code == 1 and "tiny_fp32 on onnxruntime (+50.0%)" in failed.err, failed.out + failed.err
        write_latencies(list(1.5 * rng.lognormal(0.0, 0.1, 300)))  # another run, same spread
        rerun = run_cli(ort_workspace, "compare", "--format", "md", "--baseline", str(baseline), "--fail-above", "5")
        assert rerun.exit_code == 0, rerun.out + rerun.err
    finally:
        measured.write(path)  # the other tests read the real measurement


def test_csv_from_real_runs(ort_workspace, run_cli):
    rows = list(csv.DictReader(io.StringIO(run_cli(ort_workspace, "compare", "--format", "csv").out)))
    assert [r["engine"] for r in rows] == ["tiny_fp32", "tiny_int8"]
    assert all(float(r["median_ms"]) > 0 for r in rows) and rows[1]["baseline"] == "fp32"


def test_html_report_is_self_contained(ort_workspace, run_cli):
    result = run_cli(ort_workspace, "compare", "--format", "html")
    assert result.exit_code == 0
    report = ort_workspace.parent / "reports" / "compare.html"
    text = report.read_text()
    assert text.count('<table class="comparison">') == 1 and "tiny_int8" in text
    assert text.count("data:image/png;base64,") >= 2  # latency bars and CDF, embedded
    assert "http://" not in text and "https://" not in text  # nothing fetched when opened


def test_html_report_renders_in_chromium(ort_workspace, run_cli, tmp_path):
    from PIL import Image

    assert run_cli(ort_workspace, "compare", "--format", "html").exit_code == 0
    rendered = render_in_chromium(ort_workspace.parent / "reports" / "compare.html", tmp_path, screenshot=True)
    colours = Image.open(rendered.screenshot).convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # tables and plots, not a blank page
    dom = rendered.dom
    assert dom.count("<table") == 2 and dom.count("<img") >= 2 and "tiny_fp32" in dom


def test_a_real_100_column_terminal_shows_every_number_whole(trt_workspace, run_cli):
    """In a pseudo-terminal 100 columns wide, as in tmux, with no $COLUMNS to help."""
    import fcntl
    import os
    import pty
    import re
    import struct
    import sys
    import termios

    rows = json.loads(run_cli(trt_workspace, "compare", "--format", "json").out)["rows"]
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(trt_workspace), "compare"],
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes when the process exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=60) == 0
    os.close(leader)
    out = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", b"".join(chunks).decode())  # colours off
    lines = out.replace("\r", "").splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in out
    for row in rows:
        line = next(candidate for candidate in lines if candidate.split()[:2] == [row["variant"], row["toolchain"]])
        p99 = f"{row['p99_ms']:.3f}" + ("?" if row["p99_interval_ms"] is None else "")  # unbounded: marked
        for number in (f"{row['median_ms']:.3f}", p99, f"{row['speedup']:.2f}x"):
            assert number in line.split(), (number, line)

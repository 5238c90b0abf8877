"""Parsers for trtexec's JSON exports, against the recorded files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.running.errors import PipelineError
from pipeline.trtexec.exports import read_profile, read_times
from pipeline.trtexec.layers import layer_info_from_dump, normalise_dtype, read_layer_info
from pipeline.trtexec.report import classify_export, find_exports, parse_run, run_as_json
from tests.conftest import SAMPLES

TIMES = SAMPLES / "trt10.4.0_rtx3060laptop_exportTimes_alexnet_HEAD11LINES.json.txt"
PROFILE = SAMPLES / "trt10.4.0_rtx3060laptop_exportProfile_alexnet.json"
LAYERS_104 = SAMPLES / "trt10.4.0_rtx3060laptop_exportLayerInfo_alexnet_detailed.json"
LAYERS_1016 = SAMPLES / "trt10.16.1_h100_exportLayerInfo_detailed.json"
NAMES_ONLY = SAMPLES / "trt8.6.0_rtx3090_exportLayerInfo_layer_names_only.json"


def test_truncated_export_times_are_recovered_and_recomputed():
    times = read_times(TIMES)
    assert times.truncated and times.count == 10
    assert times.compute_ms[:2] == [0.497559, 0.498535]
    assert times.h2d_ms == [0.0] * 10  # --noDataTransfers
    assert times.gpu_compute.median == pytest.approx(float(np.median(times.compute_ms)))
    assert times.latency.max == max(times.latency_ms)


def test_complete_export_times(tmp_path):
    records = [
        {"startEnqMs": i, "endEnqMs": i + 0.01, "computeMs": 1.0 + i / 100, "latencyMs": 1.2 + i / 100, "h2dMs": 0.1, "d2hMs": 0.1}
        for i in range(50)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(records))
    times = read_times(path)
    assert not times.truncated and times.count == 50
    assert times.gpu_compute.min == 1.0 and times.enqueue.median == pytest.approx(0.01)


def test_export_profile():
    profile = read_profile(PROFILE)
    assert profile.iterations == 14590
    assert len(profile.layers) == 14
    first = profile.layers[0]
    assert first.name.startswith("Reformatting CopyNode for Input Tensor 0 to /features/features.0/Conv")
    assert (first.total_ms, first.average_ms, first.median_ms, first.percent) == (135.153, 0.00926341, 0.009216, 1.76725)


@pytest.mark.parametrize("path, layers", [(LAYERS_104, 14), (LAYERS_1016, 9)], ids=["10.4", "10.16"])
def test_detailed_layer_info(path, layers):
    info = read_layer_info(path)
    assert info.verbosity == "detailed" and len(info.layer_names) == layers
    assert info.layer_names == [layer["Name"] for layer in json.loads(path.read_text())["Layers"]]


def test_names_only_layer_info():
    info = read_layer_info(NAMES_ONLY)
    assert info.verbosity == "layer_names_only" and len(info.layer_names) == 15
    assert info.layer_names[1] == "Conv-1 + ReLU-2"
    assert info.audit("fp16").intended_found is None  # no types to audit at this verbosity


def test_precision_audit_confirms_an_fp16_engine():
    audit = read_layer_info(LAYERS_104).audit("fp16")
    assert audit.output_types["fp16"] == 13
    assert audit.intended_found is True and audit.warning is None


def test_precision_audit_flags_a_silent_fallback():
    audit = read_layer_info(LAYERS_1016).audit("fp16")  # an FP32 build, audited as if fp16 was asked for
    assert audit.output_types == {"fp32": 8, "int64": 1}
    assert audit.intended_found is False
    assert "no layer runs in fp16" in audit.warning and "silent fallback" in audit.warning


def test_text_layer_dump_reads_like_the_exported_layer_info():
    # --dumpLayerInfo prints the layers --exportLayerInfo writes; these two are of two builds of the
    # same model that picked different kernels for two layers, and agree on everything else.
    dumped = layer_info_from_dump((SAMPLES / "trt10.16.1_h100_onnx_dumpLayerInfo_detailed_skipInference.txt").read_text(errors="replace"))
    exported = read_layer_info(LAYERS_1016)
    assert dumped.layer_names == exported.layer_names
    assert dumped.layers[0].layer_type == "CaskConvolution"
    # \x1e joins the fused ONNX nodes inside the dumped line: the line must not be split there.
    assert dumped.layers[0].onnx_nodes == ["node_conv2d", "node_relu"]
    differing = [
        a.name for a, b in zip(dumped.layers, exported.layers) if a.model_dump(exclude={"tactic"}) != b.model_dump(exclude={"tactic"})
    ]
    assert differing == []
    assert dumped.audit("fp32").output_types == exported.audit("fp32").output_types
    assert layer_info_from_dump("[I] no layers here\n") is None


@pytest.mark.parametrize(
    "text, dtype",
    [
        ("Float", "fp32"),
        ("Half", "fp16"),
        ("Channel major FP16 format where channel % 8 == 0", "fp16"),
        ("Row major linear FP16 format", "fp16"),
        ("Int8", "int8"),
        ("Channel major INT8 format where channel % 32 == 0", "int8"),
        ("Row major linear FP8 format", "fp8"),
        ("FP4", "fp4"),
        ("FP4E2M1", "fp4"),  # TensorRT-RTX's layer dump
        ("FP8", "fp8"),
        ("BFloat16", "bf16"),
        ("Int64", "int64"),
        ("Something new", "unknown"),
    ],
)
def test_data_type_names(text, dtype):
    assert normalise_dtype(text) == dtype


def test_exports_are_classified_by_content():
    assert classify_export(TIMES) == "times"
    assert classify_export(PROFILE) == "profile"
    assert classify_export(LAYERS_104) == "layer_info"


def test_garbage_json_is_a_clear_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(PipelineError, match="not valid JSON"):
        read_profile(path)
    path.write_text('{"a": 1}')
    with pytest.raises(PipelineError, match="not a trtexec --exportLayerInfo file"):
        read_layer_info(path)


def test_parse_run_json_has_the_documented_keys(tmp_path):
    for source in (TIMES, PROFILE, LAYERS_104):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    run = parse_run(SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt", find_exports(tmp_path), "fp16")
    data = json.loads(json.dumps(run_as_json(run)))
    for key in ("trt_version", "status", "device", "throughput_qps", "total_host_walltime_s", "total_gpu_compute_s", "warnings", "errors"):
        assert key in data
    assert data["trt_version"] == "10.16.1" and data["device"]["compute_capability"] == "9.0"
    for key in ("latency_ms", "gpu_compute_ms", "enqueue_ms", "h2d_ms", "d2h_ms"):
        assert set(data[key]) >= {"min", "max", "mean", "median", "p90", "p95", "p99"}
    assert data["exports"]["times"]["count"] == 10
    assert data["exports"]["profile"]["iterations"] == 14590
    assert data["exports"]["precision_audit"]["intended_found"] is True


def test_cli_parse_prints_json_and_nulls_for_absent_facts(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "trtexec", "parse", str(SAMPLES / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt"), "--json")
    assert result.exit_code == 0
    data = json.loads(result.out)
    assert data["status"] == "FAILED" and data["throughput_qps"] is None and data["latency_ms"] is None
    assert data["errors"][1]["code"] == 6


def test_cli_parse_of_a_non_log_fails_cleanly(run_cli, tiny_catalog, tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_text("not a log\n")
    result = run_cli(tiny_catalog, "trtexec", "parse", str(junk))
    assert result.exit_code == 1 and "does not look like trtexec output" in result.err
    missing = run_cli(tiny_catalog, "trtexec", "parse", str(tmp_path / "nope.txt"))
    assert missing.exit_code == 1 and "cannot read trtexec log" in missing.err

"""The trtexec log parser against real logs from TensorRT 8.5 to 11.0 (tests/data/trtexec)."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.running.errors import PipelineError
from pipeline.trtexec.log import NOTHING_TO_REPORT, parse_log, read_log
from pipeline.trtexec.log_records import SummaryFigures, decode_version
from tests.conftest import SAMPLES

# Every whole log: not the help texts, not the exportTimes JSON kept as .json.txt.
LOGS = sorted(p for p in SAMPLES.glob("*.txt") if "_help" not in p.name and not p.name.endswith(".json.txt"))


def test_the_recorded_samples_are_present():
    assert len(LOGS) == 17, f"expected the recorded trtexec logs in {SAMPLES}"


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_every_log_parses_and_agrees_with_its_own_text(path):
    text = path.read_text(errors="replace")
    log = read_log(path)
    banner = re.search(r"\[TensorRT v(\d+)\]", text).group(1)
    assert log.version_code == "v" + banner
    printed = re.search(r"TensorRT version: (\S+)", text)
    assert log.trt_version == (printed.group(1) if printed else decode_version(banner))
    final = re.findall(r"^&&&& (PASSED|FAILED)", text, re.M)
    assert log.status == (final[-1] if final else None)
    device = re.search(r"Selected Device: (.+?)\s*$", text, re.M)
    assert log.device.name == device.group(1)
    cc = re.search(r"Compute Capability: (\S+)", text).group(1)
    assert log.device.compute_capability == cc
    throughput = re.search(r"Throughput: ([\d.]+) qps", text)
    assert log.throughput_qps == (float(throughput.group(1)) if throughput else None)
    gpu = re.search(r"GPU Compute Time: min = ([\d.e-]+) ms, max = ([\d.e-]+) ms, mean = ([\d.e-]+) ms, median = ([\d.e-]+) ms", text)
    if gpu:
        assert (log.gpu_compute_ms.min, log.gpu_compute_ms.max, log.gpu_compute_ms.mean, log.gpu_compute_ms.median) == tuple(
            float(v) for v in gpu.groups()
        )
    else:
        assert log.gpu_compute_ms is None
    assert len(log.errors) == len(re.findall(r"^\[[^\]]*\] \[E\] (?!\[TRT\] ModelImporter.cpp:14[01]: ---)", text, re.M))
    omitted = sum(int(n) for n in re.findall(r"\.\.\. Omitting (\d+) lines", text))
    assert log.trace_lines_omitted == omitted
    assert len(log.trace) == len(re.findall(r"\] Average on \d+ runs - GPU latency", text))


def test_version_codes_of_both_numbering_schemes():
    assert decode_version("101601") == "10.16.1"
    assert decode_version("100300") == "10.3.0"
    assert decode_version("100001") == "10.0.1"
    assert decode_version("8510") == "8.5.10"
    assert decode_version("8601") == "8.6.1"


def test_performance_summary_keeps_every_statistic():
    log = read_log(SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt")
    assert (log.trt_version, log.build_tag, log.status) == ("10.16.1", "b11", "PASSED")
    assert log.device.model_dump() == {
        "name": "NVIDIA H100 PCIe",
        "compute_capability": "9.0",
        "sms": 114,
        "memory_mib": 81081,
        "uuid": "GPU-31e9692b-62b7-2d62-f0b1-f4195b568ac7",
    }
    assert log.throughput_qps == 15374.3
    assert log.latency_ms.model_dump() == {
        "min": 0.0410156, "max": 0.14917, "mean": 0.0441053, "median": 0.0440674,
        "p90": 0.0450439, "p95": 0.0458984, "p99": 0.0512695, "other": {},
    }  # fmt: skip
    assert log.enqueue_ms.p99 == 0.0357666
    assert log.h2d_ms.median == 0.00378418
    assert log.d2h_ms.max == 0.0341797
    assert (log.total_host_walltime_s, log.total_gpu_compute_s) == (3.00013, 1.6586)
    assert log.warnings[-1].startswith("* GPU compute time is unstable, with coefficient of variance = 6.58751%.")
    assert "locking GPU clock frequency" in log.warnings[-1]  # the advice line is joined to its warning
    assert log.options["Build Options"]["Precision"] == "FP32"
    assert log.options["Build Options"]["Decomposable Attentions"] == ""
    assert log.options["Inference Options"]["Duration"] == "3s (+ 200ms warm up)"
    assert log.options["Reporting Options"]["Percentiles"] == "90,95,99"
    assert log.command == "trtexec --onnx=/work/trt-samples-for-hackathon-cn/cookbook/00-Data/model/model-trained.onnx"
    assert log.facts["engine_built_in"] == "8.09138 sec."


def test_both_performance_warnings_are_reported():
    log = read_log(SAMPLES / "trt10.16.0_rtx6000ada_onnx_saveEngine_build_and_run_enqueue_bound_warning.txt")
    starred = [w for w in log.warnings if w.startswith("* ")]
    assert starred[0].startswith("* Throughput may be bound by Enqueue Time")
    assert "--useCudaGraph" in starred[0]
    assert starred[1].startswith("* GPU compute time is unstable, with coefficient of variance = 39.97%.")


def test_failed_build_lists_errors_with_the_parser_code():
    log = read_log(SAMPLES / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt")
    assert log.status == "FAILED"
    assert log.warnings == ["--plugins flag has been deprecated, use --staticPlugins flag instead."]
    coded = [e for e in log.errors if e.code is not None]
    assert len(coded) == 1 and coded[0].code == 6
    assert "Plugin not found, are the plugin name, version, and namespace correct?" in coded[0].message
    assert [e.message for e in log.errors][-4:] == [
        "Failed to parse onnx file",
        "Parsing model failed",
        "Failed to create engine from model or file.",
        "Engine set up failed",
    ]


def test_error_code_lines_keep_their_number():
    text = (
        "&&&& RUNNING TensorRT.trtexec [TensorRT v101401] [b48] # trtexec --onnx=m.onnx\n"
        "[01/01/2026-00:00:00] [E] Error[4]: IBuilder::buildSerializedNetwork: Error Code 4: Internal Error (out of memory)\n"
        "&&&& FAILED TensorRT.trtexec [TensorRT v101401] [b48] # trtexec --onnx=m.onnx\n"
    )
    log = parse_log(text)
    assert log.errors[0].code == 4 and "out of memory" in log.errors[0].message
    assert log.trt_version == "10.14.1" and log.status == "FAILED"


def test_layer_profile_in_the_10x_layout():
    log = read_log(SAMPLES / "trt10.14.1_rtx6000ada_loadEngine_dumpProfile.txt")
    profile = log.profile
    assert profile.iterations == 21248 and profile.layout == "name-last (10.x)"
    assert len(profile.layers) == 16
    first = profile.layers[0]
    assert first.name == "Reformatting CopyNode for Input Tensor 0 to node_conv2d + node_relu"
    assert (first.total_ms, first.average_ms, first.median_ms, first.percent) == (141.32, 0.0067, 0.0060, 9.4)
    assert profile.layers[-1].name == "__myl_CastReshCast_myl15_1"
    assert profile.total.total_ms == 1508.99 and profile.total.percent == 100.0
    assert log.latency_ms is None  # --dumpProfile without --separateProfileRun prints no summary
    assert any("auxiliary streams" in w for w in log.warnings)


def test_layer_profile_in_the_8x_layout_with_right_aligned_names():
    log = read_log(SAMPLES / "trt8.5.10_rtx2000adalaptop_onnx_best_dumpProfile_separateProfileRun_verbose.txt")
    profile = log.profile
    assert profile.iterations == 7477 and profile.layout == "name-first (8.x)"
    assert profile.layers[0].name == "QuantizeLinear_2"
    assert (profile.layers[0].total_ms, profile.layers[0].median_ms) == (85.71, 0.0079)
    assert profile.layers[-1].name == "Softmax_312"
    long_name = next(layer for layer in profile.layers if layer.name.startswith("fc.weight"))
    assert long_name.name.endswith("(Unnamed Layer* 356) [ElementWise]") and long_name.total_ms == 97.60
    assert profile.total.total_ms == 2689.67
    assert log.gpu_compute_ms.median == 0.134155  # the separate profile run keeps the summary
    assert log.h2d_ms.max == 0  # --noDataTransfers
    assert log.trt_version == "8.5.10" and log.build_tag is None


def test_old_releases_without_trailing_space_stripping():
    log = read_log(SAMPLES / "trt8.6.0_rtx3090_loadEngine_verbose_run.txt")
    assert log.trt_version == "8.6.0" and log.status == "PASSED"
    assert len(log.trace) == 6303 and log.trace_lines_omitted == 0
    assert all(t.enqueue_ms is not None for t in log.trace)
    assert log.options["Reporting Options"]["Percentiles"] == "90,95,99"


def test_truncated_log_is_read_and_flagged(tmp_path):
    text = (SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt").read_text()
    cut = text[: text.index("=== Performance summary ===")]
    log = parse_log(cut)
    assert log.status is None and log.latency_ms is None
    assert log.trt_version == "10.16.1" and log.device.name == "NVIDIA H100 PCIe"
    assert "truncated or killed" in log.warnings[-2]
    # Cut before its summary, it has nothing to report: `trtexec parse` exits 1 (as the README says).
    assert log.warnings[-1] == NOTHING_TO_REPORT


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "\x00\x01binary"])
def test_text_that_is_not_trtexec_output_is_refused(text):
    with pytest.raises(PipelineError, match="does not look like trtexec output"):
        parse_log(text)


def test_control_characters_and_carriage_returns_are_tolerated():
    text = (SAMPLES / "trt10.16.1_h100_onnx_dumpLayerInfo_detailed_skipInference.txt").read_text()
    assert "\x1e" in text
    log = parse_log(text.replace("\n", "\r\n"))
    assert log.status == "PASSED" and log.options["Build Options"]["Profiling verbosity"] == "2"


SUMMARY_LOGS = [p for p in LOGS if "=== Performance summary ===" in p.read_text(errors="replace")]
_STAMP = re.compile(r"^\[[^\]]*\] \[[VIWEF]\] ")


def _summary_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "=== Performance summary ===" in line)
    block = []
    for line in lines[start + 1 :]:
        if "[I]" not in line or not line.split("[I]", 1)[1].strip():
            break
        block.append(line)
    return block


@pytest.mark.parametrize("path", SUMMARY_LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("pasted", ["without the header", "without prefixes either"])
def test_summary_lines_pasted_alone_give_the_same_figures(path, pasted):
    """What people paste into issues: the summary lines, perhaps with their "[date] [I]" cut off."""
    full = read_log(path)
    block = _summary_block(path.read_text(errors="replace"))
    if pasted == "without prefixes either":
        block = [_STAMP.sub("", line) for line in block]
    log = parse_log("\n".join(block) + "\n")
    assert full.has_summary and log.has_summary
    for field in SummaryFigures.model_fields:
        assert getattr(log, field) == getattr(full, field), field
    assert log.status is None and log.warnings == []  # a summary without a banner is fine


def test_an_old_release_printing_only_the_99th_percentile_keeps_what_is_there():
    text = "Latency: min = 0.5 ms, max = 1.5 ms, mean = 0.7 ms, median = 0.6 ms, percentile(99%) = 1.2 ms\n"
    log = parse_log(text)
    assert (log.latency_ms.median, log.latency_ms.p99, log.latency_ms.p90, log.latency_ms.p95) == (0.6, 1.2, None, None)


def test_explanations_of_the_metrics_are_not_read_as_figures():
    log = read_log(SAMPLES / "trt8.5.10_rtx2000adalaptop_onnx_best_dumpProfile_separateProfileRun_verbose.txt")
    assert log.total_host_walltime_s == 3.00022  # not "the host walltime from when …" of the verbose explanations


def test_text_with_neither_summary_nor_status_says_so(tmp_path, run_cli, tiny_catalog):
    path = tmp_path / "partial.log"
    path.write_text("[11/22/2026-22:00:00] [I] Loading supplied ONNX file\n[11/22/2026-22:00:01] [I] Input filename: m.onnx\n")
    result = run_cli(tiny_catalog, "trtexec", "parse", str(path), "--json")
    assert result.exit_code == 1
    assert "no performance summary and no PASSED/FAILED line" in json.loads(result.out)["warnings"][-1]
    assert f"ERROR {path}: no performance summary and no PASSED/FAILED line" in result.err and "TIP" in result.err
    pasted = tmp_path / "pasted.log"
    pasted.write_text(
        "Throughput: 812.5 qps\nGPU Compute Time: min = 1.1 ms, max = 1.9 ms, mean = 1.2 ms, median = 1.2 ms, percentile(99%) = 1.6 ms\n"
    )
    result = run_cli(tiny_catalog, "trtexec", "parse", str(pasted), "--json")
    assert result.exit_code == 0
    data = json.loads(result.out)
    assert data["throughput_qps"] == 812.5 and data["gpu_compute_ms"]["p99"] == 1.6


def test_tensorrt_11_deprecation_warnings_name_their_flag():
    # The wording trtexec 11 prints (tests/data/trtexec/trt11.0.0_b200_loadEngine_deprecated_…_verbose.txt).
    text = (
        "[06/24/2026-10:00:01] [W] --useCudaGraph is deprecated. CUDA graph is now enabled by default. "
        "Use --noCudaGraph to disable CUDA graph.\n"
        "[06/24/2026-10:00:02] [W] * GPU compute time is unstable, with coefficient of variance = 3.1%.\n"
    )
    log = parse_log(text)
    assert log.deprecated_flags == ["--useCudaGraph"]
    assert log.warnings[:2] == [text.splitlines()[0].split("[W] ")[1], text.splitlines()[1].split("[W] ")[1]]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-8-sig", "utf-32"])
def test_a_log_saved_in_another_unicode_encoding_reads_the_same(tmp_path, run_cli, tiny_catalog, encoding):
    # Windows PowerShell's `trtexec … > run.log` writes UTF-16 LE with a byte-order mark ("utf-16"
    # here); "utf-16-le" is the same without one.
    original = SAMPLES / "trt10.16.1_h100_loadEngine_useCudaGraph_noDataTransfers_spinWait_verbose.txt"
    converted = tmp_path / "run.log"
    converted.write_bytes(original.read_text(encoding="utf-8").encode(encoding))
    expected = run_cli(tiny_catalog, "trtexec", "parse", str(original), "--json")
    result = run_cli(tiny_catalog, "trtexec", "parse", str(converted), "--json")
    assert result.exit_code == expected.exit_code == 0, result.err
    assert json.loads(result.out) == json.loads(expected.out)


# --- every input's shapes ------------------------------------------------------------------------


def _shapes(log, name, io="input"):
    tensor = next(t for t in log.tensors if t.name == name and t.io == io)
    return {k: (v.min, v.opt, v.max) for k, v in tensor.profiles.items()}, tensor.inference, tensor.binding, tensor.dtype


def test_a_dynamic_build_keeps_its_profile_and_the_shape_it_ran_at():
    log = read_log(SAMPLES / "trt10.16.1_h100_onnx_saveEngine_fp16_dynamic_skipInference_verbose.txt")
    assert _shapes(log, "x") == ({0: ("1x1x28x28", "4x1x28x28", "16x1x28x28")}, "4x1x28x28", None, None)


def test_a_static_build_and_run_keeps_every_binding_with_its_type():
    log = read_log(SAMPLES / "trt10.16.0_rtx6000ada_onnx_saveEngine_build_and_run_enqueue_bound_warning.txt")
    assert [(t.name, t.io) for t in log.tensors] == [("x", "input"), ("y", "output"), ("z", "output")]
    assert _shapes(log, "x") == ({0: ("1x1x28x28", "1x1x28x28", "1x1x28x28")}, None, "1x1x28x28", "fp32")
    x = log.tensors[0]
    assert x.automatic == "1x1x28x28" and x.ran_at == "1x1x28x28"  # trtexec chose it: no shapes were given
    assert _shapes(log, "z", "output") == ({}, None, "1", "int64")


def test_the_8x_wordings_of_shapes_and_bindings():
    run = read_log(SAMPLES / "trt8.6.0_rtx3090_loadEngine_verbose_run.txt")
    assert _shapes(run, "tensor-0") == ({0: ("4x1x28x28", "4x1x28x28", "4x1x28x28")}, "4x1x28x28", "4x1x28x28", None)
    built = read_log(SAMPLES / "trt8.5.10_rtx2000adalaptop_onnx_best_dumpProfile_separateProfileRun_verbose.txt")
    assert _shapes(built, "inputs.1") == ({}, None, "1x3x224x224", None)
    assert _shapes(built, "528", "output") == ({}, None, "1x1000", None)


def test_every_input_of_a_log_with_several_is_kept():
    """Lines verbatim from a public TensorRT 8.4 log of a three-input BERT engine (its run part; the
    recorded samples here all have one input)."""
    text = "\n".join(
        [
            "[10/11/2023-09:46:16] [I] Using random values for input input_ids",
            "[10/11/2023-09:46:16] [I] Created input binding for input_ids with dimensions 32x128",
            "[10/11/2023-09:46:16] [I] Using random values for input attention_mask",
            "[10/11/2023-09:46:16] [I] Created input binding for attention_mask with dimensions 32x128",
            "[10/11/2023-09:46:16] [I] Using random values for input token_type_ids",
            "[10/11/2023-09:46:16] [I] Created input binding for token_type_ids with dimensions 32x128",
            "[10/11/2023-09:46:16] [I] Using random values for output output_0",
            "[10/11/2023-09:46:16] [I] Created output binding for output_0 with dimensions 32x6",
            "[10/11/2023-09:46:16] [I] Starting inference",
            "&&&& PASSED TensorRT.trtexec [TensorRT v8401] # trtexec --onnx=/data0/shouxieai/bert/onnx/trans/robert-wma.onnx "
            "--saveEngine=/data0/shouxieai/bert/trt/bert_trans_fp16.trt --fp16 --memPoolSize=workspace:8192 "
            "--shapes=input_ids:32x128,attention_mask:32x128,token_type_ids:32x128 --useCudaGraph --device=0",
        ]
    )
    log = parse_log(text)
    assert [(t.name, t.io, t.ran_at) for t in log.tensors] == [
        ("input_ids", "input", "32x128"),
        ("attention_mask", "input", "32x128"),
        ("token_type_ids", "input", "32x128"),
        ("output_0", "output", "32x6"),
    ]


def test_the_10x_options_echo_names_the_profile_of_each_input():
    """The first line is verbatim from a public TensorRT 10.x log (one input); the others are written in
    the same wording for a second input and a second profile, which no recorded log has: no input's
    line may overwrite another's."""
    text = "\n".join(
        [
            "[06/17/2025-18:44:33] [I] === Build Options ===",
            "[06/17/2025-18:44:33] [I] Input build shape (profile 0): images=1x3x640x640+3x3x640x640+10x3x640x640",
            "[06/17/2025-18:44:33] [I] Input build shape (profile 0): scale=1x2+3x2+10x2",
            "[06/17/2025-18:44:33] [I] Input build shape (profile 1): images=1x3x320x320+1x3x320x320+1x3x320x320",
            "[06/17/2025-18:44:33] [I] Input calibration shapes: model",
            "[06/17/2025-18:44:33] [I] === Inference Options ===",
            "[06/17/2025-18:44:33] [I] Input inference shape : images=3x3x640x640",
            "[06/17/2025-18:44:33] [I] Input inference shape : scale=3x2",
        ]
    )
    log = parse_log(text)
    assert _shapes(log, "images") == (
        {0: ("1x3x640x640", "3x3x640x640", "10x3x640x640"), 1: ("1x3x320x320", "1x3x320x320", "1x3x320x320")},
        "3x3x640x640",
        None,
        None,
    )
    assert _shapes(log, "scale") == ({0: ("1x2", "3x2", "10x2")}, "3x2", None, None)


def test_parse_shows_every_input_with_what_it_was_built_for_and_ran_at(run_cli, tiny_catalog):
    result = run_cli(
        tiny_catalog, "trtexec", "parse", str(SAMPLES / "trt10.16.1_h100_onnx_saveEngine_fp16_dynamic_skipInference_verbose.txt")
    )
    assert result.exit_code == 0, result.err
    cells = [line.replace("│", " ").split() for line in result.out.splitlines()]
    assert ["x", "input", "1x1x28x28", "4x1x28x28", "16x1x28x28", "4x1x28x28", "–"] in cells
    as_json = run_cli(tiny_catalog, "trtexec", "parse", "--json", str(SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt"))
    tensors = json.loads(as_json.out)["tensors"]
    assert [(t["name"], t["io"], t["dtype"], t["ran_at"]) for t in tensors] == [
        ("x", "input", "fp32", "1x1x28x28"),
        ("y", "output", "fp32", "1x10"),
        ("z", "output", "int64", "1"),
    ]
    assert tensors[0]["profiles"] == {"0": {"min": "1x1x28x28", "opt": "1x1x28x28", "max": "1x1x28x28"}}


# --- shapes stated only by the command line trtexec echoes -----------------------------------------


def _command_only(text: str) -> str:
    """The log without a line that states a shape: the options echo, the context's and bindings'
    shapes — what is left when a user cuts the echo before pasting."""
    stating = ("Input build shape", "Input inference shape", "Input calibration shape", "Set shape of input tensor", "binding for ")
    return "\n".join(line for line in text.split("\n") if line.startswith("&&&&") or not any(s in line for s in stating))


def _inputs(log) -> dict:
    return {t.name: ({k: (v.min, v.opt, v.max) for k, v in t.profiles.items()}, t.inference) for t in log.tensors if t.io == "input"}


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_shapes_cut_from_the_echo_are_read_from_the_command_trtexec_echoed(path):
    """Every recorded log, its shape lines removed: the banner's command gives each input the
    profiles and inference shape the echo gave, by trtexec's rules."""
    text = path.read_text(errors="replace")
    whole, cut = parse_log(text), parse_log(_command_only(text))
    assert not any(t.from_command_line for t in whole.tensors)  # the echo states them: the command is not read
    if re.search(r"^&&&& .*--(shapes|minShapes|optShapes|maxShapes)=", text, re.M):
        stated = {name: shapes for name, shapes in _inputs(whole).items() if shapes != ({}, None)}
        assert _inputs(cut) == stated and stated
        assert all(t.from_command_line for t in cut.tensors if t.io == "input")
    else:  # no shapes on its command line: none invented
        assert all(shapes == ({}, None) for shapes in _inputs(cut).values())


def test_a_build_with_only_opt_shapes_is_broadcast_as_trtexec_warns():
    """Constructed: trtexec's banner alone, for a three-input build with --optShapes only (its
    warning: "optShapes is being broadcasted to minShapes for tensor input_ids")."""
    log = parse_log(
        "&&&& RUNNING TensorRT.trtexec [TensorRT v101401] [b48] # trtexec --onnx=bert.onnx "
        "--optShapes=input_ids:4x128,attention_mask:4x128,token_type_ids:4x128 --saveEngine=bert.plan\n"
        "&&&& PASSED TensorRT.trtexec [TensorRT v101401] [b48] # trtexec --onnx=bert.onnx "
        "--optShapes=input_ids:4x128,attention_mask:4x128,token_type_ids:4x128 --saveEngine=bert.plan\n"
    )
    assert _inputs(log) == {name: ({0: ("4x128", "4x128", "4x128")}, "4x128") for name in ("input_ids", "attention_mask", "token_type_ids")}
    assert [t.from_command_line for t in log.tensors] == [True, True, True]


@pytest.mark.parametrize(
    "command, expected",
    [
        # min and max only: opt takes max; the inference shape is opt.
        ("trtexec --onnx=m.onnx --minShapes=x:1x3 --maxShapes=x:8x3", {"x": ({0: ("1x3", "8x3", "8x3")}, "8x3")}),
        # min only: every other one takes min.
        ("trtexec --onnx=m.onnx --minShapes=x:2x3", {"x": ({0: ("2x3", "2x3", "2x3")}, "2x3")}),
        # min and opt: max takes opt; --shapes sets the inference shape.
        ("trtexec --onnx=m.onnx --minShapes=x:1x3 --optShapes=x:4x3 --shapes=x:2x3", {"x": ({0: ("1x3", "4x3", "4x3")}, "2x3")}),
        # Only --shapes, in a build: built for exactly that shape.
        ("trtexec --onnx=m.onnx --shapes=x:2x3,y:2x5", {"x": ({0: ("2x3",) * 3}, "2x3"), "y": ({0: ("2x5",) * 3}, "2x5")}),
        # Loading an engine builds nothing: only the inference shape.
        ("trtexec --loadEngine=m.plan --shapes=x:2x3", {"x": ({}, "2x3")}),
        # Two profiles; the inference shape is profile 0's opt.
        (
            "trtexec --onnx=m.onnx --profile=0 --minShapes=x:1x3 --optShapes=x:2x3 --maxShapes=x:4x3 "
            "--profile=1 --minShapes=x:8x3 --optShapes=x:16x3 --maxShapes=x:32x3",
            {"x": ({0: ("1x3", "2x3", "4x3"), 1: ("8x3", "16x3", "32x3")}, "2x3")},
        ),
        # Quoted values, trtexec's quoted names with colons, a scalar.
        (
            "trtexec --onnx=m.onnx --minShapes=\"ids:1x8,mask:1x8\" --maxShapes='ids:4x64,mask:4x64' --shapes='input:0':2x16,step:scalar",
            {
                "ids": ({0: ("1x8", "4x64", "4x64")}, "4x64"),
                "mask": ({0: ("1x8", "4x64", "4x64")}, "4x64"),
                "input:0": ({0: ("2x16",) * 3}, "2x16"),
                "step": ({0: ("",) * 3}, ""),
            },
        ),
        # Windows: backslashes are paths, not escapes; a quoted path with a space.
        (
            'C:\\TensorRT-10.14\\bin\\trtexec.exe --onnx="C:\\My Models\\bert.onnx" --minShapes=input_ids:1x16 '
            '--optShapes=input_ids:2x128 "--maxShapes=input_ids:4x512" --saveEngine=C:\\engines\\new.plan',
            {"input_ids": ({0: ("1x16", "2x128", "4x512")}, "2x128")},
        ),
    ],
)
def test_shapes_on_the_command_line_read_as_trtexec_reads_them(command, expected):
    """Constructed banners in trtexec's format: RUNNING, then FAILED (a build that failed still says
    what it was asked for)."""
    text = "".join(f"&&&& {status} TensorRT.trtexec [TensorRT v101401] [b48] # {command}\n" for status in ("RUNNING", "FAILED"))
    log = parse_log(text)
    assert log.status == "FAILED"
    assert _inputs(log) == expected


def test_the_echo_wins_over_the_command_line():
    """Constructed: where the options echo states a shape, the command is not read for it."""
    log = parse_log(
        "&&&& RUNNING TensorRT.trtexec [TensorRT v101601] [b11] # trtexec --onnx=m.onnx --shapes=x:2x3,y:2x5\n"
        "[07/07/2026-02:10:59] [I] Input build shape (profile 0): x=1x3+2x3+4x3\n"
        "[07/07/2026-02:10:59] [I] Input inference shape : x=2x3\n"
    )
    assert _inputs(log) == {"x": ({0: ("1x3", "2x3", "4x3")}, "2x3"), "y": ({0: ("2x5",) * 3}, "2x5")}
    assert [(t.name, t.from_command_line) for t in log.tensors] == [("x", False), ("y", True)]


def test_parse_marks_the_shapes_it_read_from_the_command_line(tmp_path, run_cli, tiny_catalog):
    path = tmp_path / "cut.log"
    path.write_text(_command_only((SAMPLES / "trt10.16.1_h100_onnx_saveEngine_fp16_dynamic_skipInference_verbose.txt").read_text()))
    result = run_cli(tiny_catalog, "trtexec", "parse", str(path))
    assert result.exit_code == 0, result.err
    cells = [line.replace("│", " ").split() for line in result.out.splitlines()]
    assert ["x", "*", "input", "1x1x28x28", "4x1x28x28", "16x1x28x28", "4x1x28x28", "–"] in cells
    assert "* shapes read from the command in trtexec's &&&& line" in " ".join(result.out.split())
    tensors = json.loads(run_cli(tiny_catalog, "trtexec", "parse", str(path), "--json").out)["tensors"]
    assert tensors[0]["from_command_line"] is True and tensors[0]["profiles"]["0"]["max"] == "16x1x28x28"


# --- a wrapper's prefix before every line; a log pasted onto one line -----------------------------

# Constructed prefixes of the kind benchmarking wrappers print before each line of the tool they
# run; {n} is a number that changes from line to line (a wrapper's own time stamp).
WRAPPERS = ["[INFO] ", "bench | ", "2026-11-24 10:15:{n:02d},{n:03d} [trtexec] INFO: ", "> "]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrappers_prefix_before_every_line_is_taken_off(wrapper, tmp_path, run_cli, tiny_catalog):
    text = (SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt").read_text()
    wrapped = "\n".join(wrapper.format(n=number % 60) + line for number, line in enumerate(text.split("\n")))
    assert parse_log(wrapped).model_dump() == parse_log(text).model_dump()
    path = tmp_path / "wrapped.log"
    path.write_text(wrapped)
    result = run_cli(tiny_catalog, "trtexec", "parse", str(path), "--json")
    assert result.exit_code == 0, result.err
    assert json.loads(result.out)["latency_ms"]["median"] == 0.0440674


def test_a_prefix_on_few_lines_is_not_a_wrappers():
    """Constructed: one quoted line among plain ones is not a wrapper's prefix taken off the others;
    that line itself reads from trtexec's time stamp on."""
    from pipeline.trtexec.log_lines import trtexec_lines

    lines = (SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt").read_text().split("\n")
    quoted = lines.copy()
    quoted[5] = "> " + lines[5]
    quoted[0] = "> " + lines[0]  # the banner has no time stamp: its quote mark stays
    assert lines[5].startswith("[") and trtexec_lines("\n".join(quoted)) == [quoted[0], *lines[1:]]


@pytest.mark.parametrize("separator", [" / ", " | ", "\\n", "<br>", " ⏎ "])
def test_a_log_pasted_onto_one_line_reads_like_the_log(separator, tmp_path, run_cli, tiny_catalog):
    """A whole recorded log with its line feeds replaced by a separator, as chat exports and
    generated reports write it."""
    text = (SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt").read_text()
    one_line = separator.join(text.rstrip("\n").split("\n"))
    assert "\n" not in one_line
    assert parse_log(one_line).model_dump() == parse_log(text).model_dump()
    path = tmp_path / "one-line.log"
    path.write_text(one_line)
    result = run_cli(tiny_catalog, "trtexec", "parse", str(path), "--json")
    assert result.exit_code == 0, result.err
    read = json.loads(result.out)
    assert (read["status"], read["throughput_qps"], read["device"]["name"]) == ("PASSED", 15374.3, "NVIDIA H100 PCIe")


def test_untagged_lines_of_a_joined_log_are_split_where_trtexec_prints_them():
    """The separator is also a line break before untagged lines trtexec prints (layer dumps, a
    parser error's "[6] …" detail), and stays text where what follows is not such a line."""
    text = (SAMPLES / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt").read_text()
    joined = parse_log(" / ".join(text.split("\n")))
    assert joined.errors == parse_log(text).errors
    assert any(
        e.code == 6 and e.message.endswith('"Plugin not found, are the plugin name, version, and namespace correct?"')
        for e in joined.errors
    )
    kept = parse_log("[07/07/2026-02:10:45] [I] a / b / [07/07/2026-02:10:45] [I] c / [07/07/2026-02:10:45] [W] d / e")
    assert kept.warnings[0] == "d / e"


def test_two_tags_on_a_line_are_not_a_joined_log():
    from pipeline.trtexec.log_lines import trtexec_lines

    line = "[07/07/2026-02:10:45] [E] Error[4]: see [07/07/2026-02:10:44] [I] above"
    assert trtexec_lines(line) == [line]


def test_no_recorded_log_is_split_or_unwrapped():
    """Nothing the parser read before reads differently: every recorded text's lines are its own."""
    from pipeline.trtexec.log_lines import trtexec_lines
    from pipeline.trtexec.text import log_lines

    for path in ALL_TEXTS:
        text = path.read_text(errors="replace")
        assert trtexec_lines(text) == log_lines(text), path.name


# --- what people paste: any prefix or none, indented, several runs, cut short ---------------------

GREPPED_SWEEP = SAMPLES / "trt11.0.0_b200_loadEngine_infStreams_1_2_4_GREPPED_summary_lines.log"


@pytest.mark.parametrize("path", SUMMARY_LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("form", ["severity only", "indented", "indented without prefixes"])
def test_summary_lines_are_recognised_by_their_content(path, form):
    full = read_log(path)
    block = _summary_block(path.read_text(errors="replace"))
    if form == "severity only":
        block = [re.sub(r"^\[[^\]]*\] ", "", line) for line in block]  # "[I] Throughput: …"
    elif form == "indented":
        block = ["    " + line for line in block]
    else:
        block = ["  " + _STAMP.sub("", line) for line in block]
    log = parse_log("\n".join(block) + "\n")
    assert log.summaries == [full.summaries[-1].model_copy(update={"label": None})]


def test_an_error_code_in_brackets_keeps_its_message_when_it_wraps():
    text = (
        "[11/02/2026-09:12:01] [E] Error[4]: [network.cpp::validate::3417] Error Code 4: Internal Error (input_ids: for dimension\n"
        "number 1 in profile 0 does not match network definition (got min=1, opt=128, max=4096), expected min=opt=max=512).)\n"
        "[11/02/2026-09:12:01] [E] Engine could not be created from network\n"
        "&&&& FAILED TensorRT.trtexec [TensorRT v101401] [b48] # trtexec --onnx=bert.onnx\n"
    )
    log = parse_log(text)
    first, second = log.errors
    assert first.code == 4
    assert first.message.endswith("expected min=opt=max=512).)") and "for dimension number 1 in profile 0" in first.message
    assert (second.code, second.message) == (None, "Engine could not be created from network")


def test_lines_after_a_complete_error_are_not_taken_for_its_continuation():
    log = read_log(SAMPLES / "trt11.0.0_b200_onnx_stronglyTyped_noop_skipInference_then_removed_precision_flags.txt")
    assert [e.message for e in log.errors] == [
        "Unknown option: --fp16",
        "Unknown option: --int8",
        "Unknown option: --best",
        "Unknown option: --precisionConstraints obey",
    ]


@pytest.mark.parametrize(
    "warning, flag",
    [
        ("--workspace flag has been deprecated by --memPoolSize flag.", "--workspace"),  # 8.5/8.6
        ("--buildOnly flag has been deprecated by --skipInference flag.", "--buildOnly"),
        ("--profilingVerbosity=default has been deprecated by --profilingVerbosity=layer_names_only.", "--profilingVerbosity"),
        ("--plugins flag has been deprecated, use --staticPlugins flag instead.", "--plugins"),  # 10.x
        ("--sparsity=force has been deprecated. Please use <polygraphy surgeon prune> to rewrite the weights", "--sparsity"),
        ("--useSpinWait is deprecated. Spin wait is now enabled by default. Use --noSpinWait to disable spin wait.", "--useSpinWait"),
    ],
)
def test_deprecations_in_every_wording_trtexec_has_used(warning, flag):
    # Wordings from samples/common/sampleOptions.cpp of TensorRT 8.6.1 and 11.1 (NVIDIA/TensorRT).
    log = parse_log(f"[01/01/2026-00:00:00] [W] {warning}\n&&&& PASSED TensorRT.trtexec [TensorRT v8601] # trtexec\n")
    assert log.deprecated_flags == [flag]


def test_several_summaries_in_one_text_are_all_kept_in_order(run_cli, tiny_catalog):
    log = read_log(GREPPED_SWEEP)
    assert [(s.label, s.throughput_qps, s.gpu_compute_ms.median, s.total_gpu_compute_s) for s in log.summaries] == [
        ("--- infStreams=1", 16179.7, 0.0588074, 2.86708),
        ("--- infStreams=2", 29302.3, 0.0649414, 5.74258),
        ("--- infStreams=4", 33918.6, 0.074585, 7.61806),
    ]
    assert log.throughput_qps == 33918.6  # the top level is the last run, and the warning says so
    assert any(w.startswith("the text holds 3 runs' performance summaries (1: --- infStreams=1;") for w in log.warnings)
    result = run_cli(tiny_catalog, "trtexec", "parse", str(GREPPED_SWEEP), "--json")
    assert result.exit_code == 0
    assert [s["throughput_qps"] for s in json.loads(result.out)["summaries"]] == [16179.7, 29302.3, 33918.6]
    shown = run_cli(tiny_catalog, "trtexec", "parse", str(GREPPED_SWEEP))
    assert "--- infStreams=2" in shown.out and "29302.3" in shown.out


def test_a_log_cut_before_its_summary_exits_1_and_says_it_was_cut(tmp_path, run_cli, tiny_catalog):
    text = (SAMPLES / "trt11.0.0_b200_loadEngine_dumpProfile_exportTimes_exportProfile.txt").read_text()
    path = tmp_path / "cut.log"
    path.write_text(text[: text.index("=== Performance summary ===")])
    result = run_cli(tiny_catalog, "trtexec", "parse", str(path), "--json")
    assert result.exit_code == 1
    warnings = json.loads(result.out)["warnings"]
    assert any("truncated or killed" in w for w in warnings) and warnings[-1] == NOTHING_TO_REPORT


# Every recorded trtexec text: the whole logs and the grepped one.
ALL_TEXTS = LOGS + [GREPPED_SWEEP]


# How people paste a log (the constructed ones: a wrapper's prefix, a separator for line feeds, the
# options echo cut away), each applied to every recorded text.
MUTATIONS = {
    "prefixes stripped": {"strip": True},
    "indented, CRLF": {"indent": "  ", "crlf": True},
    "prefixes stripped, tab-indented, CRLF": {"strip": True, "indent": "\t", "crlf": True},
    "a wrapper's prefix": {"wrap": "[INFO] "},
    "a wrapper's prefix, CRLF": {"wrap": "bench | ", "crlf": True},
    "joined by ' / '": {"join": " / "},
    "joined by a literal \\n": {"join": "\\n"},
    "the shape lines cut": {"shapes_cut": True},
    "a foreign prefix on one line": {"foreign": "* build step: failed "},
    "'=' dropped from the statistics": {"no_equals": True},
    "summary lines joined without a separator": {"summaries_joined": True},
}

# A summary line's start, with or without trtexec's prefix: where the mutations below act.
_SUMMARY_START = re.compile(
    r"^(?:\[[^\]]*\] )?\[I\] (?:Throughput|Latency|Enqueue Time|H2D Latency|GPU Compute Time|D2H Latency|Total Host Walltime|Total GPU Compute Time):"
)
_DATED = re.compile(r"^\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[VIWEF]\]")


def _with_foreign_prefix(lines: list[str], foreign: str) -> list[str]:
    """``foreign`` before one dated line (a summary line where there is one), as a markdown list
    item or a note pasted into the log has it."""
    dated = [i for i, line in enumerate(lines) if _DATED.match(line)]
    if dated:
        index = next((i for i in dated if _SUMMARY_START.match(lines[i])), dated[0])
        lines = [*lines[:index], foreign + lines[index], *lines[index + 1 :]]
    return lines


def _summaries_joined(lines: list[str]) -> list[str]:
    """Each run of summary lines, and the first warning after it, on one line: their line feeds
    lost, the later lines' prefixes with them ("… ms Total Host Walltime: 3.0 s [W] * Throughput …")."""
    out: list[str] = []
    joining = False
    for line in lines:
        summary = _SUMMARY_START.match(line)
        if joining and summary:
            out[-1] += " " + _STAMP.sub("", line)
        elif joining and re.match(r"^(?:\[[^\]]*\] )?\[W\] ", line):
            out[-1] += " [W] " + _STAMP.sub("", line)
            joining = False
        else:
            out.append(line)
            joining = bool(summary)
    return out


def _mutate(
    text: str, strip=False, indent="", crlf=False, wrap="", join=None, shapes_cut=False, foreign="", no_equals=False, summaries_joined=False
) -> str:
    if shapes_cut:
        text = _command_only(text)
    if no_equals:
        text = re.sub(r"\b(min|max|mean|median|percentile\([\d.]+%\)) = ", r"\1 ", text)
    lines = text.split("\n")
    if foreign:
        lines = _with_foreign_prefix(lines, foreign)
    if summaries_joined:
        lines = _summaries_joined(lines)
    if strip:
        lines = [_STAMP.sub("", line) for line in lines]
    lines = [wrap + indent + line if line else line for line in lines]
    return (join if join is not None else "\r\n" if crlf else "\n").join(lines)


def _figures(log, tagged: bool = False) -> dict:
    """What a log says; with ``tagged``, its errors and warnings too (a log whose severity tags
    were stripped cannot say which lines those were)."""
    tags = {"errors": [error.model_dump() for error in log.errors], "warnings": log.warnings} if tagged else {}
    return tags | {
        "summaries": [s.model_dump(exclude={"label"}) for s in log.summaries],
        "profile": log.profile.model_dump() if log.profile else None,
        "trace": [t.model_dump() for t in log.trace],
        "trt_version": log.trt_version,
        "status": log.status,
        "device": log.device.name,
        "inputs": {name: shapes for name, shapes in _inputs(log).items() if shapes != ({}, None)},
    }


@pytest.mark.parametrize("path", ALL_TEXTS, ids=lambda p: p.name)
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutated_logs_keep_every_figure_that_remains(path, mutation):
    """Property: prefixes stripped, lines indented, CRLF line ends, a wrapper's prefix on every line,
    the lines joined by a separator, the shape lines cut, and the text cut at any line — the figures
    still in the text are read exactly, and none is invented."""
    import random

    settings = MUTATIONS[mutation]
    original = path.read_text(errors="replace")
    tagged = not settings.get("strip")
    whole = _figures(parse_log(original), tagged)
    mutated = _figures(parse_log(_mutate(original, **settings)), tagged)
    if settings.get("shapes_cut") and not re.search(r"^&&&& .*--(shapes|minShapes|optShapes|maxShapes)=", original, re.M):
        whole["inputs"] = {}  # no shape on its command line: nothing to read them from
    assert mutated == whole
    rng = random.Random(path.name + mutation)
    lines = original.split("\n")
    for cut in sorted(rng.sample(range(1, len(lines)), min(6, len(lines) - 1))):
        kept = "\n".join(lines[:cut])
        if "join" in settings and len(re.findall(r"^\[[^\]]*\] \[[VIWEF]\]", kept, re.M)) < 3:
            continue  # fewer than three tagged lines on one line: too little to tell the separator by
        try:
            part = _figures(parse_log(_mutate(kept, **settings)))
        except PipelineError:
            continue  # nothing recognisable left before the cut: refused, never misread
        # What was read is what the whole log says, summary line by summary line.
        assert len(part["summaries"]) <= len(whole["summaries"])
        for read, complete in zip(part["summaries"], whole["summaries"]):
            assert {k: v for k, v in read.items() if v not in (None, {})} == {
                k: complete[k] for k, v in read.items() if v not in (None, {})
            }
        assert part["trace"] == whole["trace"][: len(part["trace"])]
        if part["profile"] is not None:
            assert part["profile"]["layers"] == whole["profile"]["layers"][: len(part["profile"]["layers"])]
        assert part["trt_version"] in (None, whole["trt_version"])
        assert part["device"] in (None, whole["device"])
        assert part["status"] in (None, whole["status"])
        for name, (profiles, inference) in part["inputs"].items():
            complete_profiles, complete_inference = whole["inputs"].get(name, ({}, None))
            assert all(complete_profiles.get(index) == shapes for index, shapes in profiles.items()), (name, cut)
            assert inference in (None, complete_inference), (name, cut)


# --- three more ways logs are pasted (constructed, each beside the recorded log it changes) ------

DEFAULT_RUN = SAMPLES / "trt10.16.1_h100_onnx_build_and_run_default.txt"


def test_an_error_after_foreign_text_on_its_line_is_read():
    """A markdown list item before trtexec's time stamp, on that line alone."""
    text = "\n".join(
        [
            "&&&& RUNNING TensorRT.trtexec [TensorRT v101601] [b12] # trtexec --onnx=model.onnx",
            "* build step: failed [12/03/2025-10:11:12] [E] Error[3]: [network.cpp::addInput::1234] Error Code 3: API Usage Error",
            "[12/03/2025-10:11:12] [I] done",
        ]
    )
    (error,) = parse_log(text).errors
    assert (error.code, error.message) == (3, "Error[3]: [network.cpp::addInput::1234] Error Code 3: API Usage Error"), error


def test_statistics_whose_equals_sign_was_eaten_keep_their_values():
    line = "[12/03/2025-10:11:12] [I] Latency: min 2.01 ms, max 4.5 ms, mean = 3.1 ms, median = 3.0 ms, percentile(99%) 3.2 ms"
    (summary,) = parse_log(line).summaries
    assert summary.latency_ms.model_dump(exclude={"other"}) == {
        "min": 2.01, "max": 4.5, "mean": 3.1, "median": 3.0, "p90": None, "p95": None, "p99": 3.2
    }  # fmt: skip


def test_summary_lines_run_together_on_one_line_are_each_read():
    text = DEFAULT_RUN.read_text()
    whole = parse_log(text)
    lines = text.split("\n")
    first = next(i for i, line in enumerate(lines) if "D2H Latency:" in line)
    walltime, compute, warning = (_STAMP.sub("", line) for line in lines[first + 1 : first + 4])
    assert compute.startswith("Total GPU Compute Time:") and warning.startswith("* GPU compute time is unstable")
    # "… ms Total Host Walltime: 3.00013 s Total GPU Compute Time: 1.6586 s [W] * GPU compute time is unstable, …"
    run_together = [*lines[:first], f"{lines[first]} {walltime} {compute} [W] {warning}", *lines[first + 4 :]]
    joined = parse_log("\n".join(run_together))
    assert joined.summaries == whole.summaries
    assert joined.warnings == whole.warnings
    (summary,) = joined.summaries
    assert summary.total_host_walltime_s is not None and summary.total_gpu_compute_s is not None

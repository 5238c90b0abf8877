"""`pipeline diff`: two engines layer by layer, from recorded TensorRT 10.16 and 11.0 output."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.report.layer_diff import EngineSide, canonical, diff, nodes_of
from pipeline.report.layer_sides import load_side
from pipeline.running.errors import PipelineError, UsageError
from pipeline.trtexec.layers import read_layer_info
from pipeline.trtexec.log import read_log
from tests.conftest import SAMPLES, render_in_chromium

# The cookbook's MNIST model, profiled (--dumpProfile) and described (--exportLayerInfo) on
# TensorRT 10.16.1 (H100) and 11.0.0 (B200).
PROFILE_1016 = SAMPLES / "trt10.16.1_h100_loadEngine_dumpProfile_exportTimes_exportProfile.txt"
PROFILE_110 = SAMPLES / "trt11.0.0_b200_loadEngine_dumpProfile_exportTimes_exportProfile.txt"
LAYERS_1016 = SAMPLES / "trt10.16.1_h100_exportLayerInfo_detailed.json"
LAYERS_110 = SAMPLES / "trt11.0.0_b200_exportLayerInfo_detailed.json"


@pytest.fixture
def recorded(tmp_path):
    """Each release's profile log and layer JSON in a folder of its own, as a user keeps them."""
    for name, files in (("trt10.16", (PROFILE_1016, LAYERS_1016)), ("trt11.0", (PROFILE_110, LAYERS_110))):
        (tmp_path / name).mkdir()
        for file in files:
            shutil.copy(file, tmp_path / name)
    return tmp_path / "trt10.16", tmp_path / "trt11.0"


def test_two_releases_of_one_model_side_by_side(recorded, run_cli, tiny_catalog):
    a, b = recorded
    result = run_cli(tiny_catalog, "diff", str(a), str(b), "--format", "json")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    assert (data["a"]["trt_version"], data["b"]["trt_version"]) == ("10.16.1", "11.0.0")
    # The per-layer totals are the profiles' own "Total" rows.
    for side, log in (("a", PROFILE_1016), ("b", PROFILE_110)):
        assert data[side]["total_ms"] == pytest.approx(read_log(log).profile.total.average_ms, abs=1e-4)
    assert data["counts"] == {"matched": 10, "matched by ONNX nodes": 0, "fused differently": 0, "only in A": 5, "only in B": 2}
    rows = {(tuple(r["a"]), tuple(r["b"])): r for r in data["rows"]}
    # Myelin numbers layers per graph: 10.16's graph 3 is 11.0's graph 0.
    conv = rows[(("node_conv2d_1_myl3_1",), ("node_conv2d_1_myl0_4",))]
    assert conv["kind"] == "matched" and conv["delta_ms"] == pytest.approx(0.0259 - 0.0114)
    assert rows[(("node_max_pool2d",), ("node_max_pool2d_myl0_2",))]["kind"] == "matched"
    only_a = [r["a"][0] for r in data["rows"] if r["kind"] == "only in A"]
    assert "Reformatting CopyNode for Input Tensor 0 to {ForeignNode[node_conv2d_1...node_relu_1]}" in only_a
    assert [r["b"][0] for r in data["rows"] if r["kind"] == "only in B"] == ["__myl_Move_myl0_3", "__myl_Tran_myl0_5"]
    # The largest change first: the second convolution, 0.0114 → 0.0259 ms.
    assert data["top"][0]["a"] == ["node_conv2d_1_myl3_1"] and len(data["top"]) == 10
    assert [abs(r["delta_ms"]) for r in data["top"]] == sorted((abs(r["delta_ms"]) for r in data["top"]), reverse=True)
    # These profiles and layer files are of different builds: said, not hidden.
    assert any("describes 2 of the 15 profiled layers" in note for note in data["a"]["notes"])


def test_the_terminal_shows_the_matched_the_unmatched_and_the_top_differences(recorded, run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "diff", *map(str, recorded))
    assert result.exit_code == 0, result.err
    out = result.out
    assert "A = trt10.16: TensorRT 10.16.1, 15 layers timed over 18362 iterations" in out
    assert "Total (sum of per-layer averages): A 0.0833 ms, B 0.1154 ms (+38.5%)." in out
    assert "matched 10 · matched by ONNX nodes 0 · fused differently 0 · only in A 5 · only in B 2" in out
    assert "The 10 layers that explain most of the difference" in out and "Every layer, A beside B" in out
    assert "node_conv2d_1_myl3_1" in out and "only in B" in out and "+0.0145" in out


def test_layer_information_alone_matches_fused_layers_by_their_onnx_nodes(tmp_path, run_cli, tiny_catalog):
    # No times: 10.x's "node_conv2d + node_relu" (CaskConvolution) is 11.x's Myelin "node_conv2d_myl0_2".
    result = run_cli(tiny_catalog, "diff", str(LAYERS_1016), str(LAYERS_110), "--format", "json")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    conv = next(r for r in data["rows"] if r["a"] == ["node_conv2d + node_relu"])
    assert conv["b"] == ["node_conv2d_myl0_2"] and conv["kind"] == "matched by ONNX nodes"
    assert (conv["a_type"], conv["b_type"], conv["a_precision"], conv["b_precision"]) == ("CaskConvolution", "correlation", "fp32", "fp32")
    assert conv["changed"] == ["layer type", "tactic"]
    assert data["precision"] == ["B runs 10 layers in fp32, A 8."]
    assert data["top"] == []  # nothing timed, nothing to rank


def test_the_html_section_renders_in_chromium(recorded, run_cli, tiny_catalog, tmp_path):
    out = tmp_path / "diff.html"
    result = run_cli(tiny_catalog, "diff", *map(str, recorded), "--format", "html", "--out", str(out))
    assert result.exit_code == 0, result.err
    dom = render_in_chromium(out, tmp_path).dom
    assert "What changed between the two engines, layer by layer" in dom
    assert dom.count("<table") == 2 and dom.count("<img") == 1 and "node_conv2d_1_myl0_4" in dom


def test_markdown_carries_the_same_rows(recorded, run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "diff", *map(str, recorded), "--format", "md")
    lines = [line for line in result.out.splitlines() if line.startswith("| ") and "myl" in line]
    assert result.exit_code == 0 and any("node_conv2d_1_myl3_1 | node_conv2d_1_myl0_4 | matched" in line for line in lines)


def test_engines_of_two_models_are_refused():
    with pytest.raises(UsageError, match="different models have no layers to match"):
        diff(EngineSide("trt10.16/vit_fp16", model="vit"), EngineSide("trt10.16/bert_fp16", model="bert"))


def test_files_with_no_layer_in_common_are_refused(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({"Layers": [{"Name": "embeddings_gather", "LayerType": "Gather", "Metadata": "[ONNX Layer: /embeddings/Gather]"}]})
    )
    with pytest.raises(UsageError, match="no layer of .* matches one of other.json"):
        diff(load_side(str(LAYERS_110), None), load_side(str(other), None))


def test_a_folder_without_layers_says_which_run_makes_them(tmp_path, run_cli, tiny_catalog):
    (tmp_path / "a").mkdir()
    shutil.copy(SAMPLES / "trt10.4.0_rtx3060laptop_exportTimes_alexnet_HEAD11LINES.json.txt", tmp_path / "a" / "times.json")
    result = run_cli(tiny_catalog, "diff", str(tmp_path / "a"), str(LAYERS_110))
    assert result.exit_code == 1
    assert "holds neither per-layer times nor layer information" in result.err and "pipeline profile" in result.err


def test_an_engine_of_the_workspace_that_was_never_built_is_named_with_the_command(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "diff", "onnxruntime/tiny_fp16", str(LAYERS_110))
    assert result.exit_code == 1
    assert (
        "onnxruntime/tiny_fp16 has not been built" in result.err
        and "pipeline build --engine tiny_fp16 --toolchain onnxruntime" in result.err
    )


def test_neither_a_file_nor_an_engine_is_a_usage_error(run_cli, tiny_catalog):
    result = run_cli(tiny_catalog, "diff", "vit_fp16", str(LAYERS_110))
    assert result.exit_code == 2 and "name an engine as TOOLCHAIN/ENGINE" in result.err


def test_a_profile_cut_in_the_middle_reads_what_is_complete(tmp_path):
    text = (SAMPLES / "trt10.4.0_rtx3060laptop_exportProfile_alexnet.json").read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    side = load_side(str(cut), None)
    whole = json.loads(text)[1:]
    assert 0 < len(side.timed) < len(whole)
    assert [t.name for t in side.timed] == [r["name"] for r in whole[: len(side.timed)]]
    assert side.notes == [f"cut.json: the file is cut off after layer {len(side.timed)} ({side.timed[-1].name})"]


def test_names_lose_their_myelin_numbering_and_fused_names_give_their_nodes():
    assert canonical("node_conv2d_1_myl3_1") == canonical("node_conv2d_1_myl0_4") == "node_conv2d_1"
    assert canonical("__mye59_0_myl0_0") == canonical("__mye1085_myl0_0") == "__mye"
    assert nodes_of("node_conv2d + node_relu", None) == ("node_conv2d", "node_relu")
    assert nodes_of("__myl_Resh_myl5_1", None) == ()
    layer = read_layer_info(LAYERS_110).layer("__myl_AddMaxrSubExpSum_myl0_9")
    assert nodes_of(layer.name, layer) == ("node_linear_1", "node_softmax")


def test_an_unreadable_side_is_an_error_not_a_traceback(tmp_path):
    with pytest.raises(PipelineError, match="holds neither per-layer times nor layer information"):
        load_side(str(tmp_path), None)

"""An engine's layer information as TensorRT 10 and 11 describe it, read from their recorded output."""

from __future__ import annotations

import json

import pytest

from pipeline.trtexec.layers import layer_info_from_document, layer_info_from_dump, read_layer_info
from pipeline.trtexec.report import parse_run, run_as_json
from pipeline.trtexec.text import read_text
from tests.conftest import SAMPLES

LAYERS_110 = SAMPLES / "trt11.0.0_b200_exportLayerInfo_detailed.json"
DUMP_110 = SAMPLES / "trt11.0.0_b200_onnx_dumpLayerInfo_detailed_skipInference.txt"


def test_trt11_layer_json_gives_every_layers_data_types():
    info = read_layer_info(LAYERS_110)
    assert info.source_format == "11.x json" and info.verbosity == "detailed" and info.unknown_keys == []
    assert len(info.layers) == 13
    audit = info.audit("fp32")
    # Ten layers write fp32, the argmax cast writes int64, and the two L2-cache management layers
    # (__mye1085_myl0_0, __mye1087_myl0_12) write nothing.
    assert audit.output_types == {"fp32": 10, "int64": 1, "no output": 2}
    assert audit.types_seen == ["fp32", "int32", "int64", "uint64", "uint8"]
    assert audit.warning is None
    conv = info.layer("node_conv2d_myl0_2")
    assert conv.layer_type == "correlation"
    assert conv.onnx_nodes == ["node_conv2d", "node_relu"]
    assert conv.tactic.startswith("sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_f32f32_tf32f32")
    assert [c.dtype for c in conv.constants] == ["fp32"] * 4
    assert conv.inputs[0].format == "(NHWC) Channel major format" and conv.inputs[0].dimensions == [1, 1, 28, 28]
    l2 = info.layer("__mye1085_myl0_0")
    assert (l2.layer_type, l2.outputs, l2.tactic, len(l2.inputs)) == ("custom_layer", [], None, 18)


def test_trt11_io_tensors_carry_their_mode_type_and_profile():
    info = read_layer_info(LAYERS_110)
    x, y, z = info.io_tensors
    assert (x.name, x.io, x.dtype, x.dimensions) == ("x", "input", "fp32", [1, 1, 28, 28])
    assert [(p.min, p.opt, p.max) for p in x.profiles] == [([1, 1, 28, 28], [1, 1, 28, 28], [1, 1, 28, 28])]
    assert (y.io, y.dtype, y.dimensions, y.profiles) == ("output", "fp32", [1, 10], [])
    assert (z.io, z.dtype, z.dimensions) == ("output", "int64", [1])


def test_an_fp32_trt11_engine_audited_as_fp16_names_the_real_types_not_unknown():
    audit = read_layer_info(LAYERS_110).audit("fp16")
    assert audit.intended_found is False
    assert "fell back to fp32, int64" in audit.warning and "unknown" not in audit.warning


def test_trt11_text_dump_reads_exactly_like_its_json():
    dumped = layer_info_from_dump(read_text(DUMP_110))
    exported = read_layer_info(LAYERS_110)
    assert dumped.source_format == "text dump"
    assert dumped.layers == exported.layers
    assert dumped.io_tensors == exported.io_tensors


def test_saved_layer_info_reads_back_unchanged(tmp_path):
    info = read_layer_info(LAYERS_110)
    path = tmp_path / "engine.layers.json"
    path.write_text(info.model_dump_json())
    assert read_layer_info(path) == info


def test_layer_info_saved_by_an_earlier_version_is_still_read(tmp_path):
    # Earlier versions kept TensorRT-RTX's dumped layers as TensorRT's own dicts.
    old = {
        "verbosity": "detailed",
        "layer_names": ["gemm_0"],
        "layers": [
            {"Name": "gemm_0", "LayerType": "gemm", "Inputs": [{"Format/Datatype": "FP8"}], "Outputs": [{"Format/Datatype": "Half"}]}
        ],
        "bindings": [],
    }
    path = tmp_path / "old.layers.json"
    path.write_text(json.dumps(old))
    layer = read_layer_info(path).layers[0]
    assert (layer.name, layer.precision, layer.output_type) == ("gemm_0", "fp8", "fp16")


def test_a_layer_computes_in_its_narrowest_input_type():
    info = layer_info_from_document(
        {
            "Layers": [
                {
                    "Name": "fp4_gemm",
                    "LayerType": "gemm",
                    "Inputs": [{"Datatype": "FP4E2M1"}, {"Datatype": "FP8"}],  # values and their block scales
                    "Outputs": [{"Datatype": "Half"}],
                },
                {
                    "Name": "mx_gemm",
                    "LayerType": "gemm",
                    "Inputs": [{"Datatype": "FP8"}, {"Datatype": "E8M0"}],
                    "Outputs": [{"Datatype": "Half"}],
                },
                {"Name": "argmax", "LayerType": "kgen", "Inputs": [{"Datatype": "Int32"}], "Outputs": [{"Datatype": "Int64"}]},
            ]
        }
    )
    assert [layer.precision for layer in info.layers] == ["fp4", "fp8", "int64"]
    assert info.audit("nvfp4").precisions == {"fp4": 1, "fp8": 1, "int64": 1}


def test_an_unknown_future_layout_keeps_what_it_can_and_names_the_rest(tmp_path):
    future = {
        "Layers": [
            {
                "Name": "node_linear_myl0_0",
                "LayerType": "gemm",
                "Inputs": [{"Name": "x", "ElementType": "Half", "Dimensions": [1, 8]}],
                "Outputs": [{"Name": "y", "ElementType": "Half"}],
                "TacticName": "sm120_gemm",
                "Schedule": 3,
            }
        ],
        "I/O Tensors": [{"Name": "x", "IOMode": "Input", "DataType": "Half", "Residency": "Device"}],
        "Graphs": [],
    }
    path = tmp_path / "future.json"
    path.write_text(json.dumps(future))
    info = read_layer_info(path)
    assert info.layer_names == ["node_linear_myl0_0"] and info.layers[0].tactic == "sm120_gemm"
    assert info.layers[0].inputs[0].dtype == "unknown" and info.layers[0].inputs[0].dimensions == [1, 8]
    assert info.unknown_keys == ["Graphs", "I/O Tensors[].Residency", "Layers[].Schedule", "Layers[].Inputs[].ElementType"]
    # A parse of the run says so instead of auditing blind.
    log = tmp_path / "run.log"
    log.write_text("&&&& PASSED TensorRT.trtexec [TensorRT v120000] # trtexec --onnx=m.onnx\n")
    data = run_as_json(parse_run(log, {"layer_info": path}, "fp16"))
    assert data["exports"]["layer_info"]["unknown_keys"] == info.unknown_keys
    assert data["exports"]["precision_audit"]["intended_found"] is None


@pytest.mark.parametrize(
    "name", ["trt10.16.1_h100_exportLayerInfo_detailed.json", "trt10.4.0_rtx3060laptop_exportLayerInfo_alexnet_detailed.json"]
)
def test_trt10_layer_json_knows_every_key(name):
    info = read_layer_info(SAMPLES / name)
    assert info.source_format == "10.x json" and info.unknown_keys == []
    assert all(t.dtype != "unknown" for layer in info.layers for t in layer.inputs + layer.outputs)

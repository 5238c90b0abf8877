"""The node TensorRT's ONNX parser refused, read from recorded logs: trtexec's (tests/data/trtexec)
and TensorRT-RTX's (tests/data/tensorrt_rtx, the driver's result with the compiler's log lines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.trtexec.onnx_parser import parser_failure

DATA = Path(__file__).parents[1] / "data"
PLUGIN_NOT_FOUND = "Plugin not found, are the plugin name, version, and namespace correct?"


def rtx_result(name: str) -> dict:
    return json.loads((DATA / "tensorrt_rtx" / name).read_text())


def test_trtexec_names_the_node_its_op_output_and_check():
    text = (DATA / "trtexec" / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt").read_text()
    failure = parser_failure(text)
    assert failure.model_dump() == {
        "node_number": 0,
        "op_type": "AddScalar",
        "node": "CustomOpModel-N-0-AddScalar",  # from the node dump's `name: "…"`
        "output": "CustomOpModel-V-0-AddScalar-0",
        "check": "checkFallbackPluginImporter",
        "code": 6,
        "message": PLUGIN_NOT_FOUND,
    }
    assert failure.words() == (
        'node 0 "CustomOpModel-N-0-AddScalar" (AddScalar → CustomOpModel-V-0-AddScalar-0): checkFallbackPluginImporter: ' + PLUGIN_NOT_FOUND
    )


@pytest.mark.parametrize("sample", sorted(p.name for p in (DATA / "trtexec").glob("*.txt") if "FAILED" not in p.name))
def test_no_refusal_is_read_into_a_log_without_one(sample):
    assert parser_failure((DATA / "trtexec" / sample).read_text(errors="replace")) is None


def test_tensorrt_rtx_names_the_node_by_its_log_not_its_parser_record():
    result = rtx_result("rtx1.7.1.116_build_refused_custom_op.json")
    failure = parser_failure("\n".join(result["errors"]))
    assert (failure.node_number, failure.op_type, failure.node) == (257, "FancyErf", "blocks.1.mlp.act/FancyErf")
    assert failure.output == "/blocks/blocks.3/mlp/act/Erf_output_0"
    assert (failure.check, failure.code, failure.message) == ("checkFallbackPluginImporter", 6, PLUGIN_NOT_FOUND)


def test_an_unnamed_node_refused_with_false_says_its_number_op_and_check(tmp_path):
    """The case that read `could not parse …: : false`: no node name, and the words "false"."""
    from pipeline.runtimes.tensorrt_rtx.reports import parser_failure_of
    from pipeline.runtimes.tensorrt_rtx.runtime import TensorRtRtxRuntime

    result = rtx_result("rtx1.7.1.116_build_refused_unique_unnamed.json")
    failure = parser_failure_of(result)
    assert (failure.node_number, failure.node, failure.op_type, failure.check) == (0, None, "Unique", "checkUnique")
    assert failure.message == "UNSUPPORTED_NODE"  # the parser's own code where its words are "false"
    runtime = TensorRtRtxRuntime.__new__(TensorRtRtxRuntime)
    runtime.workspace_root, runtime.spec = tmp_path, type("Spec", (), {"release": "1.7.1.116"})()
    refusal = runtime._refusal(tmp_path / "models" / "m" / "fp32.onnx", result, failure)
    assert refusal == "TensorRT-RTX 1.7.1.116 could not parse models/m/fp32.onnx at node 0 (Unique → y): checkUnique: UNSUPPORTED_NODE"


def test_the_signature_leaves_out_what_cutting_a_graph_changes():
    """The reducer keeps a failure by its op, check, words and node name; the node's number
    changes as the graph is cut, its name (Polygraphy's cuts keep it) does not."""
    result = rtx_result("rtx1.7.1.116_build_refused_custom_op.json")
    text = "\n".join(result["errors"])
    cut = text.replace("node number 257", "node number 0")
    assert parser_failure(cut).signature() == parser_failure(text).signature()
    other = text.replace("checkFallbackPluginImporter", "checkOther")
    assert parser_failure(other).signature() != parser_failure(text).signature()
    another_node = text.replace("blocks.1.mlp.act/FancyErf", "blocks.2.mlp.act/FancyErf")
    assert parser_failure(another_node).signature() != parser_failure(text).signature()


def test_tensorrt_8_words_the_check_as_an_assertion():
    """TensorRT 8.6's words, as its logs in public bug reports print them (`ModelImporter.cpp:777:
    ERROR: builtin_op_importers.cpp:5402 In function importFallbackPluginImporter:` then `[8]
    Assertion failed: creator && "Plugin not found, …"`)."""
    text = (
        '[E] [TRT] ModelImporter.cpp:773: While parsing node number 12 [Foo -> "y"]:\n'
        "[E] [TRT] ModelImporter.cpp:774: --- Begin node ---\n"
        "[E] [TRT] ModelImporter.cpp:774: --- End node ---\n"
        "[E] [TRT] ModelImporter.cpp:777: ERROR: builtin_op_importers.cpp:5402 In function importFallbackPluginImporter:\n"
        '[8] Assertion failed: creator && "Plugin not found, are the plugin name, version, and namespace correct?"\n'
    )
    failure = parser_failure(text)
    assert (failure.node_number, failure.op_type, failure.check, failure.code) == (12, "Foo", "importFallbackPluginImporter", 8)
    assert failure.message == PLUGIN_NOT_FOUND

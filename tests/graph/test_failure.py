"""What makes two build failures the same (pipeline/graph/failure.py): the error's kind, the op type
and the node's name as the exporter wrote it, found in the graph, with or without slashes.

The parser's refusals are real logs (tests/data: trtexec 10.16's custom plugin not found, whose
node is named ``CustomOpModel-N-0-AddScalar``; TensorRT-RTX 1.7's, ``blocks.1.mlp.act/FancyErf``);
the builder's words are TensorRT's, as public bug reports quote them (NVIDIA/TensorRT#2660,
zhiqwang/yolort#385).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.graph.failure import failure_signature
from pipeline.trtexec.onnx_parser import parser_failure

DATA = Path(__file__).parents[1] / "data"
TRTEXEC_REFUSAL = (DATA / "trtexec" / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt").read_text()
RTX_REFUSAL = "\n".join(json.loads((DATA / "tensorrt_rtx" / "rtx1.7.1.116_build_refused_custom_op.json").read_text())["errors"])
# TensorRT's builder, as trtexec prints it (NVIDIA/TensorRT#2660), naming one node.
NO_IMPLEMENTATION = (
    "trtexec build failed with exit status 1: [optimizer.cpp::computeCosts::3728] Error Code 10: Internal Error "
    "(Could not find any implementation for node {name}.)"
)


def graph(path: Path, names: list[tuple[str, str]]) -> Path:
    """A chain of unary nodes of these (op type, name): what a graph's names are, not what it computes."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node(op, [f"t{i}"], [f"t{i + 1}"], name=name) for i, (op, name) in enumerate(names)]
    x = helper.make_tensor_value_info("t0", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info(f"t{len(names)}", TensorProto.FLOAT, [2])
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y])), str(path))
    return path


@pytest.mark.parametrize(
    "names, failing",
    [
        # torch.onnx.export(dynamo=True): names without a slash
        ([("Relu", "node_Relu_11"), ("MatMul", "node_MatMul_12"), ("Erf", "node_Erf_13")], ("MatMul", "node_MatMul_12")),
        ([("Relu", "relu_2"), ("Gemm", "linear_3"), ("Erf", "erf_4")], ("Gemm", "linear_3")),
        # the TorchScript exporter: names with slashes
        ([("Relu", "/blocks.0/Relu"), ("MatMul", "/blocks.0/attn/MatMul"), ("Erf", "/blocks.0/Erf")], ("MatMul", "/blocks.0/attn/MatMul")),
    ],
)
def test_a_builder_failure_keeps_its_kind_op_and_node_as_written(tmp_path, names, failing):
    whole = graph(tmp_path / "fp32.onnx", names)
    cut = graph(tmp_path / "candidate.onnx", [pair for pair in names if pair == failing])
    op, name = failing
    said = failure_signature(NO_IMPLEMENTATION.format(name=name), None, whole)
    assert said == ("build", "trtexec build failed with exit status _: [optimizer.cpp::computeCosts::_] Error Code _: Internal Error "
                    "(Could not find any implementation for node <node>.)", op, name)  # fmt: skip
    # The cut is another file; its build names the same node: the same failure.
    assert failure_signature(NO_IMPLEMENTATION.format(name=name), None, cut) == said
    # Another node of the graph, or another error about the same node: another failure.
    other = next(n for o, n in names if n != name)
    assert failure_signature(NO_IMPLEMENTATION.format(name=other), None, whole) != said
    worded = NO_IMPLEMENTATION.format(name=name).replace("Could not find any implementation", "Out of tactics")
    assert failure_signature(worded, None, whole) != said


def test_a_fused_range_is_the_same_failure_whatever_its_ends(tmp_path):
    """Myelin's fused range moves its ends as the graph is cut (zhiqwang/yolort#385's names)."""
    names = [("Reshape", "Reshape_261"), ("Transpose", "Transpose_262"), ("Concat", "Concat_526")]
    whole, cut = graph(tmp_path / "fp32.onnx", names), graph(tmp_path / "candidate.onnx", names[1:])
    fused = "Error Code 10: Internal Error (Could not find any implementation for node {{ForeignNode[{}]}}.)"
    said = failure_signature(fused.format("Reshape_261 + Transpose_262...Concat_526"), None, whole)
    assert said == ("build", "Error Code _: Internal Error (Could not find any implementation for node {ForeignNode[_]}.)", None, None)
    assert failure_signature(fused.format("Transpose_262...Concat_526"), None, cut) == said
    unnamed = "(Unnamed Layer* 6862) [Shuffle].../3/0_2/Reshape_1 + /3/0_2/Transpose_1"  # NVIDIA/TensorRT#2660
    assert failure_signature(fused.format(unnamed), None, cut) == said


@pytest.mark.parametrize(
    "log, node",
    [(TRTEXEC_REFUSAL, "CustomOpModel-N-0-AddScalar"), (RTX_REFUSAL, "blocks.1.mlp.act/FancyErf")],
    ids=["trtexec", "tensorrt-rtx"],
)
def test_a_parser_refusal_keeps_the_node_name_from_the_real_log(log, node):
    failure = parser_failure(log)
    said = failure_signature("", failure.model_dump())
    assert said[0] == "parser" and said[1] == failure.op_type and said[-1] == node
    renumbered = parser_failure(log.replace(f"node number {failure.node_number}", "node number 0"))
    assert failure_signature("", renumbered.model_dump()) == said  # a cut numbers its nodes anew
    renamed = parser_failure(log.replace(node, "another_node_7"))
    assert failure_signature("", renamed.model_dump()) != said

"""Polygraphy's reducer with the product's checks (pipeline/graph/reduce.py), on graphs made here
and checks written here: what it may call reduced, and the cuts whose build gave no answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.graph.reduce import Checks, CutNotBuilt, reduce_graph
from pipeline.running.errors import PipelineError


def chain_with_constants(path: Path, layers: int = 5) -> list[str]:
    """x → (MatMul by a Constant → Relu) × layers, each weight a Constant node, as exporters write
    small weights: Polygraphy's cuts turn the Constants they carry into weights. Its node names."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, x = [], "x"
    for i in range(layers):
        weight = numpy_helper.from_array(np.eye(4, dtype=np.float32) * (i + 1), f"w{i}.value")
        nodes.append(helper.make_node("Constant", [], [f"w{i}"], value=weight, name=f"node_Constant_{3 * i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"node_MatMul_{3 * i + 1}"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"node_Relu_{3 * i + 2}"))
        x = f"r{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 4])]
    model = helper.make_model(helper.make_graph(nodes, "chain", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return [node.name for node in nodes]


def names_in(path: Path) -> set[str]:
    import onnx

    return {node.name for node in onnx.load(str(path)).graph.node}


def test_a_failure_only_the_whole_graph_shows_is_said_and_nothing_written(tmp_path):
    names = chain_with_constants(tmp_path / "model.onnx")
    first, last = names[1], names[-1]

    def whole_only(candidate: Path) -> tuple[bool, str]:
        held = names_in(candidate)
        return (first in held and last in held), "builds"

    lines: list[str] = []
    output = tmp_path / "model.reduced.onnx"
    with pytest.raises(PipelineError) as raised:
        reduce_graph(tmp_path / "model.onnx", output, Checks(whole_only, lines.append), {}, tmp_path / "work")
    assert "no cut of the graph fails the same way (in " in raised.value.message
    assert "the failure needs the whole graph (10 nodes that compute, not counting Constant and Identity)" in raised.value.message
    # The cuts Polygraphy tried that failed held every node that computes (its Constants as weights).
    assert any("fails the same way" in line for line in lines)
    assert not output.exists()


def test_a_cut_whose_build_gave_no_answer_is_counted_and_the_reduce_goes_on(tmp_path):
    """Cuts without the failing node crash, run out of memory or out of time in turn: each counts
    as a cut that did not fail the same way, and the reduce ends at the failing node."""
    names = chain_with_constants(tmp_path / "model.onnx")
    failing = "node_MatMul_7"
    assert failing in names
    answers = iter(["crashed (SIGSEGV)", "ran out of memory", "ran past its time limit"] * 100)

    def check(candidate: Path) -> tuple[bool, str]:
        if failing in names_in(candidate):
            return True, ""
        raise CutNotBuilt(next(answers))

    lines: list[str] = []
    output = tmp_path / "model.reduced.onnx"
    checks = Checks(check, lines.append)
    reduction = reduce_graph(tmp_path / "model.onnx", output, checks, {}, tmp_path / "work")
    assert failing in names_in(output) and reduction.nodes_after <= 3
    assert sum(reduction.skipped.values()) == sum(1 for line in lines if "skipped, its build" in line) > 0
    assert set(reduction.skipped) <= {"crashed (SIGSEGV)", "ran out of memory", "ran past its time limit"}
    assert "skipped, its build crashed (SIGSEGV): counted as not failing the same way" in "\n".join(lines)
    words = checks.skipped_words()
    assert words.startswith(f", {sum(reduction.skipped.values())} cuts skipped: ") and "crashed (SIGSEGV)" in words
    assert reduction.record("r.onnx", "f")["skipped"] == reduction.skipped

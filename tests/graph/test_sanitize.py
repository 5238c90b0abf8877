"""Constant folding before TensorRT reads a graph (pipeline/graph/sanitize.py), alone and in the
export of a user's ONNX: the shape computations of a static graph go, what it computes stays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, write_catalog


def foldable_graph(path: Path) -> None:
    """x [2, 3, 4] flattened by a shape computed from x itself (Shape → Gather → Unsqueeze →
    Concat → Reshape), then scaled: five nodes folding removes, leaving Reshape and Mul."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])
    weights = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], np.int64), "rest"),
        numpy_helper.from_array(np.full((12,), 0.5, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"], name="batch1"),
        helper.make_node("Concat", ["batch1", "rest"], ["flat_shape"], name="flat_shape", axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Mul", ["flat", "scale"], ["y"], name="scale_it"),
    ]
    graph = helper.make_graph(nodes, "user", [x], [y], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_folding_removes_the_shape_computation_and_keeps_the_result(tmp_path):
    import onnx

    from pipeline.graph.sanitize import sanitize

    foldable_graph(tmp_path / "user.onnx")
    folded, record = sanitize(onnx.load(str(tmp_path / "user.onnx")))
    assert (record["nodes_before"], record["nodes_after"]) == (6, 2)
    assert [node.op_type for node in folded.graph.node] == ["Reshape", "Mul"]
    assert record["folded"] == {"Concat": 1, "Gather": 1, "Shape": 1, "Unsqueeze": 1}
    assert record["tool"].startswith("polygraphy ") and record["seconds"] >= 0
    onnx.save(folded, str(tmp_path / "folded.onnx"))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(tmp_path / "folded.onnx", x), run(tmp_path / "user.onnx", x))


def test_a_quantized_graph_is_left_as_written_and_says_why():
    """Folding a constant weight through its DequantizeLinear would hand TensorRT float weights."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.graph.sanitize import sanitize

    weight = numpy_helper.from_array(np.ones((4, 4), np.int8), "w_q")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "w_scale")
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    same, record = sanitize(model)
    assert same is model and [n.op_type for n in same.graph.node] == ["DequantizeLinear", "MatMul"]
    assert "DequantizeLinear" in record["skipped"] and record["nodes_after"] == record["nodes_before"] == 2


USER = """
[models.user]
onnx = "user.onnx"
"""


@pytest.fixture
def workspace(tmp_path):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    foldable_graph(catalog.parent / "user.onnx")
    return catalog


def test_a_users_graph_is_exported_folded_and_checked_against_itself(workspace, run_cli):
    import onnx

    result = run_cli(workspace, "export", "--engine", "user_fp32")
    assert result.exit_code == 0, result.err
    assert "(constants folded: 6 → 2 nodes;" in result.err
    ws = workspace.parent
    written = onnx.load(str(ws / "models" / "user" / "fp32.onnx"))
    assert [node.op_type for node in written.graph.node] == ["Reshape", "Mul"]
    details = read_manifest(ws / "manifests" / "export" / "user_fp32.json").export.details
    assert (details.sanitized["nodes_before"], details.sanitized["nodes_after"]) == (6, 2)
    # The parity check: the folded graph against the file as given, on the same inputs.
    assert details.parity.passed and details.parity.max_abs_error == 0.0
    assert details.parity.reference == "user.onnx as given, ONNX Runtime, same input"
    assert details.parity_skipped is None and details.timings_s["sanitize"] >= 0


def test_no_sanitize_keeps_the_users_graph_byte_for_byte(workspace, run_cli):
    ws = workspace.parent
    result = run_cli(workspace, "export", "--engine", "user_fp32", "--no-sanitize")
    assert result.exit_code == 0, result.err
    assert (ws / "models" / "user" / "fp32.onnx").read_bytes() == (ws / "user.onnx").read_bytes()
    details = read_manifest(ws / "manifests" / "export" / "user_fp32.json").export.details
    assert details.sanitized == {"skipped": "--no-sanitize (or `sanitize = false` in pipeline.toml)"}
    # Turning it on is another export (its fingerprint says so), not the one on disk.
    again = run_cli(workspace, "export", "--engine", "user_fp32")
    assert again.exit_code == 0 and "didn't change" not in again.err and "constants folded" in again.err

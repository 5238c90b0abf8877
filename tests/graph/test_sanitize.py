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


def quantized_graph(path: Path) -> None:
    """x [2, 3, 4] flattened by a shape computed from x (five nodes folding removes), then an INT8
    Q/DQ pair on the activations and on a constant float weight (QuantizeLinear of a weight, whose
    inputs are all constant), a MatMul, and a weight already int8 behind its DequantizeLinear."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], np.int64), "rest"),
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
        numpy_helper.from_array(rng.standard_normal((12, 5)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
        numpy_helper.from_array(rng.integers(-100, 100, (5,)).astype(np.int8), "b_q"),
        numpy_helper.from_array(np.array(0.05, np.float32), "b_scale"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"], name="batch1"),
        helper.make_node("Concat", ["batch1", "rest"], ["flat_shape"], name="flat_shape", axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("QuantizeLinear", ["flat", "x_scale", "x_zero"], ["flat_q"], name="x_q"),
        helper.make_node("DequantizeLinear", ["flat_q", "x_scale", "x_zero"], ["flat_dq"], name="x_dq"),
        helper.make_node("QuantizeLinear", ["w", "w_scale", "x_zero"], ["w_q"], name="w_q"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "x_zero"], ["w_dq"], name="w_dq"),
        helper.make_node("MatMul", ["flat_dq", "w_dq"], ["product"], name="project"),
        helper.make_node("DequantizeLinear", ["b_q", "b_scale"], ["b"], name="b_dq"),
        helper.make_node("Add", ["product", "b"], ["y"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_quantized_graph_is_folded_around_its_q_dq_which_all_stay(tmp_path):
    """graphsurgeon never folds QuantizeLinear/DequantizeLinear, not even a weight's whose inputs
    are all constant: the shape computation goes, every Q/DQ stays, the outputs are the same."""
    import onnx

    from pipeline.graph.sanitize import sanitize

    quantized_graph(tmp_path / "q.onnx")
    given = onnx.load(str(tmp_path / "q.onnx"))
    folded, record = sanitize(given)
    assert "skipped" not in record and record["folded"] == {"Concat": 1, "Gather": 1, "Shape": 1, "Unsqueeze": 1}
    kept = [node.op_type for node in folded.graph.node]
    assert kept == [
        "Reshape",
        "QuantizeLinear",
        "DequantizeLinear",
        "QuantizeLinear",
        "DequantizeLinear",
        "MatMul",
        "DequantizeLinear",
        "Add",
    ]
    assert {t.name: t.data_type for t in folded.graph.initializer}["w"] == onnx.TensorProto.FLOAT  # the weight as given, unquantized
    onnx.save(folded, str(tmp_path / "folded.onnx"))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(tmp_path / "folded.onnx", x), run(tmp_path / "q.onnx", x))


def test_a_folding_that_removed_a_dequantize_keeps_the_graph_as_given(tmp_path, monkeypatch):
    """The guard, should a release of graphsurgeon fold Q/DQ: the graph as given, and why."""
    import onnx
    import polygraphy.backend.onnx as polygraphy_onnx

    from pipeline.graph.sanitize import sanitize

    quantized_graph(tmp_path / "q.onnx")
    given = onnx.load(str(tmp_path / "q.onnx"))

    def folds_the_bias(model, **_):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        del copy.graph.node[10]  # b_dq
        return copy

    monkeypatch.setattr(polygraphy_onnx, "fold_constants", folds_the_bias)
    same, record = sanitize(given)
    assert same is given and record["skipped"] == "folding removed 1 DequantizeLinear" and record["nodes_after"] == 12


def test_tensorrts_own_quantization_ops_are_left_as_written_and_say_why():
    """graphsurgeon treats trt::TRT_* like any op whose inputs are constant and hands it to ONNX
    Runtime: a graph with them is not folded."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.graph.sanitize import sanitize

    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "w_scale")
    nodes = [
        helper.make_node("TRT_FP8QuantizeLinear", ["w", "w_scale"], ["w_q"], domain="trt"),
        helper.make_node("TRT_FP8DequantizeLinear", ["w_q", "w_scale"], ["w_dq"], domain="trt"),
        helper.make_node("MatMul", ["x", "w_dq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("trt", 1)])
    same, record = sanitize(model)
    assert same is model and [n.op_type for n in same.graph.node] == ["TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear", "MatMul"]
    assert "TRT_FP8DequantizeLinear, TRT_FP8QuantizeLinear" in record["skipped"] and record["nodes_after"] == record["nodes_before"] == 3


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


def test_without_polygraphy_an_export_that_folds_is_an_error_that_says_how_to_get_it(workspace, run_cli, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "polygraphy", None)  # not importable, as on a machine without it
    result = run_cli(workspace, "export", "--engine", "user_fp32", "--force")
    assert result.exit_code == 3, result.err
    assert "Traceback" not in result.err and "INTERNAL ERROR" not in result.err
    assert "Constant folding before TensorRT reads the graph (--no-sanitize skips it) needs the Python package 'polygraphy'" in result.err
    assert "TIP install the 'export' extra" in result.err


CUSTOM = """
[models.custom]
onnx = "custom.onnx"
"""


def test_a_fold_onnx_runtime_cannot_check_is_said_unchecked(tmp_path, run_cli):
    """A user's graph with a custom op: folded all the same, with a WARNING and the record's
    `parity` saying why it is unchecked."""
    import onnx

    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + CUSTOM)
    foldable_graph(catalog.parent / "custom.onnx")
    graph = onnx.load(str(catalog.parent / "custom.onnx"))
    graph.graph.node[-1].op_type, graph.graph.node[-1].domain = "FancyScale", "acme.custom"
    graph.opset_import.append(onnx.helper.make_opsetid("acme.custom", 1))
    onnx.save(graph, str(catalog.parent / "custom.onnx"))
    result = run_cli(catalog, "export", "--engine", "custom_fp32")
    assert result.exit_code == 0, result.err
    assert "WARNING custom_fp32: constant folding changed the graph (6 → 2 nodes), unchecked: ONNX Runtime cannot run" in result.err
    details = read_manifest(catalog.parent / "manifests" / "export" / "custom_fp32.json").export.details
    assert (
        details.sanitized["parity"]
        == 'unchecked: ONNX Runtime cannot run "scale_it" (acme.custom:FancyScale), a custom op, for the FP32 reference'
    )
    assert details.parity is None and details.parity_by_shape == {}


def test_folding_says_nothing_of_nodes_onnx_runtimes_cpu_kernels_cannot_evaluate(capfd):
    """An FP16 Sqrt of a constant: ONNX Runtime has no CPU kernel for it, and its log printed a
    warning for each such node on every export (12 for timm's test_vit); the node stays unfolded."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.graph.sanitize import sanitize

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])
    scale = numpy_helper.from_array(np.full((4,), 4.0, np.float16), "scale")
    nodes = [helper.make_node("Sqrt", ["scale"], ["root"], name="root"), helper.make_node("Mul", ["x", "root"], ["y"], name="scaled")]
    model = helper.make_model(helper.make_graph(nodes, "half", [x], [y], [scale]), opset_imports=[helper.make_opsetid("", 17)])
    capfd.readouterr()
    folded, record = sanitize(onnx.shape_inference.infer_shapes(model))
    out, err = capfd.readouterr()
    assert "onnxruntime" not in err + out and "Could not find a CPU kernel" not in err + out
    assert {node.op_type for node in folded.graph.node} >= {"Mul"}

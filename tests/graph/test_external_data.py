"""A user's ONNX that keeps its weights in external data files (every model over 2 GB is saved so),
here forced on tiny graphs with ``size_threshold=0``: taken in with its data (fingerprinted, so a
changed data file is taken again), linted, folded, built and profiled on ONNX Runtime, and reduced
to a graph that loads with its own data file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.manifest import read_manifest
from pipeline.workspace.artifacts import sha256_file
from tests.conftest import TINY_CATALOG, write_catalog
from tests.graph.test_sanitize import run

USER = """
[models.user]
onnx = "user.onnx"
shapes = ["2"]
"""


def foldable_graph(path: Path) -> None:
    """x [batch, 128] times a weight [128, 8] (4 KB) doubled and rectified in the graph (a Constant,
    Mul and Relu folding computes once), leaving the MatMul alone."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32), "two")),
        helper.make_node("Mul", ["w", "two"], ["w2"], name="double"),
        helper.make_node("Relu", ["w2"], ["w3"], name="rectify"),
        helper.make_node("MatMul", ["x", "w3"], ["y"], name="project"),
    ]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((128, 8)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    graph = helper.make_graph(nodes, "user", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def with_external_data(source: Path, path: Path, location: str) -> None:
    """``source`` saved at ``path`` with every weight in ``location`` beside it."""
    import onnx

    onnx.save(onnx.load(str(source)), str(path), save_as_external_data=True, location=location, size_threshold=0)


def locations(path: Path) -> set[str]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return {entry.value for t in graph.initializer for entry in t.external_data if entry.key == "location"}


def test_a_graph_with_external_data_is_taken_in_folded_built_and_profiled(tmp_path, run_cli):
    import onnx

    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    ws = catalog.parent
    foldable_graph(tmp_path / "plain.onnx")
    with_external_data(tmp_path / "plain.onnx", ws / "user.onnx", "user.weights")
    assert locations(ws / "user.onnx") == {"user.weights"} and (ws / "user.weights").stat().st_size == 128 * 8 * 4

    result = run_cli(catalog, "run", "--engine", "user_fp32", "--toolchain", "onnxruntime")
    assert result.exit_code == 0, result.err
    assert "(constants folded: 4 → 1 nodes;" in result.err
    # The workspace's copy keeps its weights in one file beside it, and computes what the user's does.
    copy, data = ws / "models" / "user" / "fp32.onnx", ws / "models" / "user" / "fp32.onnx.data"
    assert locations(copy) == {"fp32.onnx.data"} and data.is_file()
    assert [node.op_type for node in onnx.load(str(copy)).graph.node] == ["MatMul"]
    x = np.random.default_rng(1).standard_normal((2, 128)).astype(np.float32)
    np.testing.assert_array_equal(run(copy, x), run(ws / "user.onnx", x))

    manifest = read_manifest(ws / "manifests" / "onnxruntime" / "user_fp32.json")
    details = manifest.export.details
    assert details.weights == "as in user.onnx and its external data (user.weights)"
    assert details.parity.passed and details.parity.max_abs_error == 0.0
    assert details.onnx_audit["size_bytes"] == (ws / "user.onnx").stat().st_size + (ws / "user.weights").stat().st_size
    written = {a.role: a for a in manifest.export.outputs}
    assert written["onnx_data"].path == "models/user/fp32.onnx.data" and written["onnx_data"].sha256 == sha256_file(data)
    assert manifest.build.status == "done" and {a.role for a in manifest.build.inputs} == {"onnx", "onnx_data"}
    # ONNX Runtime's optimized model holds its weights (under 2 GB), not a path to the input's data.
    assert locations(ws / "engines" / "onnxruntime" / "user_fp32.onnx") == set()
    profiled = read_manifest(ws / "manifests" / "onnxruntime" / "user_fp32@2.json").profile
    assert profiled.status == "done" and profiled.details.accuracy["cosine_similarity"] > 0.9999

    # The same data is the same export; a changed data file is another.
    same = run_cli(catalog, "export", "--engine", "user_fp32")
    assert same.exit_code == 0 and "didn't change" in same.err
    # The weight in the data file made ones, the graph's file as it was.
    (ws / "user.weights").write_bytes(np.ones((128, 8), np.float32).tobytes())
    again = run_cli(catalog, "export", "--engine", "user_fp32")
    assert again.exit_code == 0, again.err
    assert "didn't change" not in again.err
    np.testing.assert_allclose(run(copy, x), np.repeat(2 * x.sum(axis=1, keepdims=True), 8, axis=1), rtol=1e-5)


def test_a_data_file_that_is_not_beside_the_graph_is_named(tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    ws = catalog.parent
    foldable_graph(tmp_path / "plain.onnx")
    with_external_data(tmp_path / "plain.onnx", ws / "user.onnx", "user.weights")
    (ws / "user.weights").unlink()
    result = run_cli(catalog, "export", "--engine", "user_fp32")
    assert result.exit_code == 2, result.err
    err = " ".join(result.err.split())
    assert "keeps its weights in external data file(s) user.weights, which are not beside it" in err and "TIP" in err
    assert "Traceback" not in result.err and not (ws / "models" / "user" / "fp32.onnx").exists()


def custom_op_graph(path: Path) -> None:
    """x [2, 64] → MatMul → acme.custom:FancyScale, taking a weight of 16 KB → Relu: ONNX Runtime
    has no kernel for FancyScale (its build of the graph is a refusal), saved with every weight in
    an external data file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "s"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
        helper.make_node("FancyScale", ["h", "s"], ["h2"], name="scale/FancyScale", domain="acme.custom"),
        helper.make_node("Relu", ["h2"], ["y"], name="act"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    graph = helper.make_graph(
        nodes, "user", [x], [y], weights, value_info=[helper.make_tensor_value_info("h2", TensorProto.FLOAT, [2, 64])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme.custom", 1)])
    onnx.save(model, str(path), save_as_external_data=True, location="user.onnx.weights", size_threshold=0)


def test_a_graph_with_external_data_reduces_to_a_graph_that_loads_with_its_own_data(tmp_path, run_cli):
    import onnx

    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + '\n[models.user]\nonnx = "user.onnx"\n')
    ws = catalog.parent
    custom_op_graph(ws / "user.onnx")
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "onnxruntime")
    assert built.exit_code == 1 and "acme.custom:FancyScale(-1) is not a registered function/op" in built.err
    assert read_manifest(ws / "manifests" / "onnxruntime" / "user_fp32.json").build.status == "failed"

    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "onnxruntime")
    assert result.exit_code == 0, result.err
    reduced = ws / "models" / "user" / "fp32.onnxruntime.reduced.onnx"
    assert "3 → 1 node(s) (FancyScale)" in result.err
    # Its weight in its own data file beside it, read wherever the two go together.
    assert locations(reduced) == {"fp32.onnxruntime.reduced.onnx.data"}
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for name in ("fp32.onnxruntime.reduced.onnx", "fp32.onnxruntime.reduced.onnx.data"):
        (moved / name).write_bytes((reduced.parent / name).read_bytes())
    graph = onnx.load(str(moved / "fp32.onnxruntime.reduced.onnx"))
    assert [node.op_type for node in graph.graph.node] == ["FancyScale"]
    given = onnx.load(str(ws / "user.onnx"))
    weight = {t.name: onnx.numpy_helper.to_array(t) for t in given.graph.initializer}["s"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(next(t for t in graph.graph.initializer if t.name == "s")), weight)
    record = read_manifest(ws / "manifests" / "onnxruntime" / "user_fp32.json").build.details.reduced
    assert record["onnx"] == "models/user/fp32.onnxruntime.reduced.onnx" and record["nodes_after"] == 1

"""A user's ONNX whose inputs have no dynamic axes: one static shape, measured, reported and compared
as the point "static" — not refused when its profile's manifest is read back."""

from __future__ import annotations

import json

import numpy as np

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, write_catalog


def static_graph(path) -> None:
    """x [2, 16] times a weight [16, 4]: no axis is dynamic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="project")], "static", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_graph_without_dynamic_axes_runs_end_to_end_and_is_compared_at_its_one_shape(tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + '\n[models.user]\nonnx = "user.onnx"\n')
    static_graph(tmp_path / "ws" / "user.onnx")
    result = run_cli(catalog, "run", "--model", "user")
    assert result.exit_code == 0, result.err
    assert "does not match the schema" not in result.err
    manifest = read_manifest(tmp_path / "ws" / "manifests" / "onnxruntime" / "user_fp32@static.json")
    assert manifest.shape == "static" and manifest.profile.status == "done"
    compared = run_cli(catalog, "compare", "--model", "user", "--format", "json")
    assert compared.exit_code == 0, compared.err
    rows = [row for row in json.loads(compared.out)["rows"] if row["model"] == "user"]
    assert rows and {row["shape"] for row in rows} == {"static"}


def test_models_says_where_each_models_weights_come_from_and_names_the_catalog_read(tmp_path, run_cli):
    catalog = tmp_path / "ws" / "mine.toml"
    write_catalog(tmp_path / "ws", TINY_CATALOG + '\n[models.user]\nonnx = "user.onnx"\n').rename(catalog)
    static_graph(tmp_path / "ws" / "user.onnx")
    result = run_cli(catalog, "models")
    assert result.exit_code == 0, result.err
    assert "mine.toml" in result.out and "pipeline.toml" not in result.out
    rows = {line.split("│")[1].strip(): line for line in result.out.splitlines() if line.count("│") > 3}
    assert "as in user.onnx" in rows["user"] and "random init (seed 0)" in rows["tiny"]

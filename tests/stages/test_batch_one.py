"""Batch 1 beside a larger batch, for every model family that is exported: the graph keeps its
dynamic axes dynamic whatever the size at the point it is traced at (pipeline/models/base.py,
``trace_point``), so every point runs on ONNX Runtime and on PyTorch, quantized variants included.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import CPU_TOOLCHAINS, DATA, catalog_head, write_catalog

pytest.importorskip("torch", reason="exporting needs torch (`make setup` installs it)")

MODELS = DATA / "python_models"

# One model of each exported family with a batch-1 point (and a sequence-1 one) beside a larger point.
CATALOG = (
    catalog_head(["llama", "bert", "mlp", "block", "vit"], ["fp32"])
    + """
[models.llama]
transformers = "LlamaForCausalLM"
config = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16, vocab_size = 256, max_position_embeddings = 128 }
padding = false
shapes = ["1x16", "2x32"]

[models.bert]
transformers = "BertModel"
config = { hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 2, intermediate_size = 64, vocab_size = 512, max_position_embeddings = 64 }
shapes = ["1x1", "2x16"]

[models.mlp]
python = "models-in/mlp.py:make"
config = { features = 16, hidden = 32 }
shapes = ["1x8", "3x8"]

[models.block]
python = "models-in/attention_block.py:make"
output = "hidden"
shapes = ["1x1", "2x12"]

[models.vit]
timm = "test_vit"
batch_size = 1

[variants.fp32]
precision = "fp32"
[variants.int8]
precision = "int8"
"""
    + CPU_TOOLCHAINS
)

POINTS = {"llama": {"1x16", "2x32"}, "bert": {"1x1", "2x16"}, "mlp": {"1x8", "3x8"}, "block": {"1x1", "2x12"}, "vit": {None}}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from pipeline.cli import main

    root = tmp_path_factory.mktemp("batch-one")
    catalog = write_catalog(root, CATALOG)
    (root / "models-in").mkdir()
    for name in ("mlp.py", "attention_block.py"):
        shutil.copy(MODELS / name, root / "models-in" / name)
    models = [arg for name in POINTS for arg in ("--model", name)]
    code = main(
        [
            "--catalog",
            str(catalog),
            "run",
            *models,
            "--variant",
            "fp32",
            "--variant",
            "int8",
            "--toolchain",
            "onnxruntime",
            "--toolchain",
            "torch-eager",
        ]
    )
    assert code == 0
    return catalog


@pytest.mark.parametrize("model", ["llama", "bert", "mlp", "block"])
@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_the_graph_keeps_its_axes_free_when_the_smallest_point_has_a_size_of_one(measured, model, variant):
    import onnx

    graph = onnx.load(str(measured.parent / "models" / model / f"{variant}.onnx"), load_external_data=False)
    for value in graph.graph.input:
        batch, *rest = value.type.tensor_type.shape.dim
        assert batch.dim_param == "batch", (value.name, batch)
        assert rest[0].dim_param == "sequence", (value.name, rest[0])
    export = json.loads((measured.parent / "manifests" / "export" / f"{model}_{variant}.json").read_text())["export"]["details"]
    assert set(export["shape_points"]) == POINTS[model]


@pytest.mark.parametrize("model", list(POINTS))
def test_every_point_runs_on_onnx_runtime_and_pytorch_for_every_variant(measured, run_cli, model):
    rows = json.loads(run_cli(measured, "compare", "--model", model, "--format", "json").out)["rows"]
    measured_at = {(row["variant"], row["toolchain"], row["shape"]) for row in rows if row["median_ms"]}
    expected = {("fp32", toolchain, shape) for toolchain in ("onnxruntime", "torch-eager") for shape in POINTS[model]}
    expected |= {("int8", "onnxruntime", shape) for shape in POINTS[model]}  # PyTorch does not run a quantized graph
    assert measured_at == expected, rows
    for row in rows:
        if row["median_ms"] and row["variant"] == "fp32":
            assert row["accuracy_cosine"] > 0.9999, row


def test_onnx_runtimes_refusal_keeps_its_whole_explanation(tmp_path):
    """ONNX Runtime says which index, what it got and what it expected on the lines after its first."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from pipeline.running.errors import PipelineError
    from pipeline.stages.parity import check_parity

    fixed = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4]) for name in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "fixed", fixed[:1], fixed[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "fixed.onnx")
    with pytest.raises(PipelineError) as caught:
        check_parity(tmp_path / "fixed.onnx", [np.zeros((2, 4), np.float32)], np.zeros((2, 4)), "fp32")
    assert "Got invalid dimensions for input: x" in caught.value.message
    assert "index: 0 Got: 2 Expected: 1" in caught.value.message, caught.value.message
    assert "\n" not in caught.value.message

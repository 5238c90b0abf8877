"""Quantization and 2:4 sparsity with ModelOpt on the CPU, exported for real (timm's test_vit)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.manifest import read_manifest
from pipeline.stages.quantized_onnx import INT8_EXPORTER, MODELOPT_EXPORTER
from tests.conftest import TINY_CATALOG, modelopt_onnx, quantized_test_vit, write_catalog

CATALOG = (
    TINY_CATALOG.replace(
        "[models.tiny]",
        "[calibration]\nsamples = 8\nbatch_size = 4\n\n[models.tiny]",
    )
    + """
[variants.fp8]
precision = "fp8"
[variants.int8_sparse]
precision = "int8"
sparsity = "2:4"
sparsity_method = "sparsegpt"
[variants.fp8_sparse]
precision = "fp8"
sparsity = "2:4"

# Batch 6: quantized models traced on the CPU are traced at a batch of 2 with a dynamic batch axis.
[models.tiny_b6]
timm = "test_vit"
batch_size = 6
"""
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("quant"), CATALOG)
    engines = [
        "tiny_fp32",
        "tiny_int8",
        "tiny_fp8",
        "tiny_fp16_sparse",
        "tiny_int8_sparse",
        "tiny_fp8_sparse",
        "tiny_b6_int8",
        "tiny_b6_fp8",
    ]
    assert main(["--catalog", str(catalog), "export", *(a for e in engines for a in ("--engine", e))]) == 0
    return catalog.parent


def details(ws, engine):
    return read_manifest(ws / "manifests" / "export" / f"{engine}.json").export.details


def test_int8_export_has_qdq_and_runs_in_onnx_runtime(exported):
    d = details(exported, "tiny_int8")
    assert d.onnx_ops["QuantizeLinear"] > 0 and d.onnx_ops["DequantizeLinear"] > 0
    assert d.parity.passed and d.parity_skipped is None
    assert d.quantization["preset"] == "INT8_DEFAULT_CFG"
    assert d.quantization["weights_dtype"] == "fp32"  # portable to ONNX Runtime
    assert d.quantization["exporter"] == INT8_EXPORTER
    assert d.quantization["quantized_layers"] > 0 and d.quantization["excluded_layers"] == {}
    # Folded around its Q/DQ, which all stay: the weights stay float behind their QuantizeLinear, and
    # the zero points and shapes, Constant nodes before, are weights of their own.
    assert "skipped" not in d.sanitized and not {"QuantizeLinear", "DequantizeLinear"} & set(d.sanitized["folded"])
    dtypes = d.onnx_audit["initializer_dtypes"]
    assert d.onnx_audit["opsets"]["ai.onnx"] == 17 and set(dtypes) == {"FLOAT", "INT8", "INT64"}
    assert dtypes["INT8"] == d.onnx_ops["QuantizeLinear"]
    assert d.onnx_audit["size_bytes"] == (exported / "models" / "tiny" / "int8.onnx").stat().st_size


def test_fp8_export_has_fp8_weights_and_tensorrt_qdq(exported):
    d = details(exported, "tiny_fp8")
    assert d.onnx_ops.get("trt::QuantizeLinear", 0) > 0 and d.onnx_ops.get("trt::DequantizeLinear", 0) > 0
    assert d.onnx_audit["initializer_dtypes"].get("FLOAT8E4M3FN", 0) > 0
    assert d.onnx_audit["initializer_dtypes"].get("FLOAT16", 0) > 0  # FP16 weights for strongly typed builds
    assert d.onnx_audit["opsets"]["ai.onnx"] == 19
    assert d.quantization["exporter"] == MODELOPT_EXPORTER
    assert d.parity is None and "TensorRT-only operators" in d.parity_skipped
    assert d.input_shape == [2, 3, 160, 160]
    # Folded where its graph had something to fold (the batch-6 trace's shape arithmetic), and said
    # to be unchecked: ONNX Runtime cannot run the graph the folding would be checked on.
    b6 = details(exported, "tiny_b6_fp8").sanitized
    assert b6["nodes_after"] < b6["nodes_before"] and b6["parity"] == "unchecked: " + details(exported, "tiny_b6_fp8").parity_skipped
    assert "parity" not in details(exported, "tiny_int8").sanitized  # checked against PyTorch


COMPUTE_OPS = {"MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Erf", "QuantizeLinear", "DequantizeLinear"}


def test_cpu_traces_use_a_small_batch_and_pin_the_models_batch(exported):
    import onnx
    import onnxruntime as ort

    from pipeline.stages.quantize import CPU_TRACE_BATCH

    int8 = details(exported, "tiny_b6_int8")
    assert int8.traced_batch == CPU_TRACE_BATCH == 2 and int8.input_shape == [6, 3, 160, 160]
    # Parity ran at a batch the graph was not traced at: the batch axis is really free.
    assert int8.parity.passed and int8.parity.samples == 6
    assert details(exported, "tiny_int8").traced_batch is None  # batch 2: traced as it is
    assert details(exported, "tiny_int8").parity.samples == 2
    for variant, ops in (("int8", int8.onnx_ops), ("fp8", details(exported, "tiny_b6_fp8").onnx_ops)):
        path = exported / "models" / "tiny_b6" / f"{variant}.onnx"
        graph = onnx.load(str(path))
        dims = lambda value: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
        assert [dims(v) for v in graph.graph.input] == [[6, 3, 160, 160]]
        assert dims(graph.graph.output[0])[0] == 6
        # The same compute and Q/DQ operators as the batch-2 graph traced without a dynamic axis;
        # only shape arithmetic (Shape, Gather, Slice, Concat, …) differs.
        static_ops = details(exported, f"tiny_{variant}").onnx_ops
        compute = lambda histogram: {op: n for op, n in histogram.items() if op.split("::")[-1] in COMPUTE_OPS}
        assert compute(ops) == compute(static_ops) and compute(ops)["MatMul"] > 0
    # The pinned graph runs at its batch; its FLOPs are three times the batch-2 graph's.
    session = ort.InferenceSession(str(exported / "models" / "tiny_b6" / "int8.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": np.random.default_rng(0).standard_normal((6, 3, 160, 160), dtype=np.float32)})
    assert logits.shape[0] == 6 and np.isfinite(logits).all()
    assert int8.onnx_audit["matmul_flops"] == 3 * details(exported, "tiny_int8").onnx_audit["matmul_flops"]


def test_accuracy_proxy_is_recorded_for_every_calibrated_variant(exported):
    for engine in ("tiny_int8", "tiny_fp8", "tiny_fp16_sparse", "tiny_int8_sparse", "tiny_fp8_sparse"):
        accuracy = details(exported, engine).accuracy
        assert accuracy["samples"] == 8
        assert -1.0 <= accuracy["cosine_similarity"] <= 1.0
        assert 0.0 <= accuracy["top1_agreement"] <= 1.0
        assert accuracy["max_abs_error"] >= 0.0
    assert details(exported, "tiny_int8").accuracy["cosine_similarity"] > 0.99
    assert details(exported, "tiny_fp8").accuracy["warning"] is None
    # Pruning half of a random model's weights without fine-tuning moves its outputs: said, not hidden.
    sparse = details(exported, "tiny_fp16_sparse").accuracy
    assert sparse["cosine_similarity"] < sparse["cosine_floor"] and "2:4 sparsity" in sparse["warning"]
    assert details(exported, "tiny_fp32").accuracy is None


def test_sparse_weights_keep_the_2_4_pattern_in_the_onnx(exported):
    import onnx

    from pipeline.stages.sparsify import has_2_4_pattern, onnx_sparsity

    for engine in ("tiny_fp16_sparse", "tiny_int8_sparse", "tiny_fp8_sparse"):
        s = details(exported, engine).sparsification
        sparsified = [name for name, layer in s["layers"].items() if layer["pattern_2_4"]]
        assert len(sparsified) == s["sparsified_layers"] == 25  # every Linear; the 3-channel conv stays dense
        assert s["layers"]["patch_embed.proj"]["pattern_2_4"] is False
        assert s["onnx"]["weights_2_4"] >= s["sparsified_layers"]
        patterned = [w for w in s["onnx"]["weights"].values() if w["pattern_2_4"]]
        assert all(w["zero_fraction"] >= 0.5 for w in patterned)
        assert 0.3 < s["onnx"]["total_zero_fraction"] < 0.5  # the dense patch-embed conv is counted too
    assert details(exported, "tiny_int8_sparse").sparsification["method"] == "sparsegpt"
    # Recheck one file independently of the recorded report.
    graph = onnx.load(str(exported / "models" / "tiny" / "fp16_sparse.onnx"))
    report = onnx_sparsity(graph)
    assert report["weights_2_4"] == details(exported, "tiny_fp16_sparse").sparsification["onnx"]["weights_2_4"]
    dense = onnx_sparsity(onnx.load(str(exported / "models" / "tiny" / "fp32.onnx")))
    assert dense["weights_2_4"] == 0 and dense["weights_checked"] == report["weights_checked"]
    assert has_2_4_pattern(np.array([[0, 1, 0, 2, 3, 0, 0, 4]]), axis=1)
    assert not has_2_4_pattern(np.array([[0, 1, 5, 2, 3, 0, 0, 4]]), axis=1)


def test_fp8_sparse_combines_both(exported):
    d = details(exported, "tiny_fp8_sparse")
    assert d.quantization["preset"] == "FP8_DEFAULT_CFG" and d.sparsification["method"] == "sparse_magnitude"
    assert d.onnx_audit["initializer_dtypes"].get("FLOAT8E4M3FN", 0) > 0


def test_calibration_from_an_image_folder(tmp_path, run_cli):
    from PIL import Image

    images = tmp_path / "images" / "class_a"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (180, 200, 3), dtype=np.uint8)).save(images / f"{i}.png")
    (images / "notes.txt").write_text("ignored")
    catalog = write_catalog(tmp_path / "ws", CATALOG.replace("samples = 8", f'samples = 4\ndirectory = "{images.parent}"'))
    result = run_cli(catalog, "export", "--engine", "tiny_int8")
    assert result.exit_code == 0, result.err
    d = details(catalog.parent, "tiny_int8")
    assert d.calibration["source"] == f"images in {images.parent}" and d.calibration["samples"] == 4
    assert d.accuracy["samples"] == 4
    # Different calibration data is a different export.
    (images / "4.png").unlink()
    Image.fromarray(np.zeros((180, 200, 3), dtype=np.uint8)).save(images / "0.png")
    again = run_cli(catalog, "export", "--engine", "tiny_int8")
    assert "didn't change" not in again.err


def test_empty_or_unreadable_calibration_folder(tmp_path, run_cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    catalog = write_catalog(tmp_path / "ws", CATALOG.replace("samples = 8", f'samples = 8\ndirectory = "{empty}"'))
    result = run_cli(catalog, "export", "--engine", "tiny_int8")
    assert result.exit_code == 1 and "holds no images" in result.err
    (empty / "broken.jpg").write_bytes(b"not an image")
    result = run_cli(catalog, "export", "--engine", "tiny_int8")
    assert result.exit_code == 1 and "cannot read calibration image" in result.err and "broken.jpg" in result.err
    assert not (tmp_path / "ws" / "models" / "tiny" / "int8.onnx").exists()


def test_weights_over_the_onnx_size_limit_are_refused_clearly(tmp_path, run_cli, monkeypatch):
    import pipeline.stages.quantized_onnx

    monkeypatch.setattr(pipeline.stages.quantized_onnx, "PROTOBUF_LIMIT_BYTES", 1000)  # test_vit's weights are 1.5 MB
    catalog = write_catalog(tmp_path / "ws", CATALOG)
    result = run_cli(catalog, "export", "--engine", "tiny_int8")
    assert result.exit_code == 1 and "exceed 2 GB" in result.err
    assert not list((tmp_path / "ws" / "models").rglob("*.onnx*"))


def test_calib_dir_option_overrides_the_catalog(tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", CATALOG)
    result = run_cli(catalog, "export", "--engine", "tiny_int8", "--calib-dir", str(tmp_path / "missing"))
    assert result.exit_code == 1 and "missing does not exist" in result.err


def test_block_format_exclusions_are_found_by_rule():
    import torch.nn as nn

    from pipeline.models.torch_import import import_timm
    from pipeline.stages.quantized_layers import classifier_head, plan_exclusions

    timm = import_timm()
    vit = timm.create_model("test_vit")
    excluded, overridden = plan_exclusions(vit, "nvfp4", "exclude")
    assert set(excluded) == {"patch_embed.proj", "head"}
    assert "convolution" in excluded["patch_embed.proj"] and "classifier head" in excluded["head"]
    excluded, overridden = plan_exclusions(vit, "mxfp8", "fp8")
    assert set(excluded) == {"head"} and set(overridden) == {"patch_embed.proj"}
    assert plan_exclusions(vit, "int8", "exclude") == ({}, {})
    # Not a ViT path: any model's convolutions and last classifier are found.
    resnet = timm.create_model("test_resnet")
    excluded, _ = plan_exclusions(resnet, "nvfp4", "exclude")
    assert classifier_head(resnet) in excluded
    assert sum(isinstance(m, nn.Conv2d) for m in resnet.modules()) == len(excluded) - 1


def test_a_model_without_sparsifiable_layers_is_refused():
    import torch.nn as nn

    from pipeline.running.errors import PipelineError
    from pipeline.stages.sparsify import sparsify_model

    with pytest.raises(PipelineError, match="no layer of this model could be 2:4-sparsified"):
        sparsify_model(nn.Sequential(nn.Linear(3, 5)), "sparse_magnitude", [])


def test_manifest_lists_the_export_in_json(exported):
    raw = json.loads((exported / "manifests" / "export" / "tiny_fp8_sparse.json").read_text())
    assert raw["export"]["details"]["sparsification"]["onnx"]["weights_checked"] >= 25


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_int8_export_gives_the_graph_modelopts_exporter_gives(tmp_path):
    """The INT8 fast path runs ModelOpt's steps itself; a ModelOpt release that changes them fails here."""
    import onnx
    import onnxruntime as ort
    import torch

    from pipeline.stages.quantized_onnx import INT8_EXPORTER, export_quantized

    model = quantized_test_vit("int8")
    sample = torch.randn(2, 3, 160, 160)
    exported = export_quantized(model, (sample,), tmp_path / "int8.onnx", 17, "fp32", "int8")
    assert exported.exporter == INT8_EXPORTER and exported.traced_batch is None
    ours = onnx.load(str(tmp_path / "int8.onnx"))
    theirs = onnx.load_from_string(modelopt_onnx(model, sample, 17, "fp32"))

    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in theirs.graph.node]
    assert ours.ir_version == theirs.ir_version and list(ours.opset_import) == list(theirs.opset_import)
    weights = lambda graph: {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer}
    ours_w, theirs_w = weights(ours), weights(theirs)
    assert ours_w.keys() == theirs_w.keys() and all(np.array_equal(ours_w[k], theirs_w[k]) for k in ours_w)
    feed = np.random.default_rng(1).standard_normal((2, 3, 160, 160), dtype=np.float32)
    run = lambda graph: ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {graph.graph.input[0].name: feed}
    )[0]
    np.testing.assert_array_equal(run(ours), run(theirs))


def test_modelopt_is_loaded_without_its_hugging_face_plugins(tmp_path):
    """They never apply to timm models and took seconds to import; calibration must not pull them in either."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    marker = tmp_path / "imported"
    fake = tmp_path / "site" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    script = (
        "import sys, torch\n"
        "from pipeline.stages.quantize import load_modelopt, quantize_model\n"
        "from pipeline.models.torch_import import import_timm\n"
        "load_modelopt('test')\n"
        "loaded = set(sys.modules)\n"
        "model = import_timm().create_model('test_vit').eval()\n"
        "quantize_model(model, 'int8', [torch.randn(2, 3, 160, 160)])\n"
        "print('imported during quantization:', sorted(m for m in set(sys.modules) - loaded if m.startswith('modelopt')))\n"
    )
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "imported during quantization: []" in result.stdout
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_shape_inference_without_weights_gives_modelopts_export_byte_for_byte():
    import torch

    from pipeline.stages.quantized_onnx import shape_inference_without_weights

    model = quantized_test_vit("fp8")
    sample = torch.randn(2, 3, 160, 160)
    plain = modelopt_onnx(model, sample, 19, "fp16")
    with shape_inference_without_weights():
        shimmed = modelopt_onnx(model, sample, 19, "fp16")
    assert len(plain) > 300_000 and shimmed == plain  # test_vit's weights: most are big enough to be stripped


def test_nvfp4_graph_is_fp16_with_every_fp4_matmul_reading_fp16(tmp_path, run_cli, monkeypatch):
    """The form TensorRT's strongly typed parser accepts (tests/runtimes/tensorrt_rtx/test_tensorrt_rtx.py builds it).

    ModelOpt's own NVFP4 graph mixes FP32 and FP16 at the FP4 matrix multiplies; the pipeline
    traces an FP16 model and gives each FP4 MatMul FP16 inputs (FP32 results where asked).
    """
    import onnx
    from onnx import TensorProto

    from tests.cpu_nvfp4 import nvfp4_without_cuda

    catalog = write_catalog(tmp_path, CATALOG + '[variants.nvfp4_fp32]\nprecision = "nvfp4"\nweights_dtype = "fp32"\n')
    with nvfp4_without_cuda(monkeypatch):
        result = run_cli(catalog, "export", "--engine", "tiny_nvfp4", "--engine", "tiny_nvfp4_fp32")
    assert result.exit_code == 0, result.err
    for variant, high in (("nvfp4", TensorProto.FLOAT16), ("nvfp4_fp32", TensorProto.FLOAT)):
        d = details(tmp_path, f"tiny_{variant}")
        assert d.quantization["weights_dtype"] == ("fp16" if variant == "nvfp4" else "fp32")
        assert d.onnx_audit["initializer_dtypes"]["FLOAT4E2M1"] > 0 and d.onnx_ops["trt::TRT_FP4DynamicQuantize"] > 0
        graph = onnx.load(str(tmp_path / "models" / "tiny" / f"{variant}.onnx")).graph
        # One input, the image: ModelOpt also lists the FP4 weights as inputs, and they are not.
        assert [(v.name, v.type.tensor_type.elem_type) for v in graph.input] == [("input", high)]
        producers = {out: node for node in graph.node for out in node.output}
        consumers = {}
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        # The quantized Linear layers (attention and MLP); attention's own products stay unquantized.
        matmuls = [n for n in graph.node if n.op_type == "MatMul" and ("attn/qkv" in n.name or "attn/proj" in n.name or "mlp/fc" in n.name)]
        assert matmuls
        for node in matmuls:
            for name in node.input:
                cast = producers[name]
                assert cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.FLOAT16, (node.name, name)
            if high == TensorProto.FLOAT:
                assert [(c.op_type, c.attribute[0].i) for c in consumers[node.output[0]]] == [("Cast", TensorProto.FLOAT)]


def test_an_fp16_graph_gets_one_type_where_fp32_and_fp16_meet():
    """ModernBERT's rotary embedding as ModelOpt's clean-up leaves an FP16-traced NVFP4 graph: `cos`
    cast up to FP32 meets FP16 `q` (the cast on `q` was dropped), and an FP32 constant scales an FP16
    product. TensorRT-RTX refused such a graph ("ElementWiseOperation PROD must have same input
    types ... Half and Float"); after the repair every operation has one type, the cast up is
    FP16, the constant gets a cast, and ONNX Runtime runs it to an FP16 output."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.stages.fp4_graph import _operands, _types, one_type_where_two_meet

    half = TensorProto.FLOAT16
    nodes = [
        helper.make_node("Cast", ["cos"], ["cos_fp32"], name="up", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["q", "cos_fp32"], ["rotated"], name="rotary"),
        helper.make_node("Mul", ["rotated", "scale"], ["scaled"], name="scale_mul"),
        helper.make_node("Cast", ["scaled"], ["out"], name="down", to=half),
    ]
    graph = helper.make_graph(
        nodes, "rotary",
        [helper.make_tensor_value_info("q", half, [2, 4]), helper.make_tensor_value_info("cos", half, [2, 4])],
        [helper.make_tensor_value_info("out", half, [2, 4])],
        [numpy_helper.from_array(np.array(0.5, dtype=np.float32), "scale")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    types = _types(model.graph)
    assert any(len({types(name) for name in _operands(node)}) == 2 for node in model.graph.node)  # mixed before

    assert one_type_where_two_meet(model) == 2  # the cast retargeted, one cast added for the constant
    types = _types(model.graph)
    assert all(len({types(name) for name in _operands(node)}) <= 1 for node in model.graph.node)
    assert next(a.i for n in model.graph.node if n.name == "up" for a in n.attribute if a.name == "to") == half
    onnx.checker.check_model(model, full_check=True)
    q, cos = np.full((2, 4), 2.0, np.float16), np.full((2, 4), 0.5, np.float16)
    (out,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"q": q, "cos": cos})
    assert out.dtype == np.float16 and np.allclose(out, 0.5)

"""Hugging Face transformers models through every stage: token inputs with dynamic batch and
sequence, measured at each shape point (pipeline/models/transformers.py).

A 2-layer BERT from BertConfig with random weights (no download) keeps each export a real one
that takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.models.module_tensors import tensors_by_name
from tests.conftest import CPU_TOOLCHAINS, catalog_head, tiny_bert_catalog, write_catalog
from tests.trtexec.test_trtexec_command import help_flags

pytest.importorskip("transformers", reason="the transformers family needs the transformers package (`make setup` installs it)")

BERT_CATALOG = (
    tiny_bert_catalog(["2x8", "3x24"], ["fp32", "fp16", "int8", "fp8"], defaults=["fp32", "int8"])
    + CPU_TOOLCHAINS
    + """
[toolchains."trt10.14"]
kind = "trtexec-container"
trt = "10.14.1"
image = "nvcr.io/nvidia/tensorrt:25.11-py3"

[toolchains."trt11.1"]
kind = "trtexec-container"
trt = "11.1.0"
dockerfile = "Dockerfile.tensorrt-tarball"
"""
)


def manifest(ws: Path, folder: str, name: str) -> dict:
    return json.loads((ws / "manifests" / folder / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def bert_ws(tmp_path_factory):
    """bert fp32/int8 on ONNX Runtime and fp32/fp16 on PyTorch eager, each at both shape points."""
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("bert"), BERT_CATALOG)
    assert main(["--catalog", str(catalog), "run"]) == 0
    assert main(["--catalog", str(catalog), "run", "--toolchain", "torch-eager", "--variant", "fp32", "--variant", "fp16"]) == 0
    return catalog.parent


def test_the_export_keeps_batch_and_sequence_dynamic_and_checks_parity_at_every_point(bert_ws):
    import onnx

    graph = onnx.load(str(bert_ws / "models" / "bert" / "fp32.onnx"))
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert inputs == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    assert [o.name for o in graph.graph.output] == ["last_hidden_state"]
    export = manifest(bert_ws, "export", "bert_fp32")["export"]["details"]
    assert export["exporter"].startswith("torch.onnx.export (torch.export-based")
    assert export["shape_points"] == ["2x8", "3x24"]
    assert set(export["parity_by_shape"]) == {"2x8", "3x24"}
    assert all(check["passed"] and check["cosine_similarity"] > 0.99999 for check in export["parity_by_shape"].values())
    assert export["inputs"][0] == {"name": "input_ids", "dims": ["batch", "sequence"], "dtype": "int64", "kind": "token_ids"}
    # The int8 graph is ModelOpt's (TorchScript), quantizing only Linear layers, still dynamic.
    int8 = manifest(bert_ws, "export", "bert_int8")["export"]["details"]
    assert int8["exporter"].startswith("torch.onnx.export (TorchScript) with ModelOpt")
    assert int8["quantization"]["quantized_layers"] > 0
    assert all("only Linear layers" in why for why in int8["quantization"]["excluded_layers"].values())
    assert all(check["passed"] for check in int8["parity_by_shape"].values())
    graph = onnx.load(str(bert_ws / "models" / "bert" / "int8.onnx"))
    assert "QuantizeLinear" in {node.op_type for node in graph.graph.node}
    assert [d.dim_param for d in graph.graph.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]


def test_reference_inputs_are_valid_tokens_and_masks_at_each_point(bert_ws):
    import numpy as np

    reference = manifest(bert_ws, "export", "bert_fp32")["export"]["details"]["reference"]
    point = reference["points"]["3x24"]
    ids, mask = (np.fromfile(bert_ws / entry["path"], dtype=entry["dtype"]).reshape(entry["shape"]) for entry in point["inputs"])
    assert ids.shape == mask.shape == (3, 24)
    assert 0 <= ids.min() and ids.max() < 512  # inside the vocabulary
    assert set(np.unique(mask)) <= {0, 1} and mask[0].all() and not mask.all()  # later sequences padded
    assert point["output"]["shape"] == [3, 24, 32]


def test_every_shape_point_is_profiled_on_its_own_with_tokens_per_second(bert_ws):
    for toolchain, variants in (("onnxruntime", ("fp32", "int8")), ("torch-eager", ("fp32", "fp16"))):
        for variant in variants:
            engine = manifest(bert_ws, toolchain, f"bert_{variant}")
            assert engine["build"]["params"]["shape_range"] == {"min": "2x8", "opt": "3x24", "max": "3x24"}
            assert engine["profile"] is None  # the engine's own manifest holds its build; each point its profile
            for shape, (batch, sequence) in (("2x8", (2, 8)), ("3x24", (3, 24))):
                point = manifest(bert_ws, toolchain, f"bert_{variant}@{shape}")
                assert point["shape"] == shape and point["build"] == engine["build"]
                details = point["profile"]["details"]
                assert details["batch_size"] == batch and details["sample_unit"] == "seq"
                assert details["input_shapes"] == {"input_ids": [batch, sequence], "attention_mask": [batch, sequence]}
                assert details["tokens_per_s"] == pytest.approx(details["throughput_qps"] * batch * sequence)
                accuracy = details["accuracy"]
                assert accuracy["cosine_similarity"] >= accuracy["cosine_floor"], (toolchain, variant, shape)
                assert accuracy["top1_agreement"] is None  # hidden states are not classes


def test_compare_has_one_row_per_shape_point_and_compares_only_within_a_shape(bert_ws, run_cli):
    result = run_cli(bert_ws / "pipeline.toml", "compare", "--format", "json")
    assert result.exit_code == 0, result.err
    rows = json.loads(result.out)["rows"]
    assert sorted((r["toolchain"], r["variant"], r["shape"]) for r in rows) == sorted(
        (t, v, s) for t, vs in (("onnxruntime", ("fp32", "int8")), ("torch-eager", ("fp32", "fp16"))) for v in vs for s in ("2x8", "3x24")
    )
    by_key = {(r["toolchain"], r["variant"], r["shape"]): r for r in rows}
    for (toolchain, variant, shape), row in by_key.items():
        assert row["tokens_per_s"] > 0 and row["sample_unit"] == "seq"
        base = by_key[(toolchain, "fp32", shape)]
        assert row["speedup"] == pytest.approx(base["median_ms"] / row["median_ms"])
        if variant == "fp32":
            eager = by_key[("torch-eager", "fp32", shape)]
            assert row["vs_baseline_toolchain"] == pytest.approx(eager["median_ms"] / row["median_ms"])
    table = run_cli(bert_ws / "pipeline.toml", "compare", "--wide")
    assert table.exit_code == 0, table.err
    header = next(line for line in table.out.splitlines() if "median ms" in line)
    assert "shape" in header and "tokens/s" in header and "seq/s" in header and "img/s" not in header
    detail = table.out.split("bert: medians of per-iteration latency")[1]  # the rows' table, after the answer and the sweep
    assert sum("3×24" in line for line in detail.splitlines()) == 4


def test_fp8_export_writes_tensorrt_qdq_on_a_dynamic_graph(tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG)
    result = run_cli(catalog, "export", "--engine", "bert_fp8")
    assert result.exit_code == 0, result.err
    details = manifest(catalog.parent, "export", "bert_fp8")["export"]["details"]
    assert any(op.startswith("trt::") for op in details["onnx_ops"])
    assert "TensorRT-only operators" in details["parity_skipped"]
    assert [i["dims"] for i in details["inputs"]] == [["batch", "sequence"]] * 2


@pytest.mark.parametrize("version", ["10.14", "11.1"])
def test_dry_runs_print_the_optimization_profile_and_one_point_per_profile(version, tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG)
    build = run_cli(catalog, "build", "--engine", "bert_fp16", "--trt", version, "--dry-run")
    assert build.exit_code == 0, build.err
    line = next(line for line in build.out.splitlines() if "trtexec --onnx" in line)
    for flag, shape in (("--minShapes", "2x8"), ("--optShapes", "3x24"), ("--maxShapes", "3x24")):
        assert f"{flag}=input_ids:{shape},attention_mask:{shape}" in line
    argv = line[line.index("trtexec ") :].split()
    full = {"10.14": "10.14.1", "11.1": "11.1"}[version]
    assert {arg.split("=", 1)[0] for arg in argv[1:]} <= help_flags(full)
    profile = run_cli(catalog, "profile", "--engine", "bert_fp16", "--trt", version, "--dry-run")
    assert profile.exit_code == 0, profile.err
    runs = [line for line in profile.out.splitlines() if "trtexec --loadEngine" in line]
    assert [run.split("--shapes=")[1].split()[0] for run in runs] == [
        "input_ids:2x8,attention_mask:2x8",
        "input_ids:3x24,attention_mask:3x24",
    ]
    assert "bert_fp16@3x24.times.json" in runs[1]


def test_a_torch_engine_of_a_transformer_loads_again_in_a_new_runtime(bert_ws):
    """The engine file describes the model by family and settings: a fresh runtime (a later
    command) rebuilds it at another shape point and gets the same outputs as the profile did."""
    from pipeline.measuring.accuracy import ReferenceBatch
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime, load_catalog

    catalog = load_catalog(bert_ws / "pipeline.toml")
    runtime = create_runtime("torch-eager", catalog.toolchain("torch-eager"), Reporter(), bert_ws)
    details = manifest(bert_ws, "export", "bert_fp32")["export"]["details"]
    from pipeline.manifest import ExportDetails

    export = ExportDetails.model_validate(details)
    for shape in ("3x24", "2x8"):
        reference = ReferenceBatch.from_export(export, bert_ws, shape)
        run = runtime.run_reference(bert_ws / "engines" / "torch-eager" / "bert_fp32.pt", reference)
        import numpy as np

        expected = reference.output.as_float32()
        assert np.allclose(run.outputs["last_hidden_state"], expected, atol=1e-4), shape


# --- bad input ---------------------------------------------------------------------------------------


SHAPES = 'shapes = ["2x8", "3x24"]'


@pytest.mark.parametrize(
    ("old", "new", "message", "tip"),
    [
        ('"BertModel"', '"BertModle"', "has no model class 'BertModle'", "did you mean 'BertModel'"),
        ("hidden_size = 32,", "hiden_size = 32,", "BertConfig has no key(s) 'hiden_size'", "'hiden_size' → 'hidden_size'"),
        (SHAPES, 'shapes = ["2x8", "3x100"]', "longer than the model's max_position_embeddings (64)", "at most 64"),
        (SHAPES, 'shapes = ["2x8x4"]', "has 3 size(s), but the model's dynamic axes are batch × sequence", "one size per axis"),
        (SHAPES, SHAPES + '\nshape_range = { min = "1x8", opt = "2x8", max = "2x16" }', "lie outside the engines' shape_range", "widen"),
    ],
    ids=["unknown-class", "unknown-config-key", "sequence-too-long", "wrong-shape", "outside-range"],
)
def test_bad_models_are_refused_with_what_to_do(old, new, message, tip, tmp_path, run_cli):
    assert old in BERT_CATALOG
    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG.replace(old, new, 1))
    result = run_cli(catalog, "run", "--variant", "fp32")
    assert result.exit_code == 2, result.err
    assert message in result.err and tip in result.err
    assert "Traceback" not in result.err
    assert not (catalog.parent / "models" / "bert" / "fp32.onnx").exists()


def test_a_bad_model_setting_failing_every_engine_is_a_usage_error_its_hint_said_once(tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG.replace("hidden_size = 32,", "hiden_size = 32,", 1))
    result = run_cli(catalog, "run", "--variant", "fp32", "--variant", "fp16", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    assert result.exit_code == 2, result.err
    assert result.err.count("BertConfig has no key(s) 'hiden_size'") == 4
    assert result.err.count("'hiden_size' → 'hidden_size'") == 1 and "Traceback" not in result.err


def test_a_config_key_the_class_sets_by_a_property_is_taken(tmp_path):
    """transformers 5's BertConfig keeps num_labels as a property (its dict holds id2label):
    still a key a catalog may set."""
    from pipeline.models import model_source
    from pipeline.runtimes import load_catalog

    text = BERT_CATALOG.replace('transformers = "BertModel"', 'transformers = "BertForSequenceClassification"')
    catalog = load_catalog(write_catalog(tmp_path, text.replace("hidden_size = 32,", "hidden_size = 32, num_labels = 5,", 1)))
    source = model_source("bert", catalog.model("bert"), tmp_path)
    assert source.model_config(source.model_class()).num_labels == 5
    assert source.create().classifier.out_features == 5


def test_a_local_folder_needs_config_json_and_code_of_its_own_is_refused(tmp_path, run_cli):
    folder = tmp_path / "ws" / "my-bert"
    folder.mkdir(parents=True)
    text = BERT_CATALOG.replace('transformers = "BertModel"', 'transformers = "BertModel"\npath = "my-bert"')
    catalog = write_catalog(tmp_path / "ws", text)
    result = run_cli(catalog, "export", "--engine", "bert_fp32")
    assert result.exit_code == 2 and "has no config.json" in result.err, result.err
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "auto_map": {"AutoModel": "modeling_evil.EvilModel"}}))
    result = run_cli(catalog, "export", "--engine", "bert_fp32")
    assert result.exit_code == 2 and "trust_remote_code) is refused" in result.err, result.err


def test_a_local_folder_with_config_and_weights_is_used_as_saved(tmp_path, run_cli):
    import torch

    from pipeline.models.transformers import import_transformers

    BertConfig, BertModel = import_transformers().BertConfig, import_transformers().BertModel  # noqa: N806 — their names
    folder = tmp_path / "ws" / "my-bert"
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=300, max_position_embeddings=64
    )
    torch.manual_seed(7)
    BertModel(config).save_pretrained(folder)
    text = BERT_CATALOG.replace('transformers = "BertModel"', 'transformers = "BertModel"\npath = "my-bert"').replace(
        "config = { hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 2, intermediate_size = 64, vocab_size = 512, max_position_embeddings = 64 }\n",
        "",
    )
    catalog = write_catalog(tmp_path / "ws", text)
    result = run_cli(catalog, "run", "--variant", "fp32")
    assert result.exit_code == 0, result.err
    export = manifest(catalog.parent, "export", "bert_fp32")["export"]
    assert {"my-bert/config.json", "my-bert/model.safetensors"} <= set(export["params"]["files"])  # pinned by content
    import numpy as np

    ids = export["details"]["reference"]["points"]["3x24"]["inputs"][0]
    assert np.fromfile(catalog.parent / ids["path"], dtype="int64").max() < 300  # the folder's vocabulary


def test_calibration_images_are_refused_for_a_transformer(tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG)
    (tmp_path / "images").mkdir()
    result = run_cli(catalog, "export", "--engine", "bert_int8", "--calib-dir", str(tmp_path / "images"))
    assert result.exit_code == 2, result.err
    assert "calibrates on seeded inputs of its own" in result.err


def test_the_catalog_names_what_a_model_table_lacks(tmp_path, run_cli):
    text = BERT_CATALOG.replace('transformers = "BertModel"', 'transfomers = "BertModel"')
    result = run_cli(write_catalog(tmp_path / "ws", text), "models")
    assert result.exit_code == 2
    assert "models.bert: names no model: did you mean 'transformers'?" in result.err
    result = run_cli(write_catalog(tmp_path / "ws2", BERT_CATALOG.replace(SHAPES, "")), "models")
    assert result.exit_code == 2
    assert "models.bert: a transformers model is measured at shape points" in result.err, result.err


@pytest.mark.rtx
def test_tensorrt_rtx_builds_the_transformer_for_its_shape_range(rtx_cache, tmp_path, run_cli):
    """A real TensorRT-RTX 1.7 build, ahead of time for SM89 and SM120, with the optimization
    profile of the model's shape points (it cannot run here: no GPU)."""
    from tests.conftest import RTX_TOOLCHAINS

    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG + RTX_TOOLCHAINS)
    for variant in ("fp16", "fp8"):
        args = ("build", "--engine", f"bert_{variant}", "--toolchain", "trt-rtx1.7", "--arch", "sm89", "--arch", "sm120")
        result = run_cli(catalog, *args)
        assert result.exit_code == 0, result.err
        build = manifest(catalog.parent, "trt-rtx1.7", f"bert_{variant}")["build"]
        assert build["status"] == "done", build["reason"]
        assert build["params"]["shape_range"] == {"min": "2x8", "opt": "3x24", "max": "3x24"}
        argv = " ".join(build["command"])
        assert "--shape-range input_ids=2x8/3x24/3x24 --shape-range attention_mask=2x8/3x24/3x24" in argv
        assert build["details"]["compiler"]["targets"] == ["SM89", "SM120"] or set(build["details"]["settings"]["targets"]) == {
            "sm89",
            "sm120",
        }
        assert (catalog.parent / "engines" / "trt-rtx1.7" / f"bert_{variant}.engine").stat().st_size > 0
    dry = run_cli(catalog, "profile", "--engine", "bert_fp16", "--toolchain", "trt-rtx1.7", "--arch", "sm120", "--dry-run")
    assert dry.exit_code == 0, dry.err


@pytest.mark.rtx
def test_an_nvfp4_transformer_with_dynamic_sequence_builds_for_sm120(rtx_cache, tmp_path, run_cli, monkeypatch):
    """ModelOpt's block-format graph of BERT reshapes the attention output to (batch, sequence, -1);
    TensorRT must know the quantized axis' size when it builds. The export writes it out
    (quantized_onnx.fix_block_axes); without that, TensorRT-RTX refuses the graph (as it did the NVFP4
    and MXFP8 exports of the lent H100)."""
    import pipeline.stages.quantized_onnx
    from tests.conftest import RTX_TOOLCHAINS
    from tests.cpu_nvfp4 import nvfp4_without_cuda

    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG + '[variants.nvfp4]\nprecision = "nvfp4"\n' + RTX_TOOLCHAINS)
    args = ("build", "--engine", "bert_nvfp4", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
    with nvfp4_without_cuda(monkeypatch):
        result = run_cli(catalog, *args)
        assert result.exit_code == 0, result.err
        build = manifest(catalog.parent, "trt-rtx1.7", "bert_nvfp4")["build"]
        assert build["status"] == "done" and build["details"]["precision_audit"]["intended_found"] is True
        assert "--shape-range input_ids=2x8/3x24/3x24" in " ".join(build["command"])

        monkeypatch.setattr(pipeline.stages.quantized_onnx, "fix_block_axes", lambda model, sizes, axes: 0)
        refused = run_cli(catalog, *args, "--force")
    assert refused.exit_code == 1
    assert "attention/output/dense/input_quantizer/TRT_FP4DynamicQuantize" in refused.err
    assert "The input extent in the blocked axis should be known at build time" in refused.err


# --- a user's own ONNX ---------------------------------------------------------------------------------


def user_onnx(path: Path) -> None:
    """What a user brings: a small BERT exported plainly, two int64 inputs with named dynamic axes."""
    import torch

    from pipeline.models.transformers import import_transformers

    BertConfig, BertModel = import_transformers().BertConfig, import_transformers().BertModel  # noqa: N806 — their names
    torch.manual_seed(3)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=200, max_position_embeddings=64
    )
    model = BertModel(config).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids, mask = torch.randint(0, 200, (2, 8)), torch.ones(2, 8, dtype=torch.int64)
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        Encoder().eval(), (ids, mask), str(path), input_names=["input_ids", "attention_mask"], output_names=["hidden"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes}, opset_version=17, dynamo=False,
    )  # fmt: skip


ONNX_MODEL = """
[models.mine]
onnx = "encoder.onnx"
shapes = ["2x8", "4x32"]
"""


def test_a_users_onnx_goes_through_build_profile_and_compare_without_an_export(tmp_path, run_cli):
    import numpy as np

    ws = tmp_path / "ws"
    catalog = write_catalog(ws, BERT_CATALOG.replace('models = ["bert"]', 'models = ["mine"]') + ONNX_MODEL)
    user_onnx(ws / "encoder.onnx")
    listed = run_cli(catalog, "models")
    assert "ONNX file encoder.onnx" in listed.out and "2x8, 4x32 (batch × sequence)" in listed.out
    result = run_cli(catalog, "run", "--model", "mine")
    assert result.exit_code == 0, result.err
    export = manifest(ws, "export", "mine_fp32")["export"]
    assert export["details"]["exporter"] == "none: encoder.onnx taken as it is"
    assert export["params"]["files"] == {"encoder.onnx": export["params"]["files"]["encoder.onnx"]}
    # Its constants folded before TensorRT reads it, and checked at each point against the file as given.
    sanitized = export["details"]["sanitized"]
    assert sanitized["nodes_after"] < sanitized["nodes_before"]
    assert sorted(export["details"]["parity_by_shape"]) == ["2x8", "4x32"] and export["details"]["parity"]["passed"]
    ids = export["details"]["reference"]["points"]["4x32"]["inputs"][0]
    assert np.fromfile(ws / ids["path"], dtype="int64").max() < 200  # below the embedding table's rows, read from the graph
    for shape in ("2x8", "4x32"):
        details = manifest(ws, "onnxruntime", f"mine_fp32@{shape}")["profile"]["details"]
        assert details["accuracy"]["cosine_similarity"] > 0.9999 and details["tokens_per_s"] > 0
    # The other variants need a PyTorch model: recorded as skipped, with the reason.
    int8 = manifest(ws, "onnxruntime", "mine_int8@2x8")
    assert int8["profile"]["status"] == "skipped" and "a user's ONNX is built as it is" in int8["profile"]["reason"]
    rows = json.loads(run_cli(catalog, "compare", "--format", "json").out)["rows"]
    assert sorted((r["variant"], r["shape"]) for r in rows if r["median_ms"]) == [("fp32", "2x8"), ("fp32", "4x32")]
    assert all(r["status"].startswith("skipped: a user's ONNX") for r in rows if r["variant"] != "fp32")
    assert len(rows) == 8  # fp32, fp16, int8 and fp8 at both points
    eager = run_cli(catalog, "build", "--engine", "mine_fp32", "--toolchain", "torch-eager")
    assert eager.exit_code == 0 and "has no PyTorch model to run" in eager.err
    dry = run_cli(catalog, "build", "--engine", "mine_fp32", "--trt", "10.14", "--dry-run")
    assert "--minShapes=input_ids:2x8,attention_mask:2x8" in dry.out and "--maxShapes=input_ids:4x32,attention_mask:4x32" in dry.out


def test_a_users_onnx_without_shapes_for_its_axes_is_refused_with_its_inputs(tmp_path, run_cli):
    ws = tmp_path / "ws"
    catalog = write_catalog(ws, BERT_CATALOG + ONNX_MODEL.replace('shapes = ["2x8", "4x32"]\n', ""))
    user_onnx(ws / "encoder.onnx")
    result = run_cli(catalog, "export", "--engine", "mine_fp32")
    assert result.exit_code == 2, result.err
    assert "gives no shape for the graph's dynamic axes batch × sequence" in result.err
    assert "input_ids [batch, sequence]; attention_mask [batch, sequence]" in result.err
    catalog.write_text(
        catalog.read_text().replace('onnx = "encoder.onnx"', 'onnx = "encoder.onnx"\naxes = ["batch", "tokens"]\nshapes = ["2x8"]')
    )
    result = run_cli(catalog, "export", "--engine", "mine_fp32")
    assert result.exit_code == 2 and "axes ['batch', 'tokens'] contradict the graph" in result.err, result.err
    catalog.write_text(catalog.read_text().replace('onnx = "encoder.onnx"', 'onnx = "missing.onnx"'))
    result = run_cli(catalog, "export", "--engine", "mine_fp32")
    assert result.exit_code == 2 and "missing.onnx does not exist" in result.err, result.err


def test_a_static_model_gets_an_engine_per_shape_point(tmp_path, run_cli):
    text = BERT_CATALOG.replace(SHAPES, SHAPES + "\nstatic = true")
    catalog = write_catalog(tmp_path / "ws", text)
    result = run_cli(catalog, "run", "--variant", "fp32")
    assert result.exit_code == 0, result.err
    ws = catalog.parent
    assert sorted(p.name for p in (ws / "engines" / "onnxruntime").glob("*.onnx")) == ["bert_fp32@2x8.onnx", "bert_fp32@3x24.onnx"]
    assert not (ws / "manifests" / "onnxruntime" / "bert_fp32.json").exists()
    for shape in ("2x8", "3x24"):
        point = manifest(ws, "onnxruntime", f"bert_fp32@{shape}")
        assert point["build"]["params"]["shape_range"] == {"min": shape, "opt": shape, "max": shape}
        assert point["profile"]["status"] == "done" and point["profile"]["inputs"][0]["path"].endswith(f"bert_fp32@{shape}.onnx")
    dry = run_cli(catalog, "profile", "--engine", "bert_fp16", "--trt", "10.14", "--dry-run")
    assert dry.exit_code == 0, dry.err
    for shape in ("2x8", "3x24"):
        assert f"--saveEngine=/work/engines/trt10.14/bert_fp16@{shape}.engine" in dry.out
        assert f"--minShapes=input_ids:{shape},attention_mask:{shape}" in dry.out
        assert f"--loadEngine=/work/engines/trt10.14/bert_fp16@{shape}.engine" in dry.out


def test_the_shipped_catalog_has_bert_tiny_and_modernbert_ready(tmp_path, run_cli):
    import shutil

    from tests.conftest import REPO_ROOT

    shutil.copy(REPO_ROOT / "pipeline.toml", tmp_path / "pipeline.toml")
    catalog = tmp_path / "pipeline.toml"
    listed = run_cli(catalog, "models")
    assert "transformers ModernBertModel (sdpa attention)" in listed.out
    assert "2x512, 4x512, 2x2048, 4x2048, 2x4096, 4x4096 (batch × sequence)" in listed.out
    build = run_cli(catalog, "build", "--engine", "modernbert_bf16", "--trt", "10.14", "--dry-run")
    assert build.exit_code == 0, build.err
    for flag, shape in (("--minShapes", "2x512"), ("--optShapes", "4x2048"), ("--maxShapes", "4x4096")):
        assert f"{flag}=input_ids:{shape},attention_mask:{shape}" in build.out
    profile = run_cli(catalog, "profile", "--engine", "modernbert_fp16", "--toolchain", "torch-eager", "--dry-run")
    assert profile.exit_code == 0, profile.err
    assert sum("profile: torch" in line for line in profile.out.splitlines()) == 6
    assert "at input_ids 4×4096, attention_mask 4×4096" in profile.out


def test_quantization_calibrates_on_the_users_tokens_checked_against_the_vocabulary(tmp_path, run_cli):
    import numpy as np

    text = BERT_CATALOG.replace(SHAPES, SHAPES + '\ncalibration_tokens = "tokens.npy"')
    catalog = write_catalog(tmp_path / "ws", text)
    tokens = np.random.default_rng(0).integers(0, 512, size=(12, 16))
    np.save(catalog.parent / "tokens.npy", tokens)
    result = run_cli(catalog, "export", "--engine", "bert_int8", "--calib-samples", "10")
    assert result.exit_code == 0, result.err
    export = manifest(catalog.parent, "export", "bert_int8")["export"]
    assert export["details"]["calibration"]["source"] == "token ids from tokens.npy"
    assert export["details"]["accuracy"]["samples"] == 10
    assert "tokens.npy" in export["params"]["files"]
    tokens[7, 3] = 512
    np.save(catalog.parent / "tokens.npy", tokens)
    result = run_cli(catalog, "export", "--engine", "bert_int8")
    assert result.exit_code == 2, result.err
    assert "token id 512 at row 7, position 3 of" in result.err and "outside the vocabulary (0 to 511)" in result.err


def test_a_users_onnx_is_checked_against_the_reference_the_user_gives(tmp_path, run_cli):
    import numpy as np
    import onnxruntime as ort

    ws = tmp_path / "ws"
    catalog = write_catalog(ws, BERT_CATALOG + ONNX_MODEL + 'reference = "ref"\n')
    user_onnx(ws / "encoder.onnx")
    (ws / "ref").mkdir()
    session = ort.InferenceSession(str(ws / "encoder.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for batch, sequence in ((2, 8), (4, 32)):
        ids, mask = rng.integers(0, 200, (batch, sequence)), np.ones((batch, sequence), dtype=np.int64)
        (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
        np.savez(ws / "ref" / f"{batch}x{sequence}.npz", input_ids=ids, attention_mask=mask, hidden=hidden * (1 if batch == 2 else -1))
    result = run_cli(catalog, "run", "--engine", "mine_fp32")
    assert result.exit_code == 0, result.err
    export = manifest(ws, "export", "mine_fp32")["export"]
    assert export["details"]["reference"]["description"] == "the inputs and outputs given in ref, at each shape point"
    assert {"ref/2x8.npz", "ref/4x32.npz"} <= set(export["params"]["files"])
    good = manifest(ws, "onnxruntime", "mine_fp32@2x8")["profile"]["details"]["accuracy"]
    bad = manifest(ws, "onnxruntime", "mine_fp32@4x32")["profile"]["details"]["accuracy"]
    assert good["cosine_similarity"] > 0.9999 and good["warning"] is None
    assert bad["cosine_similarity"] < -0.99 and bad["warning"]  # the given outputs disagree: said so
    (ws / "ref" / "4x32.npz").unlink()
    result = run_cli(catalog, "export", "--engine", "mine_fp32")
    assert result.exit_code == 2 and "has no 4x32.npz" in result.err, result.err


LLAMA_CATALOG = (
    catalog_head(["llama"], ["fp32"])
    + """
[models.llama]
transformers = "LlamaForCausalLM"
config = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16, vocab_size = 512, max_position_embeddings = 256, rope_parameters = { rope_type = "llama3", rope_theta = 500000.0, factor = 32.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 64 } }
shapes = ["2x16", "3x40"]

[variants.fp32]
precision = "fp32"
"""
    + CPU_TOOLCHAINS
)


def test_a_llama_decoder_is_measured_as_a_prefill_with_dynamic_batch_and_sequence(tmp_path, run_cli):
    """A 2-layer Llama (grouped-query attention, Llama-3 RoPE) through export, ONNX Runtime,
    PyTorch eager and compare: the output is the last position's logits, the prompts are padded
    on the left, and the next token agrees with the FP32 model's."""
    import numpy as np
    import onnx

    catalog = write_catalog(tmp_path / "ws", LLAMA_CATALOG)
    result = run_cli(catalog, "run", "--model", "llama", "--variant", "fp32", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    assert result.exit_code == 0, result.err
    ws = catalog.parent
    graph = onnx.load(str(ws / "models" / "llama" / "fp32.onnx"))
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert dims == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    (output,) = graph.graph.output
    assert output.name == "next_token_logits"
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 512]
    export = manifest(ws, "export", "llama_fp32")["export"]["details"]
    assert all(check["passed"] for check in export["parity_by_shape"].values()) and set(export["parity_by_shape"]) == {"2x16", "3x40"}
    point = export["reference"]["points"]["3x40"]
    assert point["output"]["shape"] == [3, 512]
    mask_entry = next(entry for entry in point["inputs"] if entry["name"] == "attention_mask")
    mask = np.fromfile(ws / mask_entry["path"], dtype=np.int64).reshape(3, 40)
    assert (mask[:, -1] == 1).all() and (mask[0] == 1).all()  # every prompt ends in a real token
    assert (mask[1:, 0] == 0).any()  # the later ones are padded on the left
    rows = json.loads(run_cli(catalog, "compare", "--format", "json").out)["rows"]
    assert len(rows) == 4
    for row in rows:
        assert row["median_ms"] > 0 and row["accuracy_cosine"] > 0.9999 and row["top1_agreement"] == 1.0, row


def test_a_cast_to_bf16_keeps_the_rotary_frequencies_in_fp32(tmp_path):
    """A Llama in bf16 as from_pretrained(dtype=bfloat16) loads it: weights bf16, the rotary
    embeddings' inverse frequencies FP32. model.to(bfloat16) would round them, and far into a
    sequence the angles with them: its logits drift from the FP32 model's."""
    import torch

    from pipeline.models import model_source
    from pipeline.runtimes import load_catalog

    catalog = load_catalog(
        write_catalog(tmp_path, LLAMA_CATALOG.replace("max_position_embeddings = 256", "max_position_embeddings = 2048"))
    )
    source = model_source("llama", catalog.model("llama"), tmp_path)
    fp32 = source.runnable(source.create())
    cast = source.cast(source.runnable(source.create()), torch.bfloat16)
    plain = source.runnable(source.create()).to(torch.bfloat16)
    assert {b.dtype for n, b in cast.named_buffers() if n.endswith("inv_freq")} == {torch.float32}
    assert {p.dtype for p in cast.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, 512, (1, 2000), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        reference = fp32(ids, mask)
        kept = torch.nn.functional.cosine_similarity(reference, cast(ids, mask).float()).item()
        rounded = torch.nn.functional.cosine_similarity(reference, plain(ids, mask).float()).item()
    assert kept > 0.999 and kept > rounded, (kept, rounded)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_model_read_back_from_its_weights_skips_initialising_them_and_is_the_same_model(family, tmp_path):
    """A PyTorch engine read back makes the model without initialising the weights its state dict
    replaces (seconds of a transformer's start in every process that reads one), and is the model
    it was: the same weights, the same buffers it computes itself (a Llama's rotary frequencies,
    which no state dict holds), the same outputs."""
    import torch

    from pipeline.models import model_source
    from pipeline.runtimes import load_catalog

    text = LLAMA_CATALOG if family == "llama" else BERT_CATALOG
    catalog = load_catalog(write_catalog(tmp_path, text))
    name = "llama" if family == "llama" else "bert"
    source = model_source(name, catalog.model(name), tmp_path)
    built = source.cast(source.runnable(source.create()), torch.bfloat16).eval()
    bare = source.cast(source.runnable(source.create_for_weights()), torch.bfloat16).eval()
    weights = {name: tensor for name, tensor in bare.state_dict().items() if tensor.is_floating_point()}
    assert any(not torch.equal(weights[name], tensor) for name, tensor in built.state_dict().items() if name in weights)
    bare.load_state_dict(built.state_dict())
    buffers = dict(built.named_buffers())
    assert set(buffers) == {name for name, _ in bare.named_buffers()}
    assert all(torch.equal(buffer, buffers[name]) and buffer.dtype == buffers[name].dtype for name, buffer in bare.named_buffers())
    ids = torch.randint(1, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(built(ids, mask), bare(ids, mask))


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_model_made_again_in_one_process_has_the_same_weights_without_initialising_them(family, tmp_path, monkeypatch):
    """A run makes its transformer for each export and each torch build: after the first, the
    same class, config and seed copy the first one's tensors in (parameters and buffers) instead of
    initialising them again, and give the same model; another seed is another model."""
    import torch

    from pipeline.models import model_source
    from pipeline.runtimes import load_catalog

    text = LLAMA_CATALOG if family == "llama" else BERT_CATALOG
    catalog = load_catalog(write_catalog(tmp_path, text))
    name = "llama" if family == "llama" else "bert"
    source = model_source(name, catalog.model(name), tmp_path)
    first = source.create()
    cls = type(first)
    initialised = []
    real = cls._init_weights
    monkeypatch.setattr(cls, "_init_weights", lambda self, module: initialised.append(module) or real(self, module))
    again = source.create()
    assert initialised == []
    tensors = tensors_by_name(first)
    assert tensors.keys() == tensors_by_name(again).keys()
    assert all(torch.equal(tensor, tensors[key]) for key, tensor in tensors_by_name(again).items())
    ids = torch.randint(1, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(source.runnable(first)(ids, torch.ones_like(ids)), source.runnable(again)(ids, torch.ones_like(ids)))
    reseeded = model_source(name, catalog.model(name).model_copy(update={"seed": catalog.model(name).seed + 1}), tmp_path).create()
    assert initialised, "another seed initialises its weights"
    assert any(not torch.equal(tensor, tensors[key]) for key, tensor in tensors_by_name(reseeded).items() if tensor.is_floating_point())


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_model_made_in_another_process_of_the_workspace_reads_its_weights_back_from_the_cache(family, tmp_path, monkeypatch):
    """What a process of the workspace initialised is kept in its .cache/weights/ (a re-run's
    export makes the very tensors again): a later process (this one, its own copy forgotten) reads
    them back instead of initialising them, and gets the same model; a file that is not what it
    should be is made again, the same."""
    import torch

    from pipeline.models import finished_writing, model_source
    from pipeline.models import transformers_weights as weights_module
    from pipeline.runtimes import load_catalog

    text = LLAMA_CATALOG if family == "llama" else BERT_CATALOG
    catalog = load_catalog(write_catalog(tmp_path, text))
    name = "llama" if family == "llama" else "bert"
    source = model_source(name, catalog.model(name), tmp_path)
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    first = tensors_by_name(source.create())
    finished_writing()  # a thread writes them; what a cluster task waits for before its workspace goes
    (written,) = (tmp_path / weights_module.WEIGHTS_FOLDER).glob("*.pt")
    monkeypatch.setattr(weights_module, "_last_seeded", {})  # another process: nothing made here yet
    cls = type(source.create_for_weights())
    initialised = []
    real = cls._init_weights
    monkeypatch.setattr(cls, "_init_weights", lambda self, module: initialised.append(module) or real(self, module))
    again = tensors_by_name(source.create())
    assert initialised == [], "read back, not initialised"
    assert again.keys() == first.keys() and all(torch.equal(tensor, first[key]) for key, tensor in again.items())
    written.unlink()  # a new file in its place: models read back map the old one's pages
    written.write_bytes(b"not weights")
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    remade = tensors_by_name(source.create())
    assert initialised, "a damaged file is made again"
    assert all(torch.equal(tensor, first[key]) for key, tensor in remade.items())
    finished_writing()


def _mapped_from(path: Path) -> list[tuple[int, int]]:
    """The address ranges this process maps ``path`` at (/proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(part, 16) for part in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def test_weights_read_back_from_the_cache_are_the_file_mapped_copy_on_write(tmp_path, monkeypatch):
    """A model read back from the workspace's cache is made around the file's tensors, mapped,
    not copied into memory of its own; a model that writes its weights in place (as sparsifying
    does) changes neither the file nor another model read from it."""
    import hashlib

    import torch

    from pipeline.models import finished_writing, model_source
    from pipeline.models import transformers_weights as weights_module
    from pipeline.runtimes import load_catalog

    catalog = load_catalog(write_catalog(tmp_path, BERT_CATALOG))
    source = model_source("bert", catalog.model("bert"), tmp_path)
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    first = {name: tensor.clone() for name, tensor in tensors_by_name(source.create()).items()}
    finished_writing()
    (written,) = (tmp_path / weights_module.WEIGHTS_FOLDER).glob("*.pt")
    digest = hashlib.sha256(written.read_bytes()).hexdigest()
    monkeypatch.setattr(weights_module, "_last_seeded", {})  # another process: read back, not made here
    one, other = source.create(), source.create()
    weight = next(tensor for tensor in tensors_by_name(one).values() if tensor.is_floating_point() and tensor.numel() > 1024)
    assert any(start <= weight.data_ptr() < end for start, end in _mapped_from(written.resolve())), "the file's pages, not a copy"
    with torch.no_grad():
        for parameter in one.parameters():
            parameter.zero_()
    assert all(torch.equal(tensor, first[name]) for name, tensor in tensors_by_name(other).items())
    assert all(torch.equal(tensor, first[name]) for name, tensor in tensors_by_name(source.create()).items())
    assert hashlib.sha256(written.read_bytes()).hexdigest() == digest


def test_a_torch_build_in_the_weights_own_type_holds_them_in_memory_of_its_own(tmp_path, monkeypatch):
    """An FP32 torch build of weights read back from the cache (a cast that makes no new tensor)
    holds its weights in memory of its own, not on the file's pages; the same values."""
    import torch

    from pipeline.models import finished_writing, model_source
    from pipeline.models import transformers_weights as weights_module
    from pipeline.runtimes import load_catalog
    from pipeline.runtimes.pytorch import cast_weights

    catalog = load_catalog(write_catalog(tmp_path, BERT_CATALOG))
    source = model_source("bert", catalog.model("bert"), tmp_path)
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    monkeypatch.setattr(cast_weights, "_last_cast", {})
    first = {name: tensor.clone() for name, tensor in tensors_by_name(source.create()).items()}
    finished_writing()
    (written,) = (tmp_path / weights_module.WEIGHTS_FOLDER).glob("*.pt")
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    _, model = cast_weights.cast_model(source, torch.float32)
    mapped = _mapped_from(written.resolve())
    for name, tensor in tensors_by_name(model.model).items():
        assert not any(start <= tensor.data_ptr() < end for start, end in mapped), name
        assert torch.equal(tensor, first[name]), name


def test_a_tied_model_made_again_stays_tied(tmp_path, monkeypatch):
    """A model whose output head is its input embedding (tie_word_embeddings) is tied when made
    without initialising its weights too — read back from the cache, copied in, or allocated for
    an engine's weights: an untied copy holds the embedding twice and writes one alone."""
    import torch

    from pipeline.models import finished_writing, model_source
    from pipeline.models import transformers_weights as weights_module
    from pipeline.runtimes import load_catalog

    text = LLAMA_CATALOG.replace("vocab_size = 512,", "vocab_size = 512, tie_word_embeddings = true,")
    catalog = load_catalog(write_catalog(tmp_path, text))
    source = model_source("llama", catalog.model("llama"), tmp_path)
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    made = source.create()
    finished_writing()
    monkeypatch.setattr(weights_module, "_last_seeded", {})
    read_back = source.create()
    (tmp_path / weights_module.WEIGHTS_FOLDER).joinpath(next((tmp_path / weights_module.WEIGHTS_FOLDER).glob("*.pt")).name).unlink()
    copied = source.create()  # this process's own copy, the file gone
    for model in (made, read_back, copied, source.create_for_weights()):
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert len(list(model.parameters())) == len(list(made.parameters()))
    with torch.no_grad():
        read_back.get_input_embeddings().weight.mul_(2)
    assert torch.equal(read_back.get_output_embeddings().weight, read_back.get_input_embeddings().weight)


def test_a_transformer_is_made_without_importing_timm_and_a_timm_model_with_it(tmp_path):
    """A model family imports its own libraries: timm (seconds on the lent GPUs' hosts) is never
    imported for a transformer, in a fresh interpreter as a run's is; a timm model has it."""
    import subprocess
    import sys

    from tests.conftest import TINY_CATALOG

    script = (
        "import sys\n"
        "from pipeline.models import model_source\n"
        "from pipeline.runtimes import load_catalog\n"
        "catalog = load_catalog(sys.argv[1])\n"
        "source = model_source(sys.argv[2], catalog.model(sys.argv[2]), sys.argv[3])\n"
        "source.import_libraries()\n"
        "imported = 'timm' in sys.modules\n"
        "source.create()\n"
        "print(imported, 'timm' in sys.modules)\n"
    )
    for name, text, expected in (("bert", BERT_CATALOG, "False False"), ("tiny", TINY_CATALOG, "True True")):
        folder = tmp_path / name
        folder.mkdir()
        catalog = write_catalog(folder, text)
        done = subprocess.run(
            [sys.executable, "-c", script, str(catalog), name, str(folder)], capture_output=True, text=True, cwd=Path(__file__).parents[2]
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split("\n")[-2] == expected, (name, done.stdout)


def test_a_models_second_variant_takes_its_fp32_references_from_the_first_export(tmp_path, run_cli, monkeypatch):
    """The variants of one model share their reference batches, so an export after the first in a
    process takes the FP32 outputs it made instead of running the FP32 model again: the files are
    the same. Another model's weights (another seed) run the FP32 model again."""
    from pipeline.stages import export_references
    from pipeline.stages.point_outputs import PointOutputs

    made = []
    real = PointOutputs.run
    monkeypatch.setattr(
        PointOutputs, "run", lambda self, label, feeds, forward, what: made.append((label, what)) or real(self, label, feeds, forward, what)
    )
    catalog = write_catalog(tmp_path, BERT_CATALOG)
    assert run_cli(catalog, "export", "--variant", "fp32", "--variant", "fp16").exit_code == 0
    references = [label for label, what in made if what == "the FP32 reference"]
    assert sorted(references) == ["2x8", "3x24"], "the FP32 model ran once at each point, for the first variant"
    folder = tmp_path / "models" / "bert"
    for point in ("2x8", "3x24"):
        assert (folder / f"fp32.ref-{point}.output.bin").read_bytes() == (folder / f"fp16.ref-{point}.output.bin").read_bytes()
    reseeded = write_catalog(
        tmp_path / "reseeded", BERT_CATALOG.replace('transformers = "BertModel"', 'transformers = "BertModel"\nseed = 7')
    )
    made.clear()
    assert run_cli(reseeded, "export", "--variant", "fp16").exit_code == 0
    assert sorted(label for label, what in made if what == "the FP32 reference") == ["2x8", "3x24"]
    # Outputs beyond the cap are not kept: the next variant runs the FP32 model again.
    monkeypatch.setattr(export_references, "KEPT_OUTPUT_BYTES", 0)
    monkeypatch.setattr(export_references, "_fp32_kept", {})
    made.clear()
    assert run_cli(reseeded, "export", "--variant", "fp32", "--variant", "int8").exit_code == 0
    assert sorted(label for label, what in made if what == "the FP32 reference") == ["2x8", "2x8", "3x24", "3x24"]


FLASH_CATALOG = (
    tiny_bert_catalog(["2x16", "2x24"], ["fp32"], defaults=["fp32"])
    + CPU_TOOLCHAINS
    + """
[toolchains.torch-sdpa-flash]
kind = "torch"
backend = "eager"
sdpa_backend = "flash"
"""
)


def test_a_kernel_pytorch_gives_up_on_at_the_reference_batch_is_that_points_refusal(tmp_path, run_cli, monkeypatch):
    """The flash SDPA kernel takes no padding mask: PyTorch on the H100 gives up with `No available
    kernel. Aborting execution.`, which a stand-in replays here (the CPU's flash kernel takes masks).
    The build prepares the model at 2×16 on a batch without padding, where flash runs; the
    reference batch at that point is padded, and at 2×24 both are. Each point records the refusal
    with PyTorch's reason — at 2×16 found by the reference check, after preparing — never a crash;
    torch-eager measures both."""
    import warnings

    import torch

    real = torch.nn.functional.scaled_dot_product_attention

    def flash_like(query, key, value, attn_mask=None, *args, **kwargs):
        masking = attn_mask is not None and not bool((attn_mask if attn_mask.dtype == torch.bool else attn_mask == 0).all())
        if masking and not torch.backends.cuda.math_sdp_enabled():  # the toolchain's sdpa_kernel([flash]) is in force
            warnings.warn(
                "Flash Attention does not support non-null attn_mask. (Triggered internally at sdp_utils_cpp.h:262.)", stacklevel=2
            )
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(query, key, value, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", flash_like)
    catalog = write_catalog(tmp_path / "ws", FLASH_CATALOG)
    result = run_cli(catalog, "run", "--model", "bert", "--toolchain", "torch-eager", "--toolchain", "torch-sdpa-flash")
    assert result.exit_code == 1, result.err  # a refusal, not an internal error (70)
    text = " ".join(result.err.split())
    reason = (
        "PyTorch cannot run scaled-dot-product attention with the flash kernel here: Flash Attention does not support non-null attn_mask."
    )
    assert reason in text
    ws = catalog.parent
    assert manifest(ws, "torch-sdpa-flash", "bert_fp32")["build"]["status"] == "done"  # prepared at 2×16 unpadded
    for point in ("2x16", "2x24"):
        profile = manifest(ws, "torch-sdpa-flash", f"bert_fp32@{point}")["profile"]
        assert profile["status"] == "failed" and reason in profile["reason"], point
        assert manifest(ws, "torch-eager", f"bert_fp32@{point}")["profile"]["status"] == "done"


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_torch_build_after_the_first_of_the_same_weights_and_precision_shares_its_tensors(family, tmp_path, monkeypatch):
    """TorchRuntime.build's model: the second build of one model's weights in one precision is a
    module made around the first one's cast tensors (runtimes/pytorch/cast_weights.py), nothing
    initialised or cast again, and is the model a fresh creation and cast make: every parameter
    and buffer equal in value and dtype (a Llama's rotary frequencies kept FP32), ties kept, the
    same outputs. Another precision, or weights read from a folder, are made afresh."""
    import torch

    from pipeline.models import model_source
    from pipeline.runtimes import load_catalog
    from pipeline.runtimes.pytorch import cast_weights

    text = LLAMA_CATALOG if family == "llama" else BERT_CATALOG
    catalog = load_catalog(write_catalog(tmp_path, text))
    name = "llama" if family == "llama" else "bert"
    source = model_source(name, catalog.model(name), tmp_path)
    monkeypatch.setattr(cast_weights, "_last_cast", {})
    _, first = cast_weights.cast_model(source, torch.bfloat16)
    casts = []
    real_cast = type(source).cast
    monkeypatch.setattr(type(source), "cast", lambda self, model, dtype: casts.append(dtype) or real_cast(self, model, dtype))
    _, again = cast_weights.cast_model(source, torch.bfloat16)
    assert casts == [] and again is not first
    fresh = real_cast(source, source.runnable(source.create()), torch.bfloat16)
    made = tensors_by_name(again)
    assert made.keys() == tensors_by_name(fresh).keys()
    for key, tensor in tensors_by_name(fresh).items():
        assert made[key].dtype == tensor.dtype and torch.equal(made[key], tensor), key
    assert made[key].data_ptr() == tensors_by_name(first)[key].data_ptr()  # shared, not copied
    ties = {id(p) for p in fresh.parameters()}, {id(p) for p in again.parameters()}
    assert len(ties[0]) == len(ties[1])
    ids = torch.randint(1, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fresh.eval()(ids, torch.ones_like(ids)), again.eval()(ids, torch.ones_like(ids)))
    cast_weights.cast_model(source, torch.float16)
    assert casts == [torch.float16]
    monkeypatch.setattr(type(source), "weights_key", lambda self: None)
    cast_weights.cast_model(source, torch.bfloat16)
    assert casts == [torch.float16, torch.bfloat16]

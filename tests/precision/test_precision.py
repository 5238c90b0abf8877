"""`pipeline sensitivity` and `pipeline plan`, and `exclude` in a variant, from the command line.

The planted fault (examples/planted_fault.py): one Linear layer sees four input
channels a thousand times larger than the rest, so per-tensor INT8 of that layer's input rounds
every other channel to zero. The analysis must find that layer first, the plan must exclude it
(and at most one other), and the planned variant must meet the floor in a real run on ONNX
Runtime, with no Q/DQ on the excluded layer in its ONNX.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.test_bad_input import _bullets, files_of, user_graph
from tests.conftest import CPU_TOOLCHAINS, REPO_ROOT, catalog_head, render_in_chromium, write_catalog
from tests.precision.test_users_data import image_folder

pytest.importorskip("modelopt", reason="quantization needs nvidia-modelopt (`make setup` installs it)")
jsonschema = pytest.importorskip("jsonschema")

PLANTED = REPO_ROOT / "examples" / "planted_fault.py"
LAYERS = {"fc1", "fc2", "fc3", "fc4", "head"}
QDQ = ("QuantizeLinear", "DequantizeLinear")


def planted_catalog(ws: Path, fault: str = "fc2", variants: str = "") -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    shutil.copy(PLANTED, ws / "planted_fault.py")
    return write_catalog(
        ws,
        f"""
# The planted-fault workspace. This comment, and the blank lines, must survive `plan --apply`.
{catalog_head(["faulty"], ["fp32"])}
[models.faulty]
python = "planted_fault.py:make"
config = {{ fault = "{fault}" }}
shapes = ["16"]

[models.mine]
onnx = "user.onnx"
shapes = ["2x8"]

[variants.fp32]
precision = "fp32"
[variants.fp16_sparse]
precision = "fp16"
sparsity = "2:4"
[variants.int8]
precision = "int8"   # the variant the plan starts from
[variants.int8_sparse]
precision = "int8"
sparsity = "2:4"
[variants.nvfp4]
precision = "nvfp4"
[variants.mxfp8]
precision = "mxfp8"
{variants}
# Toolchains follow.
{CPU_TOOLCHAINS}
""",
    )


def schema(name: str) -> dict:
    return json.loads((REPO_ROOT / "docs" / f"{name}.schema.json").read_text())


@pytest.fixture(scope="module", params=["fc2", "fc3"])
def planted(request, tmp_path_factory):
    """Sensitivity and plan of faulty_int8 with the fault at fc2, then moved to fc3."""
    from pipeline.cli import main

    ws = tmp_path_factory.mktemp(f"planted_{request.param}")
    catalog = planted_catalog(ws, request.param)
    args = ["--catalog", str(catalog)]
    assert main([*args, "sensitivity", "--engine", "faulty_int8", "--format", "json", "--out", str(ws / "sensitivity.json")]) == 0
    assert main([*args, "plan", "--engine", "faulty_int8", "--format", "json", "--out", str(ws / "plan.json")]) == 0
    return request.param, json.loads((ws / "sensitivity.json").read_text()), json.loads((ws / "plan.json").read_text())


def test_the_planted_fault_is_ranked_first_with_a_clear_margin(planted):
    fault, sensitivity, _ = planted
    jsonschema.validate(sensitivity, schema("sensitivity"))
    layers = sensitivity["layers"]
    assert {layer["name"] for layer in layers} == LAYERS  # every quantized layer, ranked
    assert [layer["rank"] for layer in layers] == [1, 2, 3, 4, 5]
    first, second = layers[0], layers[1]
    assert first["name"] == fault
    assert first["gain"] > 0.5 and first["gain"] > second["gain"] + 0.5
    assert first["excluded_alone"]["cosine"] > 0.99 and sensitivity["fully_quantized"]["cosine"] < 0.9
    assert first["cost"] > 0.5 > max(layer["cost"] for layer in layers[1:])  # quantized alone, it alone ruins the output
    assert not sensitivity["fully_quantized_meets_floor"]
    # The error appears at the faulty layer's output along the depth, not before.
    depth = [unit["name"] for unit in sensitivity["depth"]]
    broken = [unit["name"] for unit in sensitivity["depth"] if unit["cosine"] < 0.99]
    assert broken[0] == fault and set(depth[: depth.index(fault)]).isdisjoint(broken)
    search, confirm = sensitivity["evaluation"]["search"], sensitivity["evaluation"]["confirm"]
    assert set(search["seeds"]).isdisjoint(confirm["seeds"]) and search["samples"] == 32


def test_the_plan_excludes_the_fault_and_meets_a_floor_the_full_variant_misses(planted):
    fault, _, plan = planted
    jsonschema.validate(plan, schema("plan"))
    assert fault in plan["exclude"] and len(plan["exclude"]) <= 2
    assert plan["fully_quantized"]["search"]["cosine"] < 0.99 and plan["fully_quantized"]["confirm"]["cosine"] < 0.99
    assert plan["search"]["cosine"] >= 0.99 and plan["confirm"]["cosine"] >= 0.99 and plan["confirmed"]
    assert 0.5 < plan["quantized_flops_share"] < 1.0
    assert plan["variant"]["name"] == "int8_plan" and plan["variant"]["table"]["exclude"] == plan["exclude"]
    assert plan["variant"]["table"]["models"] == ["faulty"]
    assert "--variant fp32 --variant int8 --variant int8_plan" in plan["measure_with"]


def onnx_qdq_layers(path: Path) -> set[str]:
    """The layers (fc1 … head) that have Q/DQ nodes in an exported graph."""
    import onnx

    graph = onnx.load(str(path))
    return {name for node in graph.graph.node if node.op_type in QDQ for name in LAYERS if f"/{name}/" in node.name}


def test_plan_apply_then_run_meets_the_floor_with_no_qdq_on_the_excluded_layer(tmp_path, run_cli):
    ws = tmp_path / "ws"
    catalog = planted_catalog(ws)
    before = catalog.read_text()
    result = run_cli(catalog, "plan", "--engine", "faulty_int8", "--apply")
    assert result.exit_code == 0, result.err
    assert "[variants.int8_plan]" in result.out and "confirmed, by its bounds, on batches the search never saw" in result.out
    after = catalog.read_text()
    # Only lines were added: every comment and blank line of the user's file is where it was.
    import difflib

    changes = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines()).get_opcodes()
    assert {tag for tag, *_ in changes} == {"equal", "insert"}, changes
    (added,) = [after.splitlines()[j1:j2] for tag, _, _, j1, j2 in changes if tag == "insert"]
    assert added[0] == "[variants.int8_plan]" and 'exclude = ["fc2"]' in added
    assert after.index("[variants.int8_plan]") < after.index("# Toolchains follow.")

    result = run_cli(catalog, "run", "--engine", "faulty_int8_plan", "--engine", "faulty_int8", "--toolchain", "onnxruntime")
    assert result.exit_code == 0, result.err
    profiled = json.loads((ws / "manifests" / "onnxruntime" / "faulty_int8_plan@16.json").read_text())
    assert profiled["profile"]["details"]["accuracy"]["cosine_similarity"] >= 0.99
    full = json.loads((ws / "manifests" / "onnxruntime" / "faulty_int8@16.json").read_text())
    assert full["profile"]["details"]["accuracy"]["cosine_similarity"] < 0.99
    export = json.loads((ws / "manifests" / "export" / "faulty_int8_plan.json").read_text())
    assert export["export"]["details"]["quantization"]["excluded_layers"] == {
        "fc2": "excluded by the catalog (exclude in [variants.int8_plan])"
    }
    assert onnx_qdq_layers(ws / "models" / "faulty" / "int8_plan.onnx") == LAYERS - {"fc2"}
    assert onnx_qdq_layers(ws / "models" / "faulty" / "int8.onnx") == LAYERS


def test_exclude_by_wildcard_and_by_a_module_holding_layers():
    import torch

    from pipeline.stages.quantized_layers import resolve_exclude

    model = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    )
    assert set(resolve_exclude(model, ("*.1",), True, "v", "m")) == {"0.1", "1.1"}
    assert set(resolve_exclude(model, ("0",), True, "v", "m")) == {"0.0", "0.1"}  # a block: every layer in it
    assert set(resolve_exclude(model, ("1.0", "0.1"), True, "v", "m")) == {"1.0", "0.1"}


def test_sensitivity_of_vit_tiny_and_bert_tiny(tmp_path, run_cli):
    """The CI models: every quantized layer ranked, the depth profile printed, JSON valid, HTML drawn."""
    from PIL import Image

    pytest.importorskip("transformers", reason="bert_tiny is a transformers model")
    catalog = write_catalog(
        tmp_path / "ws",
        catalog_head(["vit_tiny"], ["int8"])
        + """
[models.vit_tiny]
timm = "vit_tiny_patch16_224"
batch_size = 4

[models.bert_tiny]
transformers = "BertModel"
config = { hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 2, intermediate_size = 128, vocab_size = 1024, max_position_embeddings = 512 }
shapes = ["2x16", "2x64"]

[variants.int8]
precision = "int8"
"""
        + CPU_TOOLCHAINS,
    )
    # vit_tiny: 12 blocks of qkv, proj, fc1, fc2, the patch embedding and the head; bert_tiny: 2 layers of 6, and the pooler.
    for engine, layers, units in (("vit_tiny_int8", 50, 12), ("bert_tiny_int8", 13, 2)):
        result = run_cli(catalog, "sensitivity", "--engine", engine, "--samples", "8")
        assert result.exit_code == 0, result.err
        assert f"{layers} quantized layers" in result.out and "error along the depth" in result.out
        assert f"(15 of {layers} layers" in result.out if layers > 15 else "of 13 layers" not in result.out
        document = json.loads(run_cli(catalog, "sensitivity", "--engine", engine, "--samples", "8", "--format", "json").out)
        jsonschema.validate(document, schema("sensitivity"))
        assert len(document["layers"]) == layers and len(document["depth"]) == units
        assert document["evaluation"]["search"]["samples"] == 8
    result = run_cli(catalog, "sensitivity", "--engine", "vit_tiny_int8", "--samples", "4", "--format", "html")
    page = tmp_path / "ws" / "reports" / "sensitivity_vit_tiny_int8.html"
    assert result.exit_code == 0 and page.is_file()
    rendered = render_in_chromium(page, tmp_path, screenshot=True)
    colours = Image.open(rendered.screenshot).convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50
    assert rendered.dom.count("<img") == 2 and rendered.dom.count("<tr>") == 51 and "blocks.11.mlp.fc2" in rendered.dom


# --- bad input ------------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    doc: str  # the words of docs/precision.md's "Bad input" line this case checks
    args: list[str]
    exit: int
    message: str
    tip: str
    variants: str = ""
    prepare: Callable[[Path], None] | None = None


CASES = [
    Case("not-quantized", "an engine that is not quantized", ["sensitivity", "--engine", "faulty_fp32"], 2,
         "faulty_fp32 is not quantized: variant fp32 has precision fp32", "faulty_int8"),
    Case("sparse-only", "a sparse-only variant", ["plan", "--engine", "faulty_fp16_sparse"], 2,
         "variant fp16_sparse has 2:4 sparsity alone", "int8, fp8, mxfp8, nvfp4"),
    Case("sparse-and-quantized", "quantized and 2:4-sparse", ["sensitivity", "--engine", "faulty_int8_sparse"], 2,
         "is 2:4-sparse as well as int8", "analyse the variant without sparsity"),
    Case("user-onnx", "a user's ONNX model", ["sensitivity", "--engine", "mine_int8"], 2, "has no PyTorch layers", "the PyTorch model the ONNX came from",
         prepare=lambda ws: user_graph(ws / "user.onnx")),
    Case("floor-unparsable", "a floor that does not parse", ["plan", "--engine", "faulty_int8", "--floor", "cos=high"], 2,
         "--floor 'cos=high' is not a threshold", "cos=0.99"),
    Case("floor-above-one", "above what FP32 reaches against itself", ["plan", "--engine", "faulty_int8", "--floor", "cos=1.5"], 2,
         "--floor 'cos=1.5' is not a threshold", "between 0 and 1"),
    Case("per-sample-floor-without-share", "a per-sample floor without its share", ["plan", "--engine", "faulty_int8", "--floor", "sample-cos=0.99"], 2,
         "--floor 'sample-cos=0.99' is not a threshold", "sample-cos=0.99@99%"),
    Case("two-per-sample-floors", "two per-sample floors at once",
         ["plan", "--engine", "faulty_int8", "--floor", "sample-cos=0.99@99%", "--floor", "sample-cos=0.9@99.9%"], 2,
         "--floor gives 2 per-sample floors (sample-cos=0.99@99%, sample-cos=0.9@99.9%): a plan keeps one", "keep the one that matters most"),
    Case("floor-only-unquantized", "a floor only the unquantized model meets", ["plan", "--engine", "faulty_int8", "--floor", "cos=1.0"], 1,
         "only the unquantized model meets cosine ≥ 1", "measure faulty at fp16 or bf16"),
    Case("block-format-on-cpu", "mxfp8 or nvfp4 without a CUDA GPU", ["sensitivity", "--engine", "faulty_nvfp4"], 3,
         "nvfp4 quantization needs a CUDA GPU", "pick int8/fp8"),
    Case("eval-dir-without-images", "a model that takes no images", ["sensitivity", "--engine", "faulty_int8", "--eval-dir", "images"], 2,
         "model 'faulty' has no use for an evaluation folder of images", "leave out --eval-dir",
         prepare=lambda ws: image_folder(ws / "images", {"cat": 2})),
    Case("max-drop-unparsable", "a `--max-drop` that does not parse", ["plan", "--engine", "faulty_int8", "--max-drop", "top1=5"], 2,
         "--max-drop 'top1=5' is not a largest drop", "top1=1%"),
    Case("exclude-no-match", "an `exclude` name that matches no layer", ["export", "--engine", "faulty_int8_typo"], 2,
         "exclude 'fc9' in [variants.int8_typo] matches no Linear layer", "nearest layer names: fc4, fc3, fc2, fc1",
         variants='[variants.int8_typo]\nprecision = "int8"\nexclude = ["fc9"]'),
    Case("exclude-everything", "an `exclude` that leaves nothing quantized", ["export", "--engine", "faulty_int8_none"], 2,
         "keeps every one of", "exclude fewer layers",
         variants='[variants.int8_none]\nprecision = "int8"\nexclude = ["fc*", "head"]'),
    Case("exclude-unquantized", "`exclude` on a variant that quantizes nothing", ["models"], 2,
         "exclude keeps layers out of quantization, and precision 'fp16' quantizes none", "see the comments",
         variants='[variants.fp16_keep]\nprecision = "fp16"\nexclude = ["fc2"]'),
    Case("variant-of-another-model", "a planned variant run for another model", ["export", "--engine", "mine_int8_keep"], 2,
         "variant int8_keep is for faulty only", "pipeline plan --engine mine_int8",
         variants='[variants.int8_keep]\nprecision = "int8"\nmodels = ["faulty"]\nexclude = ["fc2"]'),
    Case("apply-name-taken", "a variant of that name", ["plan", "--engine", "faulty_int8", "--apply", "--name", "int8"], 2,
         "already has a variant named 'int8'; nothing was changed", "--name"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_bad_input_is_an_error_with_a_tip_and_nothing_written(case, tmp_path, run_cli, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the block-format case, on a GPU machine too
    ws = tmp_path / "ws"
    catalog = planted_catalog(ws, variants=case.variants)
    if case.prepare:
        case.prepare(ws)
    before = files_of(ws)
    result = run_cli(catalog, *case.args)
    assert result.exit_code == case.exit, result.err
    said = " ".join(result.err.split())
    assert any(line.startswith("ERROR ") for line in result.err.splitlines()) and case.message in said, result.err
    assert any(line.startswith("TIP ") for line in result.err.splitlines()) and case.tip in said, result.err
    assert "Traceback" not in result.err and "INTERNAL ERROR" not in result.err
    assert files_of(ws) == before, "something was written"


def test_apply_refuses_a_catalog_that_changed_while_the_plan_was_computed(tmp_path, run_cli, monkeypatch):
    import pipeline.precision.plan as plan_module

    catalog = planted_catalog(tmp_path / "ws")
    original = plan_module.make_plan

    def edited_meanwhile(*args, **kwargs):
        catalog.write_text(catalog.read_text() + "\n# edited by hand meanwhile\n")
        return original(*args, **kwargs)

    monkeypatch.setattr(plan_module, "make_plan", edited_meanwhile)
    result = run_cli(catalog, "plan", "--engine", "faulty_int8", "--apply")
    assert result.exit_code == 2, result.err
    assert "pipeline.toml changed while the plan was computed; nothing was changed" in result.err and "TIP " in result.err
    assert catalog.read_text().endswith("# edited by hand meanwhile\n") and "int8_plan" not in catalog.read_text()


@pytest.mark.parametrize("command", ["sensitivity", "plan"])
def test_ctrl_c_writes_nothing_and_leaves_the_catalog_alone(command, tmp_path, run_cli, monkeypatch):
    from pipeline.precision.variant_lab import VariantLab

    ws = tmp_path / "ws"
    catalog = planted_catalog(ws)
    before = files_of(ws)
    measured = VariantLab.evaluate
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # in the middle of the per-layer measurements
            raise KeyboardInterrupt
        return measured(self, *args, **kwargs)

    monkeypatch.setattr(VariantLab, "evaluate", interrupted)
    extra = ["--apply"] if command == "plan" else []
    result = run_cli(catalog, command, "--engine", "faulty_int8", "--format", "json", "--out", str(ws / "out.json"), *extra)
    assert result.exit_code == 130, result.err
    assert files_of(ws) == before


def test_every_line_of_the_bad_input_section_has_a_case():
    bullets = _bullets(REPO_ROOT / "docs" / "precision.md")
    for case in CASES:
        assert any(case.doc in bullet for bullet in bullets), f"{case.id}: {case.doc!r} is in no docs line"
    for bullet in bullets:
        if any(
            words in bullet
            for words in ("Ctrl-C", "changed since", "out of memory", "fewer than twice", "not class scores", "test_hooks.py")
        ):
            # The two tests above, too few images and a top-1 of no classes (they need an image
            # model and a transformer: the test of them below); the hooks' own cases
            # (tests/precision/test_hooks.py, on a trained model); out of GPU memory is the
            # profile's error (pipeline/measuring/out_of_memory.py).
            continue
        assert any(case.doc in bullet for case in CASES), f"no case for: {bullet}"


@pytest.mark.parametrize("columns", [80, 120])
def test_the_terminal_table_fits_the_width_with_layer_names_whole(columns, tmp_path, run_cli, monkeypatch):
    from tests.conftest import tiny_bert_catalog

    pytest.importorskip("transformers", reason="bert is a transformers model")
    catalog = write_catalog(tmp_path / "ws", tiny_bert_catalog(["2x8"], ["int8"], ["int8"]) + CPU_TOOLCHAINS)
    monkeypatch.setenv("COLUMNS", str(columns))
    result = run_cli(catalog, "sensitivity", "--engine", "bert_int8", "--samples", "2")
    assert result.exit_code == 0, result.err
    lines = result.out.splitlines()
    assert max(len(line) for line in lines) <= columns
    names = [parts[1] for parts in map(str.split, lines) if parts and parts[0].isdigit() and parts[1] != "—"]
    assert len(names) == 13 and all(name.startswith("encoder.layer.") or name == "pooler.dense" for name in names)
    assert ("quantized alone" in result.out) is (columns >= 120)


def test_each_layer_is_named_with_its_onnx_nodes_once_exported(tmp_path, run_cli):
    ws = tmp_path / "ws"
    catalog = planted_catalog(ws)
    document = json.loads(run_cli(catalog, "sensitivity", "--engine", "faulty_int8", "--format", "json").out)
    assert all(layer["onnx_nodes"] == [] for layer in document["layers"])  # nothing exported yet
    assert run_cli(catalog, "export", "--engine", "faulty_int8").exit_code == 0
    document = json.loads(run_cli(catalog, "sensitivity", "--engine", "faulty_int8", "--format", "json").out)
    for layer in document["layers"]:
        nodes = layer["onnx_nodes"]
        assert f"/module/{layer['name']}/Gemm" in nodes, nodes  # the compute node
        assert any("input_quantizer/QuantizeLinear" in node for node in nodes) and all(f"/{layer['name']}/" in node for node in nodes)


@pytest.mark.rtx
@pytest.mark.parametrize("precision, narrowest", [("nvfp4", "fp4"), ("mxfp8", "fp8")])
def test_each_layer_is_named_with_its_engine_layers_once_built(precision, narrowest, rtx_cache, tmp_path, run_cli, monkeypatch):
    """The block formats with ModelOpt's kernel replaced by the CPU stand-in (tests/cpu_nvfp4.py),
    built by TensorRT-RTX for SM120: each quantized layer's engine layers hold its format (MXFP8:
    the FP8 weights' dequantization; TensorRT-RTX 1.7 multiplies in FP16 there)."""
    from tests.conftest import RTX_TOOLCHAINS
    from tests.cpu_nvfp4 import nvfp4_without_cuda

    catalog = planted_catalog(tmp_path / "ws")
    catalog.write_text(catalog.read_text() + RTX_TOOLCHAINS)
    with nvfp4_without_cuda(monkeypatch, mxfp8=True):
        built = run_cli(catalog, "build", "--engine", f"faulty_{precision}", "--toolchain", "trt-rtx1.7", "--arch", "sm120")
        assert built.exit_code == 0, built.err
        result = run_cli(catalog, "sensitivity", "--engine", f"faulty_{precision}", "--format", "json")
    assert result.exit_code == 0, result.err
    document = json.loads(result.out)
    assert {layer["name"] for layer in document["layers"]} == LAYERS - {"head"}  # the head is the rule's
    for layer in document["layers"]:
        engine = layer["engine_layers"]
        assert engine and {entry["toolchain"] for entry in engine} == {"trt-rtx1.7"}, layer
        assert narrowest in {entry["precision"] for entry in engine}, layer


def test_a_plan_the_confirmation_does_not_hold_is_said_and_not_applied(tmp_path, run_cli, monkeypatch):
    """Where the unseen batches miss the floor the search met, the plan is printed with both
    figures, the command fails, and the catalog is left as it was."""
    import dataclasses

    import pipeline.precision.plan as plan_module

    catalog = planted_catalog(tmp_path / "ws")
    before = catalog.read_text()
    original = plan_module.make_plan

    def unconfirmed(lab, sensitivity, floor, progress=None):
        planned = original(lab, sensitivity, floor, progress)
        # As if the unseen batches broke it: the confirmation's figures and bounds those of the fully quantized variant.
        return dataclasses.replace(
            planned, confirm=planned.fully_quantized["confirm"], bounds={**planned.bounds, "confirm": lab.bounds([], floor, "confirm")}
        )

    monkeypatch.setattr(plan_module, "make_plan", unconfirmed)
    result = run_cli(catalog, "plan", "--engine", "faulty_int8", "--apply")
    assert result.exit_code == 1, result.err
    assert "not confirmed by its bounds on the confirmation batches" in result.out and "[variants.int8_plan]" in result.out
    said = " ".join(result.err.split())
    assert (
        "holds cosine ≥ 0.99 (the int8 check of pipeline/catalog/floor.py) on the search batches but its bounds on the confirmation" in said
    )
    assert "do not (cosine ≥ " in said and "heavy-tailed)" in said  # the bound that failed
    assert "it was not applied" in result.err and catalog.read_text() == before


def test_measure_times_a_plan_whatever_its_status_and_says_what_it_timed(tmp_path, run_cli, monkeypatch):
    """A plan the confirmation does not hold (status failed) is still timed by --measure, beside the
    fully quantized and the unquantized variants, and the output says what was timed and as what;
    --apply still refuses it. Where there is no plan at all, the error says that nothing was timed."""
    import dataclasses

    import pipeline.precision.plan as plan_module

    catalog = planted_catalog(tmp_path / "ws")
    before = catalog.read_text()
    original = plan_module.make_plan

    def unconfirmed(lab, sensitivity, floor, progress=None):
        planned = original(lab, sensitivity, floor, progress)
        return dataclasses.replace(
            planned, confirm=planned.fully_quantized["confirm"], bounds={**planned.bounds, "confirm": lab.bounds([], floor, "confirm")}
        )

    monkeypatch.setattr(plan_module, "make_plan", unconfirmed)
    args = ("plan", "--engine", "faulty_int8", "--no-check-built", "--measure", "onnxruntime", "--apply")
    result = run_cli(catalog, *args, "--format", "json")
    assert result.exit_code == 1 and "it was not applied" in result.err, result.err
    plan = json.loads(result.out)
    jsonschema.validate(plan, schema("plan"))
    measured = plan["measured"]
    assert plan["status"] == "failed" and measured["plan_status"] == "failed"
    assert measured["variants"] == {"planned": "int8_plan", "full": "int8", "unquantized": "fp32"}
    (point,) = measured["points"]
    assert point["planned"]["variant"] == "int8_plan" and point["planned"]["median_ms"] > 0
    assert point["planned_over_full"]["rounds"] >= 2 and point["planned_over_unquantized"]["rounds"] >= 2
    assert catalog.read_text() == before  # timed, not applied

    shown = run_cli(catalog, *args)
    said = " ".join(shown.out.split())
    assert shown.exit_code == 1 and catalog.read_text() == before
    assert "what it costs on onnxruntime" in said and "× int8's time [" in said and "× fp32's time [" in said
    assert "timed int8_plan (the plan, failed: timed as it is), int8 (fully quantized) and fp32 (unquantized)" in said

    monkeypatch.setattr(plan_module, "make_plan", original)
    none = run_cli(catalog, "plan", "--engine", "faulty_int8", "--floor", "cos=1.0", "--measure", "onnxruntime")
    said = " ".join(none.err.split())
    assert none.exit_code == 1 and "only the unquantized model meets cosine ≥ 1" in said
    assert "--measure onnxruntime timed nothing: there is no planned variant to time" in said


def test_a_per_sample_floor_is_planned_bounded_built_and_kept_in_the_engines_manifest(tmp_path, run_cli):
    """`--floor sample-cos=0.99@90%` through the command line: the sensitivity ranks the fault by
    the samples it brings back above 0.99; the plan excludes it, holds the floor by the exact
    bound of the share below on 32 samples (29 could show 90 %), builds the planned engine on ONNX
    Runtime and measures the same floor on it, and the engine's manifest keeps both."""
    catalog = planted_catalog(tmp_path / "ws")
    each = ("--floor", "sample-cos=0.99@90%", "--format", "json")
    analysed = run_cli(catalog, "sensitivity", "--engine", "faulty_int8", *each)
    assert analysed.exit_code == 0, analysed.err
    sensitivity = json.loads(analysed.out)
    jsonschema.validate(sensitivity, schema("sensitivity"))
    assert sensitivity["per_sample"] == {
        "metric": "cos", "threshold": 0.99, "share": 0.9, "samples": 32, "fully_quantized_below": 32, "unquantized_below": 0,
    }  # fmt: skip
    first = sensitivity["layers"][0]
    assert first["name"] == "fc2" and first["samples_bought"] == 32 and first["samples_cost"] == 32
    assert not sensitivity["fully_quantized_meets_floor"] and sensitivity["floor"]["per_sample"] == [
        {"metric": "cos", "value": 0.99, "share": 0.9}
    ]

    planned = run_cli(catalog, "plan", "--engine", "faulty_int8", *each)
    assert planned.exit_code == 0, planned.err
    plan = json.loads(planned.out)
    jsonschema.validate(plan, schema("plan"))
    assert "fc2" in plan["exclude"] and plan["status"] == "confirmed"
    assert plan["steps"][0]["failing"] == [{"metric": "sample_cos", "side": "lower"}]
    (metric,) = plan["metrics"]
    assert (metric["metric"], metric["threshold"], metric["limit"], metric["status"]) == ("sample_cos", 0.99, 0.9, "held")
    assert metric["bound"] == pytest.approx(0.05 ** (1 / 32))  # none of 32 below: the share kept is at least 91.1 %
    assert metric["built"]["held"] is True and metric["built"]["method"] == "exact binomial (Clopper-Pearson)"
    (confirm,) = plan["bounds"]["confirm"]
    assert (confirm["counting"], confirm["counted"], confirm["samples_needed"], confirm["resolvable"]) == ("below", 0, 29, True)
    assert "per-sample cosine ≥ 0.99 on at least 90% of inputs" in plan["variant"]["table"]["description"]
    engine = json.loads((catalog.parent / "manifests" / "onnxruntime" / "faulty_int8_plan.json").read_text())
    kept = engine["build"]["details"]["plan_check"]
    assert kept["metrics"] == plan["metrics"] and kept["floor"] == "per-sample cosine ≥ 0.99 on at least 90% of inputs"


def test_apply_adds_the_variant_where_the_catalogs_variant_tables_lie_apart(tmp_path):
    """A variant added by hand after the toolchains splits [variants.*] in two: tomlkit reads them
    through a proxy, and the planned variant still goes in, every other line kept."""
    import tomllib

    from pipeline.precision.catalog_edit import apply_variant, digest

    catalog = tmp_path / "pipeline.toml"
    text = (
        '[variants.fp32]\nprecision = "fp32"\n\n[toolchains.ort]\nkind = "onnxruntime"\n\n'
        '# mine\n[variants.int8_ex]\nprecision = "int8"\nexclude = ["head"]\n'
    )
    catalog.write_text(text)
    apply_variant(catalog, "int8_plan", {"precision": "int8", "models": ["tiny"], "exclude": ["head"]}, digest(catalog))
    written = catalog.read_text()
    assert set(tomllib.loads(written)["variants"]) == {"fp32", "int8_ex", "int8_plan"}
    assert all(line in written.splitlines() for line in text.splitlines() if line)

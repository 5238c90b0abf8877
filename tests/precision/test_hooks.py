"""`pipeline sensitivity` and `pipeline plan` on the user's own data and metric, as Python
functions: a data hook (`--eval-data FILE.py:FUNCTION`) yielding batches, and a metric hook
(`--metric FILE.py:FUNCTION`) kept with `--max-drop metric=…` — on timm's test_vit trained for a
few seconds (tests/precision/test_users_data.py), so that its accuracy means something."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.precision.test_users_data import jsonschema, schema, trained  # noqa: F401 (a fixture)

pytest.importorskip("modelopt", reason="quantization needs nvidia-modelopt (`make setup` installs it)")

HOOKS = '''
from pathlib import Path

import torch

ROOT = Path({images!r})
CLASSES = sorted(p.name for p in ROOT.iterdir())
_MODEL = None


def _images(files):
    global _MODEL
    import timm

    from pipeline.models.images import load_images

    _MODEL = _MODEL or timm.create_model("test_vit", pretrained=False, num_classes=len(CLASSES))
    return load_images(_MODEL, files, _MODEL.pretrained_cfg["input_size"])


def batches():
    """The labelled images, four at a time, as a user's data loader would give them."""
    files = sorted(ROOT.glob("*/*.png"))
    for start in range(0, len(files), 4):
        chunk = files[start : start + 4]
        yield {{"inputs": (_images(chunk),), "labels": torch.tensor([CLASSES.index(f.parent.name) for f in chunk])}}


def one_batch():
    yield from list(batches())[:1]


def accuracy(outputs, batch):
    return (outputs.argmax(dim=1) == batch["labels"]).float().mean()


def broken(outputs, batch):
    raise RuntimeError("the labels file is gone")


def nothing(outputs, batch):
    return None


def failing_data():
    yield from list(batches())[:2]
    raise OSError("the share went away")
'''


@pytest.fixture(scope="module")
def hooks(trained, tmp_path_factory) -> Path:  # noqa: F811 (the fixture imported above)
    _, images = trained
    path = tmp_path_factory.mktemp("hooks") / "hooks.py"
    path.write_text(HOOKS.format(images=str(images)))
    return path


def test_a_plan_on_the_users_data_hook_keeps_the_users_metric_within_its_max_drop(trained, hooks, run_cli, monkeypatch):  # noqa: F811
    import torch

    import pipeline.precision.samples as samples

    catalog, _ = trained
    dealt = []
    drawn_batches = samples.drawn_batches
    monkeypatch.setattr(samples, "drawn_batches", lambda *args: dealt.append(drawn_batches(*args)) or dealt[-1])
    args = ("--engine", "vit_int8", "--samples", "16", "--eval-data", f"{hooks}:batches", "--metric", f"{hooks}:accuracy")
    # int8 keeps the task's accuracy whole; a cosine floor beside the drop makes the plan search.
    floor = ("--max-drop", "metric=0.05", "--floor", "cos=0.999")
    result = run_cli(catalog, "plan", *args, *floor)
    assert result.exit_code == 0, result.err
    said = " ".join(result.out.split())
    assert (
        "cosine ≥ 0.999, the metric at most 0.05 below FP32's (--floor and --max-drop)" in said and "metric " in said and "(FP32 " in said
    )
    assert f"4 batches of {hooks}:batches; metric {hooks}:accuracy" in said
    # Not applied: the command that measures it names a variant the catalog has not got yet.
    assert "add the table above to the catalog (or plan with --apply), then measure whether it still pays" in said

    plan = json.loads(run_cli(catalog, "plan", *args, *floor, "--format", "json").out)
    jsonschema.validate(plan, schema("plan"))
    assert plan["schema_version"] == 6 and plan["floor"]["max_drop"] == [{"metric": "metric", "value": 0.05}]
    search, confirm = plan["evaluation"]["search"], plan["evaluation"]["confirm"]
    assert search["source"] == confirm["source"] == "hook" and search["hook"] == f"{hooks}:batches"
    assert search["samples"] == confirm["samples"] == 16 and search["batches"] == confirm["batches"] == 4
    assert search["metric"] == f"{hooks}:accuracy"
    for which in ("search", "confirm"):
        assert plan[which]["fp32_metric"] > 0.9  # the trained model's own accuracy, through the user's metric
    # The cosine floor binds: the fully quantized variant misses it, so the plan searched.
    assert plan["needed"] and plan["fully_quantized"]["search"]["cosine"] < 0.999 <= plan["search"]["cosine"]
    # The floor held by each metric's bound, on the search and on the confirmation: the cosine's
    # lower bound (a bootstrap over the samples) and the metric's drop's upper bound (over batches).
    for which in ("search", "confirm"):
        cosine, metric = plan["bounds"][which]
        assert (cosine["metric"], cosine["side"], metric["metric"], metric["side"]) == ("cos", "lower", "metric", "upper")
        assert cosine["bound"] < plan[which]["cosine"] == pytest.approx(cosine["estimate"]) and cosine["bound"] >= 0.999 - 1e-9
        assert metric["bound"] >= metric["estimate"] and metric["bound"] <= 0.05 + 1e-9 and cosine["held"] and metric["held"]
    assert plan["held_on_search"] and plan["confirmed"]
    assert "95% one-sided bounds search: cosine ≥ 0.999" in said and "metric drop ≤" in said
    # The search and the confirmation saw different batches: no batch the hook yielded went to both.
    search_batches, confirm_batches = dealt[-1]
    assert len(search_batches) == len(confirm_batches) == 4
    assert not any(torch.equal(a.inputs[0], b.inputs[0]) for a in search_batches for b in confirm_batches)


def test_the_users_metric_on_labelled_images_is_the_top1_accuracy_the_product_measures(trained, hooks, run_cli):  # noqa: F811
    """On --eval-dir images the metric gets {"inputs", "labels"}: an accuracy hook must read what
    the product's own top-1 accuracy reads, variant and FP32 alike."""
    catalog, images = trained
    document = json.loads(
        run_cli(
            catalog, "sensitivity", "--engine", "vit_int8", "--samples", "16", "--eval-dir", str(images),
            "--metric", f"{hooks}:accuracy", "--format", "json",
        ).out
    )  # fmt: skip
    jsonschema.validate(document, schema("sensitivity"))
    for part in ("fully_quantized", "unquantized"):
        figures = document[part]
        assert figures["metric"] == pytest.approx(figures["top1_accuracy"]) and figures["fp32_metric"] == pytest.approx(
            figures["fp32_top1_accuracy"]
        )


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            ("--eval-data", "{hooks}:failing_data"),
            "--eval-data '{hooks}:failing_data' raised OSError: the share went away after 2 batch(es)",
        ),
        (("--eval-data", "{hooks}:one_batch"), "yielded 4 samples in 1 batch(es); the search and its confirmation need 16"),
        (
            ("--eval-data", "{hooks}:batches", "--metric", "{hooks}:broken"),
            "--metric '{hooks}:broken' raised RuntimeError: the labels file is gone",
        ),
        (("--eval-data", "{hooks}:batches", "--metric", "{hooks}:nothing"), "--metric '{hooks}:nothing' returned None, not a number"),
        (("--metric", "{hooks}:absent"), "has no function absent"),
        (("--metric", "{hooks}"), "names no Python function"),
        (("--eval-data", "{hooks}:batches", "--eval-dir", "{images}"), "are given: the samples come from one"),
        (("--max-drop", "metric=0.01"), "a floor on the metric needs the metric: no --metric"),
    ],
    ids=[
        "data-raises",
        "data-too-small",
        "metric-raises",
        "metric-no-number",
        "no-such-function",
        "no-function-named",
        "two-sources",
        "drop-without-metric",
    ],
)
def test_a_hook_that_fails_is_an_error_naming_it_with_a_tip_and_nothing_written(trained, hooks, run_cli, extra, said, tmp_path):  # noqa: F811
    catalog, images = trained
    out = tmp_path / "out.json"
    extra = [part.format(hooks=hooks, images=images) for part in extra]
    result = run_cli(catalog, "sensitivity", "--engine", "vit_int8", "--samples", "8", *extra, "--format", "json", "--out", str(out))
    assert result.exit_code == 2, (result.exit_code, result.err)
    assert said.format(hooks=hooks) in " ".join(result.err.split()) and "TIP" in result.err
    assert "Traceback" not in result.err and not out.exists()


def test_plan_measure_times_the_planned_variant_beside_the_full_and_the_unquantized_in_paired_rounds(trained, hooks, run_cli):  # noqa: F811
    """`plan --measure onnxruntime`: the planned variant exported (its ONNX without Q/DQ on the
    excluded layers), built and timed in one set of rounds with int8 and fp32 — fp32 made for the
    measurement, the catalog has none — and the cost printed beside the accuracy."""
    catalog, _ = trained
    args = ("--engine", "vit_int8", "--samples", "16", "--eval-data", f"{hooks}:batches", "--floor", "cos=0.999")
    result = run_cli(catalog, "plan", *args, "--measure", "onnxruntime", "--format", "json")
    assert result.exit_code == 0, result.err
    plan = json.loads(result.out)
    jsonschema.validate(plan, schema("plan"))
    measured = plan["measured"]
    assert measured["toolchain"] == "onnxruntime" and len(measured["points"]) == 1
    point = measured["points"][0]
    assert (point["planned"]["variant"], point["full"]["variant"], point["unquantized"]["variant"]) == ("int8_plan", "int8", "fp32")
    for which in ("planned_over_full", "planned_over_unquantized"):
        assert point[which]["rounds"] >= 2 and point[which]["low"] <= point[which]["ratio"] <= point[which]["high"]
    # Each engine's own outputs checked on the export's reference batch: the planned one keeps the floor there too.
    assert point["planned"]["reference_cosine"] >= 0.999 and point["full"]["reference_cosine"] is not None
    manifests = Path(catalog).parent / "manifests" / "onnxruntime"
    assert {"vit_fp32.json", "vit_int8.json", "vit_int8_plan.json"} <= {p.name for p in manifests.glob("*.json")}

    again = run_cli(catalog, "plan", *args, "--measure", "onnxruntime")
    assert again.exit_code == 0, again.err
    said = " ".join(again.out.split())
    assert "what it costs on onnxruntime" in said and "× int8's time [" in said and "× fp32's time [" in said
    assert "reference-batch cosine" in said

    unknown = run_cli(catalog, "plan", *args, "--measure", "no-such-toolchain")
    assert unknown.exit_code == 2 and "no-such-toolchain" in unknown.err and "Traceback" not in unknown.err


def test_plan_measure_of_a_variant_that_needs_no_exclusion_times_it_beside_the_unquantized(trained, run_cli):  # noqa: F811
    """The issue's own command: int8 keeps this model's top-1 within 1 % with nothing excluded, so the
    plan is the fully quantized variant itself, and --measure times it beside fp32."""
    catalog, images = trained
    args = ("--engine", "vit_int8", "--samples", "16", "--eval-dir", str(images), "--max-drop", "top1=1%", "--measure", "onnxruntime")
    # 16 images cannot show a 1 % drop: unresolved, not applied, and timed as it is all the same.
    refused = run_cli(catalog, "plan", *args)
    assert refused.exit_code == 1 and "is unresolved" in refused.err and "what it costs on onnxruntime" in refused.out
    assert "timed int8 (the plan, fully quantized, no layer excluded; unresolved: timed as it is) and fp32" in " ".join(refused.out.split())
    args = (*args, "--apply", "--apply-unresolved")  # nothing to apply: no layer needs excluding
    result = run_cli(catalog, "plan", *args)
    assert result.exit_code == 0, result.err
    said = " ".join(result.out.split())
    assert "already meets top-1 at most 1% below FP32's (--max-drop) fully quantized" in said
    # 16 images cannot show a 1% drop (even none lost bounds it at 17%): said, with the samples that could.
    assert "16 samples cannot show a top-1 drop of at most 1.00% at 95% confidence" in said and "(no fewer than 299 could)" in said
    assert "to resolve it with an 80% chance at the rates seen here" in said
    assert "top-1 drop ≤ 18.2% (0 of 16 lost, 0 gained, paired exact)" in said
    assert "floor top-1 at most 1% below FP32's (--max-drop): unresolved" in said
    assert "what it costs on onnxruntime" in said and "× fp32's time [" in said and "the plan is the fully quantized variant itself" in said
    plan = json.loads(run_cli(catalog, "plan", *args, "--format", "json").out)
    jsonschema.validate(plan, schema("plan"))
    (point,) = plan["measured"]["points"]
    assert point["planned"]["variant"] == point["full"]["variant"] == "int8" and point["planned_over_full"] is None
    assert point["planned_over_unquantized"]["rounds"] >= 2


def test_plan_measure_times_a_variant_of_the_planned_name_only_when_it_is_this_plan(trained, hooks, run_cli, tmp_path):  # noqa: F811
    """A variant of the planned name from an earlier `--apply` is timed when it is this plan, and
    refused, with nothing measured, once its exclusions are another plan's."""
    source, _ = trained
    catalog = tmp_path / "pipeline.toml"
    catalog.write_text(Path(source).read_text())
    args = ("--engine", "vit_int8", "--samples", "16", "--eval-data", f"{hooks}:batches", "--floor", "cos=0.999")
    applied = run_cli(catalog, "plan", *args, "--apply")
    assert applied.exit_code == 0 and "added [variants.int8_plan]" in applied.err, applied.err
    same = run_cli(catalog, "plan", *args, "--measure", "onnxruntime", "--format", "json")
    assert same.exit_code == 0, same.err
    assert json.loads(same.out)["measured"]["points"][0]["planned"]["variant"] == "int8_plan"

    text = catalog.read_text()
    start = text.index("[variants.int8_plan]")
    catalog.write_text(text[:start] + text[start:].replace("exclude = [", 'exclude = ["blocks.0.mlp.fc1", ', 1))
    manifest = tmp_path / "manifests" / "onnxruntime" / "vit_int8_plan.json"
    before = manifest.stat().st_mtime_ns
    stale = run_cli(catalog, "plan", *args, "--measure", "onnxruntime")
    assert stale.exit_code == 2 and "Traceback" not in stale.err
    said = " ".join(stale.err.split())
    assert "the catalog already has a variant named 'int8_plan' that is not this plan (exclude" in said, said
    assert "nothing was measured" in said and "TIP name the planned variant otherwise (--name int8_plan_2)" in said
    assert manifest.stat().st_mtime_ns == before

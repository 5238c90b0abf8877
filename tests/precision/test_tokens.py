"""`pipeline sensitivity` and `pipeline plan` on a transformer's own token ids (`--eval-tokens`, a
.npy of one sequence per row, as `calibration_tokens`): the search's and the confirmation's rows
drawn apart, said in the output and the JSON; a file too small, or ids the model cannot take,
is an error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.precision.test_users_data import image_folder, jsonschema, schema, vit_catalog

pytest.importorskip("modelopt", reason="quantization needs nvidia-modelopt (`make setup` installs it)")


def tokens(path, rows: int, vocab: int = 128, length: int = 8, seed: int = 0):
    np.save(path, np.random.default_rng(seed).integers(0, vocab, (rows, length)))
    return path


def test_a_transformers_plan_measures_on_the_users_token_ids_search_and_confirmation_apart(tmp_path, run_cli, monkeypatch):
    from pipeline.models.transformers import TransformersModel

    catalog = vit_catalog(tmp_path / "ws")
    ids = tokens(tmp_path / "ids.npy", 20)
    drawn: list[list[int]] = []
    token_batches = TransformersModel.token_batches
    monkeypatch.setattr(
        TransformersModel, "token_batches", lambda self, model, path, rows: drawn.append(rows) or token_batches(self, model, path, rows)
    )
    args = ("--engine", "bert_int8", "--samples", "8", "--eval-tokens", str(ids))
    result = run_cli(catalog, "sensitivity", *args)
    assert result.exit_code == 0, result.err
    assert f"sequences of {ids} (20 rows), drawn seeded" in " ".join(result.out.split())
    document = json.loads(run_cli(catalog, "sensitivity", *args, "--format", "json").out)
    jsonschema.validate(document, schema("sensitivity"))
    search, confirm = document["evaluation"]["search"], document["evaluation"]["confirm"]
    assert search["source"] == confirm["source"] == "tokens" and search["file"] == str(ids) and search["rows"] == 20
    assert search["samples"] == confirm["samples"] == 8
    seeded = json.loads(run_cli(catalog, "sensitivity", "--engine", "bert_int8", "--samples", "8", "--format", "json").out)
    assert seeded["fully_quantized"] != document["fully_quantized"]  # other inputs, other figures

    search_rows, confirm_rows = drawn[:2]
    assert len(search_rows) == len(confirm_rows) == 8 and not set(search_rows) & set(confirm_rows)  # apart

    # BERT-tiny's INT8 is within 1.3e-8 of FP32 in cosine here: a largest drop of 5e-9 binds.
    plan = json.loads(run_cli(catalog, "plan", *args, "--max-drop", "cos=5e-9", "--format", "json").out)
    jsonschema.validate(plan, schema("plan"))
    assert plan["evaluation"]["confirm"]["source"] == "tokens" and plan["needed"] and plan["confirmed"]
    assert 1 - plan["fully_quantized"]["search"]["cosine"] > 5e-9 and 1 - plan["search"]["cosine"] <= 5e-9
    (search,), (confirm,) = plan["bounds"]["search"], plan["bounds"]["confirm"]
    assert search["estimate"] <= search["bound"] <= 5e-9 and confirm["estimate"] <= confirm["bound"] <= 5e-9
    assert plan["search"] != plan["confirm"]  # other rows, other figures


@pytest.mark.parametrize(
    ("engine", "rows", "vocab", "said"),
    [
        ("bert_int8", 10, 128, "token file {ids} holds 10 sequences; bert_int8's search and its confirmation need 16: 8 each"),
        ("bert_int8", 20, 500, "is outside the vocabulary (0 to 127)"),
        ("vit_int8", 20, 128, "model 'vit' takes no token ids"),
    ],
    ids=["too-few-rows", "outside-the-vocabulary", "image-model"],
)
def test_token_ids_that_cannot_serve_are_an_error_with_a_tip_and_nothing_written(tmp_path, run_cli, engine, rows, vocab, said):
    catalog = vit_catalog(tmp_path / "ws")
    ids = tokens(tmp_path / "ids.npy", rows, vocab)
    out = tmp_path / "out.json"
    result = run_cli(
        catalog, "sensitivity", "--engine", engine, "--samples", "8", "--eval-tokens", str(ids), "--format", "json", "--out", str(out)
    )
    assert result.exit_code == 2, result.err
    assert said.format(ids=ids) in " ".join(result.err.split()) and "TIP" in result.err
    assert "Traceback" not in result.err and not out.exists()


def test_two_sources_of_samples_are_refused(tmp_path, run_cli):
    catalog = vit_catalog(tmp_path / "ws")
    images = image_folder(tmp_path / "images", {"cat": 8, "dog": 8})
    result = run_cli(
        catalog, "sensitivity", "--engine", "vit_int8", "--eval-dir", str(images), "--eval-tokens", str(tokens(tmp_path / "i.npy", 20))
    )
    assert result.exit_code == 2 and "an evaluation folder" in result.err and "token ids" in result.err and "TIP pass one of" in result.err

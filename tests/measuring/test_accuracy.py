"""Accuracy figures, reference files, and what trtexec writes about an engine's outputs."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.measuring.accuracy import ReferenceTensor, compare_outputs
from pipeline.running.errors import PipelineError
from pipeline.trtexec.outputs import parse_accuracy_lines, read_trtexec_outputs


def figures(reference, output, precision="fp16"):
    return compare_outputs(reference, output, precision=precision, sparse=False, description="test", checked_by="test")


def test_identical_outputs_are_perfect_and_a_flipped_class_is_seen():
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((8, 1000)).astype(np.float32)
    same = figures(reference, reference.copy())
    assert same.cosine_similarity == pytest.approx(1.0) and same.max_abs_error == 0.0
    assert same.top1_agreement == 1.0 and same.top5_agreement == 1.0 and same.warning is None
    changed = reference.copy()
    winner = reference[0].argmax()
    changed[0, winner] = reference[0].min() - 1.0  # the first sample's top class drops to last
    result = figures(reference, changed)
    assert result.top1_agreement == pytest.approx(7 / 8) and result.top5_agreement == pytest.approx(7 / 8)
    assert result.cosine_similarity < 1.0


def test_a_drift_below_the_precisions_floor_warns():
    rng = np.random.default_rng(1)
    reference = rng.standard_normal((4, 100))
    noisy = reference + 0.5 * rng.standard_normal((4, 100))
    result = figures(reference, noisy, precision="int8")
    assert result.cosine_similarity < 0.99 and result.cosine_floor == 0.99
    assert result.warning.startswith("cosine similarity to FP32 0.") and result.warning.endswith("is below 0.99 for int8")


def test_nan_or_inf_outputs_are_never_accurate():
    reference = np.ones((2, 10), dtype=np.float32)
    broken = reference.copy()
    broken[1, 3] = np.nan
    broken[0, 0] = np.inf
    result = figures(reference, broken)
    assert result.cosine_similarity is None and result.max_abs_error is None
    assert result.nonfinite_values == 2 and result.warning == "2 of 20 output values are NaN or Inf"


def test_figures_summed_block_by_block_are_the_float64_formulas(monkeypatch):
    """compare_outputs sums its figures a block of values at a time (ErrorSums): across blocks that
    split samples unevenly, they are the float64 formulas on the whole arrays, and a NaN in a later
    block is still counted."""
    from pipeline.measuring import accuracy

    monkeypatch.setattr(accuracy.ErrorSums, "BLOCK", 7)
    rng = np.random.default_rng(3)
    reference = rng.standard_normal((3, 5, 6)).astype(np.float32)
    output = (reference + 0.1 * rng.standard_normal((3, 5, 6))).astype(np.float16)  # another dtype
    ref, out = reference.astype(np.float64), output.astype(np.float64)
    result = figures(reference, output)
    assert result.cosine_similarity == pytest.approx(accuracy.cosine_of(ref.ravel(), out.ravel()), abs=1e-12)
    each = [accuracy.cosine_of(r, o) for r, o in zip(ref.reshape(3, -1), out.reshape(3, -1))]
    assert result.min_sample_cosine_similarity == pytest.approx(min(each), abs=1e-12)
    assert result.max_abs_error == pytest.approx(np.max(np.abs(ref - out)), rel=1e-12)
    assert result.mean_abs_error == pytest.approx(np.mean(np.abs(ref - out)), rel=1e-12)
    assert result.mse == pytest.approx(np.mean((ref - out) ** 2), rel=1e-12)
    output[2, 4, 5] = np.nan  # the last value, in the last block
    assert figures(reference, output).nonfinite_values == 1
    assert figures(reference, np.zeros_like(reference)).cosine_similarity == 0.0


def test_outputs_of_another_size_are_an_error():
    with pytest.raises(PipelineError, match=r"the engine's output has 6 values \(\[2, 3\]\); the reference has 8"):
        figures(np.zeros((2, 4)), np.zeros((2, 3)))


def test_a_reference_file_of_the_wrong_size_is_an_error(tmp_path):
    path = tmp_path / "ref.bin"
    np.zeros(10, dtype=np.float16).tofile(path)
    with pytest.raises(PipelineError) as info:
        ReferenceTensor("input", path, (2, 3, 4), "float16").as_float32()
    assert info.value.message == f"reference file {path} holds 10 float16 values; [2, 3, 4] needs 24."
    assert "re-export" in info.value.hint


def test_bfloat16_reference_files_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    from pipeline.measuring.accuracy import write_tensor

    values = torch.randn(3, 5).to(torch.bfloat16)
    write_tensor(values, tmp_path / "x.bin")
    assert (tmp_path / "x.bin").stat().st_size == 3 * 5 * 2
    read = ReferenceTensor("x", tmp_path / "x.bin", (3, 5), "bfloat16").as_float32()
    assert np.array_equal(read, values.float().numpy())


def _export_output(name: str, dims: str, values: str) -> str:
    # The layout of trtexec's exportJSONOutput (samples/common/sampleReporting.cpp): a list of
    # {name, dimensions "AxB", values}, floats printed by an ostream (so nan/inf unquoted).
    return f'[\n  {{ "name" : "{name}"\n  , "dimensions" : "{dims}"\n  , "values" : [ {values} ]\n  }}\n]\n'


def test_trtexec_exported_outputs_are_read_with_their_shape(tmp_path):
    path = tmp_path / "out.json"
    path.write_text(_export_output("logits", "2x3", "0.5, -1.25, 3, 1e-05, -0, 7.5"))
    outputs = read_trtexec_outputs(path)
    assert list(outputs) == ["logits"] and outputs["logits"].shape == (2, 3)
    assert outputs["logits"][0].tolist() == [0.5, -1.25, 3.0]


def test_trtexec_nan_and_inf_in_exported_outputs_are_read_as_such(tmp_path):
    path = tmp_path / "out.json"
    path.write_text(_export_output("logits", "1x4", "nan, -nan, inf, -inf"))
    values = read_trtexec_outputs(path)["logits"][0]
    assert np.isnan(values[0]) and np.isnan(values[1]) and values[2] == np.inf and values[3] == -np.inf


def test_a_file_that_is_not_an_export_is_refused(tmp_path):
    path = tmp_path / "out.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(PipelineError, match="is not a trtexec --exportOutput file"):
        read_trtexec_outputs(path)


def test_trtexec_11_1_accuracy_lines():
    # The line format of samples/common/sampleInference.cpp in the TensorRT 11.1 OSS release (NVIDIA/TensorRT@82d1dca8).
    log = (
        "[06/24/2026-10:00:00] [I] Accuracy loss for tensor logits (cos): 0.000123\n"
        "[06/24/2026-10:00:00] [I] Accuracy loss for tensor 'aux:0' (cos): 0.512000 [FAIL: >= threshold 0.010000]\n"
        "[06/24/2026-10:00:00] [I] Latency: min = 1 ms\n"
    )
    found = parse_accuracy_lines(log)
    assert found["logits"] == {"algorithm": "cos", "loss": 0.000123, "failed": False, "threshold": None}
    assert found["aux:0"] == {"algorithm": "cos", "loss": 0.512, "failed": True, "threshold": 0.01}


# --- real images: --eval-dir ---------------------------------------------------------------------------


@pytest.fixture
def eval_workspace(tmp_path):
    """test_vit with a checkpoint that always predicts class 0, and an ImageFolder of three images
    in two ImageNet classes: n01440764 (class 0, two images) and n01443537 (class 1, one)."""
    torch = pytest.importorskip("torch")
    from PIL import Image

    from pipeline.models.torch_import import import_timm
    from tests.conftest import TINY_CATALOG, write_catalog

    model = import_timm().create_model("test_vit", pretrained=False)
    with torch.no_grad():
        model.head.bias[0] = 1e4
    torch.save(model.state_dict(), tmp_path / "w.pth")
    rng = np.random.default_rng(0)
    for folder, count in (("n01440764", 2), ("n01443537", 1)):
        (tmp_path / "images" / folder).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (180, 200, 3), dtype=np.uint8)).save(tmp_path / "images" / folder / f"{i}.png")
    catalog = TINY_CATALOG.replace("batch_size = 2", 'batch_size = 4\ncheckpoint = "w.pth"')
    return write_catalog(tmp_path, catalog)


def test_eval_dir_checks_engines_on_the_images_and_against_their_labels(eval_workspace, run_cli):
    from pipeline.manifest import read_manifest

    result = run_cli(eval_workspace, "run", "--variant", "fp32", "--eval-dir", str(eval_workspace.parent / "images"))
    assert result.exit_code == 0, result.err
    manifest = read_manifest(eval_workspace.parent / "manifests" / "onnxruntime" / "tiny_fp32.json")
    reference = manifest.export.details.reference
    assert reference["samples"] == 3 and reference["classes"] == {"n01440764": 2, "n01443537": 1}
    assert sorted(reference["images"]) == ["n01440764/0.png", "n01440764/1.png", "n01443537/0.png"]
    assert reference["labels"] == [0 if image.startswith("n01440764") else 1 for image in reference["images"]]
    assert "3 images from" in reference["description"] and "drawn across its 2 class(es)" in reference["description"]
    assert "repeated to fill the batch of 4" in reference["description"]
    assert reference["fp32_top1_accuracy"] == pytest.approx(2 / 3)  # it always answers class 0
    accuracy = manifest.profile.details.accuracy
    assert accuracy["samples"] == 3 and accuracy["top1_accuracy"] == pytest.approx(2 / 3)
    assert accuracy["top1_agreement"] == 1.0 and accuracy["cosine_similarity"] > 0.9999
    assert "top-1 accuracy 66.7% on the labelled images" in result.err


def test_switching_to_eval_images_rechecks_without_rebuilding(eval_workspace, run_cli):
    """Same model, same ONNX, a new reference batch: the engine stays, its accuracy is re-checked."""
    from pipeline.manifest import read_manifest

    assert run_cli(eval_workspace, "run", "--variant", "fp32").exit_code == 0
    engine_manifest = eval_workspace.parent / "manifests" / "onnxruntime" / "tiny_fp32.json"
    built = read_manifest(engine_manifest).build
    result = run_cli(eval_workspace, "run", "--variant", "fp32", "--eval-dir", str(eval_workspace.parent / "images"))
    assert result.exit_code == 0, result.err
    after = read_manifest(engine_manifest)
    assert after.build == built  # the ONNX did not change, so neither did the engine
    assert after.profile.details.accuracy["top1_accuracy"] == pytest.approx(2 / 3)
    export = read_manifest(eval_workspace.parent / "manifests" / "export" / "tiny_fp32.json").export
    assert after.export == export  # the engine manifest carries the export it was checked against


def test_eval_dir_without_imagenet_folders_or_a_checkpoint_has_no_labels(eval_workspace, run_cli):
    from pipeline.manifest import read_manifest

    images = eval_workspace.parent / "images"
    (images / "n01443537").rename(images / "cats")
    assert run_cli(eval_workspace, "export", "--engine", "tiny_fp32", "--eval-dir", str(images)).exit_code == 0
    reference = read_manifest(eval_workspace.parent / "manifests" / "export" / "tiny_fp32.json").export.details.reference
    assert (
        reference["labels"] is None
        and reference["labels_skipped"] == "folder names 'cats' are not ImageNet-1k synsets (such as 'n01440764')"
    )
    eval_workspace.write_text(eval_workspace.read_text().replace('checkpoint = "w.pth"\n', ""))
    assert run_cli(eval_workspace, "export", "--engine", "tiny_fp32", "--eval-dir", str(images)).exit_code == 0
    reference = read_manifest(eval_workspace.parent / "manifests" / "export" / "tiny_fp32.json").export.details.reference
    assert reference["labels"] is None and "random weights" in reference["labels_skipped"]


def test_an_empty_or_unreadable_eval_dir_is_a_clear_error(eval_workspace, run_cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli(eval_workspace, "export", "--engine", "tiny_fp32", "--eval-dir", str(empty))
    assert result.exit_code == 1
    assert f"ERROR evaluation folder {empty} holds no images" in result.err and "--eval-dir" in result.err
    broken = tmp_path / "broken" / "n01440764"
    broken.mkdir(parents=True)
    (broken / "x.png").write_bytes(b"not a png")
    result = run_cli(eval_workspace, "export", "--engine", "tiny_fp32", "--eval-dir", str(broken.parent))
    assert result.exit_code == 1 and f"ERROR cannot read evaluation image {broken / 'x.png'}" in result.err
    assert not (eval_workspace.parent / "models" / "tiny" / "fp32.onnx").exists()  # nothing half-written

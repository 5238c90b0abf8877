"""Accuracy figures, reference files, and what trtexec writes about an engine's outputs."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy import ReferenceTensor, compare_outputs, parse_accuracy_lines, read_trtexec_outputs
from pipeline.errors import PipelineError


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
    from pipeline.accuracy import write_tensor

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
    # The line format of samples/common/sampleInference.cpp in TensorRT 11.1 (INDEX.md f).
    log = (
        "[06/24/2026-10:00:00] [I] Accuracy loss for tensor logits (cos): 0.000123\n"
        "[06/24/2026-10:00:00] [I] Accuracy loss for tensor 'aux:0' (cos): 0.512000 [FAIL: >= threshold 0.010000]\n"
        "[06/24/2026-10:00:00] [I] Latency: min = 1 ms\n"
    )
    found = parse_accuracy_lines(log)
    assert found["logits"] == {"algorithm": "cos", "loss": 0.000123, "failed": False, "threshold": None}
    assert found["aux:0"] == {"algorithm": "cos", "loss": 0.512, "failed": True, "threshold": 0.01}

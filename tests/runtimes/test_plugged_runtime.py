"""A new toolchain kind touches only its own module and the registry: the steady stand-in
(tests/runtimes/steady_runtime.py), registered as one more line of RUNTIMES, builds and profiles
beside ONNX Runtime, keeps its own evidence in the manifests under its own key, and appears in
`pipeline compare` with its GPU, memory and per-layer times — with nothing of manifest.py or
report/ edited for it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tests.conftest import TINY_CATALOG, write_catalog


@pytest.fixture
def steady(monkeypatch):
    from pipeline import runtimes

    monkeypatch.setitem(runtimes.RUNTIMES, "steady", "tests.runtimes.steady_runtime:SteadyRuntime")
    runtimes.runtime_class.cache_clear()
    yield
    runtimes.runtime_class.cache_clear()


def test_a_new_kind_plugs_in_with_its_own_evidence_and_appears_in_compare(steady, tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + '\n[toolchains.steady]\nkind = "steady"\n')
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "steady", "--toolchain", "onnxruntime")
    assert result.exit_code == 0, result.err

    written = json.loads((tmp_path / "ws" / "manifests" / "steady" / "tiny_fp32.json").read_text())
    assert written["build"]["details"]["steady"] == {"built_from": "fp32.onnx"}
    profile = written["profile"]["details"]
    assert profile["steady"] == {"clock": "fixed", "run_ms": 0.25}
    assert profile["gpu"] == "Steady GPU 1" and profile["gpu_memory_mib"] == 42.0
    assert [layer["name"] for layer in profile["layer_times"]] == ["the only layer"]
    # Timed in one set of rounds with ONNX Runtime's engine, as any engine of the point is.
    ort = json.loads((tmp_path / "ws" / "manifests" / "onnxruntime" / "tiny_fp32.json").read_text())["profile"]["details"]
    assert profile["rounds"][0]["group"] == ort["rounds"][0]["group"]

    compared = run_cli(catalog, "compare", "--format", "json")
    assert compared.exit_code == 0, compared.err
    row = next(row for row in json.loads(compared.out)["rows"] if row["toolchain"] == "steady")
    assert row["median_ms"] == pytest.approx(0.25) and row["gpu"] == "Steady GPU 1"
    assert row["gpu_memory_mib"] == 42.0 and row["gpu_memory_kind"] == "all it ever needs"


def test_a_key_the_runtimes_model_does_not_name_is_refused_not_written(steady):
    from pipeline.manifest import ProfileDetails
    from pipeline.runtimes.base import checked_evidence
    from tests.runtimes.steady_runtime import SteadyRuntime

    assert checked_evidence(SteadyRuntime, {"gpu": "G", "steady": {"clock": "fixed"}}, ProfileDetails) == {
        "gpu": "G",
        "steady": {"clock": "fixed"},
    }
    with pytest.raises(ValidationError, match="surprise"):
        checked_evidence(SteadyRuntime, {"surprise": 1}, ProfileDetails)


def test_two_engines_of_a_new_kind_are_diffed_by_the_per_layer_times_it_hands_over(steady, tmp_path, run_cli):
    # The stand-in writes no sidecar files of TensorRT's formats: its per-layer times are the
    # profile's core field alone, and its runtime is named as it names itself.
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + '\n[toolchains.steady]\nkind = "steady"\n')
    result = run_cli(catalog, "run", "--model", "tiny", "--variant", "fp32", "--variant", "fp16", "--toolchain", "steady")
    assert result.exit_code == 0, result.err

    compared = run_cli(catalog, "diff", "steady/tiny_fp32", "steady/tiny_fp16", "--format", "json")
    assert compared.exit_code == 0, compared.err
    data = json.loads(compared.out)
    assert data["a"]["layers_timed"] == data["b"]["layers_timed"] == 1
    assert data["a"]["total_ms"] == data["b"]["total_ms"] == pytest.approx(0.25)
    assert data["a"]["trt_version"] == "1.0" and data["counts"]["matched"] == 1
    assert [(row["a"], row["b"], row["delta_ms"]) for row in data["rows"]] == [(["the only layer"], ["the only layer"], 0.0)]

    shown = run_cli(catalog, "diff", "steady/tiny_fp32", "steady/tiny_fp16")
    assert shown.exit_code == 0, shown.err
    assert "A = steady/tiny_fp32: Steady 1.0, 1 layers timed" in shown.out and "TensorRT" not in shown.out


def test_reports_call_each_runtime_by_its_own_name_and_an_unknown_kind_by_the_kind():
    from pipeline.runtimes import product_of

    assert [product_of(kind) for kind in ("onnxruntime", "torch", "trtexec-container", "trtexec-local", "tensorrt-rtx")] == [
        "ONNX Runtime",
        "PyTorch",
        "TensorRT",
        "TensorRT",
        "TensorRT-RTX",
    ]
    assert product_of("written-by-a-newer-version") == "written-by-a-newer-version"


def test_a_kind_that_cannot_serve_streams_says_why_at_each_count_and_the_run_goes_on(steady, tmp_path, run_cli):
    catalog = write_catalog(
        tmp_path / "ws", TINY_CATALOG.replace("round_ms = 0", "round_ms = 0\nserve_s = 0.2") + '\n[toolchains.steady]\nkind = "steady"\n'
    )
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "steady", "--toolchain", "onnxruntime", "--streams", "1,2")
    assert result.exit_code == 0, result.err
    steady = json.loads((tmp_path / "ws" / "manifests" / "steady" / "tiny_fp32.json").read_text())["profile"]["details"]["streams"]
    assert [(record["streams"], record["why_not"]) for record in steady] == [
        (1, "the steady runtime does not serve concurrent streams"),
        (2, "the steady runtime does not serve concurrent streams"),
    ]
    ort = json.loads((tmp_path / "ws" / "manifests" / "onnxruntime" / "tiny_fp32.json").read_text())["profile"]["details"]["streams"]
    assert [record["why_not"] for record in ort] == [None, None]
    assert "not measured: the steady runtime does not serve concurrent streams" in result.out


def test_tensorrt_rtx_says_why_it_serves_no_streams():
    from types import SimpleNamespace

    from pipeline.runtimes.tensorrt_rtx.runtime import TensorRtRtxRuntime

    runtime = SimpleNamespace(kind="tensorrt-rtx", serves_no_streams=TensorRtRtxRuntime.serves_no_streams)
    run = TensorRtRtxRuntime.serve(runtime, None, 2, 1.0)
    assert (
        run.why_not
        == "the tensorrt-rtx runtime does not serve concurrent streams yet: its driver runs one execution context on one CUDA stream"
    )

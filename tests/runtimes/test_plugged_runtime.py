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

"""The trtexec-local toolchain: trtexec installed on this machine, run as a subprocess.

The `trtexec` here is the stand-in script (tests/standin/trtexec) replaying recorded TensorRT
10.14.1 output; it proves the subprocess plumbing, not TensorRT.
"""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, write_catalog
from tests.dockerd import STANDIN, standin_files


@pytest.fixture
def local_install(tmp_path, monkeypatch):
    def install(mode: str = "ok", timeout_s: float = 60, trt: str = "10.14.1"):
        root = tmp_path / f"TensorRT-{mode}"
        (root / "bin").mkdir(parents=True)
        (root / "lib").mkdir()
        shutil.copy(STANDIN, root / "bin" / "trtexec")
        data = tmp_path / f"standin-{mode}"
        data.mkdir()
        for name, content in standin_files(mode).items():
            if trt.startswith("11.") and name.endswith(".log"):
                # No real TensorRT 11 log exists: the recorded one, as release 11.1.0 would label it.
                content = content.replace(b"[TensorRT v101401]", b"[TensorRT v110100]").replace(
                    b"TensorRT version: 10.14.1", b"TensorRT version: 11.1.0"
                )
            (data / name).write_bytes(content)
        monkeypatch.setenv("STANDIN_DIR", str(data))
        extra = (
            f'\n[toolchains.local]\nkind = "trtexec-local"\ntrt = "{trt}"\ntrt_root = "{root}"\ngpus = "none"\ntimeout_s = {timeout_s}\n'
        )
        return write_catalog(tmp_path / "ws", TINY_CATALOG + extra)

    return install


def test_local_build_and_profile(local_install, run_cli):
    catalog = local_install("ok")
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    manifest = read_manifest(catalog.parent / "manifests" / "local" / "tiny_fp32.json")
    assert manifest.build.command[0].endswith("/bin/trtexec")
    assert manifest.build.command[1] == f"--onnx={catalog.parent / 'models' / 'tiny' / 'fp32.onnx'}"
    assert manifest.build.details.trtexec["trt_version"] == "10.14.1"
    assert manifest.profile.details.metric == "GPU compute time"
    assert (catalog.parent / "engines" / "local" / "tiny_fp32.build.log").read_text().count("&&&& PASSED") == 1
    # The accuracy check: one inference on the reference batch, its --exportOutput file parsed. (The
    # stand-in answers with the reference itself, so the figures are perfect; the plumbing is real.)
    accuracy = manifest.profile.details.accuracy
    assert accuracy["checked_by"] == "trtexec 10.14.1 --loadInputs/--exportOutput"
    assert accuracy["cosine_similarity"] == pytest.approx(1.0, abs=1e-6) and accuracy["top1_agreement"] == 1.0
    reference = next(a for a in manifest.profile.outputs if a.role == "reference_outputs")
    assert reference.path == "engines/local/tiny_fp32.outputs.json"
    reference_log = (catalog.parent / "engines" / "local" / "tiny_fp32.reference.log").read_text()
    assert f"--loadInputs=input:{catalog.parent / 'models' / 'tiny' / 'fp32.ref-input.bin'}" in reference_log
    assert "--iterations=1" in reference_log and "--loadRefOutputs" not in reference_log  # 10.x cannot check itself


def test_diff_of_two_workspace_engines_reads_their_layer_info_and_layer_profiles(local_install, run_cli):
    # The stand-in replays the same recorded layer JSON (10.16.1) and --exportProfile (10.4.0) for
    # every engine: two variants then agree layer for layer, and the diff says exactly that.
    catalog = local_install("ok")
    assert run_cli(catalog, "run", "--model", "tiny", "--variant", "fp32", "--variant", "fp16", "--toolchain", "local").exit_code == 0
    result = run_cli(catalog, "diff", "local/tiny_fp32", "local/tiny_fp16", "--format", "json")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    recorded = json.loads(standin_files("ok")["profile.json"])
    assert data["a"]["layers_timed"] == data["b"]["layers_timed"] == len(recorded) - 1
    assert data["a"]["iterations"] == recorded[0]["count"] and data["a"]["trt_version"] == "10.14.1"
    assert data["counts"]["matched"] == len(recorded) - 1 and data["a"]["total_ms"] == data["b"]["total_ms"]
    assert {row["delta_ms"] for row in data["rows"]} == {0.0}
    # The profile (alexnet) and the layer information (the MNIST model) are of different builds.
    assert any("describes 0 of the 14 profiled layers" in note for note in data["a"]["notes"])
    shown = run_cli(catalog, "diff", "local/tiny_fp32", "local/tiny_fp16")
    assert f"A = local/tiny_fp32: TensorRT 10.14.1, 14 layers timed over {recorded[0]['count']} iterations" in shown.out


def test_nan_outputs_are_reported_as_such(local_install, run_cli):
    catalog = local_install("nan")
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    accuracy = read_manifest(catalog.parent / "manifests" / "local" / "tiny_fp32.json").profile.details.accuracy
    assert accuracy["cosine_similarity"] is None and accuracy["nonfinite_values"] == 2000
    assert accuracy["warning"] == "2000 of 2000 output values are NaN or Inf"
    assert "WARNING tiny_fp32 on local: 2000 of 2000 output values are NaN or Inf" in result.err


@pytest.mark.parametrize("mode", ["ok", "inaccurate"])
def test_tensorrt_11_1_checks_accuracy_itself_and_its_verdict_is_recorded(local_install, run_cli, mode):
    catalog = local_install(mode, trt="11.1.0")
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    ws = catalog.parent
    log = (ws / "engines" / "local" / "tiny_fp32.reference.log").read_text()
    assert f"--loadRefOutputs=logits:{ws / 'models' / 'tiny' / 'fp32.ref-output.bin'}" in log
    assert "--accuracyAlgorithm=cos" in log and "--accuracyThreshold=0.0001" in log  # 1 - the fp32 floor
    accuracy = read_manifest(ws / "manifests" / "local" / "tiny_fp32.json").profile.details.accuracy
    assert accuracy["checked_by"] == "trtexec 11.1.0 --loadInputs/--exportOutput and trtexec's own --loadRefOutputs check (cos)"
    if mode == "ok":
        assert accuracy["tool_loss"] == 0.0 and accuracy["tool_failed"] is False and accuracy["warning"] is None
    else:  # recorded as an accuracy failure with its figure, not a crash
        assert accuracy["tool_loss"] == 0.25 and accuracy["tool_failed"] is True
        assert accuracy["warning"] == "trtexec's own check failed: cosine loss 0.25 >= threshold 0.0001"
        gate = run_cli(catalog, "compare", "--format", "json", "--fail-accuracy-below", "0.5")
        assert gate.exit_code == 0  # the figures computed from its outputs pass; its own verdict is in the status
        assert "inaccurate: trtexec's own check failed" in json.loads(gate.out)["rows"][0]["status"] + "".join(
            json.loads(gate.out)["rows"][0]["flags"]
        )


def test_local_timeout_kills_trtexec(local_install, run_cli):
    catalog = local_install("slow", timeout_s=2)
    result = run_cli(catalog, "build", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 1
    assert "ran past its 2 s limit and was killed" in result.err
    assert not (catalog.parent / "engines" / "local" / "tiny_fp32.engine").exists()


def test_missing_local_install_is_an_environment_error(tmp_path, run_cli):
    extra = '\n[toolchains.local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ntrt_root = "/nonexistent/TensorRT"\ngpus = "none"\n'
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + extra)
    result = run_cli(catalog, "build", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 3
    assert "/nonexistent/TensorRT/bin/trtexec does not exist" in result.err


def test_trtexec_engines_join_the_rounds_of_their_point_one_short_run_per_take(local_install, run_cli, tmp_path):
    catalog = local_install("ok")
    # The stand-in behind a wrapper that notes every call.
    trtexec = tmp_path / "TensorRT-ok" / "bin" / "trtexec"
    shutil.move(trtexec, trtexec.with_name("trtexec-standin"))
    calls = tmp_path / "calls.txt"
    trtexec.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec "$(dirname "$0")/trtexec-standin" "$@"\n')
    trtexec.chmod(0o755)
    argv = ["run", "--model", "tiny", "--variant", "fp32", "--variant", "fp16", "--toolchain", "local", "--toolchain", "onnxruntime"]
    result = run_cli(catalog, *argv)
    assert result.exit_code == 0, result.err
    ws = catalog.parent

    def details(toolchain, name):
        return read_manifest(ws / "manifests" / toolchain / f"{name}.json").profile.details

    (fp32,), (fp16,), (ort,) = (
        details("local", "tiny_fp32").rounds,
        details("local", "tiny_fp16").rounds,
        details("onnxruntime", "tiny_fp32").rounds,
    )
    assert fp32.group == fp16.group == ort.group  # one set of rounds at the point
    assert set(fp32.entrants) == {"fp32/local", "fp16/local", "fp32/onnxruntime", "fp16/onnxruntime"} and fp32.rounds >= 6
    recorded = json.loads(standin_files("ok")["times.json"])
    assert [t.runs for t in fp32.takes] == [len(recorded)] * fp32.rounds  # each take: the runs of one short trtexec run
    takes = [line for line in calls.read_text().splitlines() if "--loadEngine" in line and "--exportTimes" in line]
    assert len(takes) == fp32.rounds + fp16.rounds
    first, *others = [line for line in takes if "tiny_fp32" in line]
    # A take: warm-up for the take's length, then at least take_runs runs and take_ms (5 ms here).
    assert "--warmUp=5 --iterations=1 --duration=0.005" in first
    # The per-layer profile once, in the first take (a separate run, after the timed ones).
    assert "--exportProfile" in first and not any("--exportProfile" in line for line in others)
    profile = read_manifest(ws / "manifests" / "local" / "tiny_fp32.json").profile
    assert profile.details.trtexec["exported_profile"] is not None  # kept from the first take
    assert {a.role for a in profile.outputs} >= {"profile_log", "times", "layer_profile"}
    assert " ".join(profile.command[1:]) == others[-1]  # the last take's command, its files beside it
    compared = json.loads(run_cli(catalog, "compare", "--format", "json").out)
    (pair,) = [c for v in compared["verdicts"] for c in v["comparisons"] if {c["a"]["toolchain"], c["b"]["toolchain"]} == {"local"}]
    assert pair["paired"] is True and pair["outcome"] == "same"  # the stand-in replays the same times for both


def test_a_trtexec_engine_alone_at_its_point_is_one_whole_trtexec_measurement(local_install, run_cli):
    catalog = local_install("ok")
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    profile = read_manifest(catalog.parent / "manifests" / "local" / "tiny_fp32.json").profile
    assert profile.details.rounds == []
    assert "--warmUp=5" in profile.command and "--iterations=5" in profile.command and "--duration=0.05" in profile.command


def test_a_tool_measured_alone_reports_the_time_its_runs_took(local_install, run_cli, monkeypatch):
    """The measurement is made before the profile records it (pipeline/stages/point.py): the
    profile's line says how long the tool's runs took, not the instant the recording did."""
    import re
    import time

    from pipeline.runtimes.tensorrt.trtexec import TrtexecRuntime

    catalog = local_install("ok")
    assert run_cli(catalog, "build", "--engine", "tiny_fp32", "--toolchain", "local").exit_code == 0
    profile = TrtexecRuntime.profile

    def slow(self, *args, **kwargs):
        time.sleep(0.6)
        return profile(self, *args, **kwargs)

    monkeypatch.setattr(TrtexecRuntime, "profile", slow)
    result = run_cli(catalog, "profile", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    line = " ".join(next(line for line in result.err.splitlines() if line.startswith("profile ")).split())
    assert line.startswith("profile tiny_fp32 on local done in ") and "of rounds" not in line, line
    assert float(re.search(r"done in ([\d.]+)s", line).group(1)) >= 0.6, line


def test_a_build_that_runs_out_of_gpu_memory_is_a_result_with_what_tensorrt_asked_for(tmp_path):
    """TensorRT's words for an allocation that failed, in a recorded trtexec log of a failed build
    (the log's own parse error replaced by the lines public reports of TensorRT 8.4–10 show): the
    build is out of memory, a result with the bytes asked for and the log, not a refusal."""
    from types import SimpleNamespace

    from pipeline.running.errors import OutOfMemory
    from pipeline.runtimes.tensorrt.trtexec import Execution, TrtexecRuntime, out_of_memory_words
    from pipeline.trtexec.log import parse_log
    from tests.conftest import SAMPLES

    recorded = (SAMPLES / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt").read_text()
    ran_out = (
        "[04/24/2026-02:26:01] [W] [TRT] Requested amount of GPU memory (4294967296 bytes) could not be allocated. "
        "There may not be enough free memory for allocation to succeed.\n"
        "[04/24/2026-02:26:01] [E] Error[2]: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)\n"
    )
    text = recorded.replace("[04/24/2026-02:26:01] [E] Failed to parse onnx file\n", ran_out)
    assert out_of_memory_words(recorded) is None
    assert out_of_memory_words(text) == ("Error Code 2: OutOfMemory (no further information)", 4294967296)
    log_path = tmp_path / "build.log"
    with pytest.raises(OutOfMemory) as info:
        TrtexecRuntime._check(SimpleNamespace(), Execution(1, text), parse_log(text), "build", ["trtexec"], log_path)
    assert info.value.message == "out of GPU memory in trtexec's build: Error Code 2: OutOfMemory (no further information)"
    assert info.value.facts["requested_bytes"] == 4294967296 and info.value.result.sidecars == {"build_log": log_path}


def test_streams_run_trtexec_with_inf_streams_and_read_its_throughput(local_install, run_cli):
    # The stand-in replays a recorded 10.14.1 run whatever it is asked: this holds the plumbing — the
    # command each count runs, its log and exported times read into the count's record.
    catalog = local_install("ok")
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local", "--streams", "1,2")
    assert result.exit_code == 0, result.err
    profile = read_manifest(catalog.parent / "manifests" / "local" / "tiny_fp32.json").profile
    records = profile.details.streams
    assert [(record.streams, record.mode, record.why_not) for record in records] == [(1, "tool streams", None), (2, "tool streams", None)]
    # A count is one whole run of trtexec (not split into serve_rounds takes), so serve_rounds,
    # which changes nothing here, is no part of the measurement's fingerprint.
    assert all(record.takes_per_s == [] for record in records)
    assert "serve_rounds" not in profile.params["settings"] and "serve_s" in profile.params["settings"]
    engines = catalog.parent / "engines" / "local"
    assert "--infStreams" not in (engines / "tiny_fp32.streams1.log").read_text()
    assert "--infStreams=2" in (engines / "tiny_fp32.streams2.log").read_text()
    two = records[1]
    assert two.how.startswith("trtexec 10.14.1 --infStreams=2")
    assert two.inferences_per_s > 0 and two.completed > 0 and len(two.latencies_ms) > 0
    assert "tiny: serving concurrent streams" in result.out

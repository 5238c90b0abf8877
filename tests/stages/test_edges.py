"""A sweep at its edges: a point that does not fit in memory is a result, recorded for its
toolchain while every other point and toolchain is measured, kept until --force, and shown in the
table, the sweep, the JSON and the answer; a point whose FP32 reference does not fit is made a few
samples at a time, or its engines are measured with their accuracy said to be unchecked.

The model is a user's module that raises PyTorch's own OutOfMemoryError past a budget of elements
(tests/data/python_models/memory_bound.py), as a GPU too small for the larger point does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import CPU_TOOLCHAINS, DATA, REPO_ROOT, catalog_head, write_catalog

pytest.importorskip("torch", reason="the python model family needs torch (`make setup` installs it)")


def catalog(budget: int, shapes: str = '["1x16", "4x64"]') -> str:
    return (
        catalog_head(["bound"], ["fp32"])
        + f"""
[models.bound]
python = "models-in/memory_bound.py:make"
config = {{ features = 8, budget = {budget} }}
shapes = {shapes}

[variants.fp32]
precision = "fp32"
"""
        + CPU_TOOLCHAINS
    )


def workspace(root: Path, budget: int, shapes: str = '["1x16", "4x64"]') -> Path:
    path = write_catalog(root, catalog(budget, shapes))
    (root / "models-in").mkdir(exist_ok=True)
    shutil.copy(DATA / "python_models" / "memory_bound.py", root / "models-in" / "memory_bound.py")
    return path


def profile_record(root: Path, toolchain: str, shape: str):
    return read_manifest(root / "manifests" / toolchain / f"bound_fp32@{shape}.json").profile


def export_details(root: Path):
    return read_manifest(root / "manifests" / "export" / "bound_fp32.json").export.details


RUN = ("run", "--model", "bound", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")


@pytest.fixture(scope="module")
def batch_too_large(tmp_path_factory):
    """Budget 128: 4×64 does not fit as a batch, but two samples at a time do; the engine that runs
    the batch whole (torch-eager) runs out at 4×64."""
    from pipeline.cli import main

    root = tmp_path_factory.mktemp("oom")
    path = workspace(root, 128)
    code = main(["--catalog", str(path), *RUN])
    return root, path, code


def test_out_of_memory_at_one_point_is_a_result_and_every_other_point_is_measured(batch_too_large, capsys):
    root, _, code = batch_too_large
    assert code == 0  # every failure is a recorded out-of-memory result
    record = profile_record(root, "torch-eager", "4x64")
    assert record.status == "out_of_memory"
    assert record.reason.startswith("out of GPU memory at shape 4×64")
    facts = record.out_of_memory
    assert facts.memory == "GPU" and facts.requested_bytes == int(2.5 * 2**30)
    assert profile_record(root, "torch-eager", "1x16").status == "done"
    assert profile_record(root, "onnxruntime", "4x64").status == "done"
    assert profile_record(root, "onnxruntime", "1x16").status == "done"
    # The FP32 reference at 4×64 was made two samples at a time, and checks the engine that fit.
    details = export_details(root)
    assert details.references_in_parts == {"4x64": 2} and details.references_out_of_memory == {}
    ort = profile_record(root, "onnxruntime", "4x64").details
    assert ort.accuracy is not None and ort.accuracy["cosine_similarity"] > 0.9999 and ort.accuracy_skipped is None


def test_the_table_json_sweep_and_answer_say_what_did_not_fit(batch_too_large, run_cli):
    jsonschema = pytest.importorskip("jsonschema", reason="the test extra installs jsonschema (`make setup`)")
    root, path, _ = batch_too_large
    table = run_cli(path, "compare").out
    eager = next(line for line in table.splitlines() if line.startswith("fp32") and "torch-eager" in line and "4×64" in line)
    assert " out of memory [" in eager, eager
    result = run_cli(path, "compare", "--format", "json")
    data = json.loads(result.out)
    jsonschema.validate(data, json.loads((REPO_ROOT / "docs" / "compare.schema.json").read_text()))
    assert data["schema"] == 19
    (at_large,) = [v for v in data["verdicts"] if v["shape"] == "4x64"]
    assert at_large["fastest"]["toolchain"] == "onnxruntime"
    (did_not_fit,) = at_large["out_of_memory"]
    assert did_not_fit["toolchain"] == "torch-eager" and did_not_fit["facts"]["requested_bytes"] == int(2.5 * 2**30)
    assert all(e["toolchain"] != "torch-eager" for e in at_large["excluded"])
    assert "Did not fit: fp32 on torch-eager (out of GPU memory at shape 4×64" in at_large["text"]
    row = next(r for r in data["rows"] if r["toolchain"] == "torch-eager" and r["shape"] == "4x64")
    assert row["outcome"] == "out_of_memory" and row["out_of_memory"]["memory"] == "GPU"
    (sweep,) = data["sweeps"]
    line = next(line for line in sweep["lines"] if line["toolchain"] == "torch-eager")
    assert line["gaps"] == [{"shape": "4x64", "outcome": "out_of_memory", "why": "out of memory"}]
    assert line["points"]["1x16"]["outcome"] == "measured"


def test_a_second_run_keeps_the_result_and_force_tries_again(batch_too_large, run_cli):
    root, path, _ = batch_too_large
    before = profile_record(root, "torch-eager", "4x64")
    again = run_cli(path, *RUN)
    assert again.exit_code == 0, again.err
    assert "recorded earlier; `--force` tries again" in again.err
    assert profile_record(root, "torch-eager", "4x64").finished_at == before.finished_at  # not tried again
    forced = run_cli(path, *RUN, "--force")
    assert forced.exit_code == 0, forced.err
    after = profile_record(root, "torch-eager", "4x64")
    assert after.status == "out_of_memory" and after.finished_at > before.finished_at
    assert "recorded earlier;" not in forced.err and "did not fit in memory, recorded as results" in forced.err


def test_an_accuracy_gate_holds_the_engines_that_were_measured(batch_too_large, run_cli):
    """The gate judges what was measured: a point that did not fit neither passes nor fails it,
    and an engine below the floor still fails the command."""
    root, path, _ = batch_too_large
    assert run_cli(path, "compare", "--fail-accuracy-below", "0.99").exit_code == 0
    cosine = min(profile_record(root, "onnxruntime", shape).details.accuracy["cosine_similarity"] for shape in ("1x16", "4x64"))
    if cosine < 1.0:  # a floor above what was measured
        gated = run_cli(path, "compare", "--fail-accuracy-below", "1")
        assert gated.exit_code == 1 and "onnxruntime" in gated.err and "torch-eager at 4" not in gated.err


def test_a_reference_that_does_not_fit_even_a_sample_at_a_time_leaves_the_accuracy_unchecked(tmp_path, run_cli):
    """Budget 32: one sample of 4×64 is 64 elements; the FP32 reference there cannot be made at all.
    The engines that fit (ONNX Runtime runs the graph, not the module) are measured, their accuracy
    there said to be unchecked and why."""
    path = workspace(tmp_path, 32)
    result = run_cli(path, *RUN)
    assert result.exit_code == 0, result.err
    assert "bound_fp32 at 4x64: the FP32 reference did not fit, even one sample at a time" in result.err
    details = export_details(tmp_path)
    assert set(details.references_out_of_memory) == {"4x64"}
    assert details.references_out_of_memory["4x64"].requested_bytes == int(2.5 * 2**30)
    assert "4x64" not in details.parity_by_shape and "1x16" in details.parity_by_shape
    ort = profile_record(tmp_path, "onnxruntime", "4x64")
    assert ort.status == "done" and ort.details.accuracy is None
    assert ort.details.accuracy_skipped.startswith("the FP32 reference did not fit in memory at this point: out of GPU memory")
    assert profile_record(tmp_path, "torch-eager", "4x64").status == "out_of_memory"
    data = json.loads(run_cli(path, "compare", "--format", "json").out)
    (at_large,) = [v for v in data["verdicts"] if v["shape"] == "4x64"]
    assert at_large["accuracy_unchecked"].startswith("the FP32 reference did not fit")
    assert "Its accuracy here is unchecked: the FP32 reference did not fit" in at_large["text"]


def test_a_run_of_which_nothing_fit_in_memory_exits_non_zero(tmp_path, run_cli):
    """Exit 0 is for a run whose points that fit were measured. When nothing of what was asked
    came to a result — the one point of a sweep, its engine out of memory as it is built — the warning
    says so and the run fails: a script that checks the exit status must not take it for a run.
    The result is still recorded, and a second run that finds it fails the same way."""
    path = workspace(tmp_path, 128, shapes='["4x64"]')
    result = run_cli(path, "run", "--model", "bound", "--toolchain", "torch-eager")
    assert result.exit_code == 1, result.err
    assert "1 did not fit in memory, recorded as results" in result.err
    assert "ERROR nothing to profile fit in memory: no measurement was written." in result.err
    assert "Traceback" not in result.err
    manifest = read_manifest(tmp_path / "manifests" / "torch-eager" / "bound_fp32@4x64.json")
    assert manifest.build.status == "out_of_memory" and manifest.profile.reason.startswith("not built: out of GPU memory")
    again = run_cli(path, "profile", "--model", "bound", "--toolchain", "torch-eager")
    assert again.exit_code == 1 and "nothing to profile fit in memory" in again.err
    # Beside a point that fits, the same result is no failure (the test above: exit 0).


FAULT_CATALOG = (
    catalog_head(["faulty"], ["fp32"])
    + """
[models.faulty]
python = "models-in/faulting.py:make"
config = { features = 8, longest = 32 }
shapes = ["1x16", "4x64"]

[variants.fp32]
precision = "fp32"
"""
    + CPU_TOOLCHAINS
)


def faulting_workspace(root: Path, text: str = FAULT_CATALOG) -> Path:
    """A workspace of the faulting module (tests/data/python_models/faulting.py) with catalog ``text``."""
    path = write_catalog(root, text)
    (root / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / "faulting.py", root / "models-in" / "faulting.py")
    return path


def run_pipeline(path: Path, *args: str):
    """The command line as a user runs it, in a process of its own: a fault replaces that process."""
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if not key.startswith("PIPELINE_REPLACED")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "--catalog", str(path), *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_a_kernel_that_faults_at_one_point_costs_that_point_not_the_run(tmp_path):
    """The module faults at 4×64 — in the export's FP32 reference first, then in torch-eager's
    preparation there — and every call after it in the same process fails (a sticky CUDA error).
    Each fault is recorded for its point, the command goes on in a fresh process, and every other
    point and toolchain is measured; the command then exits 1 naming the point, with no traceback."""
    path = faulting_workspace(tmp_path)
    run = ("run", "--model", "faulty", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    result = run_pipeline(path, *run)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "INTERNAL ERROR" not in result.stderr
    # Named where each happened: the export's reference at 4×64, then torch-eager at 4×64.
    assert "ERROR faulted on the GPU exporting faulty_fp32: the FP32 reference at shape 4×64: CUDA error: device-side assert triggered" in (
        result.stderr
    )
    assert "the run goes on in a fresh process" in result.stderr
    assert "faulty_fp32 on torch-eager at 4x64: faulted on the GPU at shape 4×64: CUDA error: device-side assert triggered" in result.stderr
    export = read_manifest(tmp_path / "manifests" / "export" / "faulty_fp32.json").export
    assert export.status == "done" and set(export.details.references_faulted) == {"4x64"}
    faulted = read_manifest(tmp_path / "manifests" / "torch-eager" / "faulty_fp32@4x64.json").profile
    assert faulted.status == "faulted" and faulted.fault.error == "CUDA error: device-side assert triggered"
    assert read_manifest(tmp_path / "manifests" / "torch-eager" / "faulty_fp32@1x16.json").profile.status == "done"
    assert read_manifest(tmp_path / "manifests" / "onnxruntime" / "faulty_fp32@1x16.json").profile.status == "done"
    ort = read_manifest(tmp_path / "manifests" / "onnxruntime" / "faulty_fp32@4x64.json").profile
    assert ort.status == "done" and ort.details.accuracy_skipped.startswith("the FP32 model faulted on the GPU at this point")
    # The comparison of what was measured is printed, the fault shown in its cell.
    assert "The answer" in result.stdout and "faulted [" in result.stdout
    # Kept until --force: a second run measures nothing again and says the same.
    again = run_pipeline(path, *run)
    assert (
        again.returncode == 1
        and "recorded earlier; `--force` tries again" in again.stderr
        and "goes on in a fresh process" not in again.stderr
    )


def _read_only_mounts_work() -> str | None:
    """Why a folder cannot be made read-only here (None where it can): root bypasses permission
    bits, so a test mounts the folder read-only in a mount namespace of its own."""
    import os
    import subprocess

    if os.geteuid() != 0:
        return "a read-only mount needs root (unshare -m; .ci/run runs as root)"
    try:
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not usable here ({exc})"
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.decode().strip()}"


@pytest.mark.parametrize("folder", ["models", "engines", "manifests/onnxruntime"])
def test_a_read_only_folder_is_a_clear_error_naming_it_and_leaves_nothing_half_written(tmp_path, folder):
    """Each stage's folder read-only in turn (a read-only mount, as a container or a shared disk
    gives): the stage that writes there fails with an ERROR naming the folder, exit 1, no traceback,
    and no temporary file is left behind."""
    import subprocess
    import sys

    why = _read_only_mounts_work()
    if why is not None:
        pytest.skip(why)
    path = workspace(tmp_path, 10_000)
    target = tmp_path / folder
    target.mkdir(parents=True)
    command = " ".join([sys.executable, "-m", "pipeline", "--catalog", str(path), "run", "--model", "bound", "--toolchain", "onnxruntime"])
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind -o ro '{target}' '{target}' && exec {command}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "INTERNAL ERROR" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert any(f"the folder {target}" in line and "is on a read-only file system" in line for line in errors), result.stderr
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_fault_in_the_middle_of_a_points_rounds_is_pinned_to_the_engine_whose_take_saw_it(tmp_path):
    """The module faults only after 12 calls at 4×64: past the export, the preparation, the
    accuracy check and the warm-up (six calls), in the middle of the point's rounds, whose six
    rounds call it at least twice each (the untimed run and one timed), however few runs a loaded
    host fits in a take. Every take waits for its GPU work, so the fault is torch-eager's, not ONNX
    Runtime's whose take came next; ONNX Runtime is measured at that point in the fresh process,
    and nothing of the interrupted rounds is recorded."""
    path = faulting_workspace(tmp_path, FAULT_CATALOG.replace("longest = 32 }", "longest = 32, calls_before_fault = 12 }"))
    result = run_pipeline(path, "run", "--model", "faulty", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("the run goes on in a fresh process") == 1
    export = read_manifest(tmp_path / "manifests" / "export" / "faulty_fp32.json").export
    assert export.details.references_faulted == {}  # the export's calls came before the fault
    faulted = read_manifest(tmp_path / "manifests" / "torch-eager" / "faulty_fp32@4x64.json").profile
    assert faulted.status == "faulted"
    ort = read_manifest(tmp_path / "manifests" / "onnxruntime" / "faulty_fp32@4x64.json").profile
    assert ort.status == "done" and ort.details.accuracy is not None
    (rounds,) = ort.details.rounds
    assert rounds.entrants == ["fp32/onnxruntime"]  # measured anew, alone: not the interrupted rounds


def test_a_build_that_runs_out_at_its_own_point_still_builds_the_engine_for_the_others(tmp_path, run_cli):
    """A PyTorch engine of several points is prepared at the first when it is built: running out of
    memory there is that point's result (its profile records it), not the engine's; the other point
    is measured."""
    path = workspace(tmp_path, 128, '["4x64", "1x16"]')
    result = run_cli(path, "run", "--model", "bound", "--toolchain", "torch-eager")
    assert result.exit_code == 0, result.err
    build = read_manifest(tmp_path / "manifests" / "torch-eager" / "bound_fp32.json").build
    assert build.status == "done" and build.details.notes[0].startswith(
        "preparing at 4x64 ran out of memory; that point's profile records it"
    )
    assert profile_record(tmp_path, "torch-eager", "4x64").status == "out_of_memory"
    assert profile_record(tmp_path, "torch-eager", "1x16").status == "done"


def test_a_fault_in_a_repeats_fresh_process_is_pinned_to_its_engine(tmp_path):
    """`--repeat 2`: the second measurement runs in a fresh process, and the module faults only
    there, in torch-eager's preparation at 4×64. The fault crosses back named for its engine and is
    recorded for torch-eager at 4×64 alone; ONNX Runtime there and every engine at 1×16 are measured."""
    text = FAULT_CATALOG.replace("longest = 32 }", "longest = 32, only_in_repeats = true }")
    path = faulting_workspace(tmp_path, text)
    result = run_pipeline(path, "run", "--model", "faulty", "--toolchain", "onnxruntime", "--toolchain", "torch-eager", "--repeat", "2")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "faulty_fp32 on torch-eager at 4x64: faulted on the GPU at shape 4×64" in result.stderr
    assert read_manifest(tmp_path / "manifests" / "torch-eager" / "faulty_fp32@4x64.json").profile.status == "faulted"
    ort = read_manifest(tmp_path / "manifests" / "onnxruntime" / "faulty_fp32@4x64.json").profile
    assert ort.status == "done" and ort.details.repeats_pooled == 2
    for toolchain in ("onnxruntime", "torch-eager"):
        assert read_manifest(tmp_path / "manifests" / toolchain / "faulty_fp32@1x16.json").profile.status == "done"


def test_a_fault_in_a_build_is_recorded_for_that_engine_and_the_other_toolchains_go_on(tmp_path):
    """One point, 2×64, past the table: the export leaves its reference out, and torch-eager's build
    faults preparing there — recorded as the build's result (the engine of that one point), the run
    going on in a fresh process, where ONNX Runtime builds and measures it with its accuracy unchecked."""
    path = faulting_workspace(tmp_path, FAULT_CATALOG.replace('shapes = ["1x16", "4x64"]', 'shapes = ["2x64"]'))
    result = run_pipeline(path, "run", "--model", "faulty", "--toolchain", "torch-eager", "--toolchain", "onnxruntime")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    build = read_manifest(tmp_path / "manifests" / "torch-eager" / "faulty_fp32.json").build
    assert build.status == "faulted" and "device-side assert" in build.fault.error
    ort = read_manifest(tmp_path / "manifests" / "onnxruntime" / "faulty_fp32@2x64.json").profile
    assert ort.status == "done" and ort.details.accuracy_skipped.startswith("the FP32 model faulted on the GPU at this point")
    assert "fp32 on torch-eager (faulted on the GPU at shape 2×64: CUDA error: device-side assert triggered)" in result.stdout


def test_a_schema_2_manifest_that_recorded_out_of_memory_as_failed_reads_as_out_of_memory(batch_too_large):
    """Manifests written before schema 3 recorded a point that ran out of memory as failed: a report
    reads them as out of memory, the same as a new one."""
    from pipeline.manifest import parse_manifest
    from pipeline.report.rows import row_of

    root, _, _ = batch_too_large
    raw = json.loads((root / "manifests" / "torch-eager" / "bound_fp32@4x64.json").read_text())
    raw["schema_version"] = 2
    for record in (raw["export"], raw["build"], raw["profile"]):
        del record["out_of_memory"], record["fault"]
    for key in ("references_out_of_memory", "references_in_parts", "references_faulted"):
        del raw["export"]["details"][key]
    raw["profile"]["status"] = "failed"
    row = row_of(parse_manifest(json.dumps(raw), "bound_fp32@4x64.json"))
    assert row.outcome == "out_of_memory" and row.status.startswith("out of GPU memory at shape 4×64")


def test_an_exporter_that_ran_out_of_memory_is_out_of_memory_not_a_model_it_refuses():
    """The torch.export-based exporter reports a MemoryError as its own error ("MemoryError: no
    message"); under an 800 MiB–1 GiB address-space limit the export read it as a model the
    exporter cannot take, wrote no ONNX, and exited 0. The limit is found in the error's chain and
    raised as the memory it is (out_of_memory_as_error makes it the export's result)."""
    from pipeline.stages.onnx_writing import _out_of_memory_in

    ran_out = MemoryError()
    try:
        try:
            raise ran_out
        except MemoryError as exc:
            raise RuntimeError("Failed to export the model with torch.export") from exc
    except RuntimeError as wrapped:
        assert _out_of_memory_in(wrapped) is ran_out
    assert _out_of_memory_in(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 2 GB")) is not None
    assert _out_of_memory_in(ValueError("unsupported operator aten::foo")) is None

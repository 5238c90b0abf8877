"""Faults users and operators run into, each ending with a clear message and the right exit code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.manifest import READS, SCHEMA_VERSION, read_manifest
from tests.conftest import REPO_ROOT

RECORDED = Path(__file__).parents[1] / "data" / "manifests" / "landed-bdf42fb"


@pytest.fixture
def recorded_workspace(tmp_path) -> Path:
    """A workspace holding real manifests (vit_tiny fp32 and int8 on ONNX Runtime)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    shutil.copy(REPO_ROOT / "pipeline.toml", workspace / "pipeline.toml")
    shutil.copytree(RECORDED, workspace / "manifests")
    return workspace


def edit_manifest(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("fmt", ["table", "md", "json", "csv"])
def test_a_reader_that_goes_away_ends_compare_quietly_with_0(recorded_workspace, fmt):
    # `pipeline compare | head`: the reader closes the pipe before (or while) compare writes.
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(recorded_workspace / "pipeline.toml"), "compare", "--format", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "ERROR" not in err


def test_a_baseline_written_by_a_newer_version_says_so(recorded_workspace, run_cli, tmp_path):
    baseline = tmp_path / "baseline"
    shutil.copytree(recorded_workspace / "manifests", baseline)
    edit_manifest(baseline / "onnxruntime" / "vit_tiny_int8.json", lambda d: d["profile"]["details"].update(power_w=612.0))
    result = run_cli(recorded_workspace / "pipeline.toml", "compare", "--baseline", str(baseline))
    assert result.exit_code == 1
    assert "vit_tiny_int8.json has field(s) this version of the pipeline does not know: profile.details.power_w" in result.err
    assert "written by a newer version" in result.err and "upgrade this checkout" in result.err
    assert "Traceback" not in result.err


def test_a_baseline_of_a_newer_schema_version_says_so(recorded_workspace, run_cli, tmp_path):
    baseline = tmp_path / "baseline"
    shutil.copytree(recorded_workspace / "manifests", baseline)
    edit_manifest(baseline / "onnxruntime" / "vit_tiny_int8.json", lambda d: d.update(schema_version=SCHEMA_VERSION + 1))
    result = run_cli(recorded_workspace / "pipeline.toml", "compare", "--baseline", str(baseline))
    assert result.exit_code == 1, result.err
    reads = ", ".join(str(v) for v in READS[:-1]) + f" and {READS[-1]}"
    assert (
        f"vit_tiny_int8.json has schema_version {SCHEMA_VERSION + 1}: it was written by a newer version (this one reads {reads})"
        in result.err
    )
    assert "upgrade this checkout" in result.err and "Traceback" not in result.err


def test_a_baseline_from_git_written_by_a_newer_version_names_the_ref_and_file(recorded_workspace, run_cli):
    def git(*args):
        subprocess.run(["git", *args], cwd=recorded_workspace, check=True, capture_output=True)

    git("init", "-q")
    edit_manifest(recorded_workspace / "manifests" / "onnxruntime" / "vit_tiny_fp32.json", lambda d: d.update(signed_by="ci"))
    git("add", "-f", "manifests")
    git("-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "commit", "-qm", "results")
    shutil.rmtree(recorded_workspace / "manifests")
    shutil.copytree(RECORDED, recorded_workspace / "manifests")
    result = run_cli(recorded_workspace / "pipeline.toml", "compare", "--baseline", "HEAD")
    assert result.exit_code == 1
    assert "manifest HEAD:manifests/onnxruntime/vit_tiny_fp32.json has field(s) this version" in result.err
    assert "signed_by" in result.err and "Traceback" not in result.err


HAND_EDITS = {
    "no per-iteration times": lambda d: d["profile"]["details"].update(per_iteration_ms=[]),
    "a zero median": lambda d: d["profile"]["details"]["latency_ms"].update(median=0.0),
    "accuracy without top-1": lambda d: d["profile"]["details"]["accuracy"].pop("top1_agreement"),
    "a load average that is text": lambda d: d["profile"]["details"]["machine_load"]["start"].update(load_average="high"),
}


@pytest.mark.parametrize("edit", HAND_EDITS.values(), ids=HAND_EDITS.keys())
def test_a_hand_edited_manifest_is_named_instead_of_crashing_compare(recorded_workspace, run_cli, edit):
    path = recorded_workspace / "manifests" / "onnxruntime" / "vit_tiny_int8.json"
    edit_manifest(path, edit)
    result = run_cli(recorded_workspace / "pipeline.toml", "compare")
    assert result.exit_code == 1
    assert f"manifest {path} holds a value compare cannot use" in result.err
    assert "re-run the stage that wrote it with --force" in result.err and "Traceback" not in result.err


def tiny_workspace(tmp_path, replace: tuple[str, str] | None = None) -> Path:
    from tests.conftest import TINY_CATALOG, write_catalog

    text = TINY_CATALOG.replace(*replace) if replace else TINY_CATALOG
    return write_catalog(tmp_path / "ws", text)


def test_an_image_size_the_model_cannot_take_names_the_shape_and_its_own_size(tmp_path, run_cli):
    catalog = tiny_workspace(tmp_path, ("batch_size = 2", "batch_size = 2\nimage_size = 150"))
    result = run_cli(catalog, "run", "--variant", "fp32")
    assert result.exit_code == 1
    assert "test_vit cannot take a 2×3×150×150 input: Input height (150) should be divisible by patch size (16)" in result.err
    assert "its own input is 3×160×160" in result.err and "Traceback" not in result.err
    assert not list((tmp_path / "ws").rglob("*.onnx")) and not list((tmp_path / "ws").rglob(".*.tmp"))


@pytest.mark.skipif(
    Path("/proc/sys/vm/overcommit_memory").exists() and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
    reason="this kernel overcommits every allocation (vm.overcommit_memory = 1): a batch too large for memory would be killed, not refused",
)
def test_a_batch_too_large_for_memory_is_named_instead_of_crashing(tmp_path, run_cli):
    # 4096 images of 16000×16000: terabytes, refused by the allocator at once.
    catalog = tiny_workspace(tmp_path, ("batch_size = 2", "batch_size = 4096\nimage_size = 16000"))
    result = run_cli(catalog, "run", "--variant", "fp32")
    # A result, said with a WARNING and its TIP; and since nothing else was asked, a run that
    # produced nothing: exit 1, not 0 (a script must not take it for a run).
    assert result.exit_code == 1
    assert "ERROR nothing to profile fit in memory: no measurement was written." in result.err
    assert "WARNING tiny_fp32: out of host memory exporting tiny_fp32 at batch size 4096" in result.err
    assert "TIP lower the model's batch_size" in result.err and "Traceback" not in result.err
    export = read_manifest(catalog.parent / "manifests" / "export" / "tiny_fp32.json").export
    assert export.status == "out_of_memory" and export.out_of_memory.memory == "host"
    build = read_manifest(catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json").build
    assert build.status == "skipped" and build.reason.startswith("not exported: out of host memory")


def test_an_empty_selection_says_what_is_empty_and_what_to_name(tmp_path, run_cli):
    catalog = tiny_workspace(tmp_path, ('variants = ["fp32", "fp16", "int8"]', "variants = []"))
    result = run_cli(catalog, "run")
    assert result.exit_code == 2
    assert "nothing is selected: the catalog's [defaults] variants is empty" in result.err
    assert "--variant V" in result.err and "variants: fp32, fp16, int8" in result.err


def test_a_decompression_bomb_among_the_evaluation_images_is_named(tmp_path, run_cli, monkeypatch):
    from PIL import Image

    catalog = tiny_workspace(tmp_path)
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    for index in range(2):
        Image.new("RGB", (64, 64), (index * 90, 30, 200)).save(images / f"{index}.png")
    # Pillow refuses images of more than twice MAX_IMAGE_PIXELS; lowered here so a 64×64 file
    # stands in for a 40000×40000 one that decodes to gigabytes.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    result = run_cli(catalog, "run", "--variant", "fp32", "--eval-dir", str(tmp_path / "images"))
    assert result.exit_code == 1
    # The images are drawn in a seeded order: the first one read is named.
    assert any(f"evaluation image {images / name} is too large to decode safely" in result.err for name in ("0.png", "1.png"))
    assert "downscaled copy" in result.err and "Traceback" not in result.err


def _build_in_subprocess(catalog: Path, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(catalog), "build", "--variant", "fp32"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        preexec_fn=preexec,
        timeout=300,
    )


def test_a_file_size_limit_while_the_engine_is_written_is_named_not_blamed_on_the_onnx(tmp_path, run_cli):
    import resource

    catalog = tiny_workspace(tmp_path)
    assert run_cli(catalog, "export", "--variant", "fp32").exit_code == 0
    onnx = tmp_path / "ws" / "models" / "tiny" / "fp32.onnx"
    limit = onnx.stat().st_size // 2  # room for manifests and the lock, not for the engine

    result = _build_in_subprocess(catalog, lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert result.returncode == 1, result.stderr
    assert "ERROR could not write the engine tiny_fp32.onnx: this process may write files of at most" in result.stderr
    assert "(its file-size limit, `ulimit -f`), and the engine takes up to about" in result.stderr
    assert "raise the limit" in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "ws" / "engines").rglob("*.onnx")) and not list((tmp_path / "ws").rglob(".*.tmp"))
    manifest = tmp_path / "ws" / "manifests" / "onnxruntime" / "tiny_fp32.json"
    assert not manifest.exists() or "build" not in json.loads(manifest.read_text())  # no refusal recorded: the ONNX is fine
    assert _build_in_subprocess(catalog).returncode == 0  # and once the limit is gone, it builds


def _small_disk(directory: Path, size: int):
    """Mount a tmpfs of ``size`` bytes at ``directory`` (root only); skip the test where that cannot be done."""
    import os

    if os.geteuid() != 0:
        pytest.skip("a real full disk is a small tmpfs mounted for the test, which needs root")
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    return directory


def test_a_full_disk_while_the_engine_is_written_is_named_with_its_free_space(tmp_path, run_cli):
    catalog = tiny_workspace(tmp_path)
    assert run_cli(catalog, "export", "--variant", "fp32").exit_code == 0
    onnx = tmp_path / "ws" / "models" / "tiny" / "fp32.onnx"
    engines = _small_disk(tmp_path / "ws" / "engines", onnx.stat().st_size // 2)
    try:
        result = run_cli(catalog, "build", "--variant", "fp32")
        assert result.exit_code == 1, result.err
        assert f"ERROR could not write the engine tiny_fp32.onnx: the disk holding {engines / 'onnxruntime'} has" in result.err
        assert "MiB free, and the engine takes up to about" in result.err and "Traceback" not in result.err
        assert not list(engines.rglob("*.onnx")) and not list(engines.rglob(".*.tmp"))
    finally:
        subprocess.run(["umount", str(engines)], check=True)


def test_a_full_disk_when_taking_the_lock_names_the_free_space(tmp_path, run_cli):
    catalog = tiny_workspace(tmp_path)
    manifests = _small_disk(tmp_path / "ws" / "manifests", 4096)
    try:
        (manifests / "filler").write_bytes(b"\0" * 4096)  # full
        result = run_cli(catalog, "export", "--variant", "fp32")
        assert result.exit_code == 1, result.err
        assert "ERROR cannot take the workspace lock: writing" in result.err and "No space left on device" in result.err
        assert "(0 MiB free now)" in result.err and "Traceback" not in result.err
    finally:
        subprocess.run(["umount", str(manifests)], check=True)

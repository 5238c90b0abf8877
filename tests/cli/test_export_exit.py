"""`pipeline export` is asked for ONNX models: where it could write none for any engine selected
(the exporter refuses the user's module, tests/data/python_models/gated.py), it failed at what it
was asked, and exits non-zero with the exporter's reason in one clear error, no traceback — as a
run of which nothing fit in memory does. What it could write (the references the torch toolchains
run from) is kept, and an export of which one engine got its ONNX exits 0 as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import CPU_TOOLCHAINS, DATA, catalog_head, write_catalog

pytest.importorskip("torch", reason="the python model family needs torch (`make setup` installs it)")

CATALOG = (
    catalog_head(["gated"], ["fp32"])
    + """
[models.gated]
python = "models-in/gated.py:make"
shapes = ["2x8", "4x32"]

[models.mlp]
python = "models-in/mlp.py:make"
config = { features = 16, hidden = 32 }
shapes = ["2x8"]

[variants.fp32]
precision = "fp32"
"""
    + CPU_TOOLCHAINS
)


def workspace(root: Path) -> Path:
    catalog = write_catalog(root, CATALOG)
    (root / "models-in").mkdir()
    for name in ("gated.py", "mlp.py"):
        shutil.copy(DATA / "python_models" / name, root / "models-in" / name)
    return catalog


def test_an_export_that_writes_no_onnx_at_all_exits_non_zero(tmp_path, run_cli):
    catalog = workspace(tmp_path)
    result = run_cli(catalog, "export", "--model", "gated")
    assert result.exit_code == 1, result.err
    assert "Traceback" not in result.err
    assert "ERROR nothing was exported to ONNX: the exporter refused every model selected (gated_fp32: GuardOnDataDependentSymNode" in (
        " ".join(result.err.split())
    ), result.err
    assert "TIP" in result.err and "torch toolchains still run" in result.err, result.err
    export = read_manifest(tmp_path / "manifests" / "export" / "gated_fp32.json").export
    assert export.status == "done" and export.details.onnx_refused  # recorded, references kept
    assert not (tmp_path / "models" / "gated" / "fp32.onnx").exists()
    # Found again by a second export (current, nothing redone): the same failure.
    again = run_cli(catalog, "export", "--model", "gated")
    assert again.exit_code == 1 and "nothing was exported to ONNX" in again.err, again.err


def test_an_export_of_which_one_engine_got_its_onnx_exits_zero(tmp_path, run_cli):
    catalog = workspace(tmp_path)
    result = run_cli(catalog, "export", "--model", "gated", "--model", "mlp")
    assert result.exit_code == 0, result.err
    assert "gated_fp32 is not exportable to ONNX" in result.err  # the WARNING, as before
    assert (tmp_path / "models" / "mlp" / "fp32.onnx").exists()

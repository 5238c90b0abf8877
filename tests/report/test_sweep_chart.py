"""The HTML report's sweep chart (pipeline/report/sweep_chart.py) for points of any number of axes:
a panel per point's sizes but the last, the last along x, named by the axes the export record
names; a batch alone gets no chart, as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.report.rows import ComparisonRow
from pipeline.report.sweep import sweeps
from pipeline.report.sweep_chart import axis_names, chart_axes, sweep_figure
from pipeline.report.verdict import verdicts
from tests.conftest import CPU_TOOLCHAINS, catalog_head, write_catalog

THREE_AXES = ("batch", "frames", "sequence")


def _sweep(shapes: list[str]):
    rows = [
        ComparisonRow(
            model="m",
            variant="fp32",
            toolchain=toolchain,
            status="measured (GPU time)",
            shape=shape,
            median_ms=median * (1 + index),
            median_ci_ms=(median * (1 + index) * 0.99, median * (1 + index) * 1.01),
            tokens_per_s=1000.0 / (median * (1 + index)),
        )
        for index, shape in enumerate(shapes)
        for toolchain, median in (("a", 1.0), ("b", 2.0))
    ]
    (sweep,) = sweeps(rows, verdicts(rows, "a"))
    return sweep


def test_a_three_axis_sweep_has_a_panel_per_batch_and_frames_along_the_sequence():
    sweep = _sweep(["2x3x8", "2x3x16", "2x5x8", "2x5x16"])
    assert chart_axes(sweep, THREE_AXES) == (("batch 2, frames 3", "batch 2, frames 5"), "sequence length")
    figure, along = sweep_figure(sweep, THREE_AXES)
    assert along == "sequence length"
    panels = figure.axes
    assert [axis.get_title() for axis in panels[:2]] == ["batch 2, frames 3", "batch 2, frames 5"]
    assert {axis.get_xlabel() for axis in panels[-2:]} == {"sequence length"}
    # Each panel's line runs along the sequence at its frames: 8 and 16, not the frames 3 and 5.
    assert [list(line.get_xdata()) for line in panels[0].get_lines()[:1]] == [[8, 16]]


def test_axes_the_export_does_not_name_are_said_by_their_sizes():
    sweep = _sweep(["2x3x8", "2x3x16", "2x5x8"])
    assert chart_axes(sweep, None) == (("sizes 2×3", "sizes 2×5"), "last size")
    assert chart_axes(sweep, ("batch", "sequence")) == (("sizes 2×3", "sizes 2×5"), "last size")  # not one name per axis


def test_batch_and_sequence_are_drawn_as_before_and_a_batch_alone_not_at_all():
    assert chart_axes(_sweep(["2x512", "4x512", "2x2048"]), ("batch", "sequence")) == (("batch 2", "batch 4"), "sequence length")
    assert chart_axes(_sweep(["1", "2", "4"]), ("batch",)) is None and sweep_figure(_sweep(["1", "2"]), ("batch",)) is None


def _manifest(model: str, params: dict, inputs: list[dict] | None):
    details = SimpleNamespace(inputs=inputs) if inputs is not None else None
    return SimpleNamespace(model=model, export=SimpleNamespace(params=params, details=details))


def test_the_axis_names_come_from_the_export_record_the_models_own_list_first():
    manifests = [
        _manifest("none", {}, None),
        # The family's list (the catalog's order) over the order the inputs happen to name them in.
        _manifest("listed", {"axes": list(THREE_AXES)}, [{"dims": ["batch", "sequence", 4]}, {"dims": ["batch", "frames"]}]),
        _manifest("bert", {}, [{"dims": ["batch", "sequence"]}, {"dims": ["batch", "sequence"]}]),
        _manifest("bert", {}, [{"dims": ["other"]}]),  # the first record naming them answers
        SimpleNamespace(model="no-export", export=None),
    ]
    assert axis_names(manifests) == {"listed": THREE_AXES, "bert": ("batch", "sequence")}


FRAMES = '''"""A Linear layer over a batch of clips: frames of sequences of 4 features."""

import torch


def make(table):
    return torch.nn.Linear(4, 4), [{"name": "x", "shape": ["batch", "frames", "sequence", 4]}]
'''


def test_a_three_axis_model_gets_its_chart_in_the_html_report(tmp_path, run_cli):
    """A user's module with batch × frames × sequence, measured on PyTorch eager at three points:
    the report draws it against the sequence, named from its export."""
    pytest.importorskip("torch", reason="the python model family needs torch")
    text = (
        catalog_head(["clips"], ["fp32"])
        + """
[models.clips]
python = "models-in/frames.py:make"
axes = ["batch", "frames", "sequence"]
shapes = ["2x3x8", "2x3x16", "2x5x8"]

[variants.fp32]
precision = "fp32"
"""
        + CPU_TOOLCHAINS
    )
    catalog = write_catalog(tmp_path / "ws", text)
    (tmp_path / "ws" / "models-in").mkdir()
    (tmp_path / "ws" / "models-in" / "frames.py").write_text(FRAMES)
    result = run_cli(catalog, "run", "--toolchain", "torch-eager")
    assert result.exit_code == 0, result.err
    assert run_cli(catalog, "compare", "--format", "html").exit_code == 0
    report = (tmp_path / "ws" / "reports" / "compare.html").read_text()
    assert 'alt="clips: latency, tokens/s and memory against sequence length" src="data:image/png;base64,' in report

"""The floor on the engine that ships (pipeline/precision/built.py): the planned variant exported,
built on ONNX Runtime and run on the plan's confirmation samples, measured against the FP32 model's
outputs there by the plan's own figures and bounds — and a built engine that misses the floor is
said plainly."""

from __future__ import annotations

import pytest

from pipeline.precision.figures import Floor
from tests.precision.test_precision import planted_catalog

pytest.importorskip("modelopt")


@pytest.fixture(scope="module")
def lab_and_state(tmp_path_factory):
    from pipeline.cli.state import State
    from pipeline.precision.variant_lab import VariantLab

    ws = tmp_path_factory.mktemp("built")
    state = State(planted_catalog(ws, "fc2"), verbose=False)
    ref = state.catalog.engine("faulty_int8")
    return VariantLab(state.catalog, ref, samples=32), state, ref


def test_the_planned_engine_built_on_onnx_runtime_is_measured_on_the_confirmation_samples(lab_and_state):
    from pipeline.precision.built import check_built

    lab, state, ref = lab_and_state
    planned = {"precision": "int8", "exclude": ["fc2"]}
    floor = Floor((("cos", 0.99),), "--floor")
    check = check_built(state, lab, ref, "int8_plan", planned, "onnxruntime", floor)
    assert check.figures is not None and check.why_not is None, check.why_not
    assert check.engine == "faulty_int8_plan" and check.samples == 32
    assert check.checked_by.startswith("onnxruntime ")
    # ONNX Runtime's integer kernels round otherwise than ModelOpt's fake quantization, but the
    # built engine is the variant the plan measured: the fault excluded, its cosine stays high,
    # as the lab's on the same samples does.
    in_pytorch = lab.evaluate(["fc2"], "confirm")
    assert check.figures.cosine > 0.99 and abs(check.figures.cosine - in_pytorch.cosine) < 0.01
    assert check.held and [bound.metric for bound in check.bounds] == ["cos"]
    assert "it holds" in check.said(floor) and check.as_dict()["held"] is True


def test_a_built_engine_that_misses_the_floor_is_said_plainly(lab_and_state):
    from pipeline.precision.built import check_built

    lab, state, ref = lab_and_state
    # The fully quantized variant, the fault quantized too: far below a cosine of 0.99.
    floor = Floor((("cos", 0.99),), "--floor")
    check = check_built(state, lab, ref, None, {}, "onnxruntime", floor)
    assert check.figures is not None and check.figures.cosine < 0.99
    assert check.held is False
    said = check.said(floor)
    assert "MISSES" in said and "on the 32 confirmation samples" in said

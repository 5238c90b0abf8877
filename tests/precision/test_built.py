"""The floor on the engine that ships (pipeline/precision/built.py): the planned variant exported,
built on ONNX Runtime and run on the plan's confirmation samples, measured against the FP32 model's
outputs there by the plan's own figures and bounds — and a built engine that misses the floor is
said plainly."""

from __future__ import annotations

import pytest

from pipeline.catalog.floor import AccuracyFloor
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
    floor = AccuracyFloor((("cos", 0.99),), "--floor")
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
    floor = AccuracyFloor((("cos", 0.99),), "--floor")
    check = check_built(state, lab, ref, None, {}, "onnxruntime", floor)
    assert check.figures is not None and check.figures.cosine < 0.99
    assert check.held is False
    said = check.said(floor)
    assert "MISSES" in said and "on the 32 confirmation samples" in said


def test_the_engine_that_ships_keeps_the_plans_figures_beside_its_own_in_its_manifest(lab_and_state):
    from types import SimpleNamespace

    from pipeline.manifest import read_manifest
    from pipeline.precision.built import check_built, record_on_engine

    lab, state, ref = lab_and_state
    # A 1 % top-1 drop: 32 samples cannot bound it, so the engine holds it only as far as they show.
    floor = AccuracyFloor((("cos", 0.99),), "--floor", (("top1", 0.01),))
    check = check_built(state, lab, ref, "int8_plan", {"precision": "int8", "exclude": ["fc2"]}, "onnxruntime", floor)
    top1 = next(bound for bound in check.bounds if bound.metric == "top1")
    assert check.held and top1.status == "unresolved" and top1.counted == 0
    said = check.said(floor)
    assert (
        "it holds cosine ≥ 0.99, top-1 at most 1% below FP32's (--floor) as far as 32 samples can show, unresolved by its bounds: top-1 drop ≤"
        in said
    )

    plan = SimpleNamespace(floor=floor, status="unresolved", exclude=["fc2"], bounds={"confirm": lab.bounds(["fc2"], floor, "confirm")})
    record_on_engine(check, plan)
    kept = read_manifest(check.manifest).build.details.plan_check
    assert kept["floor"] == floor.wanted() and kept["plan_status"] == "unresolved" and kept["exclude"] == ["fc2"]
    assert kept["held"] is True and kept["samples"] == 32 and kept["checked_by"] == check.checked_by
    cosine = next(metric for metric in kept["metrics"] if metric["metric"] == "cos")
    # The plan's figure (fake quantization) and the built engine's, each with its bound, side by side.
    assert cosine["figure"] == pytest.approx(lab.evaluate(["fc2"], "confirm").cosine)
    assert cosine["built"]["estimate"] == pytest.approx(check.figures.cosine) and cosine["built"]["held"] is True

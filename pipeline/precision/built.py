"""The floor on the engine that ships (`pipeline plan`).

The plan's figures come from ModelOpt's fake quantization in PyTorch. The engine a user ships is
the planned variant exported to ONNX and built by a toolchain, whose kernels round otherwise (ONNX
Runtime's integer kernels, TensorRT's fused ones). So the planned variant is exported and built on
the measuring runtime — ONNX Runtime, the embedded default, or the toolchain ``--measure`` names —
and run on the confirmation samples the plan was confirmed on; its outputs are set against the FP32
model's on those samples by the same figures and the same one-sided bounds as the plan's
(pipeline/precision/bounds.py). A built engine that misses the floor is said plainly.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.precision.bounds import Bound

# ONNX's tensor element types (onnx.TensorProto) as torch names, for the inputs a runtime is fed.
_ONNX_TO_TORCH = {1: "float32", 10: "float16", 16: "bfloat16", 6: "int32", 7: "int64"}


@dataclass
class BuiltCheck:
    """The planned engine as built on ``toolchain``, measured on the confirmation samples."""

    toolchain: str
    engine: str
    samples: int
    figures: Any | None = None  # Figures; None where it could not be measured
    bounds: list[Bound] = field(default_factory=list)
    held: bool | None = None  # the floor by its figures and bounds; None: not measured
    checked_by: str | None = None
    why_not: str | None = None  # why the built engine has no figures (a refused build, a runtime that cannot feed it)
    manifest: Path | None = field(default=None, repr=False)  # the built engine's manifest (record_on_engine)

    def figure(self, metric: str, side: str) -> dict[str, Any] | None:
        """One floor metric's figure and bound on the built engine, for the plan's JSON."""
        bound = next((b for b in self.bounds if (b.metric, b.side) == (metric, side)), None)
        if bound is None:
            return None
        return {"estimate": bound.estimate, "bound": bound.bound, "method": bound.method, "held": bound.held}

    def as_dict(self) -> dict[str, Any]:
        return {
            "toolchain": self.toolchain,
            "engine": self.engine,
            "samples": self.samples,
            "figures": self.figures.as_dict() if self.figures is not None else None,
            "bounds": [bound.as_dict() for bound in self.bounds],
            "held": self.held,
            "checked_by": self.checked_by,
            "why_not": self.why_not,
        }

    def said(self, floor) -> str:
        """ "built on onnxruntime, on the 32 confirmation samples: cosine 0.9991, top-1 100%; holds
        cos ≥ 0.99 by its bounds" — or that it misses the floor, or why it was not measured."""
        where = f"the planned engine built on {self.toolchain}"
        if self.figures is None:
            return f"{where} was not measured on the confirmation samples: {self.why_not}"
        said = f"{where}, on the {self.samples} confirmation samples: {self.figures.said()}"
        unresolved = [bound for bound in self.bounds if bound.status == "unresolved"]
        if self.held and not unresolved:
            return f"{said}; it holds {floor} by its bounds"
        if self.held:  # by no sample counted, where these samples cannot bound the limit
            shown = "; ".join(bound.said() for bound in unresolved)
            return f"{said}; it holds {floor} as far as {self.samples} samples can show, unresolved by its bounds: {shown}"
        failing = "; ".join(bound.said() for bound in self.bounds if not bound.held) or "by its figures"
        return f"{said}; it MISSES {floor} ({failing})"


def check_built(state, lab, ref, planned: str | None, table: dict[str, Any], toolchain: str, floor) -> BuiltCheck:
    """Export and build the planned variant (``planned`` None: the fully quantized one, which the
    plan left as it is) on ``toolchain``, run it on ``lab``'s confirmation batches and measure it
    against the FP32 model's outputs there."""
    from pipeline.catalog import VariantSpec
    from pipeline.precision.measure import refuse_another_plan
    from pipeline.stages.base import RunRequest
    from pipeline.stages.build import BuildStage
    from pipeline.stages.runner import LocalLauncher

    catalog = state.catalog
    if planned is not None:
        wanted = VariantSpec.model_validate(table)
        refuse_another_plan(planned, catalog.variants.get(planned), wanted)
        catalog = catalog.model_copy(update={"variants": {**catalog.variants, planned: catalog.variants.get(planned, wanted)}})
        state.use_catalog(catalog)
    engine = catalog.engine(f"{ref.model}_{planned or ref.variant}")
    samples = lab.describe()["confirm"]["samples"]
    check = BuiltCheck(toolchain, engine.name, samples)
    ctx = state.context(False)
    with state.holding_workspace(False):
        LocalLauncher().run(ctx, RunRequest([engine], [toolchain], "build"))
    stage = BuildStage(ctx, engine, toolchain)
    engine_path = stage.engine_path()
    if not engine_path.is_file():
        check.why_not = f"{toolchain} built no engine for {engine.name} (`pipeline compare` says why)"
        return check
    check.manifest = stage.manifest_path()
    outputs, checked_by = _run_on(stage.runtime, engine_path, ctx.workspace.root / ctx.workspace.onnx_path(engine), lab.batches["confirm"])
    if outputs is None:
        check.why_not = f"{toolchain} cannot run its engines on given inputs"
        return check
    check.figures, stats = lab.measured("confirm", outputs)
    from pipeline.precision.bounds import bounds

    check.bounds = bounds(stats, floor)
    check.held = floor.met_by(check.figures) and all(bound.held for bound in check.bounds)
    check.checked_by = checked_by
    return check


def record_on_engine(check: BuiltCheck, plan) -> None:
    """Keep the plan's floor in the built engine's manifest (``build.details.plan_check``): per
    metric the plan's figure and bound (fake quantization in PyTorch) beside this engine's on the
    same confirmation samples, so the engine that ships carries the evidence, not only the plan."""
    from pipeline.manifest import read_manifest
    from pipeline.precision.report import plan_metrics

    if check.manifest is None or check.figures is None or not check.manifest.is_file():
        return
    manifest = read_manifest(check.manifest)
    if manifest.build is None or manifest.build.details is None:
        return
    kept = {
        "floor": plan.floor.wanted(),
        "plan_status": plan.status,
        "exclude": list(plan.exclude),
        "samples": check.samples,
        "metrics": plan_metrics(plan, check),
        "held": check.held,
        "checked_by": check.checked_by,
    }
    details = manifest.build.details.model_copy(update={"plan_check": kept})
    manifest.build = manifest.build.model_copy(update={"details": details})
    manifest.write(check.manifest)


def _run_on(runtime, engine_path: Path, onnx_path: Path, batches: list) -> tuple[list | None, str | None]:
    """The engine's first output on each batch (as torch tensors), and how it was run; (None,
    None) where the runtime cannot feed its engine given inputs."""
    import onnx
    import torch

    from pipeline.measuring.accuracy import ReferenceBatch, ReferenceTensor, write_tensor

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    weights = {initializer.name for initializer in graph.initializer}
    inputs = [(i.name, _ONNX_TO_TORCH.get(i.type.tensor_type.elem_type, "float32")) for i in graph.input if i.name not in weights]
    outputs, checked_by = [], None
    with tempfile.TemporaryDirectory(prefix="planned-engine-") as scratch:
        for index, batch in enumerate(batches):
            tensors = batch if isinstance(batch, tuple) else (batch,)
            feeds = []
            for (name, dtype), tensor in zip(inputs, tensors):
                tensor = tensor.to(getattr(torch, dtype))  # the type the engine takes (ONNX's declared input type)
                path = Path(scratch) / f"{index}.{len(feeds)}.bin"
                write_tensor(tensor, path)
                feeds.append(ReferenceTensor(name, path, tuple(tensor.shape), dtype))
            reference = ReferenceBatch(
                inputs=tuple(feeds), output=None, description="the plan's confirmation samples", precision="", sparse=False
            )
            run = runtime.run_reference(engine_path, reference)
            if run is None:
                return None, None
            checked_by = run.checked_by
            outputs.append(torch.from_numpy(next(iter(run.outputs.values())).copy()).float())
    return outputs, checked_by

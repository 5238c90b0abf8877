"""Which layers break a quantized variant: each layer measured alone, two ways, and ranked.

For every quantized layer, on the search batches:

- **excluded alone** — every other layer quantized, this one not: what excluding it *buys*
  (``gain``: its cosine minus the fully quantized variant's);
- **quantized alone** — only this layer quantized: what it *costs* on its own (``cost``: the
  unquantized model's cosine minus this one's).

Layers are ranked by gain, then cost; where the floor has one each input must keep (a per-sample
cosine, pipeline/catalog/floor.py), first by the samples excluding the layer alone brings back above
it (``samples_bought``): a layer whose error falls on a few inputs buys little of the cosine over
the set, and all of those inputs. Beside the ranking, the *depth profile*: with every layer
quantized, each block's output against FP32, which shows where along the model the error first
appears. One calibration serves every measurement (variant_lab.py says why that is exact).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog.floor import AccuracyFloor
from pipeline.precision.figures import Figures
from pipeline.precision.variant_lab import VariantLab


@dataclass
class LayerSensitivity:
    name: str
    kind: str  # the module's class: Linear, Conv2d
    flops: float  # of one forward of an evaluation batch
    excluded_alone: Figures
    quantized_alone: Figures
    gain: float
    cost: float
    rank: int = 0
    # Where the floor has a per-sample one: the samples below its threshold that excluding this
    # layer alone brings back above it, and that quantizing it alone puts below (None: no such floor).
    samples_bought: int | None = None
    samples_cost: int | None = None
    onnx_nodes: list[str] = field(default_factory=list)
    engine_layers: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Sensitivity:
    engine: str
    precision: str
    floor: AccuracyFloor
    fully_quantized: Figures
    unquantized: Figures
    layers: list[LayerSensitivity]  # ranked: the most sensitive first
    kept_unquantized: dict[str, str]  # by rule or by the catalog, with the reason
    depth: list[dict[str, Any]]
    evaluation: dict[str, Any]
    seconds: float

    def below(self, figures: Figures) -> int | None:
        """How many samples fall below the floor's per-sample threshold (None: the floor has none)."""
        return below_per_sample(self.floor, figures)

    @property
    def total_flops(self) -> float:
        return sum(layer.flops for layer in self.layers)

    def layer(self, name: str) -> LayerSensitivity:
        return next(layer for layer in self.layers if layer.name == name)


def _ordered(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def _fewer_below(floor: AccuracyFloor, before: Figures, after: Figures) -> int | None:
    """How many fewer samples fall below the per-sample threshold ``after`` than ``before``."""
    was, now = below_per_sample(floor, before), below_per_sample(floor, after)
    return None if was is None or now is None else was - now


def below_per_sample(floor: AccuracyFloor, figures: Figures) -> int | None:
    """How many samples of ``figures`` fall below ``floor``'s per-sample threshold; None without one."""
    if not floor.per_sample:
        return None
    metric, threshold, _ = floor.per_sample[0]
    return figures.below(metric, threshold)


def analyse(lab: VariantLab, floor: AccuracyFloor, progress=None) -> Sensitivity:
    """Measure every quantized layer of ``lab`` excluded alone and quantized alone; rank them."""
    progress = progress or (lambda text: None)
    started = time.perf_counter()
    full = lab.evaluate([])
    unquantized = lab.evaluate(lab.layers)
    modules = dict(lab.model.named_modules())
    layers = []
    for number, name in enumerate(lab.layers, 1):
        progress(f"layer {number} of {len(lab.layers)}: {name}")
        excluded_alone = lab.evaluate([name])
        quantized_alone = lab.evaluate_only([name])
        layers.append(
            LayerSensitivity(
                name=name,
                kind=type(modules[name]).__name__.removeprefix("Quant"),
                flops=lab.flops.get(name, 0.0),
                excluded_alone=excluded_alone,
                quantized_alone=quantized_alone,
                gain=excluded_alone.cosine - full.cosine,
                cost=unquantized.cosine - quantized_alone.cosine,
                samples_bought=_fewer_below(floor, full, excluded_alone),
                samples_cost=_fewer_below(floor, quantized_alone, unquantized),
            )
        )
    layers.sort(key=lambda layer: (layer.samples_bought or 0, _ordered(layer.gain), _ordered(layer.cost)), reverse=True)
    for rank, layer in enumerate(layers, 1):
        layer.rank = rank
    progress("depth profile")
    depth = lab.depth_profile()
    evaluation = lab.describe()
    evaluation["timings_s"] = {**lab.timings, "measure_s": round(time.perf_counter() - started, 2)}
    return Sensitivity(
        engine=lab.ref.name,
        precision=lab.variant.precision,
        floor=floor,
        fully_quantized=full,
        unquantized=unquantized,
        layers=layers,
        kept_unquantized=lab.kept_unquantized,
        depth=depth,
        evaluation=evaluation,
        seconds=round(time.perf_counter() - started + lab.timings.get("prepare_s", 0.0), 2),
    )

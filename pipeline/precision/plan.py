"""The variant that meets an accuracy floor keeping the least of the model's work in high precision.

Search, on the search batches (what sensitivity.py measured):

1. Exclude layers in order of what each buys per FLOP (its ``gain`` — the cosine excluding it
   alone adds — over its FLOPs), measuring after each, until the floor holds. When an exclusion
   buys less than half of what its rank promised, layers interact: the remaining layers are
   measured again, each excluded beside the exclusions so far, and ranked anew (at most
   ``RERANKS`` times; each costs a measurement per remaining layer).
2. Put back every excluded layer that is no longer needed, the costliest in FLOPs first: a layer
   stays excluded only if quantizing it again breaks the floor.
3. Confirm the result on the confirmation batches, which the search never saw.

"The floor holds" in the search means it holds with a margin from the search's own spread (a
bootstrap over its samples, pipeline/precision/margin.py): a plan that stopped exactly at the floor
would miss it on the confirmation about half the time. The confirmation is judged at the floor.

The floor metrics are those of the floor; the order is by cosine, the one that moves with every
layer (top-1 agreement moves in steps of a sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import PipelineError
from pipeline.precision.figures import Figures, Floor, change_text
from pipeline.precision.margin import Margins
from pipeline.precision.sensitivity import Sensitivity
from pipeline.precision.variant_lab import VariantLab

# How often the remaining layers are ranked again when exclusions interact.
RERANKS = 3
# An exclusion that buys less than this share of what it was ranked on means the layers interact.
INTERACTION = 0.5


@dataclass
class Step:
    action: str  # "exclude", "rerank", "put back", "keep"
    layer: str | None
    search: Figures | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "layer": self.layer, "search": self.search.as_dict() if self.search else None, "note": self.note}


@dataclass
class Plan:
    engine: str
    floor: Floor
    exclude: list[str]  # in the model's order
    search: Figures
    confirm: Figures
    fully_quantized: dict[str, Figures]  # "search", "confirm"
    quantized_flops_share: float  # of the quantizable layers' FLOPs, still quantized
    steps: list[Step] = field(default_factory=list)
    search_samples: int = 0
    confirm_samples: int = 0
    # What the search and the confirmation were measured on (VariantLab.describe()).
    evaluation: dict[str, Any] = field(default_factory=dict)
    # How far the search's figures may be off, which the floor held by (None: not needed).
    margin: Margins | None = None

    @property
    def confirmed(self) -> bool:
        return self.floor.met_by(self.confirm)

    @property
    def needed(self) -> bool:
        return bool(self.exclude)


def make_plan(lab: VariantLab, sensitivity: Sensitivity, floor: Floor, progress=None) -> Plan:
    """Search, prune and confirm the exclusions that meet ``floor``."""
    progress = progress or (lambda text: None)
    flops = {layer.name: max(layer.flops, 1.0) for layer in sensitivity.layers}
    full = lab.evaluate([])
    steps: list[Step] = []
    described = lab.describe()
    if not floor.met_by(lab.evaluate(lab.layers)):
        raise PipelineError(
            f"no plan meets {floor} for {lab.ref.name}: not even the unquantized model (every layer in "
            f"{described['compute_dtype']}) does: {lab.evaluate(lab.layers).said()}.",
            hint="lower the floor (--floor), or measure this model unquantized",
        )
    excluded: list[str] = []
    current = full

    def holds(layers: list[str], figures: Figures) -> bool:
        return floor.met_by(figures) and floor.met_by(figures, lab.margins(layers, floor))

    gains = {layer.name: layer.gain for layer in sensitivity.layers}
    candidates = _by_gain_per_flop(gains, flops)
    reranks = 0
    while not holds(excluded, current) and candidates:
        layer = candidates.pop(0)
        progress(f"excluding {layer} ({len(excluded) + 1} excluded)")
        after = lab.evaluate([*excluded, layer])
        bought, promised = after.cosine - current.cosine, gains[layer]
        excluded.append(layer)
        steps.append(Step("exclude", layer, after, f"bought {change_text(bought)} of cosine, ranked on {change_text(promised)}"))
        current = after
        if not holds(excluded, current) and candidates and reranks < RERANKS and not bought >= INTERACTION * promised:
            reranks += 1
            progress(f"layers interact: measuring the {len(candidates)} remaining again")
            gains = {name: lab.evaluate([*excluded, name]).cosine - current.cosine for name in candidates}
            candidates = _by_gain_per_flop(gains, flops)
            steps.append(Step("rerank", None, None, f"the remaining {len(candidates)} layers ranked again beside the exclusions so far"))
    if not holds(excluded, current):
        excluded = list(lab.layers)  # only the unquantized model meets it (checked above)
    for layer in sorted(excluded, key=lambda name: flops[name], reverse=True):
        trial = [name for name in excluded if name != layer]
        progress(f"putting {layer} back")
        figures = lab.evaluate(trial)
        if holds(trial, figures):
            excluded, current = trial, figures
            steps.append(Step("put back", layer, figures, "no longer needed: the floor holds with it quantized"))
        else:
            steps.append(Step("keep", layer, figures, "quantizing it again breaks the floor"))
    if set(excluded) == set(lab.layers):
        raise PipelineError(
            f"only the unquantized model meets {floor} for {lab.ref.name}: every quantized layer had to be excluded.",
            hint=f"measure {lab.ref.model} at fp16 or bf16, or lower the floor (--floor)",
        )
    order = {name: index for index, name in enumerate(lab.layers)}
    excluded.sort(key=order.__getitem__)
    progress("confirming on the batches the search never saw")
    confirm = lab.evaluate(excluded, "confirm")
    total = sum(flops.values())
    return Plan(
        engine=lab.ref.name,
        floor=floor,
        exclude=excluded,
        search=current,
        confirm=confirm,
        fully_quantized={"search": full, "confirm": lab.evaluate([], "confirm")},
        quantized_flops_share=sum(flops[name] for name in lab.layers if name not in excluded) / total if total else 0.0,
        steps=steps,
        margin=lab.margins(excluded, floor),
        search_samples=described["search"]["samples"],
        confirm_samples=described["confirm"]["samples"],
        evaluation=described,
    )


def _by_gain_per_flop(gains: dict[str, float], flops: dict[str, float]) -> list[str]:
    """Layers whose exclusion buys anything, the most per FLOP first (larger gains first on a tie)."""
    useful = [name for name, gain in gains.items() if not math.isnan(gain) and gain > 0]
    return sorted(useful, key=lambda name: (gains[name] / flops[name], gains[name]), reverse=True)

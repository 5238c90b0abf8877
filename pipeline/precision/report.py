"""`pipeline sensitivity` and `pipeline plan` as the user reads them: terminal, JSON, HTML.

The JSON documents are contracts (docs/precision.md; JSON Schemas in docs/): ``kind`` says which,
``schema_version`` counts their changes.
"""

from __future__ import annotations

import html
import math
from typing import Any

from pipeline.precision.bounds import CONFIDENCE
from pipeline.precision.figures import Figures, change_text, cosine_text
from pipeline.precision.plan import Plan
from pipeline.precision.sensitivity import LayerSensitivity, Sensitivity

SENSITIVITY_SCHEMA_VERSION = 4
PLAN_SCHEMA_VERSION = 6
# Layers the terminal lists; JSON and HTML list every one.
TERMINAL_LAYERS = 15


def _number(value: float | None) -> float | None:
    """JSON has no NaN: a cosine of outputs that are not finite is null."""
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


def _figures(figures: Figures) -> dict[str, Any]:
    return {key: _number(value) for key, value in figures.as_dict().items()}


# --- JSON --------------------------------------------------------------------------------------------


def sensitivity_document(result: Sensitivity) -> dict[str, Any]:
    total = result.total_flops or 1.0
    return {
        "kind": "sensitivity",
        "schema_version": SENSITIVITY_SCHEMA_VERSION,
        "engine": result.engine,
        "precision": result.precision,
        "floor": result.floor.as_dict(),
        "evaluation": result.evaluation,
        "fully_quantized": _figures(result.fully_quantized),
        "unquantized": _figures(result.unquantized),
        "fully_quantized_meets_floor": result.floor.met_by(result.fully_quantized),
        "per_sample": _per_sample(result),
        "layers": [
            {
                "rank": layer.rank,
                "name": layer.name,
                "kind": layer.kind,
                "flops": layer.flops,
                "flops_share": layer.flops / total,
                "gain": _number(layer.gain),
                "cost": _number(layer.cost),
                "samples_bought": layer.samples_bought,
                "samples_cost": layer.samples_cost,
                "excluded_alone": _figures(layer.excluded_alone),
                "quantized_alone": _figures(layer.quantized_alone),
                "onnx_nodes": layer.onnx_nodes,
                "engine_layers": layer.engine_layers,
            }
            for layer in result.layers
        ],
        "kept_unquantized": result.kept_unquantized,
        "depth": [{key: _number(value) if key != "name" else value for key, value in unit.items()} for unit in result.depth],
        "seconds": result.seconds,
    }


def _per_sample(result: Sensitivity) -> dict[str, Any] | None:
    """The floor each input must keep, and how many samples fall below it fully quantized and
    unquantized; None where the floor has none."""
    if not result.floor.per_sample:
        return None
    metric, threshold, share = result.floor.per_sample[0]
    return {
        "metric": metric,
        "threshold": threshold,
        "share": share,
        "samples": result.evaluation["search"]["samples"],
        "fully_quantized_below": result.below(result.fully_quantized),
        "unquantized_below": result.below(result.unquantized),
    }


def plan_metrics(plan: Plan, built=None) -> list[dict[str, Any]]:
    """Per floor metric, on the confirmation samples: the figure, its bound and method, its status,
    the samples that would show its limit with an 80 % chance, and the built engine's (null where
    it was not built: pipeline/precision/built.py)."""
    return [
        {
            "metric": bound.metric,
            "side": bound.side,
            "limit": bound.limit,
            "threshold": bound.threshold,
            "figure": _number(bound.estimate),
            "bound": _number(bound.bound),
            "method": bound.method,
            "status": bound.status,
            "samples_for_power": bound.samples_for_power,
            "built": built.figure(bound.metric, bound.side) if built is not None else None,
        }
        for bound in plan.bounds.get("confirm", [])
    ]


def plan_document(
    plan: Plan,
    variant_name: str,
    variant_table: dict[str, Any],
    toml_text: str,
    command: str,
    measured: dict[str, Any] | None = None,
    built=None,
) -> dict[str, Any]:
    return {
        "kind": "plan",
        "schema_version": PLAN_SCHEMA_VERSION,
        "engine": plan.engine,
        "floor": plan.floor.as_dict(),
        "exclude": plan.exclude,
        "needed": plan.needed,
        "held_on_search": plan.held_on_search,
        "confirmed": plan.confirmed,
        "status": plan.status,
        "metrics": plan_metrics(plan, built),
        "unseen": plan.unseen.as_dict(),
        "built": built.as_dict() if built is not None else None,
        "quantized_flops_share": plan.quantized_flops_share,
        "evaluation": plan.evaluation,
        "search": _figures(plan.search),
        "confirm": _figures(plan.confirm),
        "fully_quantized": {which: _figures(figures) for which, figures in plan.fully_quantized.items()},
        "steps": [step.as_dict() for step in plan.steps],
        "bounds": {
            "confidence": CONFIDENCE,
            **{
                which: [{key: _number(value) for key, value in bound.as_dict().items()} for bound in found]
                for which, found in plan.bounds.items()
            },
        },
        "variant": {"name": variant_name, "table": variant_table, "toml": toml_text},
        "measure_with": command,
        "measured": measured,  # --measure: pipeline/precision/measure.py
    }


# --- terminal ---------------------------------------------------------------------------------------


def _drawn(part: dict[str, Any]) -> str:
    """Where the samples came from, in words: "seeds 1000–1001", or "images of 4 classes from DIR,
    8 each"."""
    metric = f"; metric {part['metric']}" if part.get("metric") else ""
    if part.get("source") == "images":
        counts = sorted(set(part["classes"].values()))
        each = f"{counts[0]} each" if len(counts) == 1 else f"{counts[0]}–{counts[-1]} each"
        return f"images of {len(part['classes'])} classes from {part['folder']}, {each}{metric}"
    if part.get("source") == "tokens":
        return f"sequences of {part['file']} ({part['rows']} rows), drawn seeded{metric}"
    if part.get("source") == "hook":
        return f"{part['batches']} batches of {part['hook']}{metric}"
    seeds = part["seeds"]
    return (f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}–{seeds[-1]}") + metric


def _kept(kept: dict[str, str]) -> list[str]:
    """Layers kept unquantized, grouped by reason: "5 layers — reason (a, b, …)"."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in kept.items():
        by_reason.setdefault(reason, []).append(name)
    lines = []
    for reason, names in by_reason.items():
        shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
        lines.append(f"  {len(names)} — {reason}: {shown}")
    return lines


def _where(layer: LayerSensitivity) -> str:
    parts = [f"{len(layer.onnx_nodes)} nodes"] if layer.onnx_nodes else []
    precisions = sorted({entry["precision"] for entry in layer.engine_layers})
    if precisions:
        parts.append("engine " + "/".join(precisions))
    return ", ".join(parts) or "—"


def print_sensitivity(result: Sensitivity, console) -> None:
    from rich.table import Table

    evaluation = result.evaluation
    search = evaluation["search"]
    at = f" at shape {evaluation['point']}" if evaluation["point"] else ""
    console.print(
        f"[bold]{result.engine}[/bold]: {len(result.layers)} quantized layers, each measured alone on {search['samples']} samples"
        f"{at} ({_drawn(search)}, apart from calibration), {evaluation['device']}, {result.seconds:.1f} s"
    )
    met = result.floor.met_by(result.fully_quantized)
    below = result.below(result.fully_quantized)
    each = f" ({below} of {search['samples']} samples below its per-sample cosine)" if below is not None else ""
    console.print(
        f"fully quantized: {result.fully_quantized.said()} · unquantized ({evaluation['compute_dtype']}): {result.unquantized.said()}\n"
        f"floor: {result.floor} — {'met' if met else '[red]missed[/red]'} by the fully quantized variant{each}"
    )
    total = result.total_flops or 1.0
    columns = {
        "#": [str(layer.rank) for layer in result.layers[:TERMINAL_LAYERS]],
        "layer": [layer.name for layer in result.layers[:TERMINAL_LAYERS]],
        "FLOPs": [f"{layer.flops / total:.1%}" for layer in result.layers[:TERMINAL_LAYERS]],
        "excluded alone": [cosine_text(layer.excluded_alone.cosine) for layer in result.layers[:TERMINAL_LAYERS]],
        "buys": [change_text(layer.gain) for layer in result.layers[:TERMINAL_LAYERS]],
        "samples back": [f"{layer.samples_bought:+d}" for layer in result.layers[:TERMINAL_LAYERS] if layer.samples_bought is not None],
        "quantized alone": [cosine_text(layer.quantized_alone.cosine) for layer in result.layers[:TERMINAL_LAYERS]],
        "costs": [change_text(layer.cost) for layer in result.layers[:TERMINAL_LAYERS]],
        "where": [_where(layer) for layer in result.layers[:TERMINAL_LAYERS]],
    }
    if not columns["samples back"]:  # no per-sample floor: no samples to count
        del columns["samples back"]
    # Layer names stay whole; in a narrow terminal the columns that say least go first.
    for optional in ("where", "quantized alone", "excluded alone"):
        if _width(columns) <= console.width:
            break
        del columns[optional]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in columns:
        table.add_column(header, justify="left" if header in ("layer", "where") else "right", no_wrap=header == "layer")
    for row in zip(*columns.values()):
        table.add_row(*row)
    console.print(table)
    if len(result.layers) > TERMINAL_LAYERS:
        console.print(f"({TERMINAL_LAYERS} of {len(result.layers)} layers; --format json or html lists every one)")
    if result.kept_unquantized:
        console.print("kept unquantized already (not analysed):\n" + "\n".join(_kept(result.kept_unquantized)), markup=False)
    print_depth(result.depth, console)


def _width(columns: dict[str, list[str]]) -> int:
    return sum(max(len(header), *(len(cell) for cell in cells)) for header, cells in columns.items()) + 2 * (len(columns) - 1)


def print_depth(depth: list[dict[str, Any]], console) -> None:
    from rich.table import Table

    console.print("\n[bold]error along the depth[/bold] (every layer quantized, first search batch): each unit's output vs FP32")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in ("unit", "cosine", "rel. error", ""):
        table.add_column(header, justify="left" if header in ("unit", "") else "right")
    worst = max((unit["relative_error"] for unit in depth if math.isfinite(unit["relative_error"])), default=1.0) or 1.0
    for unit in depth:
        error = unit["relative_error"]
        bar = "█" * max(1, round(24 * min(error, worst) / worst)) if math.isfinite(error) else "not finite"
        table.add_row(unit["name"], cosine_text(unit["cosine"]), f"{error:.2%}", bar)
    console.print(table)
    first = next((unit["name"] for unit in depth if not unit["cosine"] >= 0.99), None)
    if first:
        console.print(f"first unit below cosine 0.99: {first}")


def print_plan(plan: Plan, total_layers: int, toml_text: str, command: str, console, in_catalog: bool = True) -> None:
    confirm, search = plan.confirm, plan.search
    for bound in plan.unresolved():
        console.print(f"[yellow]{bound.unresolved_said()}[/yellow]")
    if not plan.needed and plan.held_on_search:
        console.print(f"[bold]{plan.engine}[/bold] already meets {plan.floor} fully quantized: {search.said()}; no layer needs excluding.")
        console.print(f"  search: {_bounds(plan, 'search')}   confirmation: {_bounds(plan, 'confirm')}")
        console.print(f"  what the confirmation cannot see: {plan.unseen.said()}", markup=False, highlight=False)
        if plan.status == "unresolved":
            console.print(f"[yellow]floor {plan.floor}: unresolved — these samples cannot show every limit by its bound[/yellow]")
        return
    console.print(
        f"[bold]plan for {plan.engine}[/bold]: exclude {len(plan.exclude)} of {total_layers} quantized layers "
        f"({', '.join(plan.exclude) or 'none'}); {plan.quantized_flops_share:.1%} of their FLOPs stay quantized"
    )
    console.print(
        f"  fully quantized   search: {plan.fully_quantized['search'].said()}   confirmation: {plan.fully_quantized['confirm'].said()}"
    )
    console.print(f"  planned           search: {search.said()}   confirmation: {confirm.said()}")
    console.print(f"  {CONFIDENCE:.0%} one-sided bounds   search: {_bounds(plan, 'search')}   confirmation: {_bounds(plan, 'confirm')}")
    console.print(f"  what the confirmation cannot see: {plan.unseen.said()}", markup=False, highlight=False)
    for step in plan.steps:
        if step.action == "exclude":
            console.print(f"  exclude {step.layer}: {step.note}", markup=False, highlight=False)
        elif step.action == "stop":
            console.print(f"  stopped: {step.note}", markup=False, highlight=False)
    if plan.evaluation:
        drawn = plan.evaluation["search"], plan.evaluation["confirm"]
        console.print(
            f"  search on {drawn[0]['samples']} samples ({_drawn(drawn[0])}); confirmation on {drawn[1]['samples']} others ({_drawn(drawn[1])})"
        )
    if not plan.held_on_search:
        failing = "; ".join(bound.said() for bound in plan.failing())
        console.print(f"[red]floor {plan.floor}: not met on the search batches{': ' + failing if failing else ''}[/red]", highlight=False)
        return
    if plan.confirmed:
        console.print(f"floor {plan.floor}: held on the search batches and confirmed, by its bounds, on batches the search never saw")
    elif plan.status == "unresolved":
        console.print(
            f"[yellow]floor {plan.floor}: unresolved — held by everything these samples can say, but not every limit is shown "
            "by its bound: a plan, not a confirmed one[/yellow]"
        )
    else:
        console.print(f"[red]floor {plan.floor}: held on the search batches, not confirmed by its bounds on the confirmation batches[/red]")
    console.print("\n" + toml_text.rstrip(), markup=False, highlight=False)
    first = "" if in_catalog else "add the table above to the catalog (or plan with --apply), then "
    console.print(
        f"\n{first}measure whether it still pays, in paired rounds beside the full and unquantized variants:\n  {command}", markup=False
    )


def _bounds(plan: Plan, which: str) -> str:
    """ "top-1 drop ≤ 8.9% (0 of 32 lost, exact)" for each floor metric, with a cross where it fails."""
    return "; ".join(bound.said() + ("" if bound.held else " ✗") for bound in plan.bounds.get(which, [])) or "—"


def print_paid(measured, console) -> None:
    """What the plan costs in speed on the toolchain, point by point, and what was timed
    (pipeline/precision/measure.py's Measured)."""
    console.print(
        f"\n[bold]what it costs on {measured.toolchain}[/bold] (paired rounds; planned engine's time over each other's, 95% interval):"
    )
    console.print(f"  {measured.said()}", markup=False, highlight=False)
    for point in measured.points:
        console.print(f"  {point.said()}", markup=False, highlight=False)
    if not measured.points:
        console.print("  no engine of these variants has a time (`pipeline compare` says why)", markup=False)
    paid = measured.points
    if paid and paid[0].vs_full is None and paid[0].rows.get("planned") is paid[0].rows.get("full"):
        console.print("  (no layer needed excluding: the plan is the fully quantized variant itself)")


# --- HTML ----------------------------------------------------------------------------------------------

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem; color: #1d2330; }
h1 { font-size: 1.5rem; } h2 { margin-top: 2rem; border-bottom: 2px solid #76b900; }
table { border-collapse: collapse; font-size: 0.85rem; } th, td { border: 1px solid #ccd; padding: 0.25rem 0.5rem; text-align: right; }
th { background: #eef3e2; } td.text { text-align: left; } img { max-width: 100%; border: 1px solid #dde; }
.note { color: #556; font-size: 0.85rem; max-width: 60rem; }
"""


def sensitivity_html(result: Sensitivity) -> str:
    from pipeline.report.html import _png

    evaluation = result.evaluation
    rows = "\n".join(
        f"<tr><td>{layer.rank}</td><td class='text'>{html.escape(layer.name)}</td><td class='text'>{layer.kind}</td>"
        f"<td>{layer.flops / (result.total_flops or 1):.2%}</td><td>{layer.excluded_alone.cosine:.4f}</td><td>{change_text(layer.gain)}</td>"
        f"<td>{layer.quantized_alone.cosine:.4f}</td><td>{change_text(layer.cost)}</td><td class='text'>{html.escape(_where(layer))}</td></tr>"
        for layer in result.layers
    )
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>sensitivity of {html.escape(result.engine)}</title>
<style>{_STYLE}</style></head><body>
<h1>Which layers of {html.escape(result.engine)} break its {result.precision} quantization</h1>
<p>Fully quantized: {result.fully_quantized.said()}; unquantized ({evaluation["compute_dtype"]}): {result.unquantized.said()};
floor {html.escape(str(result.floor))}. Measured on {evaluation["search"]["samples"]} samples ({html.escape(_drawn(evaluation["search"]))}, apart from calibration), {evaluation["device"]}.</p>
<h2>Each layer alone</h2><img alt="per-layer chart" src="{_png(_layer_chart(result))}">
<h2>Error along the depth</h2><img alt="depth chart" src="{_png(_depth_chart(result.depth))}">
<h2>Every layer</h2>
<table><tr><th>#</th><th>layer</th><th>kind</th><th>FLOPs</th><th>excluded alone</th><th>buys</th><th>quantized alone</th><th>costs</th><th>where</th></tr>
{rows}</table>
<p class="note">“Excluded alone”: cosine to FP32 with every other layer quantized; “buys”: its gain over the fully quantized variant.
“Quantized alone”: cosine with only this layer quantized; “costs”: its loss against the unquantized model.</p>
</body></html>
"""


def _layer_chart(result: Sensitivity):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = result.layers
    height = max(2.5, 0.22 * len(layers) + 1)
    figure, axis = plt.subplots(figsize=(9, height))
    positions = range(len(layers))
    axis.barh(
        [p + 0.2 for p in positions], [max(layer.gain, 0) for layer in layers], height=0.4, color="#76b900", label="buys (excluded alone)"
    )
    axis.barh(
        [p - 0.2 for p in positions], [max(layer.cost, 0) for layer in layers], height=0.4, color="#5a6b8c", label="costs (quantized alone)"
    )
    axis.set_yticks(list(positions), [layer.name for layer in layers], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("change of cosine to FP32")
    axis.legend(loc="lower right", fontsize=8)
    return figure


def _depth_chart(depth: list[dict[str, Any]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 3.2))
    names = [unit["name"] for unit in depth]
    axis.plot(range(len(depth)), [unit["relative_error"] for unit in depth], marker="o", color="#76b900")
    axis.set_xticks(range(len(depth)), names, rotation=60, ha="right", fontsize=7)
    axis.set_ylabel("relative error vs FP32")
    return figure

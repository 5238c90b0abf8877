"""The HTML report's sweep chart: latency, tokens/s and GPU memory against the last axis of a model's
shape points (the sequence), a column of panels per point's other sizes (the batch; batch and
frames of batch × frames × sequence), labelled with the names the model gives its axes.

The names come from the export record every point's manifest carries: the axes a model lists
(``axes`` among the export's parameters, where its family keeps them in the catalog's order), else
the named dimensions of its inputs in the order they first appear — the order a family without its
own list gives its points (pipeline/models). Without an export record naming them, by their sizes.
"""

from __future__ import annotations

from pipeline.catalog import ShapeSizes
from pipeline.manifest import EngineManifest
from pipeline.report.rows import ComparisonRow

# How an axis is worded under the chart, where its name alone says less ("sequence" is its length).
AXIS_WORDS = {"sequence": "sequence length"}


def axis_names(manifests: list[EngineManifest]) -> dict[str, tuple[str, ...]]:
    """Each model's axis names, in the order its shape points give sizes, from the first of its
    manifests with an export record that names them."""
    out: dict[str, tuple[str, ...]] = {}
    for manifest in manifests:
        record = manifest.export
        if manifest.model in out or record is None or record.details is None:
            continue
        named = record.params.get("axes") or [
            dim for entry in getattr(record.details, "inputs", []) for dim in entry.get("dims", []) if isinstance(dim, str)
        ]
        if named:
            out[manifest.model] = tuple(dict.fromkeys(named))
    return out


def chart_axes(sweep, names: tuple[str, ...] | None) -> tuple[tuple[str, ...], str] | None:
    """(each panel's title, by its held sizes; the x axis's words) for a sweep whose points all
    have the same number of axes, two or more; None otherwise (a batch alone: the table says it
    all). ``names``: the model's axis names, used where there is one per axis ("batch 2",
    "sequence length"); else the panels are named by their sizes ("sizes 2×3") and the x axis
    "last size"."""
    points = [ShapeSizes.parse(shape) for shape in sweep.shapes]
    counts = {len(point.sizes) for point in points}
    if len(counts) != 1 or min(counts) < 2:
        return None
    series = dict.fromkeys(point.held for point in points)
    if names is None or len(names) != min(counts):
        return tuple(f"size{'s' if len(held) > 1 else ''} {ShapeSizes(held).shown}" for held in series), "last size"
    titles = tuple(", ".join(f"{name} {size}" for name, size in zip(names, held)) for held in series)
    return titles, AXIS_WORDS.get(names[-1], names[-1])


def sweep_figure(sweep, names: tuple[str, ...] | None = None):
    """(the figure, the words of its x axis): latency, tokens/s and GPU memory against the last
    axis, a line per variant × toolchain, a column of panels per point's other sizes; points that
    failed are marked where the line would go. None where chart_axes draws none."""
    drawn = chart_axes(sweep, names)
    if drawn is None:
        return None
    titles, along = drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = {shape: ShapeSizes.parse(shape) for shape in sweep.shapes}
    series = list(dict.fromkeys(point.held for point in sizes.values()))
    metrics = [("ms", "median latency, ms"), ("tokens", "tokens/s")]
    if any(row.gpu_memory_mib for points in sweep.lines.values() for row in points.values()):
        metrics.append(("memory", "GPU memory, MiB"))
    figure, axes = plt.subplots(len(metrics), len(series), figsize=(4.6 * len(series), 3.2 * len(metrics)), squeeze=False, sharex="col")
    for column, held in enumerate(series):
        shapes = [shape for shape, point in sizes.items() if point.held == held]
        for row_index, (metric, label) in enumerate(metrics):
            axis = axes[row_index][column]
            for (variant, target), points in sweep.lines.items():
                xs, ys, spans, failed = [], [], [], []
                for shape in shapes:
                    row = points.get(shape)
                    value = None
                    if row is not None and row.median_ms is not None:
                        value = {"ms": row.median_ms, "tokens": row.tokens_per_s, "memory": row.gpu_memory_mib}[metric]
                    if value is not None:
                        xs.append(sizes[shape].sequence)
                        ys.append(value)
                        spans.append(_interval_of(row, metric, value))
                    elif row is not None and row.median_ms is None and row.status.startswith("failed"):
                        failed.append(shape)
                (line,) = axis.plot(xs, ys, marker="o", label=f"{target} · {variant}")
                if any(span != (0.0, 0.0) for span in spans):  # each point's interval of its median
                    below, above = zip(*spans)
                    axis.errorbar(xs, ys, yerr=[below, above], fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.8)
                for shape in failed:  # e.g. out of memory: where the line would have gone
                    axis.axvline(sizes[shape].sequence, color=line.get_color(), linestyle=":", alpha=0.6)
                    axis.annotate(
                        "✕ " + {"out_of_memory": "OOM", "faulted": "faulted"}.get(points[shape].outcome, "failed"),
                        (sizes[shape].sequence, 0.95),
                        xycoords=("data", "axes fraction"),
                        color=line.get_color(),
                        fontsize=8,
                        ha="center",
                    )
            axis.set_xscale("log", base=2)
            axis.grid(alpha=0.3)
            if row_index == 0:
                axis.set_title(titles[column])
            if column == 0:
                axis.set_ylabel(label)
            if row_index == len(metrics) - 1:
                axis.set_xlabel(along)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    return figure, along


def _interval_of(row: ComparisonRow, metric: str, value: float) -> tuple[float, float]:
    """How far the point's interval reaches below and above it: the median's interval in ms, the
    same interval as tokens/s (the rate is inverse to the time); none for memory."""
    if row.median_ci_ms is None or metric == "memory":
        return 0.0, 0.0
    low, high = row.median_ci_ms
    if metric == "ms":
        return max(0.0, value - low), max(0.0, high - value)
    return max(0.0, value - value * row.median_ms / high), max(0.0, value * row.median_ms / low - value)

"""The HTML report's figure of serving (docs/streams.md): inferences/s against the number of
concurrent streams, a line per engine and way of serving, one figure per model and point."""

from __future__ import annotations

from pipeline.catalog.shape import shown


def throughput_against_streams(rows):
    """A matplotlib figure of the rows' served throughput by stream count, or None where none of
    them served more than one count. Counts not measured are left out of their line."""
    lines = {}
    for row in rows:
        for entry in row.streams:
            if entry["why_not"] is None and entry.get("inferences_per_s"):
                label = " · ".join(filter(None, (row.variant, shown(row.shape), row.target, entry["mode"])))
                lines.setdefault(label, []).append((entry["streams"], entry["inferences_per_s"]))
    if not any(len(points) > 1 for points in lines.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    counts = sorted({count for points in lines.values() for count, _ in points})
    for label, points in lines.items():
        points.sort()
        axis.plot([count for count, _ in points], [rate for _, rate in points], marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_xticks(counts, [str(count) for count in counts])
    axis.set_xlabel("concurrent streams")
    axis.set_ylabel("inferences/s (all streams, over their common span)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return figure

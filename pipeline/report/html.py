"""A self-contained HTML report: the comparison tables plus plots, with no network fetches.

Plots are matplotlib PNGs embedded as data URIs; styles are inline. One file to attach to a
review or an issue.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime, timezone

from pipeline.catalog.shape import shown
from pipeline.manifest import EngineManifest
from pipeline.report.answer import Answer
from pipeline.report.energy import energy_notes
from pipeline.report.rows import ComparisonRow
from pipeline.report.streams import STREAM_HEADERS, serving_tables
from pipeline.report.streams_chart import throughput_against_streams
from pipeline.report.sweep_chart import axis_names, sweep_figure
from pipeline.report.tables import HEADERS, row_cells, samples_header
from pipeline.workspace import output_folder

STYLE = """
body { font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem; color: #1d2330; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.5rem; border-bottom: 2px solid #76b900; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 1rem 0; }
th, td { border: 1px solid #ccd; padding: 0.3rem 0.5rem; text-align: right; }
th { background: #eef3e2; } td.text { text-align: left; }
tr.unmeasured td { color: #889; }
.verdict { background: #f4f8ea; border-left: 4px solid #76b900; padding: 0.6rem 1rem; max-width: 70rem; }
.verdict li { margin: 0.3rem 0; } td.best { font-weight: bold; background: #eef7d8; } td.tied { text-decoration: underline; background: #f4f9e8; } td.failed { color: #b22; }
.note { color: #556; font-size: 0.85rem; max-width: 60rem; }
img { max-width: 100%; border: 1px solid #dde; margin: 0.5rem 0; }
"""
LEFT = {"engine", "toolchain", "status", "layer audit", "vs baseline toolchain", "vs ref toolchain", "speedup"}


def _png(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _latency_bars(rows: list[ComparisonRow]) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    measured = [r for r in rows if r.median_ms is not None]
    if not measured:
        return None
    # One group of bars per variant, and per shape point for models measured at several.
    variants = list(dict.fromkeys((r.variant, r.shape) for r in measured))
    chains = list(dict.fromkeys(r.target for r in measured))
    width = 0.8 / len(chains)
    figure, axis = plt.subplots(figsize=(max(6, 1.2 * len(variants) * len(chains)), 4))
    for i, chain in enumerate(chains):
        xs, medians, low, high = [], [], [], []
        for j, variant in enumerate(variants):
            row = next((r for r in measured if (r.variant, r.shape) == variant and r.target == chain), None)
            if row is None:
                continue
            xs.append(j + i * width)
            medians.append(row.median_ms)
            # The whiskers are of the pooled runs; a median of takes may lie beyond one (row_times.py).
            low.append(max(0.0, row.median_ms - row.p5_ms))
            high.append(max(0.0, row.p95_ms - row.median_ms))
        axis.bar(xs, medians, width, yerr=[low, high], capsize=3, label=chain)
    labels = [f"{variant} {shown(shape)}" if shape else variant for variant, shape in variants]
    axis.set_xticks(np.arange(len(variants)) + width * (len(chains) - 1) / 2, labels)
    axis.set_ylabel("median latency, ms (whiskers: p5–p95)")
    axis.legend(title="toolchain")
    axis.grid(axis="y", alpha=0.3)
    return _png(figure)


def _latency_cdf(rows: list[ComparisonRow]) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    measured = [r for r in rows if r.samples_ms]
    if not measured:
        return None
    figure, axis = plt.subplots(figsize=(7, 4))
    for row in measured:
        values = np.sort(np.asarray(row.samples_ms))
        axis.step(
            values,
            np.arange(1, values.size + 1) / values.size,
            where="post",
            label=" · ".join(filter(None, (row.variant, row.shape, row.target))),
        )
    axis.set_xlabel("per-iteration latency, ms")
    axis.set_ylabel("fraction of iterations")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _png(figure)


def _top_layers(row: ComparisonRow, top: int = 12) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not row.layers:
        return None
    layers = sorted(row.layers, key=lambda item: item[1], reverse=True)[:top][::-1]
    figure, axis = plt.subplots(figsize=(8, 0.35 * len(layers) + 1))
    axis.barh([name if len(name) < 60 else name[:57] + "…" for name, _ in layers], [ms for _, ms in layers], color="#76b900")
    axis.set_xlabel("average time per iteration, ms")
    axis.set_title(f"{row.engine} on {row.target}: top {len(layers)} layers")
    return _png(figure)


def _answer(answer: Answer) -> list[str]:
    """The verdicts, at the top of the report."""
    if not answer.verdicts:
        return []
    items = "".join(f"<li>{html.escape(text)}</li>" for text in answer.verdict_text())
    parts = [f'<div class="verdict"><h2>{html.escape(answer.headline())}</h2><ul>{items}</ul></div>']
    if answer.serving:  # --p99-under
        picks = "".join(f"<li>{html.escape(pick.sentence())}</li>" for pick in answer.serving)
        parts.append(f'<div class="verdict"><h2>Serving within a p99 of {answer.serving[0].budget_ms:g} ms</h2><ul>{picks}</ul></div>')
    return parts


def _streams_table(rows: list[ComparisonRow]) -> str | None:
    """The rows' serving at each stream count (docs/streams.md), a table per point as the
    terminal's streams section, each with its note."""
    head = "".join(f"<th>{html.escape(text)}</th>" for text in STREAM_HEADERS)
    tables = []
    for title, cells, note in serving_tables(rows):
        body = "".join("<tr>" + "".join(f"<td>{html.escape(text)}</td>" for text in line) + "</tr>" for line in cells)
        tables.append(f'<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table><p class="note">{html.escape(note)}</p>')
    return "".join(tables) or None


def _sweep_section(answer: Answer, sweep, names: tuple[str, ...] | None = None) -> list[str]:
    headers, cells = answer.sweep_table(sweep)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in cells:
        tds = []
        for index, cell in enumerate(row):
            kind = (
                "text"
                if index < 2
                else "best"
                if cell.startswith("*")
                else "tied"
                if cell.startswith("=")
                else "failed"
                if not cell[:1].isdigit() and cell != "–"
                else "num"
            )
            tds.append(f'<td class="{kind}">{html.escape(cell.lstrip("*="))}</td>')
        body.append(f"<tr>{''.join(tds)}</tr>")
    parts = [
        f"<h3>{html.escape(answer.sweep_title(sweep)).replace('(* the verdict', '(bold: the verdict').replace(', = not told', ', underlined: not told')}</h3>",
        f'<table class="sweep"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>',
    ]
    crossovers = sweep.notes()
    if crossovers:
        parts.append('<ul class="crossovers">' + "".join(f"<li>{html.escape(text)}</li>" for text in crossovers) + "</ul>")
    drawn = sweep_figure(sweep, names)
    if drawn is not None:
        figure, along = drawn
        parts.append(
            f'<img alt="{html.escape(sweep.title)}: latency, tokens/s and memory against {html.escape(along)}" src="{_png(figure)}">'
        )
    return parts


def _table(rows: list[ComparisonRow]) -> str:
    # The throughput column in the model's unit (seq/s for token inputs), as in the other formats.
    head = "".join(f"<th>{html.escape(samples_header(rows) if h == 'img/s' else h)}</th>" for h in HEADERS)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="{"text" if header in LEFT else "num"}">{html.escape(cell)}</td>' for header, cell in zip(HEADERS, row_cells(row))
        )
        body.append(f'<tr class="{"measured" if row.median_ms is not None else "unmeasured"}">{cells}</tr>')
    return f'<table class="comparison"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _environment(manifests: list[EngineManifest]) -> str:
    seen = {}
    for m in manifests:
        env = m.environment
        gpus = ", ".join(f"{g.name} (driver {g.driver})" for g in env.gpus) or (f"{m.gpu_type} (placed by)" if m.gpu_type else "none")
        host = env.hostname + (f" · Ray node {env.cluster_node.ray_node_id[:8]}" if env.cluster_node else "")
        key = (output_folder(m.toolchain or "?", m.gpu_type), host, env.cpu, gpus)
        seen[key] = env.git_commit or "–"
    rows = "".join(
        f'<tr><td class="text">{html.escape(str(k[0]))}</td><td class="text">{html.escape(k[1])}</td>'
        f'<td class="text">{html.escape(k[2])}</td><td class="text">{html.escape(k[3])}</td>'
        f'<td class="text">{html.escape(v[:12])}</td></tr>'
        for k, v in seen.items()
    )
    return (
        '<table class="environment"><thead><tr><th>toolchain</th><th>host</th><th>CPU</th><th>GPUs</th>'
        f"<th>commit</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def render_html(rows: list[ComparisonRow], manifests: list[EngineManifest], answer: Answer | None = None) -> str:
    answer = answer or Answer([], [])
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>Engine comparison</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>Engine comparison</h1>",
        f'<p class="note">Rendered {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from {len(manifests)} manifests. '
        "Latency is what each row's status names: GPU compute time for TensorRT engines, GPU time by CUDA events "
        "for PyTorch on a GPU, host latency for ONNX Runtime and for PyTorch on a CPU. Speedups are within a "
        "toolchain, against its baseline variant; the baseline-toolchain column is the speedup over the catalog's "
        "baseline (PyTorch eager) for the same variant; the change column compares each toolchain with the first. "
        "<b>~</b> marks differences within the runs' own spread (the 95% interval of the ratio, paired by round "
        "where timed in rounds, else a bootstrap of the medians' difference, contains no change) or measured in too "
        "few rounds for an interval. The accuracy columns compare each engine's own outputs with the FP32 "
        "PyTorch model's on the reference batch ((proxy): the fake-quantized PyTorch model, where no engine ran). "
        "TFLOP/s count MatMul/Gemm/Conv work; peak % uses datasheet peaks "
        "for known GPUs.</p>",
        *_answer(answer),
    ]
    names = axis_names(manifests)
    for model in dict.fromkeys(r.model for r in rows):
        model_rows = [r for r in rows if r.model == model]
        parts.append(f"<h2>{html.escape(model)}</h2>")
        for sweep in answer.sweeps:
            if sweep.model == model:
                parts += _sweep_section(answer, sweep, names.get(model))
        parts.append(_table(model_rows))
        parts += [f'<p class="note">{html.escape(note)}</p>' for note in energy_notes(model_rows)]
        streams = _streams_table(model_rows)
        if streams:
            parts.append(streams)
        served = throughput_against_streams(model_rows)
        for title, image in (
            ("Latency by variant and toolchain", _latency_bars(model_rows)),
            ("Latency distribution", _latency_cdf(model_rows)),
            ("Throughput against concurrent streams", _png(served) if served is not None else None),
        ):
            if image:
                parts.append(f'<h3>{title}</h3><img alt="{html.escape(title)}" src="{image}">')
        for row in model_rows:
            image = _top_layers(row)
            if image:
                parts.append(f'<img alt="top layers of {html.escape(row.engine)} on {html.escape(row.toolchain)}" src="{image}">')
    parts.append("<h2>Where it was measured</h2>")
    parts.append(_environment(manifests))
    parts.append("</body></html>")
    return "\n".join(parts)


# --- what changed between two engines (pipeline diff) -------------------------------------------


def _diff_bars(result, rows) -> str | None:
    """Per-layer time, A beside B, for the rows that explain the difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return None
    rows = rows[::-1]
    labels = []
    for row in rows:
        name = (row.a or row.b)[0].name + (" …" if len(row.a or row.b) > 1 else "")
        labels.append(name if len(name) < 48 else name[:45] + "…")
    positions = range(len(rows))
    figure, axis = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    height = 0.38
    axis.barh([p + height / 2 for p in positions], [row.a_ms or 0 for row in rows], height, label=f"A: {result.a.label}", color="#8a9bb0")
    axis.barh([p - height / 2 for p in positions], [row.b_ms or 0 for row in rows], height, label=f"B: {result.b.label}", color="#76b900")
    axis.set_yticks(list(positions), labels)
    axis.set_xlabel("average time per iteration, ms (0: the layer is not in that engine)")
    axis.legend(loc="lower right")
    axis.set_title("The layers that explain most of the difference")
    return _png(figure)


def layer_diff_section(result) -> str:
    """One section: who A and B are, the precision verdict, the totals, bars per layer, the tables."""
    from pipeline.report.layer_diff import header_lines

    def cell(text, css: str = "") -> str:
        return f'<td class="text{css}">{html.escape(str(text))}</td>'

    def number(value, signed: bool = False) -> str:
        return f"<td>{'–' if value is None else (f'{value:+.4f}' if signed else f'{value:.4f}')}</td>"

    def names(layers) -> str:
        return " + ".join(layer.name for layer in layers) or "–"

    parts = ["<section><h2>What changed between the two engines, layer by layer</h2>"]
    parts.append('<div class="verdict"><ul>' + "".join(f"<li><b>{html.escape(s)}</b></li>" for s in result.precision_verdict()))
    parts += [f"<li>{html.escape(line)}</li>" for line in result.summary()] + ["</ul></div>"]
    parts.append('<p class="note">' + "<br>".join(html.escape(line) for line in header_lines(result)) + "</p>")
    top = result.top()
    image = _diff_bars(result, top)
    if image:
        parts.append(f'<img alt="per-layer time, A beside B" src="{image}">')
    header = "<tr><th>A</th><th>B</th><th>kind</th><th>A ms</th><th>B ms</th><th>Δ ms</th>"
    if top:
        parts.append("<h3>The layers that explain most of the difference</h3><table>" + header + "</tr>")
        for row in top:
            parts.append(
                "<tr>"
                + cell(names(row.a))
                + cell(names(row.b))
                + cell(row.kind)
                + number(row.a_ms)
                + number(row.b_ms)
                + number(result.delta(row), signed=True)
                + "</tr>"
            )
        parts.append("</table>")
    parts.append(
        "<h3>Every layer</h3><table>"
        + header
        + "<th>A precision</th><th>B precision</th><th>A type</th><th>B type</th><th>A tactic</th><th>B tactic</th></tr>"
    )
    for row in result.rows:
        only = " failed" if row.kind.startswith("only") else ""
        parts.append(
            "<tr>"
            + cell(names(row.a))
            + cell(names(row.b))
            + cell(row.kind, only)
            + number(row.a_ms)
            + number(row.b_ms)
            + number(result.delta(row), signed=True)
            + "".join(
                cell(value or "–")
                for value in (
                    row.precision("a"),
                    row.precision("b"),
                    row.layer_type("a"),
                    row.layer_type("b"),
                    row.tactic("a"),
                    row.tactic("b"),
                )
            )
            + "</tr>"
        )
    parts.append("</table></section>")
    return "\n".join(parts)


def render_diff_html(result) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
            "<title>Layer diff</title>",
            f"<style>{STYLE}</style></head><body>",
            f"<h1>Layer diff: {html.escape(result.a.label)} vs {html.escape(result.b.label)}</h1>",
            f'<p class="note">Rendered {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}. Layers are matched by name, then by name '
            "without Myelin's per-graph numbering, then by the ONNX nodes they implement (layers fused differently are "
            "compared as a group). Times are each engine's per-layer profile (a separate profiled run, so they add up to "
            "more than the engine's own latency); Δ is B − A.</p>",
            layer_diff_section(result),
            "</body></html>",
        ]
    )

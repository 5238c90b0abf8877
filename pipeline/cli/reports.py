"""The commands that read what was measured: `pipeline compare` (and the table `run` prints) and
`pipeline diff`."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import ranking_name
from pipeline.cli.state import State as _State
from pipeline.cli.state import pass_state


@click.command()
@click.option("--toolchain", "toolchains", multiple=True, metavar="T", help="Only these toolchains, in this order (repeatable).")
@click.option("--trt", "trts", multiple=True, metavar="VERSION", help="Only the toolchains of these TensorRT versions, in this order.")
@click.option("--model", "--models", "models", multiple=True, metavar="M", help="Only these models (repeatable).")
@click.option(
    "--gpu", "gpu_types", multiple=True, metavar="TYPE", help="Only engines a cluster run built and timed for this GPU type (repeatable)."
)
@click.option("--format", "fmt", type=click.Choice(["table", "md", "html", "json", "csv"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file (html default: reports/compare.html).")
@click.option("--baseline", metavar="DIR|REF", help="Regression gate: compare with the manifests in DIR or at git ref REF.")
@click.option(
    "--fail-above",
    type=click.FloatRange(min=0),
    metavar="PCT",
    help="With --baseline: fail when an engine got slower than PCT percent beyond the noise (default 5).",
)
@click.option(
    "--wide", is_flag=True, help="Terminal table: every column, however wide (default: every column that fits, else a compact set)."
)
@click.option(
    "--columns",
    metavar="LIST",
    help="Terminal table: these columns, comma-separated, e.g. median,p99,cv,status (an unknown name lists them).",
)
@click.option(
    "--noisy-cv",
    type=click.FloatRange(min=0),
    metavar="PCT",
    help="Flag measurements whose spread is above PCT percent as noisy (default 10): the interquartile range as a CV, so a few outlying runs do not count.",
)
@click.option(
    "--metric",
    type=click.Choice(["ms", "tokens", "memory"]),
    default="ms",
    show_default=True,
    help="What the sweep tables (a model measured at shape points) show per point: median latency, tokens/s, or GPU memory.",
)
@click.option(
    "--by",
    metavar="NAME",
    callback=ranking_name,
    help="What the answer ranks engines by (median, p90, p99 or energy): their median, their p90 or p99 bounded by their takes, or their energy per "
    "inference paired round by round (docs/energy.md), at the same 95 % confidence (docs/tails.md); re-ranks from the manifests, never re-measures. Default: the catalog's [profile] by (median).",
)
@click.option(
    "--fail-accuracy-below",
    "accuracy_thresholds",
    multiple=True,
    metavar="[cos=|top1=]X",
    help="Exit 1 naming every engine whose own outputs fall below X against the FP32 model: cosine "
    "similarity (0.99, cos=0.99) or top-1 agreement (top1=0.95). Repeatable. Also the floor the "
    "answer is held to, in place of the catalog's accuracy_floor.",
)
@click.option(
    "--p99-under",
    "p99_under",
    metavar="BUDGET",
    help="Name, per model and shape point, the engine and concurrency that serve the most inferences/s whose p99's 95% "
    "interval lies within BUDGET (10ms, 0.5s, 800us; a number alone is ms), from profiles measured with --streams; "
    "where none can be bounded, says how many requests it needs (docs/streams.md).",
)
@pass_state
def compare(
    state: _State,
    toolchains,
    trts,
    models,
    gpu_types,
    fmt,
    out,
    baseline,
    fail_above,
    wide,
    columns,
    noisy_cv,
    metric,
    by,
    accuracy_thresholds,
    p99_under,
):
    """Put profiled engines side by side, from the saved manifests (never re-measures).

    \b
    The answer first: per model and shape point, the fastest engine whose own accuracy meets the
    floor (--fail-accuracy-below, else the catalog's accuracy_floor, else each precision's own
    check), its speedup over the catalog's baseline toolchain, and what was left out and why.
    A model measured at shape points then gets its sweep: a line per variant x toolchain, a
    column per point (--metric), and where one toolchain overtakes another, in words.
    \b
    Per model: variant x toolchain (x GPU type, for cluster runs) with median/p99 latency, throughput, speedup against the
    toolchain's baseline variant and against the catalog's baseline toolchain, the change
    against the first toolchain, engine size, build time, accuracy proxy, layer-precision audit
    and roofline. "~" marks differences within the runs' own spread; measurements taken on a
    busy machine or with a high CV are flagged. In a terminal the table fits its width (and
    $COLUMNS when piped): every column when they fit, else a compact set with notes under it;
    --wide or --columns choose. With --baseline it also gates: exit 1 naming every engine that
    got slower than --fail-above percent beyond the noise.
    """
    catalog = state.catalog
    names = list(toolchains) + [catalog.toolchain_for_trt(v) for v in trts]
    if fmt == "html" and out is None:
        out = catalog.root / "reports" / "compare.html"
    from pipeline.report.gates import parse_accuracy_threshold
    from pipeline.report.streams import parse_budget

    thresholds = [parse_accuracy_threshold(text) for text in accuracy_thresholds]  # checked before any work
    if fail_above is not None and baseline is None:  # a CI job that forgot --baseline must not pass
        from pipeline.running.errors import UsageError

        raise UsageError("--fail-above gates against a baseline, and none was given.", hint="add --baseline DIR|REF")
    budget = parse_budget(p99_under) if p99_under is not None else None
    rows = _print_comparison(
        state,
        names or None,
        fmt,
        out,
        list(models) or None,
        columns,
        wide,
        noisy_cv,
        list(gpu_types) or None,
        metric,
        thresholds,
        budget,
        by,
    )
    if thresholds:
        from pipeline.report.gates import check_accuracy

        check_accuracy(rows, thresholds, say=lambda text: click.echo(text, err=True))
    if baseline is not None:
        from pipeline.report.gates import check_regressions
        from pipeline.workspace import Workspace

        # To stderr, as the accuracy gate's: stdout is the comparison (a JSON or CSV document too).
        check_regressions(
            Workspace(catalog.root),
            names or None,
            baseline,
            5.0 if fail_above is None else fail_above,
            say=lambda text: click.echo(text, nl=False, err=True),
            models=list(models) or None,
            gpu_types=list(gpu_types) or None,
        )


def _print_comparison(
    state: _State,
    toolchains,
    fmt,
    out,
    models=None,
    columns=None,
    wide=False,
    noisy_cv=None,
    gpu_types=None,
    metric="ms",
    thresholds=(),
    p99_under_ms=None,
    by=None,
):
    from pipeline.report.compare import compare as compare_manifests
    from pipeline.report.compare import write_output
    from pipeline.report.flags import NOISY_CV
    from pipeline.report.tables import parse_columns
    from pipeline.running.reporting import Reporter, stdout_console
    from pipeline.workspace import Workspace

    console = stdout_console()
    if out is not None and fmt == "table":
        fmt = "md"  # a file gets the table as markdown
    rows, rendered = compare_manifests(
        state.catalog,
        Workspace(state.catalog.root),
        toolchains,
        fmt,
        models,
        width=console.width,
        columns=parse_columns(columns) if columns else None,
        wide=wide,
        noisy_cv=NOISY_CV if noisy_cv is None else noisy_cv / 100,
        gpu_types=gpu_types,
        metric=metric,
        thresholds=thresholds,
        p99_under_ms=p99_under_ms,
        by=by,
        warn=Reporter().warn,
    )
    differently = [f"{r.engine} on {r.toolchain}: {flag}" for r in rows for flag in r.flags if flag.startswith("measured differently")]
    if differently:
        for line in differently:
            Reporter().warn(f"{line}; the comparison is not like for like")
    if out is not None:
        write_output(rendered, out)
        click.echo(f"wrote {out}", err=True)
    elif isinstance(rendered, str):
        click.echo(rendered, nl=False)
    else:
        # Laid out for the terminal's width already; a table that cannot fit (a very narrow
        # terminal, --wide) is printed whole for the terminal to wrap, never cut.
        console.print(rendered, crop=False)
    return rows


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "json", "html"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file (html default: reports/diff.html).")
@pass_state
def diff(state: _State, a, b, fmt, out):
    """What changed between two engines, layer by layer: A and B side by side.

    \b
    A and B are each an engine of this workspace, TOOLCHAIN/ENGINE[@SHAPE]
    (trt10.16/vit_fp16, trt-rtx1.7/vit_tiny_fp8), or trtexec output: a log with a
    `=== Profile` table or a --dumpLayerInfo dump, --exportProfile / --exportLayerInfo JSON,
    or a folder holding them. Two toolchains or releases of one engine, or two variants of one
    model; engines of different models are refused.
    \b
    Shown: the precision each engine's layers compute in ("B runs 48 layers in fp4, A none"),
    the total of the per-layer times, the ten layers that explain most of the difference, and
    every layer with its time, precision, type and tactic. Layers are matched by name, then by
    name without Myelin's numbering, then by the ONNX nodes they implement, so that layers two
    builds fused differently are compared as a group; the rest is "only in A" / "only in B".
    Per-layer times come from `pipeline profile` (trtexec's --exportProfile, TensorRT-RTX's
    profiler, or those another runtime records in its profile manifest); without them, layer
    types and precisions are compared.
    """
    from pipeline.report.layer_diff import diff as diff_engines
    from pipeline.report.layer_diff import render_markdown, render_terminal
    from pipeline.report.layer_sides import load_side
    from pipeline.runtimes import product_of

    result = diff_engines(*(load_side(spec, lambda: state.catalog, product_of) for spec in (a, b)))
    if fmt == "html" and out is None:  # beside the workspace whose engines were diffed, else here
        out = (state.catalog.root if state._catalog is not None else Path.cwd()) / "reports" / "diff.html"
    if fmt == "table" and out is None:
        from pipeline.running.reporting import stdout_console

        stdout_console().print(render_terminal(result), crop=False)
        return
    if fmt == "json":
        import json

        text = json.dumps(result.to_json(), indent=2) + "\n"
    elif fmt == "html":
        from pipeline.report.html import render_diff_html

        text = render_diff_html(result)
    else:
        text = render_markdown(result)
    if out is None:
        click.echo(text, nl=False)
    else:
        from pipeline.report.compare import write_output

        out.parent.mkdir(parents=True, exist_ok=True)
        write_output(text, out)
        click.echo(f"wrote {out}", err=True)

"""The `pipeline` command. A thin layer: it builds configurations and calls the library.

Only click is imported at start-up so `pipeline --help` stays instant; each command imports what
it needs. ``main(argv)`` returns the exit code, so tests call it directly:

    0 success · 1 a stage failed · 2 bad usage · 3 this machine lacks something (GPU, Docker,
    a package) · 130 interrupted (Ctrl-C) · 143 terminated (SIGTERM) · 70 a bug in the pipeline
    (printed with its traceback)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from pipeline.cli.options import (
    calibration_options,
    cluster_options,
    engine_stage_options,
    force_option,
    repeat_option,
    selection_options,
    toolchain_options,
)
from pipeline.cli.precision import plan, sensitivity
from pipeline.cli.state import State as _State
from pipeline.cli.state import pass_state

EXIT_INTERNAL = 70


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--catalog",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PIPELINE_CATALOG",
    help="Catalog file (default: pipeline.toml in this or a parent directory). Outputs go beside it.",
)
@click.option("-v", "--verbose", is_flag=True, help="Stream tool output and show internal steps.")
@click.version_option(package_name="trt-pipeline", prog_name="pipeline")
@click.pass_context
def cli(ctx: click.Context, catalog: Path | None, verbose: bool):
    """Turn timm models into TensorRT or ONNX Runtime engines, profile them, and compare.

    \b
    Stages:  export → build → profile → compare
    Engines are named <model>_<variant>, e.g. vit_nvfp4, vit_tiny_fp16 (`pipeline models`).
    Unchanged stages are skipped; --force re-runs them. Outputs: models/, engines/, manifests/.

    \b
    Quick start (no GPU needed):  pipeline run
    """
    ctx.obj = _State(catalog, verbose)


# --- commands -----------------------------------------------------------------------------------

cli.add_command(sensitivity)
cli.add_command(plan)


@cli.command()
@pass_state
def models(state: _State):
    """List models, variants, toolchains and the engine names they make."""
    from rich.table import Table

    from pipeline.reporting import stdout_console

    catalog = state.catalog
    console = stdout_console()
    table = Table(title=f"Models ({catalog.root / 'pipeline.toml'})")
    from pipeline.models import model_source

    for column in ("model", "source", "shapes", "weights"):
        table.add_column(column)
    for name, spec in catalog.models.items():
        weights = f"checkpoint {spec.checkpoint}" if spec.checkpoint else f"random init (seed {spec.seed})"
        source = model_source(name, spec, catalog.root)
        table.add_row(name, source.describe(), source.shapes_summary(), weights)
    console.print(table)
    variants = Table(title="Variants")
    for column in ("variant", "precision", "sparsity"):
        variants.add_column(column)
    for name, spec in catalog.variants.items():
        variants.add_row(name, spec.precision, spec.sparsity or "–")
    console.print(variants)
    from pipeline.reporting import Reporter
    from pipeline.runtimes import create_runtime

    chains = Table(title="Toolchains")
    for column in ("toolchain", "kind", "provides"):
        chains.add_column(column)
    for name, spec in catalog.toolchains.items():
        chains.add_row(name, spec.kind, create_runtime(name, spec, Reporter(), catalog.root).describe())
    console.print(chains)
    console.print("Engine names: <model>_<variant>, e.g. " + ", ".join(catalog.engine_names()[:4]) + ", …")


@cli.command()
@selection_options
@force_option
@calibration_options
@cluster_options
@pass_state
def export(state: _State, engines, models, variants, force, wait, calib_dir, calib_samples, eval_dir, cluster, gpu_types):
    """Export models to ONNX, sparsifying and quantizing as the variant needs.

    Writes models/<model>/<variant>.onnx. Quantized and sparse variants are calibrated on
    synthetic inputs unless --calib-dir names a folder of images.
    """
    state.override(calib_dir, calib_samples, eval_dir)
    refs = state.catalog.select(engines, models, variants)
    with state.holding_workspace(wait):
        _launcher(state, cluster, gpu_types).run(state.context(force), refs, None, "export")


def _launcher(state: _State, cluster: str | None, gpu_types):
    """Where the stages run: in this process, or on the Ray cluster named by --cluster."""
    from pipeline.errors import UsageError

    if not cluster:
        if gpu_types:
            raise UsageError("--gpu chooses among a cluster's GPU types; it needs --cluster.", hint="add --cluster HOST:PORT")
        from pipeline.stages.runner import LocalLauncher

        return LocalLauncher()
    from pipeline.cluster.supervisor import ClusterLauncher

    return ClusterLauncher(cluster, tuple(gpu_types), state.verbose)


def _stage_command(
    state: _State,
    engines,
    models,
    variants,
    toolchains,
    trts,
    archs,
    force,
    wait,
    dry_run,
    calib_dir,
    calib_samples,
    eval_dir,
    cluster,
    gpu_types,
    until,
    repeat=None,
) -> list[str]:
    """Select, settle the toolchains, then print the work (--dry-run) or do it, one toolchain after
    the other (a failure in one does not stop the next); the toolchains' names."""
    from pipeline.errors import EnvironmentMissing, PipelineError

    state.override(calib_dir, calib_samples, eval_dir, repeat)
    refs = state.catalog.select(engines, models, variants)
    chains = state.toolchains(toolchains, trts, archs)
    ctx = state.context(force)
    if dry_run:
        from pipeline.stages.runner import describe

        for chain in chains:
            if len(chains) > 1:
                click.echo(f"# {chain}")
            for line in describe(ctx, refs, chain, until):
                click.echo(line)
        return chains
    failed: list[tuple[str, PipelineError]] = []
    with state.holding_workspace(wait):
        launcher = _launcher(state, cluster, gpu_types)
        if not cluster:  # every toolchain at once: the engines of a shape point are timed together
            launcher.run(ctx, refs, chains, until)
            return chains
        for chain in chains:
            try:
                launcher.run(ctx, refs, chain, until)
            except PipelineError as exc:
                if len(chains) == 1:
                    raise
                from pipeline.reporting import print_error

                print_error(f"{chain}: {exc.message}", exc.hint)
                failed.append((chain, exc))
    if failed:
        worst = EnvironmentMissing if all(isinstance(exc, EnvironmentMissing) for _, exc in failed) else PipelineError
        raise worst(
            f"{len(failed)} of {len(chains)} toolchains failed: {', '.join(chain for chain, _ in failed)}.",
            hint="the errors above say why; what the others measured is kept",
        )
    return chains


@cli.command()
@engine_stage_options
@pass_state
def build(state: _State, **options):
    """Build engines for one toolchain (exporting first if needed): engines/<toolchain>/."""
    _stage_command(state, **options, until="build")


@cli.command()
@engine_stage_options
@repeat_option
@pass_state
def profile(state: _State, **options):
    """Time engines (building them first if needed), then check each one's outputs against the
    FP32 model on the reference batch; results go to manifests/<toolchain>/."""
    _stage_command(state, **options, until="profile")


@cli.command()
@selection_options
@toolchain_options
@force_option
@calibration_options
@repeat_option
@cluster_options
@pass_state
def run(state: _State, **options):
    """Export, build and profile a selection, then print the comparison.

    With no selection it runs the catalog's defaults: the demo on ONNX Runtime.
    """
    from pipeline.errors import PipelineError, UsageError

    try:
        chains = _stage_command(state, **options, dry_run=False, until="profile")
    except PipelineError as exc:
        if isinstance(exc, UsageError):
            raise
        # What did run (the other shape points and toolchains of a sweep) is still worth seeing.
        try:
            _print_comparison(state, state.catalog.toolchains_named(options["toolchains"], options["trts"]), "table", None)
        except PipelineError:
            pass  # nothing was measured: the error says why
        raise
    _print_comparison(state, chains, "table", None)


@cli.command()
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
    default=5.0,
    show_default=True,
    metavar="PCT",
    help="With --baseline: fail when an engine got slower than PCT percent beyond the noise.",
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
    "--fail-accuracy-below",
    "accuracy_thresholds",
    multiple=True,
    metavar="[cos=|top1=]X",
    help="Exit 1 naming every engine whose own outputs fall below X against the FP32 model: cosine "
    "similarity (0.99, cos=0.99) or top-1 agreement (top1=0.95). Repeatable. Also the floor the "
    "answer is held to, in place of the catalog's accuracy_floor.",
)
@pass_state
def compare(
    state: _State, toolchains, trts, models, gpu_types, fmt, out, baseline, fail_above, wide, columns, noisy_cv, metric, accuracy_thresholds
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

    thresholds = [parse_accuracy_threshold(text) for text in accuracy_thresholds]  # checked before any work
    rows = _print_comparison(
        state, names or None, fmt, out, list(models) or None, columns, wide, noisy_cv, list(gpu_types) or None, metric, thresholds
    )
    if thresholds:
        from pipeline.report.gates import check_accuracy

        check_accuracy(rows, thresholds, say=lambda text: click.echo(text, err=True))
    if baseline is not None:
        from pipeline.report.gates import check_regressions
        from pipeline.workspace import Workspace

        check_regressions(Workspace(catalog.root), names or None, baseline, fail_above, say=lambda text: click.echo(text, nl=False))


def _print_comparison(
    state: _State, toolchains, fmt, out, models=None, columns=None, wide=False, noisy_cv=None, gpu_types=None, metric="ms", thresholds=()
):
    from pipeline.report.compare import compare as compare_manifests
    from pipeline.report.compare import write_output
    from pipeline.report.rows import NOISY_CV
    from pipeline.report.tables import parse_columns
    from pipeline.reporting import stdout_console
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
    )
    differently = [f"{r.engine} on {r.toolchain}: {flag}" for r in rows for flag in r.flags if flag.startswith("measured differently")]
    if differently:
        from pipeline.reporting import Reporter

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


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def doctor(state: _State, as_json):
    """What this machine can run: Python deps, CUDA, GPU, Docker, NVIDIA runtime, toolchains."""
    import json

    from pipeline.reporting import stdout_console
    from pipeline.runtimes.doctor import as_dicts, render, run_doctor

    checks = run_doctor(state.catalog)
    if as_json:
        click.echo(json.dumps(as_dicts(checks), indent=2))
    else:
        stdout_console().print(render(checks))


@cli.command()
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
    profiler); without them, layer types and precisions are compared.
    """
    from pipeline.report.layer_diff import diff as diff_engines
    from pipeline.report.layer_diff import load_side, render_markdown, render_terminal

    result = diff_engines(*(load_side(spec, lambda: state.catalog) for spec in (a, b)))
    if fmt == "html" and out is None:  # beside the workspace whose engines were diffed, else here
        out = (state.catalog.root if state._catalog is not None else Path.cwd()) / "reports" / "diff.html"
    if fmt == "table" and out is None:
        from pipeline.reporting import stdout_console

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


@cli.group()
def toolchains():
    """The toolchains: list them, fetch what they need (images, environments), pin them."""


@toolchains.command("list")
@pass_state
def toolchains_list(state: _State):
    """Each toolchain, what it provides, whether it is here and usable, and whether it is locked."""
    from rich.markup import escape
    from rich.table import Table

    from pipeline.reporting import Reporter, stdout_console
    from pipeline.runtimes.toolchains import status

    rows = status(state.catalog, Reporter(state.verbose))
    table = Table(title="Toolchains")
    for column in ("toolchain", "kind", "here", "usable", "detail", "pin", "locked"):
        table.add_column(column, overflow="fold")
    for row in rows:
        st = row.status
        present = "?" if st.present is None else ("yes" if st.present else "no (`pipeline toolchains pull`)")
        locked = "–" if not row.locked else ("yes" if st.pin is None or row.locked == st.pin else "[yellow]differs[/]")
        table.add_row(row.name, row.kind, present, "yes" if st.usable else "no", escape(st.detail), (st.pin or "–")[:19], locked)
    stdout_console().print(table)


@toolchains.command("pull")
@click.argument("names", nargs=-1)
@click.option("--wait", is_flag=True, help="If another run holds this workspace, wait for it to finish instead of failing at once.")
@pass_state
def toolchains_pull(state: _State, names, wait):
    """Fetch what NAMES need (default: every toolchain): pull or build a container image, or
    create a TensorRT-RTX release's own environment. Re-pulling repairs a broken one."""
    from pipeline.reporting import Reporter
    from pipeline.runtimes.toolchains import pull

    with state.holding_workspace(wait):
        pull(state.catalog, list(names) or None, Reporter(state.verbose))


@toolchains.command("lock")
@click.argument("names", nargs=-1)
@pass_state
def toolchains_lock(state: _State, names):
    """Record what pins each toolchain (image digest, installed wheels) in toolchains.lock.json."""
    from pipeline.reporting import Reporter
    from pipeline.runtimes.toolchains import lock

    path = lock(state.catalog, list(names) or None, Reporter(state.verbose))
    click.echo(f"wrote {path}", err=True)


@cli.group()
def trtexec():
    """Work with trtexec output you already have."""


@trtexec.command("parse")
@click.argument("log", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--exports",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder with the JSON written by --exportTimes/--exportProfile/--exportLayerInfo.",
)
@click.option(
    "--precision",
    type=click.Choice(["fp16", "bf16", "int8", "fp8", "mxfp8", "nvfp4"]),
    help="Intended precision, for the layer-precision audit.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the parsed run as JSON.")
def trtexec_parse(log, exports, precision, as_json):
    """Parse a trtexec log (and its JSON exports) into structured facts.

    \b
    JSON keys: trt_version, status, device{name, compute_capability, sms, memory_mib},
    throughput_qps, latency_ms / gpu_compute_ms / enqueue_ms / h2d_ms / d2h_ms
    {min, max, mean, median, p90, p95, p99}, total_host_walltime_s, total_gpu_compute_s,
    warnings, errors[{code, message}], profile, options, exports. Absent facts are null.
    Summary lines are read wherever they stand, also pasted without their "[date] [I]"
    prefix or section header; text with neither a summary nor a PASSED/FAILED line exits 1.
    """
    import json

    from pipeline.errors import PipelineError
    from pipeline.trtexec.log import NOTHING_TO_REPORT
    from pipeline.trtexec.report import find_exports, parse_run, run_as_json

    run = parse_run(log, find_exports(exports) if exports else None, precision)
    if as_json:
        click.echo(json.dumps(run_as_json(run), indent=2))
    else:
        from pipeline.reporting import stdout_console
        from pipeline.trtexec.summary import render_run

        stdout_console().print(render_run(run))
    if NOTHING_TO_REPORT in run.log.warnings:
        # Said after the (empty) result, and with a failing exit code, so a script cannot take a
        # page of nulls for a measurement.
        raise PipelineError(
            f"{log}: {NOTHING_TO_REPORT}.",
            hint="pass trtexec's whole output (`trtexec … | tee run.log`), or at least its performance summary lines",
        )


# --- the error boundary ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # here, not at interpreter exit, so a reader that went away is handled
        return code
    except SystemExit as exc:
        # click answers a closed stdout inside a command with sys.exit(1), after wrapping stdout so
        # that later flushes are silent (click.core.Command.main, EPIPE).
        from click.utils import _PacifyFlushWrapper

        if isinstance(sys.stdout, _PacifyFlushWrapper):
            return 0
        raise exc
    except BrokenPipeError:
        # stdout closed early (`pipeline compare | head`): the reader's choice, not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv: list[str] | None) -> int:
    from pipeline.errors import PipelineError
    from pipeline.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, sigterm_as_interrupt

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with sigterm_as_interrupt():
            cli.main(args=args, prog_name="pipeline", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        from pipeline.reporting import print_error

        # click turns an interruption inside a command into Abort, keeping it as the cause.
        if isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated):
            print_error("terminated (SIGTERM); partial outputs were removed, finished ones are kept.")
            return EXIT_TERMINATED
        print_error("interrupted; partial outputs were removed, finished ones are kept.")
        return EXIT_INTERRUPTED
    except PipelineError as exc:
        from pipeline.reporting import print_error

        if exc.__cause__ is not None and ("-v" in args or "--verbose" in args):
            import traceback

            # The tool error behind the message, for whoever debugs it.
            traceback.print_exception(exc.__cause__)
        print_error(exc.message, exc.hint)
        return exc.exit_code
    except BrokenPipeError:
        # stdout closed early (e.g. `pipeline compare | head`): not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:
        import traceback

        traceback.print_exc()
        click.echo("INTERNAL ERROR: this is a bug in the pipeline; the traceback above helps fix it.", err=True)
        return EXIT_INTERNAL

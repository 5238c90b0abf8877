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

EXIT_INTERNAL = 70


class _State:
    def __init__(self, catalog_path: Path | None, verbose: bool):
        self.catalog_path = catalog_path
        self.verbose = verbose
        self._catalog = None

    @property
    def catalog(self):
        if self._catalog is None:
            from pipeline.runtimes import load_catalog

            self._catalog = load_catalog(self.catalog_path)
        return self._catalog

    def context(self, force: bool = False):
        from pipeline.reporting import Reporter
        from pipeline.stages.base import RunContext
        from pipeline.workspace import Workspace

        return RunContext(
            catalog=self.catalog,
            workspace=Workspace(self.catalog.root),
            reporter=Reporter(verbose=self.verbose),
            force=force,
        )

    def holding_workspace(self, wait: bool):
        """The workspace lock, for commands that run stages (pipeline/workspace_lock.py)."""
        from pipeline.reporting import Reporter
        from pipeline.workspace import Workspace
        from pipeline.workspace_lock import workspace_lock

        return workspace_lock(Workspace(self.catalog.root).manifests_dir, Reporter(verbose=self.verbose), wait)


pass_state = click.make_pass_decorator(_State)


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


# --- selection ----------------------------------------------------------------------------------


def selection_options(func):
    func = click.option("--variant", "variants", multiple=True, metavar="V", help="Variant(s) of the selected models (repeatable).")(func)
    func = click.option("--model", "models", multiple=True, metavar="M", help="Model(s); alone, selects all their variants (repeatable).")(
        func
    )
    func = click.option("--engine", "engines", multiple=True, metavar="NAME", help="Engine(s) by name, e.g. vit_tiny_fp16 (repeatable).")(
        func
    )
    return func


def toolchain_options(func):
    func = click.option(
        "--arch",
        "archs",
        multiple=True,
        metavar="SM",
        help="GPU architecture to compile for, e.g. sm120 (repeatable; ahead-of-time toolchains such as TensorRT-RTX). "
        "Default: the toolchain's archs in pipeline.toml, else this machine's GPU.",
    )(func)
    func = click.option("--trt", metavar="VERSION", help="The toolchain providing this TensorRT version, e.g. 10.14.")(func)
    func = click.option("--toolchain", metavar="T", help="Toolchain by name (default: the catalog's, onnxruntime).")(func)
    return func


def force_option(func):
    func = click.option(
        "--wait",
        is_flag=True,
        help="If another run holds this workspace, wait for it to finish instead of failing at once.",
    )(func)
    return click.option("--force", is_flag=True, help="Re-run stages even when nothing changed.")(func)


def cluster_options(func):
    func = click.option(
        "--gpu",
        "gpu_types",
        multiple=True,
        metavar="TYPE",
        help="With --cluster: build and time for this GPU type, e.g. H100 (repeatable). Default: every GPU "
        "type the cluster has that the toolchain supports.",
    )(func)
    return click.option(
        "--cluster",
        metavar="ADDRESS",
        envvar="RAY_ADDRESS",
        help="Fan the work out over the Ray cluster at ADDRESS (HOST:PORT of its head; `local` starts one "
        "here; default $RAY_ADDRESS). Each stage runs on a node that can run it; results land here.",
    )(func)


def calibration_options(func):
    func = click.option(
        "--eval-dir",
        type=click.Path(path_type=Path),
        help="Check every engine's accuracy on images from this folder (ImageFolder layout; a batch's worth, "
        "timm's preprocessing) instead of a seeded random batch; top-1 accuracy too where the folders are "
        "ImageNet classes of a checkpoint.",
    )(func)
    func = click.option("--calib-samples", type=click.IntRange(min=1), help="How many calibration inputs (default: the catalog's).")(func)
    func = click.option(
        "--calib-dir",
        type=click.Path(path_type=Path),
        help="Calibrate on the images in this folder (timm's preprocessing) instead of synthetic inputs.",
    )(func)
    return func


def apply_calibration(state, calib_dir, calib_samples, eval_dir=None) -> None:
    """Command-line calibration and evaluation settings replace the catalog's for this run."""
    if eval_dir is not None:
        evaluation = state.catalog.evaluation.model_copy(update={"directory": Path(eval_dir).resolve()})
        state._catalog = state.catalog.model_copy(update={"evaluation": evaluation})
    if calib_dir is None and calib_samples is None:
        return
    settings = state.catalog.calibration
    updates = {}
    if calib_dir is not None:
        updates["directory"] = Path(calib_dir).resolve()
    if calib_samples is not None:
        updates["samples"] = calib_samples
    state._catalog = state.catalog.model_copy(update={"calibration": settings.model_copy(update=updates)})


def repeat_option(func):
    return click.option(
        "--repeat",
        type=click.IntRange(min=1, max=100),
        metavar="N",
        help="Measure each engine N times (each with its own warm-up) and record every run's median and their "
        "spread, so you can tell a repeatable number from a lucky one. Default: the catalog's [profile] repeats.",
    )(func)


def apply_repeat(state, repeat) -> None:
    if repeat is not None:
        settings = state.catalog.profile
        state._catalog = state.catalog.model_copy(update={"profile": settings.model_copy(update={"repeats": repeat})})


def select_engines(catalog, engines, models, variants):
    """The one place selection options are combined and checked."""
    from pipeline.catalog import EngineRef
    from pipeline.errors import UsageError

    if engines and (models or variants):
        raise UsageError("--engine cannot be combined with --model/--variant.", hint="name engines one way or the other")
    if engines:
        refs = [catalog.engine(name) for name in engines]
    else:
        chosen_models = models or catalog.defaults.models
        if variants:
            chosen_variants = variants
        elif models:
            chosen_variants = tuple(catalog.variants)
        else:
            chosen_variants = catalog.defaults.variants
        for name in chosen_models:
            catalog.model(name)
        for name in chosen_variants:
            catalog.variant(name)
        refs = [EngineRef(m, v) for m in chosen_models for v in chosen_variants]
    return list(dict.fromkeys(refs))


def select_toolchain(state, toolchain: str | None, trt: str | None, archs: tuple[str, ...] = ()) -> str:
    """The toolchain named by --toolchain or --trt (or the catalog's default), with --arch applied."""
    catalog = state.catalog
    name = _toolchain_name(catalog, toolchain, trt)
    if archs:
        state._catalog = catalog.with_targets(name, archs)
    return name


def _toolchain_name(catalog, toolchain: str | None, trt: str | None) -> str:
    from pipeline.errors import UsageError

    if toolchain and trt:
        raise UsageError("--toolchain and --trt name the same thing; give one.", hint=f"e.g. --trt {trt}")
    if trt:
        return catalog.toolchain_for_trt(trt)
    name = toolchain or catalog.defaults.toolchain
    catalog.toolchain(name)
    return name


# --- commands -----------------------------------------------------------------------------------


@cli.command()
@pass_state
def models(state: _State):
    """List models, variants, toolchains and the engine names they make."""
    from rich.table import Table

    from pipeline.reporting import stdout_console

    catalog = state.catalog
    console = stdout_console()
    table = Table(title=f"Models ({catalog.root / 'pipeline.toml'})")
    for column in ("model", "timm", "batch", "weights"):
        table.add_column(column)
    for name, spec in catalog.models.items():
        weights = f"checkpoint {spec.checkpoint}" if spec.checkpoint else f"random init (seed {spec.seed})"
        table.add_row(name, spec.timm, str(spec.batch_size), weights)
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
    apply_calibration(state, calib_dir, calib_samples, eval_dir)
    refs = select_engines(state.catalog, engines, models, variants)
    with state.holding_workspace(wait):
        _execute(state, state.context(force), refs, None, "export", cluster, gpu_types)


def _execute(state: _State, ctx, refs, chain, until, cluster, gpu_types) -> None:
    """Run the stages here, or on the Ray cluster named by --cluster."""
    from pipeline.errors import UsageError

    if not cluster:
        if gpu_types:
            raise UsageError("--gpu chooses among a cluster's GPU types; it needs --cluster.", hint="add --cluster HOST:PORT")
        from pipeline.stages.runner import run_engines

        run_engines(ctx, refs, chain, until=until)
        return
    from pipeline.cluster.supervisor import run_on_cluster

    run_on_cluster(ctx, cluster, refs, chain, until, tuple(gpu_types), state.verbose)


def engine_stage_options(func):
    """What build and profile take: the selection, the toolchain, --force, --dry-run, calibration, --cluster."""
    func = click.option("--dry-run", is_flag=True, help="Print what would run (the exact command and container) and stop.")(func)
    for decorator in (cluster_options, calibration_options, force_option, toolchain_options, selection_options):
        func = decorator(func)
    return func


def _stage_command(
    state: _State,
    engines,
    models,
    variants,
    toolchain,
    trt,
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
):
    apply_calibration(state, calib_dir, calib_samples, eval_dir)
    apply_repeat(state, repeat)
    refs = select_engines(state.catalog, engines, models, variants)
    chain = select_toolchain(state, toolchain, trt, archs)
    ctx = state.context(force)
    if dry_run:
        from pipeline.stages.runner import describe

        for line in describe(ctx, refs, chain, until):
            click.echo(line)
        return
    with state.holding_workspace(wait):
        _execute(state, ctx, refs, chain, until, cluster, gpu_types)


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
def run(
    state: _State,
    engines,
    models,
    variants,
    toolchain,
    trt,
    archs,
    force,
    wait,
    calib_dir,
    calib_samples,
    eval_dir,
    repeat,
    cluster,
    gpu_types,
):
    """Export, build and profile a selection, then print the comparison.

    With no selection it runs the catalog's defaults: the demo on ONNX Runtime.
    """
    apply_calibration(state, calib_dir, calib_samples, eval_dir)
    apply_repeat(state, repeat)
    refs = select_engines(state.catalog, engines, models, variants)
    chain = select_toolchain(state, toolchain, trt, archs)
    with state.holding_workspace(wait):
        _execute(state, state.context(force), refs, chain, "profile", cluster, gpu_types)
    _print_comparison(state, [chain], "table", None)


@cli.command()
@click.option("--toolchain", "toolchains", multiple=True, metavar="T", help="Only these toolchains, in this order (repeatable).")
@click.option("--trt", "trts", multiple=True, metavar="VERSION", help="Only the toolchains of these TensorRT versions, in this order.")
@click.option("--models", "models", multiple=True, metavar="M", help="Only these models (repeatable).")
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
    "--noisy-cv", type=click.FloatRange(min=0), metavar="PCT", help="Flag measurements whose CV is above PCT percent as noisy (default 10)."
)
@click.option(
    "--fail-accuracy-below",
    "accuracy_thresholds",
    multiple=True,
    metavar="[cos=|top1=]X",
    help="Exit 1 naming every engine whose own outputs fall below X against the FP32 model: cosine "
    "similarity (0.99, cos=0.99) or top-1 agreement (top1=0.95). Repeatable.",
)
@pass_state
def compare(
    state: _State, toolchains, trts, models, gpu_types, fmt, out, baseline, fail_above, wide, columns, noisy_cv, accuracy_thresholds
):
    """Put profiled engines side by side, from the saved manifests (never re-measures).

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
    rows = _print_comparison(state, names or None, fmt, out, list(models) or None, columns, wide, noisy_cv, list(gpu_types) or None)
    if thresholds:
        _accuracy_gate(rows, thresholds)
    if baseline is not None:
        _gate(state, names or None, baseline, fail_above)


def _accuracy_gate(rows, thresholds) -> None:
    from pipeline.errors import PipelineError
    from pipeline.report.gates import accuracy_gate

    checked, failures = accuracy_gate(rows, thresholds)
    if not checked:
        raise PipelineError(
            "--fail-accuracy-below: no engine in the comparison had its own outputs checked.",
            hint="profile the engines (`pipeline profile`); the accuracy proxy of an export is not an engine's accuracy",
        )
    wanted = ", ".join(f"{'cosine' if m == 'cos' else 'top-1'} ≥ {t:g}" for m, t in thresholds)
    click.echo(f"Accuracy gate ({wanted}): {checked - len({f.split(':')[0] for f in failures})} of {checked} engines pass", err=True)
    if failures:
        raise PipelineError(
            f"{len(failures)} accuracy check(s) failed: " + "; ".join(failures) + ".",
            hint="the engines' own outputs against the FP32 model on the reference batch; `--format json` has every figure",
        )


def _gate(state: _State, toolchains, baseline: str, fail_above: float) -> None:
    from pipeline.errors import PipelineError
    from pipeline.report.gates import regression_gate, render_gate
    from pipeline.report.rows import load_baseline, load_manifests
    from pipeline.workspace import Workspace

    workspace = Workspace(state.catalog.root)
    results = regression_gate(
        load_manifests(workspace.manifests_dir, toolchains), load_baseline(baseline, workspace, toolchains), fail_above
    )
    if not results:
        raise PipelineError(f"no engine was measured both now and in baseline {baseline}.", hint="compare the same engines and toolchains")
    click.echo(render_gate(results, fail_above), nl=False)
    regressed = [r for r in results if r.regressed]
    if regressed:
        names = ", ".join(f"{r.engine} on {r.toolchain} ({r.change_pct:+.1f}%)" for r in regressed)
        raise PipelineError(
            f"{len(regressed)} engine(s) got slower than {fail_above:g}% beyond the noise: {names}.",
            hint="the lines marked REGRESSED above show the medians and the confidence interval",
        )


def _print_comparison(state: _State, toolchains, fmt, out, models=None, columns=None, wide=False, noisy_cv=None, gpu_types=None):
    from pipeline.report.compare import compare as compare_manifests
    from pipeline.report.compare import write_output
    from pipeline.report.rows import NOISY_CV
    from pipeline.report.tables import parse_columns, render_markdown
    from pipeline.reporting import stdout_console
    from pipeline.workspace import Workspace

    console = stdout_console()
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
    )
    differently = [f"{r.engine} on {r.toolchain}: {flag}" for r in rows for flag in r.flags if flag.startswith("measured differently")]
    if differently:
        from pipeline.reporting import Reporter

        for line in differently:
            Reporter().warn(f"{line}; the comparison is not like for like")
    if out is not None:
        write_output(rendered if isinstance(rendered, str) else render_markdown(rows), out)
        click.echo(f"wrote {out}", err=True)
    elif isinstance(rendered, str):
        click.echo(rendered, nl=False)
    else:
        if wide:  # every column, as wide as that takes: lines may wrap, no number is cut
            console.width = 1000
        console.print(rendered)
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


"""The `pipeline` command. A thin layer: it builds configurations and calls the library.

Only click is imported at start-up so `pipeline --help` stays instant; each command imports what
it needs. ``main(argv)`` returns the exit code, so tests call it directly:

    0 success · 1 a stage failed · 2 bad usage · 3 this machine lacks something (GPU, Docker,
    a package) · 130 interrupted (Ctrl-C) · 143 terminated (SIGTERM) · 70 a bug in the pipeline
    (printed with its traceback)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click

from pipeline.cli.options import (
    Launch,
    Overrides,
    Selection,
    calibration_options,
    cluster_options,
    dry_run_option,
    engine_stage_options,
    force_option,
    repeat_option,
    selection_options,
    stage_options,
    toolchain_options,
)
from pipeline.cli.precision import plan, sensitivity
from pipeline.cli.reports import _print_comparison, compare, diff
from pipeline.cli.state import State as _State
from pipeline.cli.state import pass_state
from pipeline.cli.tools import cache, doctor, reduce, toolchains, trtexec

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
    """Turn models into engines, profile them, and find the fastest that stays accurate.

    \b
    Models:      timm classifiers, Hugging Face transformers, your own PyTorch module or ONNX file
    Toolchains:  TensorRT (trtexec), TensorRT-RTX, ONNX Runtime, PyTorch (eager, torch.compile, CUDA graphs)
    Stages:      export → build → profile → compare
    Engines are named <model>_<variant>, e.g. vit_nvfp4, vit_tiny_fp16 (`pipeline models`).
    Unchanged stages are skipped; --force re-runs them. Outputs: models/, engines/, manifests/.

    \b
    Quick start (no GPU needed):  pipeline run
    """
    ctx.obj = _State(catalog, verbose)


# --- commands -----------------------------------------------------------------------------------

for command in (sensitivity, plan, compare, diff, doctor, toolchains, trtexec, cache, reduce):
    cli.add_command(command)


@cli.command()
@pass_state
def models(state: _State):
    """List models, variants, toolchains and the engine names they make."""
    from rich.table import Table

    from pipeline.running.reporting import stdout_console

    catalog = state.catalog
    console = stdout_console()
    table = Table(title=f"Models ({state.catalog_path or catalog.root / 'pipeline.toml'})")
    from pipeline.models import model_source

    for column in ("model", "source", "shapes", "weights"):
        table.add_column(column)
    for name, spec in catalog.models.items():
        source = model_source(name, spec, catalog.root)
        table.add_row(name, source.describe(), source.shapes_summary(), source.weights_words())
    console.print(table)
    variants = Table(title="Variants")
    for column in ("variant", "precision", "sparsity"):
        variants.add_column(column)
    for name, spec in catalog.variants.items():
        variants.add_row(name, spec.precision, spec.sparsity or "–")
    console.print(variants)
    from pipeline.running.reporting import Reporter
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
def export(state: _State, engines, models, variants, force, wait, calib_dir, calib_samples, eval_dir, sanitize, cluster, gpu_types):
    """Export models to ONNX, sparsifying and quantizing as the variant needs.

    Writes models/<model>/<variant>.onnx. Quantized and sparse variants are calibrated on
    synthetic inputs unless --calib-dir names a folder of images.
    """
    from pipeline.stages.base import RunRequest
    from pipeline.stages.runner import raise_if_nothing_exported

    state.override(calib_dir, calib_samples, eval_dir, sanitize=sanitize)
    refs = state.catalog.select(engines, models, variants)
    with state.holding_workspace(wait):
        ctx = state.context(force)
        _launcher(state, cluster, gpu_types).run(ctx, RunRequest(refs, None, "export", tuple(gpu_types)))
        raise_if_nothing_exported(ctx, refs)


def _launcher(state: _State, cluster: str | None, gpu_types):
    """Where the stages run: in this process, on the Ray cluster named by --cluster, or on the GPUs
    of this machine --gpus names (a Ray instance here)."""
    from pipeline.running.errors import UsageError

    visible = click.get_current_context().meta.get("visible_gpus")
    if visible and cluster:
        raise UsageError(
            "--gpus runs on this machine's GPUs, --cluster on a Ray cluster's: give one of them.",
            hint="--gpus 0,1 for this machine (a Ray instance here); --cluster HOST:PORT for a cluster",
        )
    if visible:
        from pipeline.cluster.supervisor import ClusterLauncher

        return ClusterLauncher("local", state.verbose, visible)
    if not cluster:
        if gpu_types:
            raise UsageError("--gpu chooses among a cluster's GPU types; it needs --cluster.", hint="add --cluster HOST:PORT")
        from pipeline.stages.runner import LocalLauncher

        return LocalLauncher()
    from pipeline.cluster.supervisor import ClusterLauncher

    return ClusterLauncher(cluster, state.verbose)


def _stage_command(state: _State, until: str, selection: Selection, overrides: Overrides, launch: Launch) -> list[str]:
    """Select, settle the toolchains, then print the work (--dry-run) or do it, one toolchain after
    the other (a failure in one does not stop the next); the toolchains' names."""
    from dataclasses import asdict

    from pipeline.running.errors import DeviceFault
    from pipeline.stages.base import RunRequest
    from pipeline.stages.runner import build_order, describe, onnx_read_by

    state.override(**asdict(overrides))
    refs = state.catalog.select(selection.engines, selection.models, selection.variants)
    chains = state.toolchains(selection.toolchains, selection.trts, selection.archs)
    ctx = state.context(launch.force)
    ctx.exports_write_onnx = onnx_read_by(ctx, chains)
    if launch.dry_run:  # in the order the run goes
        for chain in build_order(ctx, chains):
            if len(chains) > 1:
                click.echo(f"# {chain}")
            for line in describe(ctx, refs, chain, until):
                click.echo(line)
        return chains
    with state.holding_workspace(launch.wait):
        try:
            _launcher(state, launch.cluster, launch.gpu_types).run(ctx, RunRequest(refs, chains, until, tuple(launch.gpu_types)))
        except DeviceFault as exc:
            exc.after(ctx.done)  # what --force redid: the fresh process does not redo it
            raise
    return chains


@cli.command()
@engine_stage_options
@pass_state
def build(state: _State, **options):
    """Build engines for one toolchain (exporting first if needed): engines/<toolchain>/."""
    _stage_command(state, "build", *stage_options(options))


@cli.command()
@engine_stage_options
@repeat_option
@pass_state
def profile(state: _State, **options):
    """Time engines (building them first if needed), then check each one's outputs against the
    FP32 model on the reference batch; results go to manifests/<toolchain>/."""
    _stage_command(state, "profile", *stage_options(options))


@cli.command()
@selection_options
@toolchain_options
@force_option
@calibration_options
@repeat_option
@cluster_options
@dry_run_option
@pass_state
def run(state: _State, **options):
    """Export, build and profile a selection, then print the comparison of its models.

    With no selection it runs the catalog's defaults: the demo on ONNX Runtime. The workspace's
    other models are `pipeline compare`'s.
    """
    from pipeline.running.errors import DeviceFault, PipelineError, UsageError

    selection, overrides, launch = stage_options(options)
    try:
        chains = _stage_command(state, "profile", selection, overrides, launch)
    except PipelineError as exc:
        if isinstance(exc, UsageError | DeviceFault):
            raise  # a fault: the fresh process that goes on prints the comparison
        # What did run (the other shape points and toolchains of a sweep) is still worth seeing.
        try:
            _print_comparison(
                state, state.catalog.toolchains_named(selection.toolchains, selection.trts), "table", None, _models_of(state, selection)
            )
        except PipelineError:
            pass  # nothing was measured: the error says why
        raise
    if launch.dry_run:
        return  # nothing ran: nothing to compare
    # The models it ran, every variant of theirs measured (the speedups read the baseline variant's);
    # the workspace's other models are `pipeline compare`'s.
    _print_comparison(state, chains, "table", None, _models_of(state, selection))


def _models_of(state: _State, selection) -> list[str]:
    """The models a selection names (the catalog's defaults where it names none), in its order."""
    return list(dict.fromkeys(ref.model for ref in state.catalog.select(selection.engines, selection.models, selection.variants)))


def _native_crashes_traced() -> None:
    """Python's stack of every thread written to stderr where a native library aborts or faults
    the process (faulthandler): CUDA, Kineto or a compiler dying under the run says from where —
    at exit too, where a daemon thread still in a library can abort the interpreter's teardown
    after all the outputs are written (seen once on the lent H100: docs/results/sweeps.md). Left
    as it is where something (pytest) already traces them."""
    import faulthandler

    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError):  # no stderr with a file descriptor: nothing to write to
        pass


def main(argv: list[str] | None = None) -> int:
    _native_crashes_traced()
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


def _naming_the_catalog_read(message: str, hint: str | None) -> tuple[str, str | None]:
    """An error's words with the catalog named as the file the command read: the stages name it
    by its default name wherever they point at a setting, and ``--catalog`` may have read another."""
    from pipeline.catalog import CATALOG_FILENAME
    from pipeline.cli.state import State

    name = State.current.catalog_file_name() if State.current is not None else None
    if not name or name == CATALOG_FILENAME:
        return message, hint
    # The default name alone: not a path's last part (a file of that name elsewhere), nor part of
    # a longer name (ci-pipeline.toml, pipeline.toml.d).
    alone = re.compile(rf"(?<![\w./\\-]){re.escape(CATALOG_FILENAME)}(?![\w-]|\.\w)")
    return alone.sub(name, message), alone.sub(name, hint) if hint else hint


def _run(argv: list[str] | None) -> int:
    from pipeline.cli.state import State
    from pipeline.running.errors import DeviceFault, PipelineError
    from pipeline.running.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, sigterm_as_interrupt

    args = list(sys.argv[1:] if argv is None else argv)
    State.current = None  # an earlier command's, where `main` is called more than once in a process
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
        from pipeline.running.reporting import print_error

        # click turns an interruption inside a command into Abort, keeping it as the cause.
        if isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated):
            print_error("terminated (SIGTERM); partial outputs were removed, finished ones are kept.")
            return EXIT_TERMINATED
        print_error("interrupted; partial outputs were removed, finished ones are kept.")
        return EXIT_INTERRUPTED
    except DeviceFault as exc:
        from pipeline.launchers.restart import go_on_in_fresh_process
        from pipeline.running.reporting import print_error

        print_error(exc.message, "recorded for that point; the run goes on in a fresh process (CUDA cannot be used again in this one)")
        return go_on_in_fresh_process(args, exc.done, replace=argv is None)
    except PipelineError as exc:
        from pipeline.running.reporting import print_error

        if exc.__cause__ is not None and ("-v" in args or "--verbose" in args):
            import traceback

            # The tool error behind the message, for whoever debugs it.
            traceback.print_exception(exc.__cause__)
        print_error(*_naming_the_catalog_read(exc.message, exc.hint))
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

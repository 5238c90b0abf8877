"""The commands about this machine and its tools: `pipeline doctor`, `pipeline toolchains`
(list, pull, lock), `pipeline trtexec parse`, `pipeline cache` (compiled work, carried), and
`pipeline reduce` for a build that failed."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.state import State as _State
from pipeline.cli.state import pass_state


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def doctor(state: _State, as_json):
    """What this machine can run: Python deps, CUDA, GPU, Docker, NVIDIA runtime, toolchains."""
    import json

    from pipeline.running.reporting import stdout_console
    from pipeline.runtimes.doctor import as_dicts, render, run_doctor

    checks = run_doctor(state.catalog)
    if as_json:
        click.echo(json.dumps(as_dicts(checks), indent=2))
    else:
        stdout_console().print(render(checks))


@click.group()
def toolchains():
    """The toolchains: list them, fetch what they need (images, environments), pin them."""


@toolchains.command("list")
@pass_state
def toolchains_list(state: _State):
    """Each toolchain, what it provides, whether it is here and usable, and whether it is locked."""
    from rich.markup import escape
    from rich.table import Table

    from pipeline.running.reporting import Reporter, stdout_console
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
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.toolchains import pull

    with state.holding_workspace(wait):
        pull(state.catalog, list(names) or None, Reporter(state.verbose))


@toolchains.command("lock")
@click.argument("names", nargs=-1)
@pass_state
def toolchains_lock(state: _State, names):
    """Record what pins each toolchain (image digest, installed wheels) in toolchains.lock.json."""
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.toolchains import lock

    path = lock(state.catalog, list(names) or None, Reporter(state.verbose))
    click.echo(f"wrote {path}", err=True)


@click.group()
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

    from pipeline.running.errors import PipelineError
    from pipeline.trtexec.log import NOTHING_TO_REPORT
    from pipeline.trtexec.report import find_exports, parse_run, run_as_json

    run = parse_run(log, find_exports(exports) if exports else None, precision)
    if as_json:
        click.echo(json.dumps(run_as_json(run), indent=2))
    else:
        from pipeline.running.reporting import stdout_console
        from pipeline.trtexec.summary import render_run

        stdout_console().print(render_run(run))
    if NOTHING_TO_REPORT in run.log.warnings:
        # Said after the (empty) result, and with a failing exit code, so a script cannot take a
        # page of nulls for a measurement.
        raise PipelineError(
            f"{log}: {NOTHING_TO_REPORT}.",
            hint="pass trtexec's whole output (`trtexec … | tee run.log`), or at least its performance summary lines",
        )


@click.group()
def cache():
    """torch.compile's compiled work, kept in the workspace (.cache/torch/): carry it elsewhere.

    \b
    pipeline cache export compiled.zip   # on the machine that compiled
    pipeline cache import compiled.zip   # on another, before `pipeline run`: its compiles are cache hits
    """


@cache.command("export")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@pass_state
def cache_export(state: _State, out: Path):
    """Write every graph this workspace's runs compiled or found (PyTorch's Mega-Cache records) to OUT."""
    from pipeline.runtimes.pytorch.cache import export_bundle, use_workspace_cache

    use_workspace_cache(state.catalog.root)
    records, size = export_bundle(out)
    click.echo(f"wrote {out}: {records} record(s) of compiled work, {size / 2**20:.1f} MiB")


@cache.command("import")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@pass_state
def cache_import(state: _State, bundle: Path):
    """Load compiled work `pipeline cache export` wrote into this workspace's caches."""
    from pipeline.runtimes.pytorch.cache import import_bundle, use_workspace_cache
    from pipeline.runtimes.pytorch.prepared import import_torch

    import_torch()  # or the error that says how to install it
    directory = use_workspace_cache(state.catalog.root)
    counts = import_bundle(bundle)
    kinds = ", ".join(f"{count} {kind}" for kind, count in counts.items() if kind != "records") or "no cache entries"
    click.echo(f"loaded {counts['records']} record(s) into {directory}: {kinds}")


# --- the error boundary ---------------------------------------------------------------------


@click.command()
@click.option("--engine", "engine_name", required=True, metavar="NAME", help="The engine whose build failed, e.g. vit_fp16.")
@click.option("--toolchain", required=True, metavar="NAME", help="The toolchain it failed on (its build is the check).")
@click.option(
    "--arch",
    "archs",
    multiple=True,
    metavar="SM",
    help="GPU architecture the failed build compiled for, as given to `pipeline build` (repeatable; ahead-of-time toolchains).",
)
@click.option(
    "--shape",
    metavar="POINT",
    help="The export's shape point the cuts are made at, for a graph with dynamic inputs (default: its first; the output names it).",
)
@click.option("--wait", is_flag=True, help="If another run holds this workspace, wait for it to finish instead of failing at once.")
@pass_state
def reduce(state: _State, engine_name, toolchain, archs, shape, wait):
    """Cut the graph of a failed build down to the smallest that still fails the same way.

    Polygraphy's reducer (`polygraphy debug reduce`) bisects the engine's ONNX, and each cut is
    built with the toolchain's own build; a cut counts as failing only when it fails as the build
    did (the same node op, parser check and words). The result goes to
    models/<model>/<variant>.<toolchain>.reduced.onnx, and the build manifest records it: the
    graph to attach to a bug report, or to try a plugin on.

    \b
    pipeline build  --engine vit_fp16 --toolchain trt-rtx1.7 --arch sm120    # fails
    pipeline reduce --engine vit_fp16 --toolchain trt-rtx1.7 --arch sm120
    """
    from pipeline.stages.reduce import reduce_engine

    (engine,) = state.catalog.select((engine_name,), (), ())
    state.toolchains((toolchain,), (), archs)  # an unknown name is refused with the known ones; --arch as the build took it
    with state.holding_workspace(wait):
        reduce_engine(state.context(), engine, toolchain, shape)

"""`pipeline sensitivity` and `pipeline plan`: which layers break a quantized variant, and the
variant that fixes it (pipeline/precision/, docs/precision.md)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from pipeline.cli.state import State, pass_state

ENGINE_HELP = "A quantized engine, e.g. vit_tiny_int8 (its model and variant are what is analysed)."
SAMPLES_HELP = "Evaluation samples for the search (and as many others for the plan's confirmation), apart from calibration."
FLOOR_HELP = (
    "The accuracy to keep: cos=0.99 (cosine to FP32 over the set), top1=0.95 (the share of inputs whose class is FP32's), "
    "or sample-cos=0.99@99% (a floor each input must keep: at least 99% of inputs keep a cosine of 0.99 to FP32's "
    "output each, which a few inputs with errors tens of times the rest's cannot hide under a mean) (repeatable; all "
    "hold). Default: the model's accuracy_floor in pipeline.toml, else the precision's own check."
)


def _floor(state: State, ref, floors: tuple[str, ...], max_drops: tuple[str, ...] = ()):
    from pipeline.catalog.floor import DROP_FORMS, PER_SAMPLE_FORMS, THRESHOLD_FORMS, parse_accuracy_threshold, parse_drop, parse_per_sample
    from pipeline.precision.figures import floor_for
    from pipeline.running.errors import UsageError

    given, drops, each = [], [], []
    for text in floors:
        try:
            if (per_sample := parse_per_sample(text)) is not None:
                each.append(per_sample)
                continue
            given.append(_metric_threshold(text) or parse_accuracy_threshold(text))
        except ValueError as exc:
            raise UsageError(
                f"--floor {text!r} is not a threshold.", hint=f"give {THRESHOLD_FORMS}, metric=0.8, or {PER_SAMPLE_FORMS}"
            ) from exc
    if len(each) > 1:
        raise UsageError(
            f"--floor gives {len(each)} per-sample floors ({', '.join(t for t in floors if parse_per_sample(t))}): a plan keeps one.",
            hint="keep the one that matters most, e.g. --floor sample-cos=0.99@99%",
        )
    for text in max_drops:
        try:
            drops.append(parse_drop(text))
        except ValueError as exc:
            raise UsageError(f"--max-drop {text!r} is not a largest drop.", hint=f"give {DROP_FORMS}") from exc
    floor = floor_for(state.catalog, ref, tuple(given), drops=tuple(drops), per_sample=tuple(each))
    if any(metric == "metric" for metric, _ in (*floor.thresholds, *floor.drops)) and not state.catalog.evaluation.metric:
        raise UsageError(
            f"{ref.name}: a floor on the metric needs the metric: no --metric (or [evaluation] metric) is given.",
            hint="pass --metric FILE.py:FUNCTION, a function (outputs, batch) -> float, higher better",
        )
    return floor


def _metric_threshold(text: str):
    """ "metric=0.8" → ("metric", 0.8): the user's metric has its own scale; None for other forms."""
    name, _, value = str(text).partition("=")
    if name.strip().lower() != "metric":
        return None
    threshold = float(value)
    if threshold != threshold:
        raise ValueError("not a number")
    return "metric", threshold


def _users_evaluation(state: State, eval_dir, eval_data, metric, eval_tokens=None) -> None:
    """The command line's evaluation data and metric in place of the catalog's, the hooks loaded
    now so that a wrong one is said before minutes of calibrating."""
    from pipeline.precision.hooks import load_hook

    state.override(eval_dir=eval_dir)
    state.override_evaluation(data=eval_data, metric=metric, tokens=Path(eval_tokens).resolve() if eval_tokens else None)
    evaluation = state.catalog.evaluation
    for spec, option in ((evaluation.data, "--eval-data"), (evaluation.metric, "--metric")):
        if spec:
            load_hook(spec, option, state.catalog.root)


MAX_DROP_HELP = (
    "The most the variant may fall below the FP32 model on the same samples: top1=1% (top-1 accuracy against the "
    "images' labels where --eval-dir has them, else the share of predictions that changed), cos=0.005, or "
    "metric=0.005 (the --metric hook's figure) (repeatable; with --floor, both hold)."
)
EVAL_DATA_HELP = (
    "Measure on your own data: FILE.py:FUNCTION, a function of no arguments yielding batches of the model's inputs (a "
    'tensor, a tuple of them, or {"inputs": ..., "labels": ...}); dealt whole, seeded, to the search and the confirmation.'
)
EVAL_TOKENS_HELP = (
    "Measure a transformer on these token ids (.npy, one sequence per row, as calibration_tokens): --samples rows "
    "for the search and as many others for the confirmation, drawn seeded."
)
METRIC_HELP = (
    "Your metric: FILE.py:FUNCTION, called as FUNCTION(outputs, batch) -> float per batch, higher better; shown beside "
    "the FP32 model's on the same batches, and kept with --max-drop metric=0.005 or --floor metric=0.8."
)
EVAL_DIR_HELP = (
    "Measure on images from this folder (ImageFolder layout) instead of seeded inputs: --samples for the search and "
    "as many others for the plan's confirmation, each drawn across its classes (seeded). Default: the catalog's "
    "[evaluation] directory."
)


def _analysed(state: State, engine: str, samples: int, floor, stage: str):
    """The calibrated variant and its sensitivity, with progress on stderr."""
    from pipeline.precision.sensitivity import analyse
    from pipeline.precision.variant_lab import VariantLab, refuse_unless_analysable
    from pipeline.precision.where import attach_locations
    from pipeline.running.reporting import Reporter

    ref = state.catalog.engine(engine)
    refuse_unless_analysable(state.catalog, ref)
    reporter = Reporter(verbose=state.verbose)
    started = time.perf_counter()
    with reporter.working(stage, ref.name), reporter.captured("modelopt"):
        lab = VariantLab(state.catalog, ref, samples, reporter.progress)
        _refuse_top1_without_classes(lab, floor)
        result = analyse(lab, floor, reporter.progress)
        attach_locations(result, lab, state.catalog)
    reporter.done(stage, ref.name, time.perf_counter() - started, f" ({len(result.layers)} layers, {result.evaluation['device']})")
    return lab, result


def _refuse_top1_without_classes(lab, floor) -> None:
    """A top-1 floor or drop on a model whose output is not class scores can never be met: say so
    before minutes of measuring."""
    from pipeline.running.errors import UsageError

    if lab.references["search"][0].dim() == 2:
        return
    if any(metric == "top1" for metric, _ in (*floor.thresholds, *floor.drops)):
        raise UsageError(
            f"{lab.ref.name}'s output is not class scores (shape {tuple(lab.references['search'][0].shape)}): it has no top-1 to keep.",
            hint="keep its cosine instead: --floor cos=0.99 or --max-drop cos=0.01",
        )


@click.command()
@click.option("--engine", required=True, metavar="NAME", help=ENGINE_HELP)
@click.option("--samples", type=click.IntRange(min=1), default=32, show_default=True, help=SAMPLES_HELP)
@click.option("--eval-dir", type=click.Path(path_type=Path), metavar="FOLDER", help=EVAL_DIR_HELP)
@click.option("--eval-data", metavar="FILE.py:FUNCTION", help=EVAL_DATA_HELP)
@click.option("--eval-tokens", type=click.Path(path_type=Path), metavar="FILE.npy", help=EVAL_TOKENS_HELP)
@click.option("--metric", metavar="FILE.py:FUNCTION", help=METRIC_HELP)
@click.option("--floor", "floors", multiple=True, metavar="THRESHOLD", help=FLOOR_HELP)
@click.option("--max-drop", "max_drops", multiple=True, metavar="METRIC=DROP", help=MAX_DROP_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table", show_default=True)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file (html default: reports/sensitivity_ENGINE.html)."
)
@pass_state
def sensitivity(state: State, engine, samples, eval_dir, eval_data, eval_tokens, metric, floors, max_drops, fmt, out):
    """Which layers break a quantized engine's accuracy: every quantized layer measured with it
    alone left unquantized (what excluding it buys) and alone quantized (what it costs), ranked,
    with each block's error along the depth.

    \b
    Calibrates once (as the export does), then measures the model's output against FP32 on
    seeded batches kept apart from calibration, or on images of --eval-dir drawn across its
    classes. Each layer is named as the model names it, with its ONNX nodes (once the variant is
    exported) and its engine layers' precision (once built).
    Runs on the CPU for int8 and fp8; mxfp8 and nvfp4 need a CUDA GPU.
    """
    from pipeline.precision import report

    _users_evaluation(state, eval_dir, eval_data, metric, eval_tokens)
    ref = state.catalog.engine(engine)
    floor = _floor(state, ref, floors, max_drops)
    _, result = _analysed(state, engine, samples, floor, "analyse")
    if fmt == "html" and out is None:
        out = state.catalog.root / "reports" / f"sensitivity_{ref.name}.html"
    if fmt == "table" and out is None:
        from pipeline.running.reporting import stdout_console

        report.print_sensitivity(result, stdout_console())
        return
    text = report.sensitivity_html(result) if fmt == "html" else _json(report.sensitivity_document(result))
    _emit(text, out)


@click.command()
@click.option("--engine", required=True, metavar="NAME", help=ENGINE_HELP)
@click.option("--floor", "floors", multiple=True, metavar="THRESHOLD", help=FLOOR_HELP)
@click.option("--max-drop", "max_drops", multiple=True, metavar="METRIC=DROP", help=MAX_DROP_HELP)
@click.option("--samples", type=click.IntRange(min=1), default=32, show_default=True, help=SAMPLES_HELP)
@click.option("--eval-dir", type=click.Path(path_type=Path), metavar="FOLDER", help=EVAL_DIR_HELP)
@click.option("--eval-data", metavar="FILE.py:FUNCTION", help=EVAL_DATA_HELP)
@click.option("--eval-tokens", type=click.Path(path_type=Path), metavar="FILE.npy", help=EVAL_TOKENS_HELP)
@click.option("--metric", metavar="FILE.py:FUNCTION", help=METRIC_HELP)
@click.option("--name", metavar="VARIANT", help="The planned variant's name (default: VARIANT_plan, e.g. int8_plan).")
@click.option("--apply", "apply_", is_flag=True, help="Add the planned variant to pipeline.toml (comments and layout kept).")
@click.option(
    "--apply-unresolved",
    is_flag=True,
    help="Accept a plan whose limits these samples cannot show (status unresolved: held by everything they can say, not "
    "confirmed): --apply adds it. Without it such a plan is written but not applied (--measure times it either way).",
)
@click.option(
    "--check-built/--no-check-built",
    default=True,
    show_default=True,
    help="Build the planned variant on the measuring runtime (ONNX Runtime, or --measure's toolchain) and measure it on "
    "the confirmation samples against the FP32 model: the floor on the engine that ships.",
)
@click.option(
    "--measure",
    metavar="TOOLCHAIN",
    help="Then export, build and time the planned variant beside the fully quantized and the unquantized ones on this "
    "toolchain, in paired rounds, and print what the plan costs in speed beside what it buys in accuracy — whatever the "
    "plan's status (a plan not confirmed is timed as it is, and still not applied).",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the output to this file.")
@pass_state
def plan(
    state: State,
    engine,
    floors,
    max_drops,
    samples,
    eval_dir,
    eval_data,
    eval_tokens,
    metric,
    name,
    apply_,
    apply_unresolved,
    check_built,
    measure,
    fmt,
    out,
):
    """The variant of a quantized engine that meets an accuracy floor keeping the least of the
    model's work (FLOPs) in high precision: layers are excluded in order of what each buys per
    FLOP until the floor holds, then every exclusion no longer needed is undone.

    \b
    The floor is checked on the search batches and confirmed on as many again that the search
    never saw, each by a one-sided 95% bound (exact for top-1 and for a floor each input must
    keep, sample-cos=0.99@99%; a bound of a heavy-tailed mean for cosine and the metric); where
    the samples are too few to show a limit, it says so, and says how rare a failure they could
    miss. The result is catalog TOML (a [variants.NAME] table with its exclude list) and, with
    --apply, written into pipeline.toml. --measure TOOLCHAIN (or the `pipeline run` printed)
    measures whether it still pays, beside the fully quantized and the unquantized variants.
    """
    from pipeline.catalog.file import find_catalog
    from pipeline.precision import catalog_edit, report
    from pipeline.running.reporting import Reporter, stdout_console

    _users_evaluation(state, eval_dir, eval_data, metric, eval_tokens)
    ref = state.catalog.engine(engine)
    variant = state.catalog.variant(ref.variant)
    name = name or f"{ref.variant}_plan"
    catalog_file = Path(state.catalog_path) if state.catalog_path else find_catalog()
    digest = catalog_edit.digest(catalog_file)
    if apply_:
        catalog_edit.refuse_existing(catalog_file, name)  # before minutes of work, and again when writing
    if measure:
        state.toolchains((measure,), ())  # an unknown toolchain is said before minutes of work
    floor = _floor(state, ref, floors, max_drops)
    lab, result = _analysed(state, engine, samples, floor, "plan")
    reporter = Reporter(verbose=state.verbose)
    with reporter.working("plan", ref.name), reporter.captured("modelopt"):
        planned = _planned(lab, result, floor, reporter.progress, measure)
    description = (
        f"{ref.variant} with {len(planned.exclude)} of {len(result.layers)} layers unquantized: {floor.wanted()} "
        f"on {planned.search_samples} + {planned.confirm_samples} samples, {planned.quantized_flops_share:.0%} of their FLOPs quantized (pipeline plan)"
    )
    table = catalog_edit.planned_table(variant, ref.model, planned.exclude, description)
    toml_text = catalog_edit.variant_toml(name, table)
    command = _measure_command(state, ref, name)
    for bound in planned.bounds.get("confirm", []):  # a metric over one batch: no bound to show its limit
        if (said := bound.warning()) is not None and bound.bound is None:
            reporter.warn(f"{said[0]}. TIP {said[1]}")
    accepted = planned.confirmed or (planned.status == "unresolved" and apply_unresolved)
    in_catalog = not planned.needed or (apply_ and accepted)  # what `command` runs is in the catalog by the end
    built = None
    if check_built and planned.status != "failed":
        from pipeline.precision.built import check_built as build_and_check
        from pipeline.precision.built import record_on_engine

        measuring = measure or _embedded_toolchain(state)
        built = build_and_check(state, lab, ref, name if planned.needed else None, table, measuring, floor)
        record_on_engine(built, planned)
    measured = None
    if measure:  # whatever its status: what the plan costs says whether resolving it is worth the work
        from pipeline.precision.measure import measure_plan

        if apply_ and accepted and planned.needed:  # the variant is in the file before its engines are made
            catalog_edit.apply_variant(catalog_file, name, table, digest)
            click.echo(f"added [variants.{name}] to {catalog_file}", err=True)
            apply_ = False
        # No layer needed excluding: the plan is the fully quantized variant, timed beside the unquantized.
        measured = measure_plan(state, ref, name if planned.needed else None, table, measure, planned.status)
    if fmt == "json":
        found = None if measured is None else measured.as_dict()
        _emit(_json(report.plan_document(planned, name, table, toml_text, command, found, built)), out)
    elif out is not None:
        _emit(toml_text, out)
    else:
        report.print_plan(planned, len(result.layers), toml_text, command, stdout_console(), in_catalog)
        if built is not None:
            stdout_console().print(built.said(floor), markup=False, highlight=False)
        if measured is not None:
            report.print_paid(measured, stdout_console())
    if built is not None and built.held is False and fmt != "table":
        reporter.warn(built.said(floor))
    _refuse_unless_shown(planned, ref, floor, apply_, apply_unresolved)
    if apply_ and planned.needed:
        catalog_edit.apply_variant(catalog_file, name, table, digest)
        click.echo(f"added [variants.{name}] to {catalog_file}", err=True)


def _planned(lab, sensitivity, floor, progress, measure: str | None):
    """The plan; where there is none (only the unquantized model meets the floor), the error says
    too that --measure timed nothing."""
    from pipeline.precision.plan import make_plan
    from pipeline.running.errors import PipelineError

    try:
        return make_plan(lab, sensitivity, floor, progress)
    except PipelineError as error:
        if not measure:
            raise
        said = f"{error.message.rstrip('.')}; --measure {measure} timed nothing: there is no planned variant to time."
        raise type(error)(said, error.hint) from error


def _refuse_unless_shown(planned, ref, floor, apply_: bool, apply_unresolved: bool) -> None:
    """A failed plan, or an unresolved one the user did not accept, is said as an error (exit 1)
    after the plan itself was written: nothing is applied."""
    from pipeline.precision.floor_bound import one_advice
    from pipeline.running.errors import PipelineError

    if not planned.held_on_search:
        # Every metric that fails is said, and where the samples cannot resolve one, how many would.
        failing = "; ".join(bound.said() for bound in planned.failing()) or planned.search.said()
        stop = next((step for step in planned.steps if step.action == "stop"), None)  # the pruning follows it
        stopped = stop.note + "; " if stop is not None else ""
        # Where the samples cannot resolve a limit, why; the TIP is the one advice every failing limit shares.
        why = "".join(f"; {bound.why_unresolvable()}" for bound in planned.unresolved() if bound.samples_needed)
        raise PipelineError(
            f"the plan for {ref.name} does not meet {floor} on the search batches: {stopped}failing {failing}{why}; "
            f"it was {'written, ' if planned.needed else ''}not applied.",
            hint=one_advice(planned.failing()) or "lower the floor, or evaluate on more samples (--samples)",
        )
    if planned.status == "unresolved":
        shown = [bound for bound in planned.bounds["confirm"] if bound.status == "unresolved"]
        if not (apply_ and apply_unresolved):
            raise PipelineError(
                f"the plan for {ref.name} is unresolved: {planned.confirm_samples} confirmation samples cannot show "
                + "; ".join(bound.said() for bound in shown)
                + f" against {floor}; it was {'not applied' if apply_ else 'written, not confirmed'}.",
                hint=(one_advice(shown) or "evaluate on more samples") + (", or --apply-unresolved to add it as it is" if apply_ else ""),
            )
    elif not planned.confirmed:
        failed = "; ".join(bound.said() for bound in planned.bounds["confirm"] if not bound.held) or planned.confirm.said()
        raise PipelineError(
            f"the plan for {ref.name} holds {floor} on the search batches but its bounds on the confirmation batches do not "
            f"({failed}); it was not applied.",
            hint="evaluate on more samples (--samples): the bounds narrow as the samples grow",
        )


def _embedded_toolchain(state: State) -> str:
    """Where the planned engine is built when --measure names no toolchain: the catalog's first
    toolchain that runs anywhere (a CPU runtime, needing no GPU: ONNX Runtime, the embedded
    default), else the catalog's default toolchain."""
    from pipeline.runtimes import runtime_class

    anywhere = (name for name, spec in state.catalog.toolchains.items() if runtime_class(spec.kind).placement == "anywhere")
    return next(anywhere, state.catalog.defaults.toolchain)


def _measure_command(state: State, ref, name: str) -> str:
    """`pipeline run` of the plan beside the fully quantized variant and the unquantized one (the
    variant of the plan's high precision), on the catalog's default toolchain: one shape point's
    engines are timed in paired rounds."""
    from pipeline.precision.measure import unquantized_variant

    plain, _ = unquantized_variant(state.catalog, state.catalog.variant(ref.variant))
    plain = plain if plain in state.catalog.variants else None
    variants = " ".join(f"--variant {v}" for v in (plain, ref.variant, name) if v)
    return f"pipeline run --model {ref.model} {variants} --toolchain {state.catalog.defaults.toolchain}"


def _json(document) -> str:
    import json

    return json.dumps(document, indent=2) + "\n"


def _emit(text: str, out: Path | None) -> None:
    if out is None:
        click.echo(text, nl=False)
        return
    from pipeline.running.files import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    click.echo(f"wrote {out}", err=True)

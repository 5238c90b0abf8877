"""The option groups commands share, defined once: which engines (selection), which toolchain,
--force/--wait, calibration and evaluation data, --repeat, --cluster/--gpu; and the typed groups
a stage command hands them on in (``stage_options``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click


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
    func = click.option(
        "--trt", "trts", multiple=True, metavar="VERSION", help="The toolchain providing this TensorRT version, e.g. 10.14 (repeatable)."
    )(func)
    func = click.option(
        "--toolchain",
        "toolchains",
        multiple=True,
        metavar="T",
        help="Toolchain by name (repeatable: a sweep runs each in turn; default: the catalog's, onnxruntime).",
    )(func)
    return func


def force_option(func):
    func = click.option(
        "--wait",
        is_flag=True,
        help="If another run holds this workspace, wait for it to finish instead of failing at once.",
    )(func)
    return click.option("--force", is_flag=True, help="Re-run stages even when nothing changed.")(func)


def _visible_gpus(ctx: click.Context, param, value: str | None) -> None:
    """--gpus 0,1: kept in the command's context for the launcher (pipeline/cli/main.py)."""
    if value is None:
        return
    ids = [part.strip() for part in value.split(",") if part.strip()]
    if not ids or not all(part.isdigit() or part.startswith("GPU-") for part in ids):
        raise click.BadParameter(f"{value!r}: give GPUs of this machine by index or UUID, as `nvidia-smi -L` lists them (e.g. 0,1)")
    ctx.meta["visible_gpus"] = ",".join(ids)


def cluster_options(func):
    func = click.option(
        "--gpus",
        metavar="IDS",
        expose_value=False,
        callback=_visible_gpus,
        help="Time on these GPUs of this machine at once, e.g. 0,1: a Ray instance here (the cluster "
        "extra), each GPU timing one shape point at a time with every engine of the point.",
    )(func)
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
        "--sanitize/--no-sanitize",
        default=None,
        help="Fold constants (shape computations, constant subgraphs) out of the ONNX before TensorRT reads it, with "
        "Polygraphy, where that is safe (graphs without quantization nodes, in one file); the parity check runs on "
        "the folded graph. --no-sanitize keeps the graph as exported. Default: the catalog's `sanitize` (on).",
    )(func)
    func = click.option(
        "--eval-dir",
        type=click.Path(path_type=Path),
        help="Check every engine's accuracy on images from this folder (ImageFolder layout; a batch's worth drawn "
        "across its classes, seeded; timm's preprocessing) instead of a seeded random batch; top-1 accuracy too where the folders are "
        "ImageNet classes of a checkpoint.",
    )(func)
    func = click.option("--calib-samples", type=click.IntRange(min=1), help="How many calibration inputs (default: the catalog's).")(func)
    func = click.option(
        "--calib-dir",
        type=click.Path(path_type=Path),
        help="Calibrate on images from this folder (--calib-samples of them drawn across its classes, seeded; "
        "timm's preprocessing) instead of synthetic inputs.",
    )(func)
    return func


def _stream_counts(ctx: click.Context, param, value: str | None) -> tuple[int, ...] | None:
    """--streams 1,2,4: the counts, checked as the catalog's [profile] streams is."""
    if value is None:
        return None
    from pydantic import ValidationError

    from pipeline.catalog import ProfileSettings

    parts = [part.strip() for part in value.split(",")]
    if not all(part.isdigit() for part in parts):  # an empty part too: "1,,2"
        raise click.BadParameter(f"{value!r}: give stream counts separated by commas, e.g. 1,2,4")
    try:
        return ProfileSettings(streams=tuple(int(part) for part in parts)).streams
    except ValidationError as exc:
        raise click.BadParameter(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None


def ranking_name(ctx: click.Context, param, value: str | None) -> str | None:
    """--by NAME: one of the catalog's rankings (RANKED_BY), read only when given, so that `--help`
    imports nothing heavy (the catalog's settings are pydantic models)."""
    if value is None:
        return None
    from pipeline.catalog.settings import RANKED_BY

    if value not in RANKED_BY:
        raise click.BadParameter(f"{value!r} is no ranking; use one of {', '.join(RANKED_BY)}")
    return value


def repeat_option(func):
    """How a profile measures: --repeat, --racing/--no-racing, --streams, --by and --energy."""
    func = click.option(
        "--energy/--no-energy",
        default=None,
        help="Read energy per inference around each take (NVML's GPU counter or the CPU's RAPL; docs/energy.md). "
        "On a GPU it lengthens takes until the counter resolves (up to 4 s) and polls the counter beside each take. "
        "--by energy reads it whatever this says. Default: the catalog's [profile] energy (off).",
    )(func)
    func = click.option(
        "--streams",
        metavar="N,N,…",
        callback=_stream_counts,
        help="After each shape point's rounds, serve each engine with these many concurrent streams (each its "
        "own inputs), [profile] serve_s seconds each, in [profile] serve_rounds takes interleaved with the point's other "
        "engines: inferences/s and each request's latency per count (docs/streams.md). "
        "Default: the catalog's [profile] streams ([1]: no serving).",
    )(func)
    func = click.option(
        "--by",
        metavar="NAME",
        callback=ranking_name,
        help="What the rounds stop on and the answer ranks by (median, p90, p99 or energy): the median, the p90 or p99 bounded by the takes, or "
        "energy per inference paired round by round (reads energy: docs/energy.md) "
        "(a p99 of two engines needs 437 takes: raise [profile] budget_s with it; docs/tails.md). "
        "Default: the catalog's [profile] by (median).",
    )(func)
    func = click.option(
        "--racing/--no-racing",
        default=None,
        help="Racing: an engine that the fastest one at its shape point beats beyond the tie band, with the rounds' "
        "confidence, leaves that point's rounds, which go on timing the others (the baseline toolchain's engines stay). "
        "--no-racing times every engine in every round. Default: the catalog's [profile] racing (on).",
    )(func)
    return click.option(
        "--repeat",
        type=click.IntRange(min=1, max=100),
        metavar="N",
        help="Measure each engine N times (each with its own warm-up). The row pools the runs of all N; every "
        "measurement's median and their spread are kept, and measurements that disagree beyond [profile] "
        "max_repeat_cv are taken again (up to [profile] retakes times) or the row is marked unstable. "
        "Default: the catalog's [profile] repeats.",
    )(func)


def dry_run_option(func):
    return click.option("--dry-run", is_flag=True, help="Print what would run (the exact command and container) and stop.")(func)


def engine_stage_options(func):
    """What build and profile take: the selection, the toolchain, --force, --dry-run, calibration, --cluster."""
    func = dry_run_option(func)
    for decorator in (cluster_options, calibration_options, force_option, toolchain_options, selection_options):
        func = decorator(func)
    return func


# --- what a stage command was given, grouped ------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which engines, for which toolchains: --engine/--model/--variant, --toolchain/--trt/--arch."""

    engines: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    toolchains: tuple[str, ...] = ()
    trts: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Overrides:
    """This run's settings in place of the catalog's (None keeps the catalog's): calibration and
    evaluation data, --sanitize, --repeat, --racing, --by and --energy."""

    calib_dir: Path | None = None
    calib_samples: int | None = None
    eval_dir: Path | None = None
    repeat: int | None = None
    racing: bool | None = None
    by: str | None = None
    sanitize: bool | None = None
    streams: tuple[int, ...] | None = None
    energy: bool | None = None


@dataclass(frozen=True)
class Launch:
    """How the work runs: --force, --wait, --dry-run, and where (--cluster, --gpu)."""

    force: bool = False
    wait: bool = False
    dry_run: bool = False
    cluster: str | None = None
    gpu_types: tuple[str, ...] = ()


def stage_options(options: dict[str, Any]) -> tuple[Selection, Overrides, Launch]:
    """A stage command's options, as click passes them, in their groups; an option no group has
    is a TypeError, as an unexpected argument to a function would be."""
    groups = (Selection, Overrides, Launch)
    unknown = set(options) - {field.name for group in groups for field in fields(group)}
    if unknown:
        raise TypeError(f"options no stage command takes: {', '.join(sorted(unknown))}")
    selection, overrides, launch = (group(**{f.name: options[f.name] for f in fields(group) if f.name in options}) for group in groups)
    return selection, overrides, launch

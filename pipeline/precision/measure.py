"""Does the plan still pay? (`pipeline plan --measure TOOLCHAIN`)

A plan buys accuracy with layers left in high precision; what it costs is speed, and only a
measurement on the toolchain that will run it says how much. The planned variant is exported,
built and timed beside the fully quantized variant and the unquantized one — every engine of a
shape point in one set of paired rounds, as any `pipeline run` times them — and each engine's
outputs are checked on the export's reference batch. The cost is the planned engine's time over
each of the others' (the paired ratio with its interval), beside the accuracy each keeps.

It is timed whatever the plan's status: a plan the samples could not resolve, or one that failed,
costs what it costs, and that figure says whether resolving it (more samples) is worth the work.
What was timed, and as what, is said beside the times (``Measured``); `--apply` still takes only a
confirmed plan (or an unresolved one the user accepts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.catalog import Catalog, EngineRef, VariantSpec
from pipeline.measuring.stats import RatioEstimate


def unquantized_variant(catalog: Catalog, base: VariantSpec) -> tuple[str, VariantSpec]:
    """The variant the plan's layers fall back to: the catalog's of that precision without
    sparsity or exclusions, else one of that name made for the measurement (fp16 under the block
    formats and FP8, whose excluded layers run in FP16; fp32 under INT8)."""
    high = "fp16" if base.precision in ("nvfp4", "mxfp8", "fp8") else "fp32"
    for name, spec in catalog.variants.items():
        if spec.precision == high and not spec.sparsity and not spec.exclude:
            return name, spec
    return high, VariantSpec(precision=high)


@dataclass
class Paid:
    """The three engines at one shape point on the toolchain: each one's row, and the planned
    engine's time over the others'."""

    shape: str | None
    rows: dict[str, Any]  # "planned", "full", "unquantized" → ComparisonRow (or None: not measured)
    vs_full: RatioEstimate | None
    vs_unquantized: RatioEstimate | None

    def as_dict(self) -> dict[str, Any]:
        def row(which: str) -> dict[str, Any] | None:
            found = self.rows.get(which)
            if found is None:
                return None
            return {
                "variant": found.variant,
                "median_ms": found.median_ms,
                "median_ci_ms": list(found.median_ci_ms) if found.median_ci_ms else None,
                "status": found.status,
                "reference_cosine": found.accuracy_cosine,
            }

        def ratio(estimate: RatioEstimate | None) -> dict[str, Any] | None:
            if estimate is None:
                return None
            return {
                "ratio": estimate.ratio,
                "low": estimate.low,
                "high": estimate.high,
                "rounds": estimate.rounds,
                "outcome": estimate.outcome,
            }

        return {
            "shape": self.shape,
            **{which: row(which) for which in ("planned", "full", "unquantized")},
            "planned_over_full": ratio(self.vs_full),
            "planned_over_unquantized": ratio(self.vs_unquantized),
        }

    def said(self) -> str:
        """ "at 1x224x224: planned 1.912 ms, 1.04× int8's time [1.01–1.07] and 0.61× fp32's [0.58–0.63];
        reference-batch cosine 0.9995 (int8 0.9890, fp32 1.0000)"."""
        planned = self.rows.get("planned")
        where = f"at {self.shape}" if self.shape else "the model"
        if planned is None or planned.median_ms is None:
            return f"{where}: the planned engine has no time ({planned.status if planned else 'not measured'})"
        parts = []
        for which, estimate in (("full", self.vs_full), ("unquantized", self.vs_unquantized)):
            other = self.rows.get(which)
            if other is None or other.median_ms is None or estimate is None:
                continue
            parts.append(f"{estimate.ratio:.2f}× {other.variant}'s time [{estimate.low:.2f}–{estimate.high:.2f}, {_how(estimate)}]")
        cosines = ", ".join(
            f"{row.variant} {row.accuracy_cosine:.4f}"
            for which in ("full", "unquantized")
            if (row := self.rows.get(which)) is not None and row.accuracy_cosine is not None
        )
        accuracy = f"; reference-batch cosine {planned.accuracy_cosine:.4f} ({cosines})" if planned.accuracy_cosine is not None else ""
        return f"{where}: planned {planned.median_ms:.3f} ms, " + " and ".join(parts) + accuracy


# What each engine timed is, in words, by its role.
ROLES = {"planned": "the plan", "full": "fully quantized", "unquantized": "unquantized"}


@dataclass
class Measured:
    """What `--measure` timed: the variant of each role (``planned`` the same as ``full`` where no
    layer needed excluding), the plan's status when it was timed, and each shape point's times."""

    toolchain: str
    plan_status: str  # "confirmed", "unresolved", "failed"
    variants: dict[str, str]  # "planned", "full", "unquantized" → variant name
    points: list[Paid]

    def as_dict(self) -> dict[str, Any]:
        return {
            "toolchain": self.toolchain,
            "plan_status": self.plan_status,
            "variants": self.variants,
            "points": [point.as_dict() for point in self.points],
        }

    def said(self) -> str:
        """ "timed int8_plan (the plan, unresolved: timed as it is), int8 (fully quantized) and
        fp32 (unquantized)"."""
        status = "confirmed" if self.plan_status == "confirmed" else f"{self.plan_status}: timed as it is"
        if self.variants["planned"] == self.variants["full"]:
            planned = f"{self.variants['planned']} (the plan, fully quantized, no layer excluded; {status})"
            return f"timed {planned} and {self.variants['unquantized']} ({ROLES['unquantized']})"
        return (
            f"timed {self.variants['planned']} (the plan, {status}), {self.variants['full']} ({ROLES['full']}) "
            f"and {self.variants['unquantized']} ({ROLES['unquantized']})"
        )


def _how(estimate: RatioEstimate) -> str:
    return {"faster": "faster", "slower": "slower", "same": "the same within the tie width"}.get(estimate.outcome, "undecided")


def measure_plan(state, ref: EngineRef, planned: str | None, table: dict[str, Any], toolchain: str, plan_status: str) -> Measured:
    """Export, build and time the planned variant beside the full and the unquantized one on
    ``toolchain``; what it costs at each shape point. The planned variant is added to this run's
    catalog where it is not in the file (without --apply). ``planned`` None: no layer needed
    excluding, the plan is the fully quantized variant, timed beside the unquantized one."""
    from pipeline.report.compare import compare
    from pipeline.stages.base import RunRequest
    from pipeline.stages.runner import LocalLauncher
    from pipeline.workspace import Workspace

    catalog = state.catalog
    plain, plain_spec = unquantized_variant(catalog, catalog.variant(ref.variant))
    variants = {**catalog.variants, plain: plain_spec}
    if planned is not None:
        wanted = VariantSpec.model_validate(table)
        refuse_another_plan(planned, catalog.variants.get(planned), wanted)
        variants.setdefault(planned, wanted)
    catalog = catalog.model_copy(update={"variants": variants})
    state.use_catalog(catalog)
    names = {"unquantized": plain, "full": ref.variant, "planned": planned or ref.variant}
    engines = [catalog.engine(f"{ref.model}_{variant}") for variant in dict.fromkeys(names.values())]
    with state.holding_workspace(False):
        LocalLauncher().run(state.context(False), RunRequest(engines, [toolchain], "profile"))
    rows, _ = compare(catalog, Workspace(catalog.root), [toolchain], "json", [ref.model])
    by_point: dict[str | None, dict[str, Any]] = {}
    for row in rows:
        for which, variant in names.items():
            if row.variant == variant and row.toolchain == toolchain:
                by_point.setdefault(row.shape, {})[which] = row
    tie = catalog.profile.tie
    points = [
        Paid(shape, found, _over(found, "full", tie) if planned else None, _over(found, "unquantized", tie))
        for shape, found in by_point.items()
    ]
    return Measured(toolchain, plan_status, names, points)


def refuse_another_plan(name: str, existing: VariantSpec | None, wanted: VariantSpec) -> None:
    """A user error when the catalog already has a variant of the planned name that is not this
    plan (another exclude list, say, from an earlier `--apply`): timing it would report another
    variant's cost as this plan's. The same variant (its description aside) is timed as it is."""
    from pipeline.running.errors import UsageError

    if existing is None:
        return

    def essence(spec: VariantSpec) -> dict[str, Any]:
        return {**spec.model_dump(exclude={"description", "exclude"}), "exclude": sorted(spec.exclude)}

    if essence(existing) == essence(wanted):
        return
    differ = [key for key, value in essence(wanted).items() if essence(existing)[key] != value]
    said = "; ".join(
        f"{key} {essence(existing)[key]!r} there, {value!r} in this plan" for key, value in essence(wanted).items() if key in differ
    )
    raise UsageError(
        f"the catalog already has a variant named {name!r} that is not this plan ({said}): measuring it would time that "
        "variant as this plan's cost; nothing was measured.",
        hint=f"name the planned variant otherwise (--name {name}_2), or remove [variants.{name}] first",
    )


def _over(found: dict[str, Any], which: str, tie: float) -> RatioEstimate | None:
    """The planned engine's time over ``which``'s at one point (paired where timed together)."""
    from pipeline.report.confidence import time_ratio

    mine, other = found.get("planned"), found.get(which)
    if mine is None or other is None or mine.median_ms is None or other.median_ms is None:
        return None
    return time_ratio(mine, other, tie)

"""The catalog: every model, variant and toolchain the pipeline knows, by name.

It is read from ``pipeline.toml`` at the root of the workspace. TOML rather than YAML on purpose:
YAML reads ``trt: 10.10`` as the float 10.1, and TensorRT versions are exactly that shape.
Everything is validated on load; errors name the field, the bad value and what is allowed.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from pipeline.catalog.errors import validate_by_settings
from pipeline.catalog.floor import AccuracyFloor, parse_accuracy_threshold
from pipeline.catalog.settings import (  # noqa: F401 (the settings tables are the catalog's, imported from here too)
    CalibrationSettings,
    ClusterSettings,
    Defaults,
    EvaluationSettings,
    ProfileSettings,
    _Strict,
)
from pipeline.catalog.shape import ShapeSizes
from pipeline.running.errors import UsageError

CATALOG_FILENAME = "pipeline.toml"
# The validation context key of the toolchain kinds' settings lookup (see read_catalog).
TOOLCHAIN_SETTINGS = "toolchain_settings"
# … and of the model families' settings (see read_catalog).
MODEL_SETTINGS = "model_settings"

# Names become file and directory names: no separators, no leading dot, nothing to escape.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]{0,63}$")

Precision = Literal["fp32", "fp16", "bf16", "int8", "fp8", "mxfp8", "nvfp4"]
# The precisions ModelOpt quantizes to (pipeline/stages/quantize.py PRESETS).
QUANTIZED_PRECISIONS = ("int8", "fp8", "mxfp8", "nvfp4")

# Directory names under manifests/ that are not toolchains.
RESERVED_NAMES = {"export"}


def check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name) or name in RESERVED_NAMES:
        raise UsageError(
            f"{kind} name {name!r} is not allowed.",
            hint="names use lowercase letters, digits, '_', '.' and '-', start with a letter or digit, "
            f"and are not one of {sorted(RESERVED_NAMES)}",
        )
    return name


def check_shape(text: str) -> str:
    """A shape point as the catalog writes it: sizes of the model's dynamic axes joined by 'x' ("2x512");
    never "static", which only a manifest holds."""
    ShapeSizes.parse(text, static=False)
    return text


def check_accuracy_floor(value: Any) -> tuple[str, ...]:
    """An accuracy floor as the catalog writes it: one threshold ("cos=0.99", 0.99, "top1=0.95") or a list."""
    texts = (value,) if isinstance(value, (str, int, float)) else tuple(value)
    for text in texts:
        parse_accuracy_threshold(str(text))
    return tuple(str(text) for text in texts)


AccuracyFloorTexts = Annotated[tuple[str, ...], BeforeValidator(check_accuracy_floor)]


class ShapeRange(_Strict):
    """The range of shapes an engine is built for (TensorRT's optimization profile)."""

    min: str
    opt: str
    max: str

    @field_validator("min", "opt", "max")
    @classmethod
    def _shape(cls, value: str) -> str:
        return check_shape(value)


class ModelSpec(_Strict):
    """What every model family shares. Each family (pipeline/models/) adds its own fields in a
    subclass; the catalog validates a ``[models.NAME]`` table with the class of the family whose
    key it has (``timm = "…"``, ``transformers = "…"``)."""

    # Weights are never downloaded (offline machines): random init unless a local file is named.
    checkpoint: Path | None = None
    seed: int = 0
    # The shape points to measure, as sizes of the family's dynamic axes ("2x512": batch 2,
    # sequence 512). Empty: the model's one fixed shape (timm: batch_size and image size).
    shapes: tuple[str, ...] = ()
    # What engines are built for: min/opt/max of every dynamic axis; None: from the points.
    shape_range: ShapeRange | None = None
    # An engine per shape point, built for exactly that shape, instead of one for the range
    # (static engines are often faster; compare a static model with a dynamic one to see by how much).
    static: bool = False
    # The accuracy an engine of this model must keep to be `pipeline compare`'s answer (replaces the
    # catalog-wide `accuracy_floor`; [] = each precision's own check). None: the catalog's.
    accuracy_floor: AccuracyFloorTexts | None = None
    # Where the export checks its ONNX against PyTorch in ONNX Runtime: at the smallest and the
    # largest shape point ("ends"), or at every point ("all"). Every point keeps its FP32 PyTorch
    # reference either way, on which each engine's own accuracy is checked.
    parity_points: Literal["ends", "all"] = "ends"

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, shapes: tuple[str, ...]) -> tuple[str, ...]:
        for shape in shapes:
            check_shape(shape)
        if len(set(shapes)) != len(shapes):
            raise ValueError(f"shape points are listed twice: {sorted(s for s in set(shapes) if shapes.count(s) > 1)}")
        return shapes

    def family(self) -> str:
        """The family this model belongs to (the key its table names its model with)."""
        raise NotImplementedError


class VariantSpec(_Strict):
    """How an engine differs from the plain FP32 export: precision and sparsity."""

    precision: Precision
    sparsity: Literal["2:4"] | None = None
    # How weights are pruned to 2:4 (sparsegpt also updates the kept weights from calibration data).
    sparsity_method: Literal["sparse_magnitude", "sparsegpt"] = "sparse_magnitude"
    # Convolutions in block formats (mxfp8/nvfp4): left unquantized, or quantized as FP8.
    conv_policy: Literal["exclude", "fp8"] = "exclude"
    # Weight dtype of quantized ONNX; default per precision (see pipeline/stages/quantize.py).
    weights_dtype: Literal["fp32", "fp16"] | None = None
    # Layers kept unquantized: module names as the model names them, or wildcards ("blocks.*.mlp.fc2"),
    # as `pipeline plan` writes them (pipeline/stages/quantized_layers.py).
    exclude: tuple[str, ...] = ()
    # The models this variant is for, where its exclude names one model's layers (a plan's variant);
    # empty: every model. `--model M` alone then selects only the variants for M.
    models: tuple[str, ...] = ()
    description: str = ""

    def applies_to(self, model: str) -> bool:
        return not self.models or model in self.models

    @property
    def quantized(self) -> bool:
        return self.precision in QUANTIZED_PRECISIONS

    @model_validator(mode="after")
    def _exclude_needs_quantization(self):
        if self.exclude and not self.quantized:
            raise ValueError(f"exclude keeps layers out of quantization, and precision {self.precision!r} quantizes none")
        if any(not name.strip() for name in self.exclude):
            raise ValueError("exclude holds an empty name")
        return self


class ToolchainSpec(_Strict):
    """A way to turn ONNX into an engine and time it: the fields every kind shares.

    Each kind adds its own fields in a subclass beside its runtime (``pipeline/runtimes/``); the
    catalog validates a ``[toolchains.NAME]`` table with the class its ``kind`` names.
    """

    kind: str
    # Variant that speedups are measured against within this toolchain (first one present wins).
    baselines: tuple[str, ...] = ("fp16", "fp32")
    # Where the facts behind this toolchain come from (release notes, package index page).
    source: str | None = None

    def tensorrt_release(self) -> str | None:
        """The TensorRT release this toolchain provides, for `--trt VERSION`; None when it is not one."""
        return None

    def with_targets(self, targets: tuple[str, ...]) -> ToolchainSpec:
        """This toolchain building for other GPU architectures (`--arch`)."""
        raise UsageError(
            f"--arch does not apply to {self.kind} toolchains: they build for the GPU they run on.",
            hint="--arch is for toolchains that compile ahead of time for a chosen GPU; `pipeline models` says what each builds for",
        )

    def for_gpus(self, capabilities: tuple[str | None, ...]) -> ToolchainSpec:
        """Itself as built on any node of a cluster whose GPUs have these compute capabilities, alike on each."""
        return self


class Catalog(_Strict):
    models: dict[str, ModelSpec]
    variants: dict[str, VariantSpec]
    toolchains: dict[str, ToolchainSpec]
    profile: ProfileSettings = ProfileSettings()
    calibration: CalibrationSettings = CalibrationSettings()
    evaluation: EvaluationSettings = EvaluationSettings()
    defaults: Defaults = Defaults()
    cluster: ClusterSettings = ClusterSettings()
    opset: int = Field(default=17, ge=13)
    # Constant folding before TensorRT reads a graph (pipeline/graph/sanitize.py): the exported or
    # user's ONNX with what folds computed once, where that is safe; false keeps it as written.
    sanitize: bool = True
    # The toolchain every engine is measured against in `pipeline compare` (PyTorch eager): each
    # row's speedup over the same model and variant there. None: no such column.
    baseline_toolchain: str | None = None
    # The accuracy an engine must keep to be `pipeline compare`'s answer, the verdict per model and
    # point: cosine similarity to the FP32 model's outputs ("cos=0.99", or 0.99) and/or top-1
    # agreement ("top1=0.95"). A model's own `accuracy_floor` replaces it, and
    # `compare --fail-accuracy-below` replaces both. Empty: each precision's own check.
    accuracy_floor: AccuracyFloorTexts = ()
    # Directory the outputs (models/, engines/, manifests/) live under; set by read_catalog.
    root: Path = Field(default=Path("."), exclude=True)
    # The file's name, as the answer and hints name it (`--catalog` may read another than
    # pipeline.toml); set by read_catalog.
    file_name: str = Field(default=CATALOG_FILENAME, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _defaults_it_can_run(cls, data: Any) -> Any:
        return Defaults.filled_in(data)

    @field_validator("toolchains", mode="before")
    @classmethod
    def _validate_toolchains_by_kind(cls, table: Any, info: ValidationInfo) -> Any:
        """Each toolchain table against the settings of its kind. The kinds are registered above this
        module (pipeline/runtimes), which hands their lookup in as the validation context."""
        if not isinstance(table, dict):
            return table
        spec_class = (info.context or {}).get(TOOLCHAIN_SETTINGS)
        if spec_class is None:
            raise ValueError("toolchain tables need their kinds' settings: load the catalog with pipeline.runtimes.load_catalog")
        return validate_by_settings(
            "toolchains", table, ToolchainSpec, lambda raw: spec_class(raw.get("kind") if isinstance(raw, dict) else None), ".kind"
        )

    @field_validator("models", mode="before")
    @classmethod
    def _validate_models_by_family(cls, table: Any, info: ValidationInfo) -> Any:
        """Each model table against the settings of its family, found by the family's key
        (pipeline/models registers the families and hands their lookup in as the context)."""
        if not isinstance(table, dict):
            return table
        spec_class = (info.context or {}).get(MODEL_SETTINGS)
        if spec_class is None:
            raise ValueError("model tables need their families' settings: load the catalog with pipeline.runtimes.load_catalog")
        return validate_by_settings("models", table, ModelSpec, spec_class, "")

    @field_validator("models", "variants", "toolchains")
    @classmethod
    def _check_names(cls, table: dict) -> dict:
        for name in table:
            if not NAME_RE.match(name) or name in RESERVED_NAMES:
                raise ValueError(
                    f"name {name!r} is not allowed: use lowercase letters, digits, '_', '.', '-' (and not {sorted(RESERVED_NAMES)})"
                )
        return table

    @model_validator(mode="after")
    def _check_references(self):
        engine_names: dict[str, tuple[str, str]] = {}
        for model in self.models:
            for variant in self.variants:
                name = f"{model}_{variant}"
                if name in engine_names:
                    other = engine_names[name]
                    raise ValueError(
                        f"engine name {name!r} is ambiguous: model {model!r} + variant {variant!r} "
                        f"and model {other[0]!r} + variant {other[1]!r}"
                    )
                engine_names[name] = (model, variant)
        for field, names, table in (
            ("defaults.models", self.defaults.models, self.models),
            ("defaults.variants", self.defaults.variants, self.variants),
            ("defaults.toolchain", (self.defaults.toolchain,), self.toolchains),
            ("baseline_toolchain", (self.baseline_toolchain,) if self.baseline_toolchain else (), self.toolchains),
        ):
            for name in names:
                if name not in table:
                    raise ValueError(f"{field}: {name!r} is not defined (known: {', '.join(table)})")
        for variant_name, variant in self.variants.items():
            for name in variant.models:
                if name not in self.models:
                    raise ValueError(f"variants.{variant_name}.models: {name!r} is not defined (known: {', '.join(self.models)})")
        return self

    # --- lookups with "did you mean" -------------------------------------------------------

    def model(self, name: str) -> ModelSpec:
        return self.models[_lookup("model", name, self.models)]

    def variant(self, name: str) -> VariantSpec:
        return self.variants[_lookup("variant", name, self.variants)]

    def toolchain(self, name: str) -> ToolchainSpec:
        return self.toolchains[_lookup("toolchain", name, self.toolchains)]

    def accuracy_floor_for(self, model: str) -> AccuracyFloor:
        """The floor the verdict holds ``model``'s engines to: the model's own, else the catalog's."""
        spec = self.models.get(model)
        if spec is not None and spec.accuracy_floor is not None:
            texts, source = spec.accuracy_floor, f"models.{model} in {self.file_name}"
        else:
            texts, source = self.accuracy_floor, self.file_name
        return AccuracyFloor(tuple(parse_accuracy_threshold(text) for text in texts), source)

    def with_targets(self, toolchain: str, targets: tuple[str, ...]) -> Catalog:
        """This catalog with ``toolchain`` compiling for other GPU architectures (`--arch`)."""
        spec = self.toolchain(toolchain).with_targets(targets)
        return self.model_copy(update={"toolchains": {**self.toolchains, toolchain: spec}})

    def toolchain_for_trt(self, version: str) -> str:
        """The toolchain providing TensorRT ``version`` ("10.14" matches trt = "10.14" or "10.14.1")."""
        releases = {name: spec.tensorrt_release() for name, spec in self.toolchains.items()}
        matches = [name for name, release in releases.items() if release and (release == version or release.startswith(version + "."))]
        if len(matches) == 1:
            return matches[0]
        known = sorted({release for release in releases.values() if release})
        if not matches:
            raise UsageError(
                f"no toolchain provides TensorRT {version}.",
                hint=f"known TensorRT versions: {', '.join(known) or 'none'}; add one under [toolchains] in {self.file_name}",
            )
        raise UsageError(
            f"TensorRT {version} is provided by several toolchains: {', '.join(matches)}.",
            hint="name one with --toolchain",
        )

    def engine(self, name: str) -> EngineRef:
        """Split an engine name such as ``vit_tiny_fp16_sparse`` into model and variant."""
        check_name("engine", name)
        for model in sorted(self.models, key=len, reverse=True):
            prefix = model + "_"
            if name.startswith(prefix) and name[len(prefix) :] in self.variants:
                return EngineRef(model, name[len(prefix) :])
        _lookup("engine", name, self.engine_names())
        raise AssertionError("unreachable: _lookup raises for unknown names")

    def engine_names(self) -> list[str]:
        return [f"{m}_{v}" for m in self.models for v, spec in self.variants.items() if spec.applies_to(m)]

    # --- what a command selects and overrides (the one place options are combined and checked) ---

    def select(self, engines: tuple[str, ...] = (), models: tuple[str, ...] = (), variants: tuple[str, ...] = ()) -> list[EngineRef]:
        """The engines named by --engine, or by --model/--variant (a model alone: all its variants;
        nothing: the catalog's defaults), each once, in order."""
        if engines and (models or variants):
            raise UsageError("--engine cannot be combined with --model/--variant.", hint="name engines one way or the other")
        if engines:
            refs = [self.engine(name) for name in engines]
        else:
            chosen_models = models or self.defaults.models
            if variants:
                chosen_variants = variants
            elif models:
                chosen_variants = tuple(self.variants)
            else:
                chosen_variants = self.defaults.variants
            for name in chosen_models:
                self.model(name)
            for name in chosen_variants:
                self.variant(name)
            refs = [EngineRef(m, v) for m in chosen_models for v in chosen_variants if variants or self.variants[v].applies_to(m)]
            if not refs:
                empty = "[defaults] models" if not chosen_models else ("[defaults] variants" if not models else "[variants]")
                raise UsageError(
                    f"nothing is selected: the catalog's {empty} is empty.",
                    hint="name what to run with --model M / --variant V (or --engine), or list them in the catalog "
                    f"(known models: {', '.join(self.models) or 'none'}; variants: {', '.join(self.variants) or 'none'})",
                )
        for ref in refs:
            variant = self.variants[ref.variant]
            if not variant.applies_to(ref.model):
                raise UsageError(
                    f"variant {ref.variant} is for {', '.join(variant.models)} only (its exclude names their layers), not {ref.model}.",
                    hint=f"plan a variant for {ref.model}: pipeline plan --engine {ref.model}_{variant.precision}",
                )
        return list(dict.fromkeys(refs))

    def toolchains_named(self, toolchains: tuple[str, ...] = (), trts: tuple[str, ...] = ()) -> list[str]:
        """The toolchains named by --toolchain and --trt (each once, in the order given), else the catalog's default."""
        names = [*toolchains, *(self.toolchain_for_trt(version) for version in trts)] or [self.defaults.toolchain]
        for name in names:
            self.toolchain(name)
        return list(dict.fromkeys(names))

    def with_overrides(
        self,
        calib_dir: Path | None = None,
        calib_samples: int | None = None,
        eval_dir: Path | None = None,
        repeats: int | None = None,
        racing: bool | None = None,
        sanitize: bool | None = None,
        streams: tuple[int, ...] | None = None,
        by: str | None = None,
        energy: bool | None = None,
    ) -> Catalog:
        """This catalog with a run's command-line settings in place of its own (None keeps the catalog's)."""
        catalog = self if sanitize is None else self.model_copy(update={"sanitize": sanitize})
        if eval_dir is not None:
            catalog = catalog.model_copy(
                update={"evaluation": catalog.evaluation.model_copy(update={"directory": Path(eval_dir).resolve()})}
            )
        calibration: dict[str, Any] = {}
        if calib_dir is not None:
            calibration["directory"] = Path(calib_dir).resolve()
        if calib_samples is not None:
            calibration["samples"] = calib_samples
        if calibration:
            catalog = catalog.model_copy(update={"calibration": catalog.calibration.model_copy(update=calibration)})
        profile = {
            key: value
            for key, value in (("repeats", repeats), ("racing", racing), ("streams", streams), ("by", by), ("energy", energy))
            if value is not None
        }
        if profile:
            catalog = catalog.model_copy(update={"profile": catalog.profile.model_copy(update=profile)})
        return catalog


@dataclass(frozen=True, order=True)
class EngineRef:
    """One model in one variant; the unit every stage works on."""

    model: str
    variant: str

    @property
    def name(self) -> str:
        return f"{self.model}_{self.variant}"

    def __str__(self) -> str:
        return self.name


def _lookup(kind: str, name: str, known) -> str:
    if name in known:
        return name
    check_name(kind, name)
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else None
    listing = ", ".join(sorted(known))
    if len(listing) > 300:
        listing = listing[:300] + ", …"
    raise UsageError(
        f"unknown {kind} {name!r}.",
        hint=hint or f"known {kind}s: {listing} (`pipeline models` lists them)",
    )

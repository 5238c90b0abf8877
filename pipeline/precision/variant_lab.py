"""A quantized variant's PyTorch model, calibrated once, whose layers are quantized or not at will.

The model is created, calibrated and cast exactly as the export stage does it (ModelOpt's preset
for the precision, the variant's rule and catalog exclusions, FP16 tracing for NVFP4), so a set
of layers left unquantized here is the variant with ``exclude`` naming them. ModelOpt's quantizers
are turned off and on again without recalibrating (``LayerSwitches``). That is the export with
those exclusions, not an approximation of it: ModelOpt calibrates with every quantizer collecting
ranges and none quantizing (``enable_stats_collection`` disables quantization while it runs), so
each layer's ranges come from FP32 activations whichever layers are excluded. Every quantizer the
variant carries belongs to one of its layers (a pooling's input quantizer to the pooling:
pipeline/stages/quantized_layers.py), so with every layer excluded its outputs are FP32's, bit for bit.

Accuracy is measured against the FP32 model's outputs (and, with a metric hook of the user's,
by that metric beside the FP32 model's, pipeline/precision/hooks.py) on *evaluation batches kept
apart from calibration*, a search's and, drawn apart, a confirmation's: seeded inputs, or the
user's images, token ids or data hook (pipeline/precision/samples.py). Each variant's figures are
also kept sample by sample, for the bounds the plan is judged by (pipeline/precision/bounds.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pipeline.catalog import Catalog, EngineRef
from pipeline.machine.environment import package_version
from pipeline.measuring.out_of_memory import out_of_memory_as_error
from pipeline.models import model_source
from pipeline.precision.bounds import Bound, SampleStats, bounds, sample_stats
from pipeline.precision.figures import Figures, cosine_of, figures, relative_error_of
from pipeline.precision.hooks import load_hook, metric_of, weighted_mean
from pipeline.precision.samples import draw
from pipeline.running.errors import UsageError
from pipeline.stages.quantize import (
    DEFAULT_WEIGHTS_DTYPE,
    TRACED_HIGH_PRECISION,
    as_inputs,
    load_modelopt,
    quantize_model,
    require_cuda_for,
)
from pipeline.stages.quantized_layers import (
    LayerSwitches,
    layers_to_rewrite,
    prefix_of,
    quantizable_layers,
    resolve_exclude,
    weighted_layers,
)

DEFAULT_SAMPLES = 32


def refuse_unless_analysable(catalog: Catalog, ref: EngineRef) -> None:
    """A user error unless the engine is a quantized variant of a model with PyTorch layers."""
    variant = catalog.variant(ref.variant)
    if not variant.quantized:
        what = "2:4 sparsity alone" if variant.sparsity else f"precision {variant.precision}"
        raise UsageError(
            f"{ref.name} is not quantized: variant {ref.variant} has {what}, so no layer has a quantization to analyse.",
            hint=f"name an engine of a quantized variant (int8, fp8, mxfp8, nvfp4), e.g. {ref.model}_int8",
        )
    if variant.sparsity:
        raise UsageError(
            f"{ref.name} is 2:4-sparse as well as {variant.precision}: the analysis separates quantization's error by layer, "
            "and sparsity's would be mixed into every figure.",
            hint=f"analyse the variant without sparsity (precision {variant.precision}), then add sparsity to the planned one",
        )
    source = model_source(ref.model, catalog.model(ref.model), catalog.root)
    if not source.has_pytorch_model:
        raise UsageError(
            f"{ref.name}: model {ref.model} is an ONNX file ({source.describe()}), which has no PyTorch layers to quantize one by one.",
            hint="analyse the PyTorch model the ONNX came from (docs/models.md: a transformers model or your own module)",
        )


class VariantLab:
    """The calibrated variant of one engine; ``evaluate(excluded)`` measures it with those layers unquantized."""

    def __init__(self, catalog: Catalog, ref: EngineRef, samples: int = DEFAULT_SAMPLES, progress=None):
        refuse_unless_analysable(catalog, ref)
        self.catalog, self.ref = catalog, ref
        self.variant = catalog.variant(ref.variant)
        self.spec = catalog.model(ref.model)
        self.source = model_source(ref.model, self.spec, catalog.root)
        self.samples = samples
        self._progress = progress or (lambda text: None)
        self._cache: dict[tuple[frozenset, str], Figures] = {}
        self._stats: dict[tuple[frozenset, str], SampleStats] = {}  # the same, sample by sample
        self._bounds: dict[tuple, list[Bound]] = {}
        self.timings: dict[str, float] = {}
        started = time.perf_counter()
        require_cuda_for(self.variant.precision)
        load_modelopt(purpose=f"Analysing {ref.name}")
        points = self.source.check_points()
        self.point = self.source.trace_point(points)
        # Out of memory names the shape the samples are evaluated at (the batch is the samples).
        self.evaluated = self.source.at_batch(self.point, samples).label if self.point else None
        with out_of_memory_as_error(getattr(self.spec, "batch_size", None), f"analysing {ref.name}", self.evaluated):
            self._prepare()
        self.timings["prepare_s"] = round(time.perf_counter() - started, 2)

    # --- set-up ------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        import torch

        source, variant = self.source, self.variant
        self._progress("creating the model")
        model = source.create()
        linear_only = source.quantize_linear_only
        if not layers_to_rewrite(model, linear_only):
            raise UsageError(
                f"{self.ref.name}: {source.describe()} has no Linear{'' if linear_only else ' or convolution'} layers to quantize.",
                hint=f"measure {self.ref.model} at fp32, fp16 or bf16",
            )
        catalog_excluded = resolve_exclude(model, variant.exclude, linear_only, self.ref.variant, source.describe())
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        model = model.to(self.device)
        runnable = source.runnable(model)
        prefix = prefix_of(runnable, model)
        self.quantizable = quantizable_layers(model, linear_only)
        self.depth_units = depth_units(model, self.quantizable)

        self._progress("drawing calibration and evaluation batches")
        settings = self.catalog.calibration
        calibration_dir = self.source.in_workspace(settings.directory) if settings.directory else None
        calibration = source.calibration_batches(model, calibration_dir, settings.samples, settings.batch_size)
        self.calibration = {
            k: v for k, v in source.describe_calibration(calibration_dir, settings.samples, settings.batch_size).items() if k != "files"
        }
        evaluation = self.catalog.evaluation
        self.drawn = draw(self, model)
        # Each set's batches, labels (in its batches' order) and each batch as a metric hook sees it.
        self.batches, self.labels, self.given = self.drawn.batches, self.drawn.labels, self.drawn.given

        self._progress("running the FP32 model")
        self.flops, self._reference_depth = {}, {}
        self.references = {}
        for which, batches in self.batches.items():
            self.references[which] = [
                self._fp32(runnable, batch, first=(which, i) == ("search", 0), model=model) for i, batch in enumerate(batches)
            ]
        self.metric = load_hook(evaluation.metric, "--metric", self.catalog.root) if evaluation.metric else None
        # The FP32 model's metric, batch by batch (the bootstrap resamples batches) and over all.
        self.fp32_by_batch = {which: self._by_batch(which, outputs) for which, outputs in self.references.items()}

        self.dtype = torch.float32
        weights_dtype = variant.weights_dtype or DEFAULT_WEIGHTS_DTYPE[variant.precision]
        if variant.precision in TRACED_HIGH_PRECISION and weights_dtype == "fp16":
            self.dtype = torch.float16  # as the export calibrates and traces it (quantize.py)
            runnable = source.cast(runnable, torch.float16)
        started = time.perf_counter()
        runnable, info = quantize_model(
            runnable, variant.precision, calibration, variant.conv_policy, self._progress, linear_only, catalog_excluded, prefix
        )
        self.timings["calibrate_s"] = round(time.perf_counter() - started, 2)
        self.kept_unquantized: dict[str, str] = info["excluded_layers"]
        self.model, self.runnable, self.prefix = model, runnable, prefix
        self.switches = LayerSwitches(runnable, prefix)
        self.layers = [name for name in self.quantizable if name in set(self.switches.layers)]
        if stray := sorted(set(self.switches.layers) - set(self.layers)):
            # A quantizer no exclusion reaches would keep "every layer excluded" from being FP32.
            raise RuntimeError(f"quantizers outside the layers a plan can exclude: {', '.join(stray)}")
        # A plan may not exclude all of these: the variant would quantize no weight (resolve_exclude).
        self.weighted = weighted_layers(model, self.layers)

    def _by_batch(self, which: str, outputs: list) -> list[float] | None:
        """The metric hook on each batch's outputs (None without one)."""
        if self.metric is None:
            return None
        spec = self.catalog.evaluation.metric
        return [metric_of(self.metric, spec, [output], [given]) for output, given in zip(outputs, self.given[which])]

    def _fp32(self, runnable, batch, first: bool, model):
        """The FP32 output of one batch; for the first search batch, also each layer's FLOPs and
        each depth unit's output (forward hooks)."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        hooks = []
        if first:
            modules = dict(model.named_modules())
            hooks = [modules[name].register_forward_hook(self._count_flops(name)) for name in self.quantizable]
            hooks += [modules[name].register_forward_hook(self._keep_output(self._reference_depth, name)) for name in self.depth_units]
        try:
            with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
                return runnable(*as_inputs(batch, self.device, torch.float32)).float().cpu()
        finally:
            for hook in hooks:
                hook.remove()

    def _count_flops(self, name: str):
        def hook(module, inputs, output):
            if hasattr(module, "in_features"):  # Linear: 2 · rows · in · out
                self.flops[name] = 2.0 * inputs[0].numel() * module.out_features
            elif not hasattr(module, "in_channels"):  # pooling, a norm: about one operation a value read
                self.flops[name] = float(inputs[0].numel())
            else:  # convolution: 2 · output values · (in / groups) · kernel
                kernel = 1
                for size in module.kernel_size:
                    kernel *= size
                self.flops[name] = 2.0 * output.numel() * module.in_channels // module.groups * kernel

        return hook

    @staticmethod
    def _keep_output(store: dict, name: str):
        def hook(module, inputs, output):
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            store[name] = tensor.detach().float().cpu()

        return hook

    # --- measuring -----------------------------------------------------------------------------------

    def evaluate(self, excluded: Iterable[str] = (), which: str = "search") -> Figures:
        """The variant with ``excluded`` layers unquantized, on the search or the confirmation batches."""
        key = (frozenset(excluded), which)
        if key not in self._cache:
            self.switches.quantize_all_but(key[0])
            self._cache[key], self._stats[key] = self.measured(which, [self._run(batch) for batch in self.batches[which]])
        return self._cache[key]

    def measured(self, which: str, outputs: list) -> tuple[Figures, SampleStats]:
        """Outputs on the search (or the confirmation) batches, one tensor a batch, against the FP32
        model's: the figures and, sample by sample, what the bounds read — the variant's here, or
        a built engine's (pipeline/precision/built.py)."""
        labels = self.labels[which] if self.labels else None
        measured = figures(self.references[which], outputs, labels)
        stats = sample_stats(self.references[which], outputs, labels)
        if self.metric is not None:
            import numpy as np

            sizes = np.asarray([output.shape[0] for output in outputs], dtype=float)
            mine, fp32 = np.asarray(self._by_batch(which, outputs), dtype=float), np.asarray(self.fp32_by_batch[which], dtype=float)
            measured = replace(measured, metric=float(weighted_mean(mine, sizes)), fp32_metric=float(weighted_mean(fp32, sizes)))
            stats = replace(stats, metric=mine, fp32_metric=fp32, batch_sizes=sizes)
        return measured, stats

    def bounds(self, excluded: Iterable[str], floor, which: str = "search") -> list[Bound]:
        """How sure the figures of ``excluded`` on the search (or the confirmation) samples are,
        for each of ``floor``'s metrics (pipeline/precision/bounds.py)."""
        key = (frozenset(excluded), which)
        if (key, floor) not in self._bounds:  # the search asks again and again as it ranks
            self.evaluate(excluded, which)
            self._bounds[(key, floor)] = bounds(self._stats[key], floor)
        return self._bounds[(key, floor)]

    def evaluate_only(self, quantized: Iterable[str]) -> Figures:
        """The variant with only ``quantized`` layers quantized, on the search batches."""
        quantized = set(quantized)
        return self.evaluate([name for name in self.layers if name not in quantized])

    def _run(self, batch):
        import torch

        with (
            torch.no_grad(),
            out_of_memory_as_error(getattr(self.spec, "batch_size", None), f"analysing {self.ref.name}", self.evaluated),
        ):
            return self.runnable(*as_inputs(batch, self.device, self.dtype)).float().cpu()

    def depth_profile(self) -> list[dict[str, Any]]:
        """With every layer quantized: each depth unit's output against FP32 on the first search batch."""
        import torch

        self.switches.quantize_all_but(())
        quantized: dict[str, Any] = {}
        modules = dict(self.model.named_modules())
        hooks = [modules[name].register_forward_hook(self._keep_output(quantized, name)) for name in self.depth_units]
        try:
            with torch.no_grad():
                self.runnable(*as_inputs(self.batches["search"][0], self.device, self.dtype))
        finally:
            for hook in hooks:
                hook.remove()
        profile = []
        for name in self.depth_units:
            reference, output = self._reference_depth[name].flatten(), quantized[name].flatten()
            profile.append({"name": name, "cosine": cosine_of(reference, output), "relative_error": relative_error_of(reference, output)})
        return profile

    def describe(self) -> dict[str, Any]:
        """What the figures were measured on, for the output."""
        return {
            # The evaluated shape: the model's smallest point, its batch the samples.
            "point": self.evaluated,
            "device": self.device,
            "compute_dtype": {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[str(self.dtype).replace("torch.", "")],
            "calibration": self.calibration,
            "search": self._drawn("search"),
            "confirm": self._drawn("confirm"),
            "reference": "the FP32 PyTorch model (attention by the math kernel) on the same batches",
            "versions": {dist: package_version(dist) for dist in ("torch", "nvidia-modelopt", *self.source.packages)},
        }

    def _drawn(self, which: str) -> dict[str, Any]:
        """Where the search's or the confirmation's samples came from (samples.py), and the metric."""
        metric = {"metric": self.catalog.evaluation.metric} if self.metric else {}
        return {**self.drawn.describe(which), **metric}


def depth_units(model, layers: list[str]) -> list[str]:
    """The model's repeated blocks (the longest run of one class in a ModuleList or Sequential:
    timm's ``blocks``, BERT's ``encoder.layer``), else its quantizable layers."""
    import torch.nn as nn

    best: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        classes = [type(child) for _, child in children]
        for cls in set(classes):
            run = [f"{name}.{child_name}" if name else child_name for child_name, child in children if type(child) is cls]
            if len(run) >= 2 and len(run) > len(best) and not issubclass(cls, (nn.Linear, nn.modules.conv._ConvNd)):
                best = run
    return best or list(layers)

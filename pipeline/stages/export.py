"""Export stage: timm model → (sparsify) → (quantize) → ONNX, checked before it is kept.

Checks, all recorded in the manifest:
* ``onnx.checker``, and an op/dtype audit of the graph (custom ``trt::`` ops included);
* parity: the ONNX run in ONNX Runtime against the PyTorch model of the same variant on the same
  input, beyond a per-precision tolerance the stage fails (skipped, with the reason, when the
  graph uses TensorRT-only operators);
* the accuracy proxy: the variant's PyTorch outputs against the dense FP32 model's;
* for sparse variants, the 2:4 pattern in every sparsified weight of the ONNX.

The ONNX is written under a temporary name and moved to ``models/<model>/<variant>.onnx`` only
when every check has passed.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.artifacts import atomic_output, sha256_file
from pipeline.environment import package_version
from pipeline.errors import EnvironmentMissing, PipelineError, UsageError, require_module
from pipeline.manifest import Artifact, ExportDetails
from pipeline.models import TORCH_DTYPES
from pipeline.models.images import image_files, load_images
from pipeline.runtimes.onnxruntime import NO_CPU_KERNELS
from pipeline.runtimes.torch_memory import is_out_of_memory, out_of_memory_as_error
from pipeline.stages.base import Stage, StageOutcome
from pipeline.stages.parity import PARITY_TOLERANCE, check_parity, run_onnx
from pipeline.stages.quantize import (
    DEFAULT_WEIGHTS_DTYPE,
    MIN_OPSET,
    PRESETS,
    TRACED_HIGH_PRECISION,
    accuracy_proxy,
    as_inputs,
    export_quantized,
    load_modelopt,
    quantize_model,
    require_cuda_for,
)
from pipeline.stages.quantized_layers import layers_to_rewrite, prefix_of, resolve_exclude
from pipeline.stages.sparsify import onnx_sparsity, sparsify_model

# Samples the parity check runs for graphs traced with a dynamic batch (CPU traces): more than the
# traced batch, fewer than a batch of 64, which takes ONNX Runtime seconds on the CPU.
PARITY_SAMPLES_DYNAMIC = 8
# Colours in an exporter's messages (torch.onnx prints its step numbers in them).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class ExportStage(Stage):
    name = "export"

    def manifest_path(self) -> Path:
        return self.ctx.workspace.export_manifest_path(self.engine)

    def opset(self) -> int:
        return max(self.ctx.catalog.opset, MIN_OPSET.get(self.variant_spec.precision, 0))

    @property
    def quantized(self) -> bool:
        return self.variant_spec.precision in PRESETS

    @property
    def needs_calibration(self) -> bool:
        return self.quantized or self.variant_spec.sparsity is not None

    def weights_dtype(self) -> str | None:
        if not self.quantized:
            return None
        return self.variant_spec.weights_dtype or DEFAULT_WEIGHTS_DTYPE[self.variant_spec.precision]

    def calibration_params(self) -> dict[str, Any] | None:
        settings = self.ctx.catalog.calibration
        return self.model_source().describe_calibration(self._calibration_dir(), settings.samples, settings.batch_size)

    def _each_point(self, references: dict):
        """(label, inputs) of each reference batch, saying which shape point the export is at: a
        large model's points take minutes each on a CPU."""
        for index, (label, feeds) in enumerate(references.items(), 1):
            if label is not None:
                self.ctx.reporter.progress(f"{label.replace('x', '×')} ({index} of {len(references)})")
            yield label, feeds

    def _parity_points(self, points) -> list:
        """The labels of the shape points parity is checked at: the smallest and the largest
        (`parity_points = "ends"`, where the graph's axes are stretched furthest apart), or all."""
        if self.model_spec.parity_points == "all" or len(points) <= 2:
            return [point.label for point in points]

        def sizes(point):
            return [size for _, size in point.axes]

        return [min(points, key=sizes).label, max(points, key=sizes).label]

    def _calibration_dir(self) -> Path | None:
        return self._in_workspace(self.ctx.catalog.calibration.directory)

    def _evaluation_dir(self) -> Path | None:
        return self._in_workspace(self.ctx.catalog.evaluation.directory)

    def _in_workspace(self, directory: Path | None) -> Path | None:
        """A folder named in the catalog: relative paths are relative to the workspace."""
        if directory is None:
            return None
        directory = Path(directory).expanduser()
        return directory if directory.is_absolute() else self.ctx.workspace.root / directory

    def evaluation_params(self) -> dict[str, Any] | None:
        directory = self._evaluation_dir()
        if directory is None:
            return None
        return self.model_source().describe_evaluation(directory)

    def params(self) -> dict[str, Any]:
        spec, variant = self.model_spec, self.variant_spec
        source = self.model_source()
        checkpoint = None
        if spec.checkpoint is not None:
            checkpoint = {"path": str(spec.checkpoint), "sha256": self.ctx.workspace.hashes.sha256(source.checkpoint_path())}
        params = {
            **source.facts(),
            "seed": spec.seed,
            "checkpoint": checkpoint,
            "opset": self.opset(),
            "precision": variant.precision,
            "sparsity": variant.sparsity,
            "parity_tolerance": PARITY_TOLERANCE[variant.precision],
            "calibration": self.calibration_params(),
            "evaluation": self.evaluation_params(),
        }
        if spec.shapes:
            params["shapes"] = list(spec.shapes)
            params["parity_points"] = spec.parity_points
        files = source.input_files()
        if files:  # the file a model is read from, by content: a changed file is taken again
            params["files"] = {self.ctx.workspace.relative(path): self.ctx.workspace.hashes.sha256(path) for path in files}
        if self.quantized:
            params["quantization"] = {
                "preset": PRESETS[variant.precision],
                "conv_policy": variant.conv_policy,
                "weights_dtype": self.weights_dtype(),
            }
            if variant.exclude:  # absent otherwise, so exports made before `exclude` existed stay current
                params["quantization"]["exclude"] = list(variant.exclude)
        if variant.sparsity:
            params["sparsity_method"] = variant.sparsity_method
        return params

    def skip_reason(self) -> str | None:
        return self.model_source().unsupported_variant(self.variant_spec)

    def cannot_redo_here(self) -> str | None:
        # MXFP8/NVFP4 exports need CUDA; their graphs are built ahead of time on machines without
        # (TensorRT-RTX), from the export a GPU machine made.
        try:
            if self.quantized:
                require_cuda_for(self.variant_spec.precision)
        except EnvironmentMissing as exc:
            return exc.message
        return None

    def identity(self) -> dict[str, Any]:
        dists = ("torch", "timm", "onnx", "nvidia-modelopt", *self.model_source().packages)
        return {dist: package_version(dist) for dist in dists}

    def run_impl(self, inputs: list[Artifact]) -> StageOutcome:
        # A batch too large for the host or the GPU (or a container's memory limit), anywhere in the export.
        points = self.model_source().shape_points()
        largest = max(points, key=lambda p: [size for _, size in p.axes]).label if points else None
        batch = getattr(self.model_spec, "batch_size", None)
        source = self.model_source()
        with self.ctx.reporter.captured("export"), out_of_memory_as_error(batch, f"exporting {self.engine.name}", shape=largest):
            outcome = self._export() if source.has_pytorch_model else self._take_onnx(source)
        # Said after the tools' output is released, so it is not swallowed with it.
        accuracy = outcome.details.accuracy
        if accuracy and accuracy["warning"]:
            self.ctx.reporter.warn(f"{self.engine.name}: {accuracy['warning']}")
        if outcome.details.onnx_refused:
            self.ctx.reporter.warn(
                f"{self.engine.name} is not exportable to ONNX: {outcome.details.onnx_refused}. "
                "The torch toolchains still run it; the toolchains that compile the ONNX skip it."
            )
        return outcome

    def _export(self) -> StageOutcome:
        variant = self.variant_spec
        phase = Phases(self.ctx.reporter)
        source = self.model_source()
        with phase("import"):
            from pipeline.models.torch_import import import_timm

            import_timm()  # timed here, not in create_model
            import torch

            require_cuda_for(variant.precision)  # before ModelOpt's seconds of imports, not after
            # Quantized exports are ModelOpt's, written by the TorchScript exporter.
            check_opset(self.opset(), "torchscript" if self.quantized else source.exporter)
            if self.quantized or variant.sparsity:
                # Seconds, once per process: timed here, not in the first variant's quantize phase.
                load_modelopt(purpose=f"Exporting {self.engine.name}")

        spec = self.model_spec
        weights = f"random-init (seed {spec.seed})"
        if spec.checkpoint is not None:
            weights = f"checkpoint {spec.checkpoint} (sha256 {sha256_file(source.checkpoint_path())[:16]}…)"
        with phase("create_model"):
            model = source.create()
        if self.needs_calibration:
            linear_only = self.quantized and source.quantize_linear_only
            if not layers_to_rewrite(model, linear_only):
                what = f"{variant.precision} quantization" if self.quantized else "2:4 sparsity"
                raise UsageError(
                    f"{self.engine.name}: {what} has nothing to act on: {source.describe()} has no Linear"
                    f"{'' if linear_only else ' or convolution'} layers, so the engine would be the unquantized model under another name.",
                    hint=f"measure {self.engine.model} at fp32, fp16 or bf16: leave the {self.engine.variant} variant out for it",
                )
            excluded = resolve_exclude(model, variant.exclude, linear_only, self.engine.variant, source.describe())

        points = source.check_points(model)
        model_inputs = source.inputs(model)
        # On the GPU when there is one (block formats need it), with TF32 off so the FP32 reference
        # that parity is checked against is real FP32.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        with phase("to_device"):
            model = model.to(device)
        runnable = source.runnable(model)
        prefix = prefix_of(runnable, model)  # how quantizers name the model's layers
        sample = source.sample_inputs(model, source.trace_point(points), spec.seed + 1)
        input_shape = tuple(sample[0].shape)
        with phase("fp32_reference"):
            # What every engine of this variant is checked against (pipeline/accuracy.py): one
            # batch per shape point, or the one batch of a model of one shape.
            if points:
                references = {p.label: source.sample_inputs(model, p, spec.seed + 1) for p in points}
                reference_facts = {
                    "description": f"the FP32 PyTorch model (attention by the math kernel) on seeded inputs at each shape point (seed {spec.seed + 1})",
                }
            else:
                reference_input, reference_facts = self.reference_batch(model, sample[0])
                references = {None: (reference_input,)}
            fp32_outputs = {}
            # Scaled-dot-product attention in the reference is PyTorch's math kernel, the formula
            # itself in FP32: every fused kernel (flash, efficient, cuDNN) is checked against it.
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), input_refused_as_error(source, input_shape, model):
                for label, feeds in self._each_point(references):
                    fp32_outputs[label] = runnable(*as_inputs(feeds, device, torch.float32)).float().cpu()
            labels = reference_facts.get("labels")
            if labels:
                predicted = fp32_outputs[None][: len(labels)].argmax(dim=1)
                reference_facts["fp32_top1_accuracy"] = float((predicted == torch.tensor(labels)).float().mean())

        calibration = None
        batches = []
        reference_outputs = []
        if self.needs_calibration:
            settings = self.ctx.catalog.calibration
            with phase("calibration_data"):
                batches = source.calibration_batches(model, self._calibration_dir(), settings.samples, settings.batch_size)
                calibration = {k: v for k, v in self.calibration_params().items() if k != "files"}
                with torch.no_grad():
                    reference_outputs = [runnable(*as_inputs(b, device, torch.float32)).cpu() for b in batches]

        sparsification = None
        if variant.sparsity:
            with phase("sparsify"):
                # The module that is exported: ModelOpt keeps its state on the root it converted,
                # and quantizing a wrapper around a converted model fails ("Model has modelopt
                # state but not the root!").
                runnable, sparsification = sparsify_model(runnable, variant.sparsity_method, batches)

        quantization = None
        dtype = torch.float32
        if variant.precision in ("fp16", "bf16"):
            dtype = getattr(torch, TORCH_DTYPES[variant.precision])
            runnable = source.cast(runnable, dtype)
        elif self.quantized:
            if variant.precision in TRACED_HIGH_PRECISION and self.weights_dtype() == "fp16":
                # Calibrated and traced in FP16, so the graph's high precision is FP16 (quantize.py).
                dtype = torch.float16
                runnable = source.cast(runnable, torch.float16)
            with phase("quantize"):
                runnable, quantization = quantize_model(
                    runnable,
                    variant.precision,
                    batches,
                    variant.conv_policy,
                    self.ctx.reporter.progress,
                    source.quantize_linear_only,
                    excluded,
                    prefix,
                )
            quantization["weights_dtype"] = self.weights_dtype()
            quantization["calibration"] = calibration

        accuracy = None
        with phase("accuracy_and_reference"):
            if batches:
                with torch.no_grad():
                    outputs = [runnable(*as_inputs(b, device, dtype)).float().cpu() for b in batches]
                accuracy = accuracy_proxy(reference_outputs, outputs, variant.precision, bool(variant.sparsity))
            variant_outputs = {}
            parity_labels = self._parity_points(points)
            with torch.no_grad():
                if points:
                    for label, feeds in self._each_point({label: references[label] for label in parity_labels}):
                        variant_outputs[label] = runnable(*as_inputs(feeds, device, dtype)).float().cpu().numpy()
                else:  # parity is checked on the seeded sample (the reference may be images)
                    variant_outputs[None] = runnable(*as_inputs(sample, device, dtype)).float().cpu().numpy()

        onnx = require_module("onnx", purpose="ONNX export")
        onnx_path = self.ctx.workspace.onnx_path(self.engine)
        input_names = [i.name for i in model_inputs]
        dynamic_axes = {i.name: {axis: dim for axis, dim in enumerate(i.dims) if isinstance(dim, str)} for i in model_inputs}
        dynamic_axes = {name: axes for name, axes in dynamic_axes.items() if axes}
        # What the details record; a model the exporter refuses leaves them empty (no graph).
        exporter, graph, traced_batch, refused = None, None, None, None
        ops, audit, parity, parity_skipped, parity_by_shape = {}, {}, None, None, {}
        try:
            with atomic_output(onnx_path) as tmp:
                shapes = ", ".join(f"{i.name} {list(i.dims)}" for i in model_inputs)
                self.ctx.reporter.detail(f"export {source.describe()} ({shapes}) opset {self.opset()} → {tmp}")
                try:
                    with phase("onnx_export"):
                        traced = as_inputs(sample, device, dtype)
                        if self.quantized:
                            exported = export_quantized(
                                runnable, traced, tmp, self.opset(), self.weights_dtype(), variant.precision, dynamic_axes
                            )
                            quantization["exporter"], traced_batch = exported.exporter, exported.traced_batch
                            exporter = exported.exporter
                        else:
                            exporter = plain_export(
                                runnable,
                                traced,
                                tmp,
                                input_names,
                                source.output_name(),
                                self.opset(),
                                source.exporter,
                                dynamic_axes,
                                self.ctx.reporter,
                            )
                    # One load for every check: these graphs are hundreds of MB.
                    with phase("onnx_checks"):
                        graph = onnx.load(str(tmp), load_external_data=False)
                        renamed = name_io(graph, input_names, source.output_name())
                        onnx.checker.check_model(graph)
                except (OSError, PipelineError):
                    raise
                except Exception as exc:
                    if self.quantized or variant.sparsity:
                        # ModelOpt's export of a model PyTorch ran: the product's own path, not the module's.
                        raise PipelineError(
                            f"ONNX export of {self.engine.name} failed: {str(exc).strip().splitlines()[0]}",
                            hint="run with -v for the exporter's output and the full traceback",
                        ) from exc
                    raise ExporterRefused(exporter_reason(exc)) from exc
                ops = op_histogram(graph)
                custom = sorted(op for op in ops if "::" in op)
                if custom:
                    parity_skipped = f"the graph uses TensorRT-only operators ({', '.join(custom)}), which ONNX Runtime cannot run"
                elif variant.precision in NO_CPU_KERNELS:  # the parity check runs on ONNX Runtime's CPU provider
                    parity_skipped = NO_CPU_KERNELS[variant.precision]
                elif points:
                    # At the smallest and the largest shape point (or every one): the graph's axes really are free.
                    with phase("parity"):
                        for label, feeds in self._each_point({label: references[label] for label in parity_labels}):
                            parity_by_shape[label] = check_parity(
                                tmp, [t.numpy() for t in feeds], variant_outputs[label], variant.precision
                            )
                    parity = min(parity_by_shape.values(), key=lambda check: (check.passed, check.cosine_similarity))
                else:
                    # A graph traced with a dynamic batch is checked at a batch it was not traced at, which
                    # also shows that the batch axis really is free before it is pinned below.
                    checked = min(spec.batch_size, PARITY_SAMPLES_DYNAMIC) if traced_batch else spec.batch_size
                    with phase("parity"):
                        parity = check_parity(tmp, [sample[0][:checked].numpy()], variant_outputs[None][:checked], variant.precision)
                if parity is not None and not parity.passed:
                    where = next((f" at {label}" for label, check in parity_by_shape.items() if check is parity), "")
                    raise PipelineError(
                        f"exported {self.engine.name} does not match PyTorch{where}: max |error| {parity.max_abs_error:.3g} "
                        f"(limit {parity.max_abs_error_limit:.3g}), cosine similarity {parity.cosine_similarity:.6f} "
                        f"(floor {parity.cosine_similarity_floor}).",
                        hint="the ONNX was not kept; try another opset (`opset` in pipeline.toml)",
                    )
                if traced_batch:
                    pin_batch(graph, spec.batch_size)
                if renamed or traced_batch:
                    with phase("onnx_save"):
                        onnx.save(graph, str(tmp))
                if sparsification is not None:
                    with phase("sparsity_check"):
                        sparsification["onnx"] = onnx_sparsity(graph)
                    expected = sparsification["sparsified_layers"]
                    found = sparsification["onnx"]["weights_2_4"]
                    if found < expected:
                        raise PipelineError(
                            f"the 2:4 pattern was lost in export: {expected} layers are 2:4-sparse in PyTorch, but only "
                            f"{found} weights of the ONNX are.",
                            hint="the ONNX was not kept; run with -v and report the exporter's output",
                        )
                audit = onnx_audit(graph, tmp.stat().st_size)
        except ExporterRefused as exc:
            # The torch toolchains still run the model; the references below are what they are
            # checked against. An ONNX from an earlier export goes: this one has none.
            refused = exc.reason
            onnx_path.unlink(missing_ok=True)

        if points:
            reference = self.write_point_references(references, fp32_outputs, model_inputs, dtype, reference_facts)
        else:
            reference = self.write_reference(model_inputs[0].name, references[None][0].to(dtype), fp32_outputs[None], reference_facts)
        facts = source.facts()
        details = ExportDetails(
            timm_model=facts.get("timm_model"),
            source=source.describe(),
            weights=weights,
            input_shape=list(input_shape),
            input_dtype=str(dtype).replace("torch.", ""),
            inputs=[i.describe() for i in model_inputs],
            output=source.output_name(),
            shape_points=[p.label for p in points],
            exporter=exporter,
            opset=graph_opset(graph, self.opset()) if graph is not None else self.opset(),
            onnx_refused=refused,
            traced_batch=traced_batch,
            precision=variant.precision,
            sparsity=variant.sparsity,
            quantization=quantization,
            sparsification=sparsification,
            calibration=calibration,
            accuracy=accuracy,
            parity=parity,
            parity_by_shape=parity_by_shape,
            parity_skipped=parity_skipped,
            onnx_ops=ops,
            onnx_audit=audit,
            flops_by_shape={p.label: flops for p in points if (flops := source.flops(p)) is not None},
            reference=reference,
            timings_s=phase.seconds,
        )
        note = f" (parity: cosine {parity.cosine_similarity:.6f})" if parity else f" (parity not run: {parity_skipped})"
        if refused:
            note = " (no ONNX: the exporter refused the model; references written for the torch toolchains)"
        if parity_by_shape:
            of = f" of {len(points)}" if len(parity_by_shape) < len(points) else ""
            plural = "s" if len(points if of else parity_by_shape) > 1 else ""
            note = f" (parity at {len(parity_by_shape)}{of} shape{plural}: cosine ≥ {parity.cosine_similarity:.6f})"
        if accuracy:
            note += f", vs FP32: cosine {accuracy['cosine_similarity']:.4f}"
        if sparsification:
            note += f", {sparsification['onnx']['weights_2_4']} weights 2:4-sparse"
        outputs = [self.ctx.workspace.artifact("onnx", onnx_path)] if refused is None else []
        outputs += [self.ctx.workspace.artifact(role, self.ctx.workspace.root / path) for role, path in reference_files(reference)]
        return StageOutcome(outputs=outputs, details=details, note=note)

    def _take_onnx(self, source) -> StageOutcome:
        """A user's ONNX file: checked, copied in as it is, and run in ONNX Runtime at each shape
        point for the reference every engine built from it is checked against."""
        import shutil

        import onnx
        import torch

        phase = Phases(self.ctx.reporter)
        path = source.path()
        with phase("onnx_checks"):
            graph = source.graph
            if any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer):
                raise PipelineError(
                    f"{path} keeps its weights in external data files, which this pipeline does not copy yet.",
                    hint="save the model with its weights inside the file (onnx.save(..., save_as_external_data=False), up to 2 GB)",
                )
            try:
                onnx.checker.check_model(str(path))
            except Exception as exc:  # onnx.checker.ValidationError and friends
                raise UsageError(
                    f"model {source.name!r}: {path} is not a valid ONNX model: {str(exc).strip().splitlines()[0]}",
                    hint="`python -c \"import onnx; onnx.checker.check_model('FILE', full_check=True)\"` says more; fix the graph or export it again",
                ) from exc
        points = source.check_points()
        model_inputs = source.inputs()
        references, fp32_outputs = {}, {}
        with phase("fp32_reference"):
            for point in points:
                given = source.user_reference(point)
                if given is not None:  # the user's own inputs and outputs
                    references[point.label], fp32_outputs[point.label] = given
                    continue
                references[point.label] = source.sample_inputs(None, point, self.model_spec.seed + 1)
                output = run_onnx(path, [t.numpy() for t in references[point.label]])
                fp32_outputs[point.label] = torch.from_numpy(output.astype("float32"))
        onnx_path = self.ctx.workspace.onnx_path(self.engine)
        with atomic_output(onnx_path) as tmp:
            shutil.copyfile(path, tmp)
        facts = {"description": source.describe_reference(self.model_spec.seed + 1)}
        reference = self.write_point_references(references, fp32_outputs, model_inputs, torch.float32, facts)
        floats = [i.dtype for i in model_inputs if not i.dtype.startswith(("int", "bool"))]
        first = references[points[0].label][0]
        details = ExportDetails(
            source=source.describe(),
            weights=f"as in {source.spec.onnx}",
            input_shape=list(first.shape),
            input_dtype=floats[0] if floats else str(first.dtype).replace("torch.", ""),
            inputs=[i.describe() for i in model_inputs],
            output=source.output_name(),
            shape_points=[p.label for p in points],
            exporter=f"none: {source.spec.onnx} taken as it is",
            opset=next((entry.version for entry in graph.opset_import if entry.domain in ("", "ai.onnx")), 0),
            precision=self.variant_spec.precision,
            parity_skipped="the reference is this ONNX file's own outputs (there is no PyTorch model to compare it with)",
            onnx_ops=op_histogram(graph),
            onnx_audit=onnx_audit(graph, path.stat().st_size),
            reference=reference,
            timings_s=phase.seconds,
        )
        outputs = [self.ctx.workspace.artifact("onnx", onnx_path)]
        outputs += [self.ctx.workspace.artifact(role, self.ctx.workspace.root / p) for role, p in reference_files(reference)]
        return StageOutcome(outputs=outputs, details=details, note=f" (taken as it is; reference at {len(points)} shape point(s))")

    def reference_batch(self, model, sample):
        """The batch every engine is checked on, and what it is: ``sample`` (seeded random), or the
        first images of the evaluation folder (cycled to fill the batch) with their labels."""
        directory = self._evaluation_dir()
        batch = sample.shape[0]
        if directory is None:
            seeded = f"the FP32 PyTorch model on a seeded random batch (seed {self.model_spec.seed + 1})"
            return sample, {"description": seeded, "samples": batch}
        files = image_files(directory, "evaluation", "--eval-dir")
        unique = min(len(files), batch)
        chosen = [files[i % len(files)] for i in range(batch)]
        images = load_images(model, chosen, tuple(sample.shape[1:]), "evaluation")
        facts: dict[str, Any] = {
            "description": f"the FP32 PyTorch model on {unique} images from {directory} (timm's evaluation preprocessing"
            + (f"; repeated to fill the batch of {batch})" if unique < batch else ")"),
            "samples": unique,
            "images": [str(path.relative_to(directory)) for path in chosen[:unique]],
        }
        facts["labels"], facts["labels_skipped"] = self.image_labels(model, directory, chosen[:unique])
        return images, facts

    def image_labels(self, model, directory: Path, files: list[Path]) -> tuple[list[int] | None, str | None]:
        """Class indices from ImageFolder names, when they are ImageNet-1k classes of a checkpoint."""
        if self.model_spec.checkpoint is None:
            return None, "the model has random weights (no checkpoint in the catalog): its classes mean nothing"
        from timm.data import ImageNetInfo

        synsets = ImageNetInfo().label_names()
        if getattr(model, "num_classes", None) != len(synsets):
            return None, f"the model has {getattr(model, 'num_classes', '?')} classes, not ImageNet-1k's {len(synsets)}"
        index = {name: i for i, name in enumerate(synsets)}
        folders = [path.relative_to(directory).parts[0] if len(path.relative_to(directory).parts) > 1 else "" for path in files]
        unknown = sorted({folder for folder in folders if folder not in index})
        if unknown:
            return None, f"folder names {', '.join(repr(f) for f in unknown[:3])} are not ImageNet-1k synsets (such as 'n01440764')"
        return [index[folder] for folder in folders], None

    def write_reference(self, input_name: str, engine_input, fp32_output, facts: dict[str, Any]) -> dict[str, Any]:
        """The reference batch in the engine's input dtype and the FP32 model's outputs for it."""
        from pipeline.accuracy import write_tensor

        described = dict(facts)
        names = (input_name, self.model_source().output_name())
        for key, name, tensor, path in zip(
            ("input", "output"), names, (engine_input, fp32_output), self.ctx.workspace.reference_paths(self.engine)
        ):
            with atomic_output(path) as tmp:
                write_tensor(tensor, tmp)
            dtype = str(tensor.dtype).replace("torch.", "")
            described[key] = {"name": name, "path": self.ctx.workspace.relative(path), "shape": list(tensor.shape), "dtype": dtype}
        return described

    def write_point_references(self, references, fp32_outputs, model_inputs, dtype, facts: dict[str, Any]) -> dict[str, Any]:
        """Each shape point's reference inputs (floating ones in the engine's dtype, integer ones
        as they are) and the FP32 model's outputs for them."""
        from pipeline.accuracy import write_tensor

        workspace = self.ctx.workspace
        described: dict[str, Any] = {**facts, "points": {}}
        names = [i.name for i in model_inputs]
        for label, feeds in references.items():
            input_paths, output_path = workspace.reference_point_paths(self.engine, label, names)
            entries = []
            for name, tensor in zip(names, feeds):
                tensor = tensor.to(dtype) if tensor.is_floating_point() else tensor
                with atomic_output(input_paths[name]) as tmp:
                    write_tensor(tensor, tmp)
                entries.append(_tensor_entry(name, workspace.relative(input_paths[name]), tensor))
            with atomic_output(output_path) as tmp:
                write_tensor(fp32_outputs[label], tmp)
            output = _tensor_entry(self.model_source().output_name(), workspace.relative(output_path), fp32_outputs[label])
            described["points"][label] = {"inputs": entries, "output": output, "samples": int(feeds[0].shape[0])}
        return described


def _tensor_entry(name: str, path: str, tensor) -> dict[str, Any]:
    return {"name": name, "path": path, "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", "")}


def reference_files(reference: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, path) of every file of an export's reference: the one batch's input and output, or
    each shape point's inputs and output."""
    if "points" not in reference:
        return [("reference_input", reference["input"]["path"]), ("reference_output", reference["output"]["path"])]
    files = []
    for label, point in reference["points"].items():
        files += [(f"reference_input@{label}:{entry['name']}", entry["path"]) for entry in point["inputs"]]
        files.append((f"reference_output@{label}", point["output"]["path"]))
    return files


class Phases:
    """Wall time of each part of an export, recorded so slow exports can be explained; the part
    under way is shown beside the stage's spinner."""

    def __init__(self, reporter=None):
        self.seconds: dict[str, float] = {}
        self.reporter = reporter

    def __call__(self, name: str):
        import contextlib
        import time

        @contextlib.contextmanager
        def timed():
            if self.reporter is not None:
                self.reporter.step(name.replace("_", " "))
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)

        return timed()


def name_io(model, input_names: list[str], output_name: str) -> bool:
    """Give the graph's inputs and its one output the model family's names (ModelOpt's exports
    name them after forward()'s parameters and its last node); True if anything was renamed."""
    renames = {}
    if len(model.graph.input) == len(input_names):
        renames.update({value.name: name for value, name in zip(model.graph.input, input_names)})
    if len(model.graph.output) == 1:
        renames[model.graph.output[0].name] = output_name
    renames = {old: new for old, new in renames.items() if old != new}
    if not renames:
        return False
    for value in list(model.graph.input) + list(model.graph.output):
        value.name = renames.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    return True


# The lowest opset the torch.export-based exporter writes natively (torch/onnx/_internal/exporter/_compat.py warns below it).
DYNAMO_LOWEST_OPSET = 18


def plain_export(
    model, args: tuple, path: Path, input_names: list[str], output_name: str, opset: int, exporter: str, dynamic_axes, reporter
) -> str:
    """Export an unquantized model with the family's exporter; returns which one, for the manifest.

    The torch.export-based exporter (``dynamo=True``) is the one PyTorch keeps; the TorchScript one
    is deprecated ("will be removed") and used only for models of one fixed shape (timm), whose
    graphs it writes as ModelOpt's quantized exports (also TorchScript) do, so variants compare."""
    import torch

    if exporter == "dynamo":
        # Its operators are implemented from opset 18; asked for less it converts the graph down,
        # which fails where an operator's form changed (torch 2.11, ModernBERT at 17: "Unrecognized
        # attribute: num_outputs for operator Split"). The opset the graph has is recorded.
        opset = max(opset, DYNAMO_LOWEST_OPSET)
        dims: dict[str, Any] = {}
        shapes = [
            {axis: dims.setdefault(label, torch.export.Dim(label, min=1)) for axis, label in dynamic_axes.get(name, {}).items()} or None
            for name in input_names
        ]
        # external_data=False: the weights stay in the one file, as every other export writes them.
        options = {"dynamic_shapes": tuple(shapes), "dynamo": True, "external_data": False}
        written_by = "torch.export-based, dynamo=True"
    else:
        # The TorchScript exporter: ModelOpt's exporter is built on it too.
        options = {"dynamic_axes": dynamic_axes or None, "dynamo": False}
        written_by = "TorchScript"
    with torch.no_grad(), reporter.captured("torch.onnx.export"):
        torch.onnx.export(model, args, str(path), input_names=input_names, output_names=[output_name], opset_version=opset, **options)
    return f"torch.onnx.export ({written_by}), torch {torch.__version__}"


def check_opset(opset: int, exporter: str) -> None:
    """Refuse, as the catalog's mistake, an opset above the highest that torch says its exporter
    writes (torch.onnx._constants): asked for more, the TorchScript exporter warns and writes it
    anyway, and the torch.export-based one fails on the model's operators or writes another opset,
    which would read as a model the exporter cannot take."""
    import torch
    from torch.onnx import _constants

    name = "ONNX_MAX_OPSET" if exporter == "dynamo" else "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET"
    highest = getattr(_constants, name, None)
    if highest is not None and opset > highest:
        written_by = "torch.export-based" if exporter == "dynamo" else "TorchScript"
        raise UsageError(
            f"opset = {opset} (pipeline.toml): torch {torch.__version__}'s ONNX exporter ({written_by}) writes opsets up to {highest}.",
            hint=f"set `opset` in pipeline.toml to at most {highest} (17 is the default)",
        )


def pin_batch(model, batch_size: int) -> None:
    """Give a graph exported with a dynamic batch axis the static batch the other variants have.

    Only the declared shapes change: the graph already computes its shapes from the input's (the
    parity check ran it at another batch), and TensorRT folds those computations for a static input.
    """
    for value in list(model.graph.input) + list(model.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        if not dim.HasField("dim_value"):
            dim.Clear()
            dim.dim_value = batch_size
    # Intermediate shapes inferred at export still name the symbolic batch; shape inference
    # (TensorRT's, or the FLOP count's) recomputes them from the pinned input.
    del model.graph.value_info[:]


def graph_opset(model, default: int) -> int:
    """The opset of the graph's default domain, as written (the exporter may raise the one asked for)."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), default)


def op_histogram(model) -> dict[str, int]:
    """Node count per operator; custom domains are prefixed (``trt::TRT_FP4QDQ``)."""
    counts = Counter(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}" for node in model.graph.node)
    return dict(sorted(counts.items()))


def onnx_audit(model, size_bytes: int) -> dict[str, Any]:
    import onnx

    from pipeline.report.roofline import matmul_flops

    dtypes = Counter(onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer)
    return {
        # Matrix FLOPs of one batch, for the roofline in reports (None when shapes are unknown).
        "matmul_flops": matmul_flops(model),
        "opsets": {(entry.domain or "ai.onnx"): entry.version for entry in model.opset_import},
        "nodes": len(model.graph.node),
        "initializer_dtypes": dict(sorted(dtypes.items())),
        "initializers": len(model.graph.initializer),
        "size_bytes": size_bytes,
    }


class input_refused_as_error:
    """The model's own refusal of the input the catalog asks for (timm's ViTs assert that the image
    size matches their patches; a user's module whose described inputs its forward does not take)
    as a user error naming the shape, in the model family's words."""

    def __init__(self, source, shape, model):
        self.source, self.shape, self.model = source, tuple(shape), model

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, traceback):
        refusals = (AssertionError, RuntimeError, ValueError, TypeError, IndexError, KeyError)
        if kind is None or not issubclass(kind, refusals) or is_out_of_memory(kind, exc):
            return False  # out of memory is out_of_memory_as_error's
        raise self.source.input_refused(exc, self.shape, self.model) from exc


class ExporterRefused(Exception):
    """The exporter could not turn the PyTorch model into ONNX; ``reason`` in its own words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def exporter_reason(exc: BaseException) -> str:
    """What the exporter said, as one line: the innermost error it wrapped (torch.onnx wraps
    torch.export's and its own translator's errors in a page of next steps), and the line of the
    model's code it arose at — the last frame below the call into PyTorch that is not the
    exporter's own — as in "(at gated.py:14 in forward)"; none where the exporter failed on its
    own graph (an operator without an ONNX function)."""
    import traceback

    chain = [exc]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    innermost = chain[-1]
    text = ANSI_ESCAPE.sub("", str(innermost)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = f"{type(innermost).__name__}: {' '.join(lines[0].split()) if lines else 'no message'}"
    tools = _exporter_directories()
    for error in reversed(chain):
        frames = traceback.extract_tb(error.__traceback__)
        # The frames above the first of the exporter's are its caller (this stage, the command line).
        entered = next((index for index, frame in enumerate(frames) if _under(frame.filename, tools)), len(frames))
        model = [frame for frame in frames[entered:] if Path(frame.filename).is_file() and not _under(frame.filename, tools)]
        if model:
            return f"{reason} (at {Path(model[-1].filename).name}:{model[-1].lineno} in {model[-1].name})"
    return reason


def _exporter_directories() -> list[Path]:
    """Where the exporter's own code is: PyTorch, ONNX Script and ONNX (those loaded), this
    package, and Python's standard library."""
    import sys
    import sysconfig

    packages = [sys.modules[name].__file__ for name in ("torch", "onnxscript", "onnx") if getattr(sys.modules.get(name), "__file__", None)]
    folders = [Path(file).parent for file in packages] + [Path(__file__).parents[1], Path(sysconfig.get_paths()["stdlib"])]
    return [folder.resolve() for folder in folders]


def _under(filename: str, folders: list[Path]) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(folder) for folder in folders)

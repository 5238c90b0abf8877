"""Export stage: timm model → (sparsify) → (quantize) → ONNX, checked before it is kept.

Checks, all recorded in the manifest:
* ``onnx.checker``, and an op/dtype audit of the graph (custom ``trt::`` ops included);
* parity: the ONNX run in ONNX Runtime against the PyTorch model of the same variant on the same
  input, beyond a per-precision tolerance the stage fails (skipped, with the reason, when the
  graph uses TensorRT-only operators);
* the accuracy proxy: the variant's PyTorch outputs against the dense FP32 model's;
* for sparse variants, the 2:4 pattern in every sparsified weight of the ONNX.

The ONNX is written under a temporary name and moved to ``models/<model>/<variant>.onnx`` only
when every check has passed — and only when a toolchain of the run reads it: a run of PyTorch
toolchains alone, which build from the PyTorch model and are checked against the references,
writes the references only (``onnx_skipped``), and a later run that reads the ONNX exports again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.catalog.shape import shown
from pipeline.machine.environment import package_version
from pipeline.manifest import Artifact, ExportDetails, OutOfMemoryFacts
from pipeline.measuring.out_of_memory import out_of_memory_as_error
from pipeline.models import TORCH_DTYPES
from pipeline.running.errors import DeviceFault, EnvironmentMissing, UsageError
from pipeline.stages.base import Stage, StageOutcome
from pipeline.stages.export_parts import References, Traced, VariantModel, export_note
from pipeline.stages.export_phases import Phases
from pipeline.stages.export_references import KeptFP32Outputs, ReferenceWriter, reference_batch, reference_files
from pipeline.stages.onnx_writing import (
    OnnxWriter,
    Written,
    check_opset,
    graph_opset,
    input_refused_as_error,
)
from pipeline.stages.parity import PARITY_TOLERANCE
from pipeline.stages.point_outputs import PointOutputs, faulted_points, parity_points
from pipeline.stages.quantize import (
    DEFAULT_WEIGHTS_DTYPE,
    MIN_OPSET,
    PRESETS,
    TRACED_HIGH_PRECISION,
    accuracy_proxy,
    as_inputs,
    load_modelopt,
    quantize_model,
    require_cuda_for,
)
from pipeline.stages.quantized_layers import layers_to_rewrite, prefix_of, resolve_exclude
from pipeline.stages.sparsify import sparsify_model
from pipeline.stages.user_onnx import take_onnx
from pipeline.workspace.artifacts import sha256_file

# Why an export wrote no ONNX though the exporter would have (ExportDetails.onnx_skipped).
ONNX_NOT_READ = "no toolchain of the run reads it"


class ExportStage(Stage):
    name = "export"

    @property
    def writes_onnx(self) -> bool:
        """Whether this export writes the ONNX: a toolchain of the run reads it, or the variant is
        one only ONNX toolchains run (quantized, sparse), whose checks are the ONNX's."""
        variant = self.variant_spec
        return self.ctx.exports_write_onnx or self.quantized or bool(variant.sparsity)

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
                self.ctx.reporter.progress(f"{shown(label)} ({index} of {len(references)})")
            yield label, feeds

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
            "sanitize": self.ctx.catalog.sanitize,
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
        if not self.writes_onnx:  # absent otherwise: an export that writes the ONNX keeps its fingerprint
            params["onnx"] = f"not written: {ONNX_NOT_READ}"
        return params

    def _reusable(self, previous, fingerprint: str, force: bool = False) -> bool:
        if previous is not None and previous.status == "faulted" and previous.fault is not None and previous.fault.shape is not None:
            return False  # not an export's end: it goes on without the point that faulted (one outside any point is)
        # An export that wrote the ONNX serves a run that reads none: the same export otherwise.
        if super()._reusable(previous, fingerprint, force):
            return True
        if self.writes_onnx or previous is None or previous.params.get("onnx") is not None:
            return False
        params = {key: value for key, value in self.params().items() if key != "onnx"}
        reason = self.skip_reason()
        return super()._reusable(previous, self.fingerprint(params, [] if reason else self.inputs(), reason), force)

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
        self._faulted = faulted_points(self)
        self._at_points = PointOutputs(self.ctx.reporter, f"exporting {self.engine.name}")
        try:
            with self.ctx.reporter.captured("export"), out_of_memory_as_error(batch, f"exporting {self.engine.name}", shape=largest):
                outcome = self._export() if source.has_pytorch_model else take_onnx(self, source, Phases(self.ctx.reporter))
        except DeviceFault as exc:  # named for its point; the earlier ones stay left out when the export goes on
            exc.facts["earlier"] = self._faulted
            raise
        for label, message in self._at_points.messages.items():
            self.ctx.reporter.warn(f"{self.engine.name} at {label}: the FP32 reference did not fit, even one sample at a time: {message}")
            self.ctx.out_of_memory.append((f"{self.engine.name}'s FP32 reference at {label}", message))
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
        self._import_tools(phase, source)
        spec = self.model_spec
        weights = f"random-init (seed {spec.seed})"
        if spec.checkpoint is not None:
            weights = f"checkpoint {spec.checkpoint} (sha256 {sha256_file(source.checkpoint_path())[:16]}…)"
        with phase("create_model"):
            model = source.create()
        excluded = self._layers_to_leave(model, source) if self.needs_calibration else None
        traced = self._on_device(model, source, phase)
        with phase("fp32_reference"):
            references = self._fp32_references(traced, source)
        batches, reference_outputs, calibration = [], [], None
        if self.needs_calibration:
            with phase("calibration_data"):
                batches, reference_outputs, calibration = self._calibration_batches(traced, source)
        variant_model = self._variant_of(traced, source, batches, calibration, excluded, phase)
        with phase("accuracy_and_reference"):
            accuracy, variant_outputs = self._variant_outputs(traced, references, variant_model, batches, reference_outputs)
        if self.writes_onnx:
            written = OnnxWriter(self, phase).write(traced, source, references, variant_model, variant_outputs)
        else:
            # An ONNX of an earlier export would be another export's: gone with its record.
            written = Written(self.ctx.workspace.onnx_path(self.engine), parity_skipped=f"no ONNX written: {ONNX_NOT_READ}")
            written.path.unlink(missing_ok=True)

        writer = ReferenceWriter(self.ctx.workspace, self.engine, source.output_name())
        dtype = variant_model.dtype
        if traced.points:
            reference = writer.each_point(
                references.batches, references.fp32_outputs, traced.inputs, dtype, references.facts, references.missing
            )
        else:
            engine_input = references.batches[None][0].to(dtype)
            reference = writer.one_batch(traced.inputs[0].name, engine_input, references.fp32_outputs[None], references.facts)
        facts = source.facts()
        details = ExportDetails(
            timm_model=facts.get("timm_model"),
            source=source.describe(),
            weights=weights,
            input_shape=list(traced.sample[0].shape),
            input_dtype=str(dtype).replace("torch.", ""),
            inputs=[i.describe() for i in traced.inputs],
            output=source.output_name(),
            shape_points=[p.label for p in traced.points],
            exporter=written.exporter,
            opset=graph_opset(written.graph, self.opset()) if written.graph is not None else self.opset(),
            onnx_refused=written.refused,
            onnx_skipped=None if self.writes_onnx else ONNX_NOT_READ,
            traced_batch=written.traced_batch,
            precision=variant.precision,
            sparsity=variant.sparsity,
            quantization=variant_model.quantization,
            sparsification=variant_model.sparsification,
            calibration=calibration,
            accuracy=accuracy,
            parity=written.parity,
            parity_by_shape=written.parity_by_shape,
            parity_skipped=written.parity_skipped,
            sanitized=written.sanitized,
            references_out_of_memory={label: OutOfMemoryFacts(**facts) for label, facts in self._at_points.out_of_memory.items()},
            references_in_parts=dict(self._at_points.in_parts),
            references_faulted=dict(self._faulted),
            onnx_ops=written.ops,
            onnx_audit=written.audit,
            flops_by_shape={p.label: flops for p in traced.points if (flops := source.flops(p)) is not None},
            reference=reference,
            timings_s=phase.seconds,
        )
        outputs = [self.ctx.workspace.artifact("onnx", written.path)] if written.refused is None and self.writes_onnx else []
        outputs += [self.ctx.workspace.artifact(role, self.ctx.workspace.root / path) for role, path in reference_files(reference)]
        return StageOutcome(outputs=outputs, details=details, note=export_note(details, len(traced.points)))

    def _import_tools(self, phase: Phases, source) -> None:
        """The model family's libraries (torch, and timm or transformers) and, for a quantized or
        sparse variant, ModelOpt imported, timed as a phase of their own; a variant this machine
        cannot quantize or an opset the exporter cannot write refused before those seconds are spent."""
        with phase("import"):
            source.import_libraries()  # timed here, not in create_model
            require_cuda_for(self.variant_spec.precision)  # before ModelOpt's seconds of imports, not after
            # Quantized exports are ModelOpt's, written by the TorchScript exporter.
            check_opset(self.opset(), "torchscript" if self.quantized else source.exporter)
            if self.quantized or self.variant_spec.sparsity:
                # Seconds, once per process: timed here, not in the first variant's quantize phase.
                load_modelopt(purpose=f"Exporting {self.engine.name}")

    def _layers_to_leave(self, model, source) -> list[str]:
        """The layers the variant leaves unquantized (its `exclude`), resolved on the model; refused
        where the model has no layer the variant would act on."""
        variant = self.variant_spec
        linear_only = self.quantized and source.quantize_linear_only
        if not layers_to_rewrite(model, linear_only):
            what = f"{variant.precision} quantization" if self.quantized else "2:4 sparsity"
            raise UsageError(
                f"{self.engine.name}: {what} has nothing to act on: {source.describe()} has no Linear"
                f"{'' if linear_only else ' or convolution'} layers, so the engine would be the unquantized model under another name.",
                hint=f"measure {self.engine.model} at fp32, fp16 or bf16: leave the {self.engine.variant} variant out for it",
            )
        return resolve_exclude(model, variant.exclude, linear_only, self.engine.variant, source.describe())

    def _on_device(self, model, source, phase: Phases) -> Traced:
        import torch

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
        sample = source.sample_inputs(model, source.trace_point(points), self.model_spec.seed + 1)
        return Traced(model, runnable, device, points, model_inputs, sample)

    def _fp32_references(self, traced: Traced, source) -> References:
        """What every engine of this variant is checked against (pipeline/measuring/accuracy.py): one batch
        per shape point, or the one batch of a model of one shape, and the FP32 model's outputs."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        seed = self.model_spec.seed + 1
        if traced.points:
            batches = {p.label: source.sample_inputs(traced.model, p, seed) for p in traced.points}
            facts = {
                "description": f"the FP32 PyTorch model (attention by the math kernel) on seeded inputs at each shape point (seed {seed})"
            }
        else:
            batch, facts = reference_batch(traced.model, traced.sample[0], self._evaluation_dir(), seed, self.model_spec.checkpoint)
            batches = {None: (batch,)}
        fp32_outputs, kept = {}, KeptFP32Outputs(source, traced.device, self._at_points)
        missing = {label: f"the FP32 model faulted on the GPU at this point: {words}" for label, words in self._faulted.items()}

        def fp32(feeds):
            return traced.runnable(*as_inputs(feeds, traced.device, torch.float32)).float().cpu()

        # Scaled-dot-product attention in the reference is PyTorch's math kernel, the formula
        # itself in FP32: every fused kernel (flash, efficient, cuDNN) is checked against it.
        with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), input_refused_as_error(source, traced.sample[0].shape, traced.model):
            for label, feeds in self._each_point({k: v for k, v in batches.items() if k not in missing}):
                output = kept.output(label, feeds, fp32, "the FP32 reference")
                if output is None:
                    missing[label] = f"the FP32 reference did not fit in memory at this point: {self._at_points.messages[label]}"
                else:
                    fp32_outputs[label] = output
        labels = facts.get("labels")
        if labels:
            predicted = fp32_outputs[None][: len(labels)].argmax(dim=1)
            facts["fp32_top1_accuracy"] = float((predicted == torch.tensor(labels)).float().mean())
        return References(batches, facts, fp32_outputs, missing)

    def _calibration_batches(self, traced: Traced, source) -> tuple[list, list, dict[str, Any]]:
        """The calibration batches, the FP32 model's outputs for them (the accuracy proxy's
        reference), and what they are."""
        import torch

        settings = self.ctx.catalog.calibration
        batches = source.calibration_batches(traced.model, self._calibration_dir(), settings.samples, settings.batch_size)
        calibration = {k: v for k, v in self.calibration_params().items() if k != "files"}
        with torch.no_grad():
            outputs = [traced.runnable(*as_inputs(b, traced.device, torch.float32)).cpu() for b in batches]
        return batches, outputs, calibration

    def _variant_of(self, traced: Traced, source, batches, calibration, excluded, phase: Phases) -> VariantModel:
        """The model of this variant: sparsified, cast to FP16/BF16, or quantized (calibrated on
        ``batches``), with the dtype it runs in."""
        import torch

        variant = self.variant_spec
        runnable, sparsification, quantization, dtype = traced.runnable, None, None, torch.float32
        if variant.sparsity:
            with phase("sparsify"):
                # The module that is exported: ModelOpt keeps its state on the root it converted,
                # and quantizing a wrapper around a converted model fails ("Model has modelopt
                # state but not the root!").
                runnable, sparsification = sparsify_model(runnable, variant.sparsity_method, batches)
        if variant.precision in ("fp16", "bf16"):
            dtype = getattr(torch, TORCH_DTYPES[variant.precision])
            runnable = source.cast(runnable, dtype)
        elif self.quantized:
            if variant.precision in TRACED_HIGH_PRECISION and self.weights_dtype() == "fp16":
                # Calibrated and traced in FP16, so the graph's high precision is FP16 (quantize.py).
                dtype = torch.float16
                runnable = source.cast(runnable, torch.float16)
            prefix = prefix_of(traced.runnable, traced.model)  # how quantizers name the model's layers
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
        return VariantModel(runnable, dtype, sparsification, quantization)

    def _variant_outputs(self, traced: Traced, references: References, variant: VariantModel, batches, reference_outputs):
        """(the accuracy proxy: the variant against the FP32 model on the calibration batches, the
        variant's outputs where parity is checked — the parity points, or the seeded sample)."""
        import torch

        accuracy = None
        if batches:
            with torch.no_grad():
                outputs = [variant.runnable(*as_inputs(b, traced.device, variant.dtype)).float().cpu() for b in batches]
            accuracy = accuracy_proxy(reference_outputs, outputs, self.variant_spec.precision, bool(self.variant_spec.sparsity))
        variant_outputs = {}
        with torch.no_grad():
            if traced.points:
                # Where the FP32 reference could not be made, the variant is not run either (it would
                # fault again, or run out as well): parity is checked at the other points.
                labels = [label for label in parity_points(traced.points, self.model_spec.parity_points) if label not in references.missing]
                parts = PointOutputs(self.ctx.reporter, f"exporting {self.engine.name}")
                for label, feeds in self._each_point({label: references.batches[label] for label in labels}):
                    output = parts.run(
                        label, feeds, lambda f: variant.runnable(*as_inputs(f, traced.device, variant.dtype)).float().cpu(), "parity"
                    )
                    if output is not None:
                        variant_outputs[label] = output.numpy()
            else:  # parity is checked on the seeded sample (the reference may be images)
                variant_outputs[None] = variant.runnable(*as_inputs(traced.sample, traced.device, variant.dtype)).float().cpu().numpy()
        return accuracy, variant_outputs

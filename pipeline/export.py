"""Export stage: timm model → ONNX, checked by running it in ONNX Runtime against PyTorch.

Quantized variants are calibrated with ModelOpt before export, so the ONNX holds the Q/DQ nodes
TensorRT expects. The ONNX is written under a temporary name and only moved into
``models/<model>/<variant>.onnx`` once the checker and the parity test have passed.
"""

from __future__ import annotations

from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.artifacts import atomic_output, sha256_file
from pipeline.errors import PipelineError, require_module
from pipeline.manifest import Artifact, ExportDetails, ParityCheck
from pipeline.quantize import MIN_OPSET, PRESETS, quantize_model
from pipeline.stage import Stage, StageOutcome

# How far the ONNX Runtime output may drift from PyTorch's on the same input, per precision:
# (max |error| relative to the largest |reference| value (at least 1), cosine similarity floor).
# The reference is the PyTorch model of the same precision (fake-quantized for Q/DQ variants),
# so these bound export faithfulness, not quantization error.
PARITY_TOLERANCE = {
    "fp32": (1e-3, 0.99999),
    "fp16": (2e-2, 0.999),
    "int8": (1.5e-1, 0.99),
    "fp8": (1.5e-1, 0.99),
    "mxfp8": (2.5e-1, 0.98),
    "nvfp4": (2.5e-1, 0.98),
}
CALIBRATION_BATCHES = 4
INPUT_NAME, OUTPUT_NAME = "input", "logits"


class ExportStage(Stage):
    name = "export"

    def manifest_path(self) -> Path:
        return self.ctx.workspace.export_manifest_path(self.engine)

    def opset(self) -> int:
        return max(self.ctx.catalog.opset, MIN_OPSET.get(self.variant_spec.precision, 0))

    def params(self) -> dict[str, Any]:
        spec = self.model_spec
        checkpoint = None
        if spec.checkpoint is not None:
            path = self.checkpoint_path()
            checkpoint = {"path": str(spec.checkpoint), "sha256": self.ctx.workspace.hashes.sha256(path)}
        params = {
            "timm_model": spec.timm,
            "batch_size": spec.batch_size,
            "image_size": spec.image_size,
            "seed": spec.seed,
            "checkpoint": checkpoint,
            "opset": self.opset(),
            "precision": self.variant_spec.precision,
            "sparsity": self.variant_spec.sparsity,
            "parity_tolerance": PARITY_TOLERANCE[self.variant_spec.precision],
        }
        if self.variant_spec.precision in PRESETS:
            params["quantization"] = {"preset": PRESETS[self.variant_spec.precision], "calib_batches": CALIBRATION_BATCHES}
        return params

    def identity(self) -> dict[str, Any]:
        versions = {}
        for dist in ("torch", "timm", "onnx", "nvidia-modelopt"):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = None
        return versions

    def checkpoint_path(self) -> Path:
        path = Path(self.model_spec.checkpoint).expanduser()
        if not path.is_absolute():
            path = self.ctx.workspace.root / path
        if not path.is_file():
            raise PipelineError(
                f"checkpoint {path} for model {self.engine.model!r} does not exist.",
                hint="fix `checkpoint` in pipeline.toml, or remove it to export with random weights",
            )
        return path

    def run_impl(self, inputs: list[Artifact]) -> StageOutcome:
        variant = self.variant_spec
        if variant.sparsity:
            raise PipelineError(
                f"variant {self.engine.variant!r} needs 2:4 sparsification, which is not implemented yet.",
                hint="pick a dense variant (fp32, fp16, int8, …)",
            )
        with self.ctx.reporter.captured("export"):
            return self._export()

    def _export(self) -> StageOutcome:
        variant = self.variant_spec
        timm = _import_timm()
        import torch

        spec = self.model_spec
        torch.manual_seed(spec.seed)
        kwargs: dict[str, Any] = {}
        weights = f"random-init (seed {spec.seed})"
        if spec.checkpoint is not None:
            path = self.checkpoint_path()
            kwargs["checkpoint_path"] = str(path)
            weights = f"checkpoint {spec.checkpoint} (sha256 {sha256_file(path)[:16]}…)"
        try:
            model = timm.create_model(spec.timm, pretrained=False, **kwargs)
        except Exception as exc:  # timm raises RuntimeError/KeyError/… for unknown names and bad weights
            raise PipelineError(
                f"timm could not create {spec.timm!r}: {exc}",
                hint="check the model name with timm.list_models() and the checkpoint file",
            ) from exc
        model.eval()

        channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
        if spec.image_size:
            height = width = spec.image_size
        input_shape = (spec.batch_size, channels, height, width)
        dtype = torch.float16 if variant.precision == "fp16" else torch.float32
        device = "cuda" if variant.precision in ("mxfp8", "nvfp4") and torch.cuda.is_available() else "cpu"
        model = model.to(device=device, dtype=dtype)
        generator = torch.Generator().manual_seed(spec.seed + 1)
        sample = torch.randn(*input_shape, generator=generator).to(device=device, dtype=dtype)

        quantization = None
        if variant.precision in PRESETS:
            model, quantization = quantize_model(model, variant.precision, input_shape, CALIBRATION_BATCHES, spec.seed)

        with torch.no_grad():
            reference = model(sample).float().cpu().numpy()

        onnx = require_module("onnx", purpose="ONNX export")
        onnx_path = self.ctx.workspace.onnx_path(self.engine)
        with atomic_output(onnx_path) as tmp:
            self.ctx.reporter.detail(f"torch.onnx.export {spec.timm} {list(input_shape)} opset {self.opset()} → {tmp}")
            try:
                with torch.no_grad():
                    torch.onnx.export(
                        model,
                        (sample,),
                        str(tmp),
                        input_names=[INPUT_NAME],
                        output_names=[OUTPUT_NAME],
                        opset_version=self.opset(),
                        # The TorchScript exporter: ModelOpt's Q/DQ export is built on it.
                        dynamo=False,
                    )
                onnx.checker.check_model(str(tmp))
            except OSError:
                raise
            except Exception as exc:
                raise PipelineError(
                    f"ONNX export of {self.engine.name} failed: {str(exc).strip().splitlines()[0]}",
                    hint="run with -v for the exporter's output",
                ) from exc
            parity = check_parity(tmp, sample.cpu().numpy(), reference, variant.precision)
            if not parity.passed:
                raise PipelineError(
                    f"exported {self.engine.name} does not match PyTorch: max |error| {parity.max_abs_error:.3g} "
                    f"(limit {parity.max_abs_error_limit:.3g}), cosine similarity {parity.cosine_similarity:.6f} "
                    f"(floor {parity.cosine_similarity_floor}).",
                    hint="the ONNX was not kept; try another opset (`opset` in pipeline.toml)",
                )
            ops = op_histogram(onnx.load(str(tmp), load_external_data=False))

        details = ExportDetails(
            timm_model=spec.timm,
            weights=weights,
            input_shape=list(input_shape),
            input_dtype=str(dtype).replace("torch.", ""),
            opset=self.opset(),
            precision=variant.precision,
            sparsity=variant.sparsity,
            quantization=quantization,
            parity=parity,
            onnx_ops=ops,
        )
        return StageOutcome(
            outputs=[self.ctx.workspace.artifact("onnx", onnx_path)],
            details=details,
            note=f" (parity: cosine {parity.cosine_similarity:.6f})",
        )


def _import_timm():
    from pipeline.torch_import import import_timm

    return import_timm()


def op_histogram(model) -> dict[str, int]:
    """Node count per operator; custom domains are prefixed (``trt::TRT_FP4QDQ``)."""
    counts = Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}" for node in model.graph.node
    )
    return dict(sorted(counts.items()))


def check_parity(onnx_path: Path, sample, reference, precision: str) -> ParityCheck:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
        feed_type = session.get_inputs()[0].type
        feed = sample.astype(np.float16 if "float16" in feed_type else np.float32)
        output = session.run(None, {session.get_inputs()[0].name: feed})[0].astype(np.float64)
    except Exception as exc:
        raise PipelineError(
            f"ONNX Runtime could not run the exported model: {str(exc).strip().splitlines()[0]}",
            hint="the ONNX was not kept; run with -v for details",
        ) from exc
    reference = reference.astype(np.float64)
    max_abs = float(np.max(np.abs(output - reference)))
    denominator = float(np.linalg.norm(output) * np.linalg.norm(reference))
    cosine = float(np.dot(output.ravel(), reference.ravel()) / denominator) if denominator else 0.0
    relative_limit, floor = PARITY_TOLERANCE[precision]
    limit = relative_limit * max(1.0, float(np.max(np.abs(reference))))
    return ParityCheck(
        reference=f"PyTorch {precision} model{' (fake-quantized)' if precision in PRESETS else ''}, same input",
        max_abs_error=max_abs,
        cosine_similarity=cosine,
        max_abs_error_limit=limit,
        cosine_similarity_floor=floor,
        passed=bool(max_abs <= limit and cosine >= floor),
    )

"""Writing a model as ONNX and checking what was written: the exporter's call, the names of the
graph's inputs and outputs, parity with PyTorch, the 2:4 pattern, the batch pinned, the opsets, an
audit of the graph, and the exporter's refusal in its own words. The export stage
(pipeline/stages/export.py) decides what is exported; this module writes and checks it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.graph.onnxruntime_cpu import NO_CPU_KERNELS
from pipeline.graph.sanitize import changed, folding_unchecked, sanitize
from pipeline.measuring.out_of_memory import is_out_of_memory
from pipeline.running.errors import PipelineError, UsageError, require_module
from pipeline.running.files import atomic_output
from pipeline.stages.parity import check_parity, worst
from pipeline.stages.quantize import as_inputs
from pipeline.stages.quantized_onnx import export_quantized
from pipeline.stages.sparsify import onnx_sparsity

# Samples the parity check runs for graphs traced with a dynamic batch (CPU traces): more than the
# traced batch, fewer than a batch of 64, which takes ONNX Runtime seconds on the CPU.
PARITY_SAMPLES_DYNAMIC = 8


@dataclass
class Written:
    """What writing the ONNX gave: the graph and what it was checked for, or the exporter's refusal."""

    path: Path
    exporter: str | None = None
    graph: Any = None
    renamed: bool = False
    traced_batch: int | None = None
    refused: str | None = None
    ops: dict[str, int] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)
    parity: Any = None
    parity_skipped: str | None = None
    parity_by_shape: dict = field(default_factory=dict)
    # What constant folding did before the checks (ExportDetails.sanitized).
    sanitized: dict[str, Any] | None = None


class OnnxWriter:
    """The export stage's ONNX: the variant exported under a temporary name, checked (onnx.checker,
    parity against PyTorch, the 2:4 pattern) and moved into place only when every check passed."""

    def __init__(self, stage, phase):
        self.stage, self.phase = stage, phase

    def write(self, traced, source, references, variant, variant_outputs) -> Written:
        """The variant exported to ONNX under a temporary name, checked (onnx.checker, parity, the
        2:4 pattern) and moved into place; a model the exporter refuses leaves no ONNX (the torch
        toolchains still run it) and its reason."""
        onnx_path = self.stage.ctx.workspace.onnx_path(self.stage.engine)
        written = Written(onnx_path)
        try:
            with atomic_output(onnx_path) as tmp:
                graph = written.graph = self._exported_graph(traced, source, variant, tmp, written)
                graph = written.graph = self._sanitized(graph, tmp, written)
                written.ops = op_histogram(graph)
                self._check_parity(traced, references, variant_outputs, tmp, written)
                warning = folding_unchecked(written.sanitized, written.parity_skipped) if written.parity_skipped else None
                if warning:  # the folding too: the parity check is what vouches for it
                    self.stage.ctx.reporter.warn(f"{self.stage.engine.name}: {warning}")
                if written.traced_batch:
                    pin_batch(graph, self.stage.model_spec.batch_size)
                if written.renamed or written.traced_batch:
                    with self.phase("onnx_save"):
                        import onnx

                        onnx.save(graph, str(tmp))
                if variant.sparsification is not None:
                    self._check_sparsity(graph, variant.sparsification)
                written.audit = onnx_audit(graph, tmp.stat().st_size)
        except ExporterRefused as exc:
            # The torch toolchains still run the model; the references are what they are
            # checked against. An ONNX from an earlier export goes: this one has none.
            written.refused = exc.reason
            written.graph = None
            onnx_path.unlink(missing_ok=True)
        return written

    def _sanitized(self, graph, tmp: Path, written: Written):
        """The graph with its constants folded (pipeline/graph/sanitize.py) and saved in place of
        the exporter's, so that parity checks what TensorRT will read; as it was with --no-sanitize."""
        with self.phase("sanitize"):
            folded, written.sanitized = sanitize(graph, asked=self.stage.ctx.catalog.sanitize)
            if folded is not graph:
                import onnx

                onnx.save(folded, str(tmp))
        return folded

    def _exported_graph(self, traced, source, variant, tmp: Path, written: Written):
        """The exporter's graph, loaded once for every check (these graphs are hundreds of MB), its
        inputs and output named as the model family names them."""
        onnx = require_module("onnx", purpose="ONNX export")
        input_names = [i.name for i in traced.inputs]
        dynamic_axes = {i.name: {axis: dim for axis, dim in enumerate(i.dims) if isinstance(dim, str)} for i in traced.inputs}
        dynamic_axes = {name: axes for name, axes in dynamic_axes.items() if axes}
        shapes = ", ".join(f"{i.name} {list(i.dims)}" for i in traced.inputs)
        self.stage.ctx.reporter.detail(f"export {source.describe()} ({shapes}) opset {self.stage.opset()} → {tmp}")
        try:
            with self.phase("onnx_export"):
                inputs = as_inputs(traced.sample, traced.device, variant.dtype)
                if self.stage.quantized:
                    exported = export_quantized(
                        variant.runnable,
                        inputs,
                        tmp,
                        self.stage.opset(),
                        self.stage.weights_dtype(),
                        self.stage.variant_spec.precision,
                        dynamic_axes,
                    )
                    variant.quantization["exporter"], written.traced_batch = exported.exporter, exported.traced_batch
                    written.exporter = exported.exporter
                else:
                    written.exporter = plain_export(
                        variant.runnable,
                        inputs,
                        tmp,
                        input_names,
                        source.output_name(),
                        self.stage.opset(),
                        source.exporter,
                        dynamic_axes,
                        self.stage.ctx.reporter,
                    )
            with self.phase("onnx_checks"):
                graph = onnx.load(str(tmp), load_external_data=False)
                written.renamed = name_io(graph, input_names, source.output_name())
                onnx.checker.check_model(graph)
            return graph
        except (OSError, PipelineError):
            raise
        except Exception as exc:
            ran_out = _out_of_memory_in(exc)
            if ran_out is not None:  # the machine's limit, not the model's: a result of the export
                raise ran_out from exc
            if self.stage.quantized or self.stage.variant_spec.sparsity:
                # ModelOpt's export of a model PyTorch ran: the product's own path, not the module's.
                raise PipelineError(
                    f"ONNX export of {self.stage.engine.name} failed: {str(exc).strip().splitlines()[0]}",
                    hint="run with -v for the exporter's output and the full traceback",
                ) from exc
            raise ExporterRefused(exporter_reason(exc)) from exc

    def _check_parity(self, traced, references, variant_outputs, tmp: Path, written: Written) -> None:
        """The ONNX run in ONNX Runtime against the variant's PyTorch outputs; a miss fails the
        export (the ONNX is not kept). Skipped, with the reason, where ONNX Runtime cannot run it."""
        precision = self.stage.variant_spec.precision
        custom = sorted(op for op in written.ops if "::" in op)
        if custom:
            written.parity_skipped = f"the graph uses TensorRT-only operators ({', '.join(custom)}), which ONNX Runtime cannot run"
            return
        if precision in NO_CPU_KERNELS:  # the parity check runs on ONNX Runtime's CPU provider
            written.parity_skipped = NO_CPU_KERNELS[precision]
            return
        if traced.points and not variant_outputs:
            written.parity_skipped = "no shape point where parity is checked has the model's outputs (out of memory, or a fault)"
            return
        if traced.points:
            # At the smallest and the largest shape point (or every one): the graph's axes really are free.
            with self.phase("parity"):
                for label, feeds in self.stage._each_point({label: references.batches[label] for label in variant_outputs}):
                    written.parity_by_shape[label] = check_parity(tmp, [t.numpy() for t in feeds], variant_outputs[label], precision)
            written.parity = worst(written.parity_by_shape)
        else:
            # A graph traced with a dynamic batch is checked at a batch it was not traced at, which
            # also shows that the batch axis really is free before it is pinned.
            batch = self.stage.model_spec.batch_size
            checked = min(batch, PARITY_SAMPLES_DYNAMIC) if written.traced_batch else batch
            with self.phase("parity"):
                written.parity = check_parity(tmp, [traced.sample[0][:checked].numpy()], variant_outputs[None][:checked], precision)
        parity = written.parity
        if not parity.passed:
            where = next((f" at {label}" for label, check in written.parity_by_shape.items() if check is parity), "")
            raise PipelineError(
                f"exported {self.stage.engine.name} does not match PyTorch{where}: max |error| {parity.max_abs_error:.3g} "
                f"(limit {parity.max_abs_error_limit:.3g}), cosine similarity {parity.cosine_similarity:.6f} "
                f"(floor {parity.cosine_similarity_floor}).",
                hint="the ONNX was not kept; try another opset (`opset` in pipeline.toml)"
                + ("; --no-sanitize exports it without constant folding" if changed(written.sanitized) else ""),
            )

    def _check_sparsity(self, graph, sparsification: dict[str, Any]) -> None:
        """Every layer sparsified in PyTorch is still 2:4-sparse in the ONNX."""
        with self.phase("sparsity_check"):
            sparsification["onnx"] = onnx_sparsity(graph)
        expected = sparsification["sparsified_layers"]
        found = sparsification["onnx"]["weights_2_4"]
        if found < expected:
            raise PipelineError(
                f"the 2:4 pattern was lost in export: {expected} layers are 2:4-sparse in PyTorch, but only "
                f"{found} weights of the ONNX are.",
                hint="the ONNX was not kept; run with -v and report the exporter's output",
            )


# Colours in an exporter's messages (torch.onnx prints its step numbers in them).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


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


def _out_of_memory_in(exc: BaseException) -> BaseException | None:
    """Running out of memory where the exporter met it: the exception itself or one it wraps (the
    torch.export-based exporter reports a MemoryError as its own error, "MemoryError: no message")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if is_out_of_memory(type(exc), exc):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


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

"""What the stages and runtimes ask of a model, whatever family it comes from.

A family (timm, transformers) is one module in this package with one class behind
:class:`ModelSource` and its catalog settings (a :class:`~pipeline.catalog.ModelSpec` subclass),
registered in ``pipeline/models/__init__.py``. Export, build and profile hold a ModelSource and
never check which family it is.

A model has named inputs (:class:`ModelInput`), each with dimensions that are fixed sizes or
named axes ("batch", "sequence"). A :class:`ShapePoint` gives every named axis a size: it is one
column of the comparison, and what the engine is measured at.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pipeline.catalog import ModelSpec, ShapeSizes, VariantSpec
from pipeline.running.errors import PipelineError, UsageError

# torch dtype name of each precision a PyTorch model runs natively; quantized precisions are
# fake-quantized graphs in PyTorch and have no entry.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# The dtype a model input declares when it takes the model's own floating type (images):
# float32 in an FP32 export, float16 in an FP16 one.
MODEL_FLOAT = "float"


@dataclass(frozen=True)
class ModelInput:
    """One input of a model, as its ONNX graph names it."""

    name: str
    # Fixed sizes, or the names of the axes that vary between shape points ("batch", "sequence").
    dims: tuple[int | str, ...]
    # numpy's name ("int64"), or MODEL_FLOAT for the model's floating type.
    dtype: str
    # What its values are, so seeded inputs make sense: "image", "token_ids", "attention_mask",
    # "token_type_ids" or "values" (standard normal).
    kind: str = "values"

    def shape_at(self, point: ShapePoint) -> tuple[int, ...]:
        return tuple(point.size(dim) if isinstance(dim, str) else dim for dim in self.dims)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dims": list(self.dims), "dtype": self.dtype, "kind": self.kind}


@dataclass(frozen=True)
class ShapePoint:
    """A size for every dynamic axis of a model, e.g. batch 2 × sequence 512 ("2x512")."""

    axes: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, text: str, axis_names: tuple[str, ...], model: str) -> ShapePoint:
        """A catalog shape ("2x512") as sizes of ``axis_names`` (("batch", "sequence")); the text is
        read by ShapeSizes, as everywhere a point's text is read."""
        sizes = ShapeSizes.parse(text).sizes
        if len(sizes) != len(axis_names):
            raise UsageError(
                f"model {model!r}: shape {text!r} has {len(sizes)} size(s), but the model's dynamic axes are {' × '.join(axis_names)}.",
                hint=f"write one size per axis, e.g. {'x'.join(['2', '512', '64'][: len(axis_names)])!r}",
            )
        return cls(tuple(zip(axis_names, sizes)))

    @property
    def label(self) -> str:
        """ "2x512"; "static" for the one shape of a graph without dynamic axes."""
        return ShapeSizes(tuple(size for _, size in self.axes)).label

    def size(self, axis: str) -> int:
        for name, size in self.axes:
            if name == axis:
                return size
        raise KeyError(axis)

    def as_dict(self) -> dict[str, int]:
        return dict(self.axes)

    def __str__(self) -> str:
        return self.label


def attention_mask(shape: tuple[int, ...], dtype, generator, padding: bool):
    """A batch's attention mask: ones, and with ``padding`` each sequence after the first cut to
    a seeded length between half and all of it (zeros beyond), as batches of real text are."""
    import torch

    mask = torch.ones(shape, dtype=dtype)
    if padding and len(shape) == 2 and shape[1] > 1:
        for row in range(1, shape[0]):
            length = int(torch.randint(max(1, shape[1] // 2), shape[1] + 1, (1,), generator=generator))
            mask[row, length:] = 0
    return mask


@dataclass(frozen=True)
class PointShapes:
    """Every input's shape at one shape point: what a runtime needs to describe a measurement
    there (the reference batch, :class:`~pipeline.measuring.accuracy.ReferenceBatch`, has the same two
    fields and the values besides)."""

    shape: str
    shapes: dict[str, tuple[int, ...]]


class ModelSource(ABC):
    """One catalog model: how to create it (never a download) and what it is fed."""

    family: ClassVar[str]
    #: The catalog settings of this family (its table key is ``family``).
    Spec: ClassVar[type[ModelSpec]]
    #: How its plain (unquantized) exports are written: "dynamo" (torch.export-based) or
    #: "torchscript". Quantized exports go through ModelOpt's exporter, which is TorchScript.
    exporter: ClassVar[str] = "torchscript"
    #: Whether quantization is limited to the Linear layers (transformers), as opposed to
    #: ModelOpt's preset everywhere it applies.
    quantize_linear_only: ClassVar[bool] = False
    #: Distributions beyond torch, timm, onnx and ModelOpt whose version changes its exports.
    packages: ClassVar[tuple[str, ...]] = ()
    #: Whether there is a PyTorch model to export (and for the torch toolchains to run); a user's
    #: ONNX file has none: it is taken as it is.
    has_pytorch_model: ClassVar[bool] = True

    def __init__(self, name: str, spec: ModelSpec, workspace_root: Path):
        self.name = name
        self.spec = spec
        self.workspace_root = workspace_root
        # Set for the engine of one point of a static model (`static = true`): it is built for
        # exactly that shape.
        self.static_point: ShapePoint | None = None

    @abstractmethod
    def describe(self) -> str:
        """What the model is, for logs and dry runs (e.g. a timm architecture name)."""

    def facts(self) -> dict[str, Any]:
        """What identifies the model beyond its weights, for the export's fingerprint and manifest."""
        return {"family": self.family, "source": self.describe()}

    def input_files(self) -> list[Path]:
        """Files the model is read from (beyond a checkpoint), pinned by content in the export's fingerprint."""
        return []

    def unsupported_variant(self, variant: VariantSpec) -> str | None:
        """Why this model cannot be made in ``variant`` at all (recorded as a skip), or None."""
        return None

    def import_libraries(self) -> None:
        """Import what ``create`` needs, ahead of it: an export times its imports as a phase of
        their own, and a family imports only its own libraries (timm's cost a transformer nothing)."""
        from pipeline.models.torch_import import import_torch

        import_torch()

    @abstractmethod
    def create(self) -> Any:
        """The model in eval mode on the CPU, in FP32, with the catalog's weights."""

    def create_for_weights(self) -> Any:
        """The model as ``create`` makes it, for weights a state dict replaces next (a PyTorch
        engine read back): a family that can leave them uninitialised does so here."""
        return self.create()

    def weights_key(self) -> Hashable | None:
        """What identifies the weights ``create`` makes, where this process can tell: two sources
        of one key make the same weights (a seeded initialisation of one class and config), so a
        process may reuse what it made of them. None where it cannot tell (weights read from
        files, which may change between two runs of one process): nothing is reused."""
        return None

    def runnable(self, model) -> Any:
        """``model`` as a module whose forward takes the inputs in order and returns the one output
        tensor that is exported, compared and checked (a transformer's last hidden state)."""
        return model

    def cast(self, model, dtype) -> Any:
        """``model`` (as ``runnable`` made it) in the floating type ``dtype`` (fp16, bf16), the way
        the family's users run it in that type."""
        return model.to(dtype)

    def use_attention(self, model, implementation: str) -> None:
        """Switch ``model`` (as ``runnable`` made it) to an attention implementation: "sdpa" (PyTorch's
        fused scaled-dot-product attention) or "eager" (the model's own matmul-softmax-matmul), as a
        torch toolchain's `attn_implementation` asks. Raises UsageError where the model has no such choice."""
        raise UsageError(
            f"model {self.name!r} ({self.describe()}) has no choice of attention implementation.",
            hint="leave attn_implementation unset for the torch toolchains that run it",
        )

    @abstractmethod
    def inputs(self, model) -> list[ModelInput]:
        """The model's inputs, in forward()'s order."""

    def shapes_at(self, point: ShapePoint, model=None) -> PointShapes:
        """Each input's shape at ``point``, by name."""
        return PointShapes(point.label, {i.name: i.shape_at(point) for i in self.inputs(model)})

    def output_name(self) -> str:
        return "logits"

    def dynamic_axes(self) -> tuple[str, ...]:
        """The axes that vary between shape points, in the order the catalog's shapes give them."""
        return ()

    def shapes_summary(self) -> str:
        """The shapes it is measured at, in a few words (`pipeline models`)."""
        axes = " × ".join(self.dynamic_axes())
        return f"{', '.join(self.spec.shapes)} ({axes})" if self.spec.shapes else "–"

    def shape_points(self) -> list[ShapePoint]:
        """The catalog's shape points; empty for a model of one fixed shape."""
        return [ShapePoint.parse(text, self.dynamic_axes(), self.name) for text in self.spec.shapes]

    def shape_range(self) -> tuple[ShapePoint, ShapePoint, ShapePoint] | None:
        """The (min, opt, max) shapes engines are built for: the catalog's `shape_range`, else
        from the points: the smallest and largest size of each axis, and for opt the median of
        each axis's sizes (the upper one of two), where TensorRT tunes its kernels. None for a
        model of one shape. A point outside a given range is refused here, before any work."""
        if self.static_point is not None:
            return self.static_point, self.static_point, self.static_point
        points = self.shape_points()
        if not points:
            return None
        axes = self.dynamic_axes()
        given = self.spec.shape_range
        if given is not None:
            low, opt, high = (ShapePoint.parse(text, axes, self.name) for text in (given.min, given.opt, given.max))
            for name, size in low.axes:
                if not size <= opt.size(name) <= high.size(name):
                    raise UsageError(
                        f"model {self.name!r}: shape_range {given.min} / {given.opt} / {given.max} is not ordered in {name}.",
                        hint="give min ≤ opt ≤ max for every axis",
                    )
            outside = [p.label for p in points if any(not low.size(a) <= s <= high.size(a) for a, s in p.axes)]
            if outside:
                raise UsageError(
                    f"model {self.name!r}: shape point(s) {', '.join(outside)} lie outside the engines' shape_range "
                    f"(min {given.min}, max {given.max}), so no engine could run them.",
                    hint="widen shape_range, or drop those points from shapes",
                )
            return low, opt, high

        def pick(choose) -> ShapePoint:
            return ShapePoint(tuple((axis, choose(sorted(p.size(axis) for p in points))) for axis in axes))

        return pick(lambda sizes: sizes[0]), pick(lambda sizes: sizes[len(sizes) // 2]), pick(lambda sizes: sizes[-1])

    def input_ranges(self, model=None) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """(min, opt, max) shape of every input with a dynamic axis, by name; empty for one shape."""
        shape_range = self.shape_range()
        if shape_range is None:
            return {}
        return {
            i.name: tuple(i.shape_at(point) for point in shape_range)
            for i in self.inputs(model)
            if any(isinstance(dim, str) for dim in i.dims)
        }

    def check_point(self, model, point: ShapePoint) -> None:  # noqa: B027 — optional: most models take any size
        """Raise a user error when the model cannot take this shape (a sequence beyond its positions).
        ``model`` is None where none was created (a dry run): the family then reads what it needs
        from its configuration."""

    def check_points(self, model=None) -> list[ShapePoint]:
        """The shape points, once the model can take each and the engines' range holds them all:
        what an export would refuse, refused before any work (a dry run asks the same)."""
        points = self.shape_points()
        self.shape_range()
        for point in points:
            self.check_point(model, point)
        return points

    def trace_point(self, points: list[ShapePoint]) -> ShapePoint | None:
        """The shape the graph is traced at: the smallest point, with every axis of size 1 made 2.
        The exporters specialise a dimension they see at size 1 (torch.export's 0/1 rule, a trace
        broadcasting over it), which would fix a decoder's batch at 1 in the graph; at 2 the axis
        stays free and the graph still runs at 1. None for a model of one shape."""
        if not points:
            return None
        smallest = min(points, key=lambda p: [size for _, size in p.axes])
        return ShapePoint(tuple((axis, max(size, 2)) for axis, size in smallest.axes))

    def flops(self, point: ShapePoint | None) -> float | None:
        """The FLOPs of one forward at ``point`` where the model counts them itself; None otherwise
        (the report then counts the ONNX graph's matrix products, for a model of one shape)."""
        return None

    def input_refused(self, exc: BaseException, shape, model) -> PipelineError:
        """The error for the model refusing the input its shape asks for (its forward raised)."""
        native = getattr(model, "pretrained_cfg", {}).get("input_size")
        return PipelineError(
            f"{self.describe()} cannot take a {'×'.join(map(str, shape))} input: {str(exc).strip() or type(exc).__name__}",
            hint=(f"its own input is {'×'.join(map(str, native))}; " if native else "")
            + "set the model's image_size in pipeline.toml to a size it accepts, or remove it",
        )

    @abstractmethod
    def sample_inputs(self, model, point: ShapePoint | None, seed: int) -> tuple:
        """Seeded inputs at ``point`` (None: the model's one fixed shape), as CPU tensors in
        inputs()'s order; integer inputs hold valid token ids and masks."""

    def describe_calibration(self, directory: Path | None, samples: int, batch_size: int) -> dict[str, Any]:
        """What calibration_batches feeds, for the manifest."""
        if directory is not None:
            raise UsageError(
                f"model {self.name!r} calibrates on seeded inputs of its own; a calibration folder ({directory}) is for image models.",
                hint="leave out --calib-dir (and [calibration] directory) for this model",
            )
        return {"source": "seeded synthetic inputs at the first shape point", "samples": samples, "batch_size": batch_size}

    def describe_evaluation(self, directory: Path) -> dict[str, Any]:
        """What an evaluation folder (`--eval-dir`) gives this model's reference batch."""
        raise UsageError(
            f"model {self.name!r} has no use for an evaluation folder of images ({directory}).",
            hint="leave out --eval-dir for this model",
        )

    def evaluation_batches(self, model, directory: Path, files: list[Path], batch_size: int) -> list[tuple]:
        """Images of an evaluation folder as input batches of ``batch_size``, for an image model
        (`pipeline sensitivity` and `plan` on the user's data)."""
        self.describe_evaluation(directory)  # raises: this family has no use for images
        return []

    def token_batches(self, model, path: Path, rows: list[int]) -> tuple:
        """Rows of a token-id file as one input batch (`--eval-tokens`), for a model that takes
        token ids."""
        raise UsageError(f"model {self.name!r} takes no token ids ({path}).", hint="leave out --eval-tokens for this model")

    def token_rows(self, model, path: Path) -> int:
        """How many sequences a token-id file holds, checked for this model."""
        self.token_batches(model, path, [])  # raises: this family takes no token ids
        return 0

    def calibration_batches(self, model, directory: Path | None, samples: int, batch_size: int) -> list[tuple]:
        """Inputs for quantization and sparsegpt calibration, as tuples in inputs()'s order."""
        points = self.shape_points()
        point = points[0] if points else None
        batches = []
        for number, start in enumerate(range(0, samples, batch_size)):
            count = min(batch_size, samples - start)
            batch = self.sample_inputs(model, self.at_batch(point, count), self.spec.seed + 2 + number)
            batches.append(batch)
        return batches

    def at_batch(self, point: ShapePoint | None, batch: int) -> ShapePoint | None:
        if point is None:
            return None
        return ShapePoint(tuple((axis, batch if axis == "batch" else size) for axis, size in point.axes))

    def in_workspace(self, path: Path) -> Path:
        """A path from the catalog: ``~`` expanded, relative ones from the workspace."""
        path = Path(path).expanduser()
        return path if path.is_absolute() else self.workspace_root / path

    def weights_words(self) -> str:
        """Where its weights come from, for `pipeline models`."""
        return f"checkpoint {self.spec.checkpoint}" if self.spec.checkpoint else f"random init (seed {self.spec.seed})"

    def checkpoint_path(self) -> Path | None:
        """The catalog's local weights file (relative paths from the workspace), or None for seeded random weights."""
        if self.spec.checkpoint is None:
            return None
        path = self.in_workspace(self.spec.checkpoint)
        if not path.is_file():
            raise PipelineError(
                f"checkpoint {path} for model {self.name!r} does not exist.",
                hint="fix `checkpoint` in pipeline.toml, or remove it to export with random weights",
            )
        return path

"""A user's own ONNX file: nothing is exported, the graph is built as it is.

Its inputs, their types and their dynamic axes are read from the graph: every dynamic dimension
must be named (``dim_param``, e.g. "batch", "sequence"), and the catalog's shape points give those
names sizes, in the order they first appear among the inputs (or the order `axes` lists).
Integer inputs are fed seeded token ids below the size of the table they index (the graph's
embedding ``Gather``, or `vocab_size`), or attention masks where the input's name says mask.
The accuracy reference is the file itself, run in ONNX Runtime on the CPU: every engine built from
it is checked against what the graph computes in FP32.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pydantic import Field

from pipeline.catalog import ModelSpec, VariantSpec
from pipeline.models.base import ModelInput, ModelSource, ShapePoint, attention_mask
from pipeline.running.errors import PipelineError, UsageError

# ONNX element types the pipeline feeds, by their numpy names (onnx.TensorProto values).
_ELEMENT_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 6: "int32", 7: "int64", 9: "bool"}


class OnnxSpec(ModelSpec):
    """A user's ONNX file (relative paths from the workspace)."""

    onnx: Path = Field(description="the ONNX file, e.g. models-in/encoder.onnx")
    # The order of the graph's dynamic axes in `shapes` ("2x512": batch, sequence); default: the
    # order in which they first appear among the inputs.
    axes: tuple[str, ...] = ()
    # Token ids are drawn below this; default: the first dimension of the table each integer input
    # indexes in the graph (its embedding).
    vocab_size: int | None = Field(default=None, gt=1)
    # Pad the sequences after the first of each batch (attention masks zero at their end).
    padding: bool = True
    # A folder of the user's own reference, one `<point>.npz` per shape point ("2x128.npz") holding
    # an array per graph input and one for its first output, by name: engines are then checked on
    # these inputs against these outputs, instead of seeded inputs and the file's own outputs.
    reference: Path | None = None

    def family(self) -> str:
        return "onnx"


class OnnxModel(ModelSource):
    """A user's ONNX graph with named inputs and named dynamic axes."""

    family = "onnx"
    Spec = OnnxSpec
    exporter = "none"
    has_pytorch_model = False

    def path(self) -> Path:
        path = self.in_workspace(self.spec.onnx)
        if not path.is_file():
            raise UsageError(f"model {self.name!r}: ONNX file {path} does not exist.", hint="fix `onnx` in pipeline.toml")
        return path

    def weights_words(self) -> str:
        return f"as in {self.spec.onnx}"

    def describe(self) -> str:
        return f"ONNX file {self.spec.onnx}"

    def facts(self) -> dict[str, Any]:
        return {
            "onnx_file": str(self.spec.onnx),
            "axes": list(self.spec.axes),
            "vocab_size": self.spec.vocab_size,
            "padding": self.spec.padding,
        }

    def input_files(self) -> list[Path]:
        return [self.path(), *self.data_files(), *self.reference_files().values()]

    def data_files(self) -> list[Path]:
        """The external data files holding the graph's weights, named relative to its folder (as
        pipeline/graph/external.py reads them; onnx.save writes only initializers there unless
        told otherwise); empty where the file holds them. Refused where one is not there."""
        path = self.path()
        named = (entry.value for t in self.graph.graph.initializer for entry in t.external_data if entry.key == "location")
        files = [path.parent / name for name in dict.fromkeys(named)]
        missing = [file.name for file in files if not file.is_file()]
        if missing:
            raise UsageError(
                f"model {self.name!r}: {path} keeps its weights in external data file(s) {', '.join(missing)}, which are not beside it.",
                hint="keep the data files where the model was saved with them: their names are relative to the model's folder",
            )
        return files

    def reference_files(self) -> dict[str, Path]:
        """The user's reference file of each shape point, by point; empty without `reference`."""
        if self.spec.reference is None:
            return {}
        folder = self.in_workspace(self.spec.reference)
        files = {point.label: folder / f"{point.label}.npz" for point in self.shape_points()}
        missing = [path.name for path in files.values() if not path.is_file()]
        if missing:
            raise UsageError(
                f"model {self.name!r}: the reference folder {folder} has no {', '.join(missing)}.",
                hint="save one .npz per shape point with an array per input and one for the output, named as in the graph",
            )
        return files

    def describe_reference(self, seed: int) -> str:
        """What engines of this model are checked against, for the manifest."""
        if self.spec.reference is not None:
            return f"the inputs and outputs given in {self.spec.reference}, at each shape point"
        return f"{self.describe()} itself in ONNX Runtime (CPU, FP32) on seeded inputs at each shape point (seed {seed})"

    def user_reference(self, point: ShapePoint) -> tuple[tuple, Any] | None:
        """(inputs in the graph's order, output) from the user's reference at ``point``, checked
        against the graph's names and the point's shapes; None without `reference`."""
        files = self.reference_files()
        if not files:
            return None
        import numpy as np
        import torch

        path = files[point.label]
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"model {self.name!r}: {path} is not a readable .npz file: {exc}.",
                hint="save it with numpy.savez(path, **{name: array}), an array per input and one for the output",
            ) from None
        wanted = [i.name for i in self.inputs()] + [self.output_name()]
        missing = [name for name in wanted if name not in arrays]
        if missing:
            raise UsageError(
                f"model {self.name!r}: {path} has no array(s) {', '.join(map(repr, missing))} (it has {', '.join(map(repr, arrays)) or 'none'}).",
                hint="name the arrays after the graph's inputs and its first output",
            )
        inputs = []
        for spec in self.inputs():
            value = arrays[spec.name]
            if tuple(value.shape) != spec.shape_at(point):
                raise UsageError(
                    f"model {self.name!r}: {spec.name!r} in {path} has shape {list(value.shape)}; at shape point {point} it is "
                    f"{list(spec.shape_at(point))}.",
                    hint=f"save the inputs of {path.name} at the sizes of shape point {point}",
                )
            inputs.append(torch.from_numpy(value.astype(spec.dtype)))
        return tuple(inputs), torch.from_numpy(arrays[self.output_name()].astype("float32"))

    @property
    def graph(self):
        """The graph as read from the file, once it is known to be a whole ONNX model: an empty
        file, bytes that do not decode and a file cut short are refused here, before any use of
        the graph, so each gets the same error whatever the catalog says of it."""
        path = self.path()
        stat = path.stat()
        hint = f"export the model to ONNX again, or point `onnx` of models.{self.name} in pipeline.toml at the complete file"
        if stat.st_size == 0:
            raise UsageError(f"model {self.name!r}: {path} is empty (0 bytes): it holds no ONNX model.", hint=hint)
        try:
            graph = _load_graph(str(path), stat.st_mtime_ns, stat.st_size)
        except Exception as exc:  # onnx raises DecodeError and others for files that are not ONNX
            raise UsageError(
                f"model {self.name!r}: {path} ({stat.st_size} bytes) is not an ONNX file, or one cut short: {str(exc).strip()}.", hint=hint
            ) from None
        missing = [
            what
            for what, there in (("ir_version", graph.ir_version), ("opset", graph.opset_import), ("graph output", graph.graph.output))
            if not there
        ]
        if missing:
            raise UsageError(
                f"model {self.name!r}: {path} ({stat.st_size} bytes) is no whole ONNX model: it has no {', no '.join(missing)} "
                "(a file cut short, or not ONNX).",
                hint=hint,
            )
        return graph

    def create(self):
        raise PipelineError(f"model {self.name!r} is an ONNX file: it has no PyTorch model.")

    def unsupported_variant(self, variant: VariantSpec) -> str | None:
        if variant.precision != "fp32" or variant.sparsity:
            return (
                "a user's ONNX is built as it is (the fp32 variant); quantized, half-precision and sparse variants need its PyTorch model"
            )
        return None

    # --- inputs -----------------------------------------------------------------------------------

    def inputs(self, model=None) -> list[ModelInput]:
        initializers = {tensor.name for tensor in self.graph.graph.initializer}
        inputs, unnamed = [], []
        for value in self.graph.graph.input:
            if value.name in initializers:
                continue
            tensor = value.type.tensor_type
            dims: list[int | str] = []
            for dim in tensor.shape.dim:
                if dim.HasField("dim_value") and dim.dim_value > 0:
                    dims.append(int(dim.dim_value))
                elif dim.dim_param:
                    dims.append(dim.dim_param)
                else:
                    dims.append("?")
            if "?" in dims or not tensor.HasField("shape"):
                unnamed.append(value.name)
            dtype = _ELEMENT_TYPES.get(tensor.elem_type)
            if dtype is None:
                raise UsageError(
                    f"model {self.name!r}: input {value.name!r} has ONNX element type {tensor.elem_type}, which the pipeline does not feed.",
                    hint=f"give the graph inputs of {', '.join(_ELEMENT_TYPES.values())} (a Cast after the input)",
                )
            kind = "values"
            if dtype.startswith("int"):
                kind = "attention_mask" if "mask" in value.name.lower() else "token_ids"
            inputs.append(ModelInput(value.name, tuple(dims), dtype, kind))
        if unnamed:
            listing = "; ".join(f"{i.name} [{', '.join(map(str, i.dims)) or 'no shape'}]" for i in inputs)
            raise UsageError(
                f"model {self.name!r}: input(s) {', '.join(unnamed)} of {self.spec.onnx} have dimensions without a size or a name, "
                f"so no shape point can size them. Its inputs: {listing}.",
                hint="export the graph with named dynamic axes (e.g. dynamic_shapes / dynamic_axes naming batch and sequence)",
            )
        return inputs

    def output_name(self) -> str:
        return self.graph.graph.output[0].name

    def dynamic_axes(self) -> tuple[str, ...]:
        found = list(dict.fromkeys(dim for i in self.inputs() for dim in i.dims if isinstance(dim, str)))
        if not self.spec.axes:
            return tuple(found)
        if sorted(self.spec.axes) != sorted(found):
            raise UsageError(
                f"model {self.name!r}: axes {list(self.spec.axes)} contradict the graph, whose dynamic axes are {found or 'none'}.",
                hint="list each of the graph's dynamic axes once in `axes`, or leave it out",
            )
        return tuple(self.spec.axes)

    def shape_points(self) -> list[ShapePoint]:
        if not self.dynamic_axes():
            if self.spec.shapes:
                raise UsageError(
                    f"model {self.name!r}: {self.spec.onnx} has no dynamic axes, so `shapes` cannot size any.", hint="remove `shapes`"
                )
            return [ShapePoint(())]  # its one static shape
        if not self.spec.shapes:
            listing = "; ".join(f"{i.name} [{', '.join(map(str, i.dims))}]" for i in self.inputs())
            raise UsageError(
                f"model {self.name!r}: the catalog gives no shape for the graph's dynamic axes {' × '.join(self.dynamic_axes())} "
                f"(its inputs: {listing}).",
                hint=f'list the points to measure, e.g. shapes = ["{"x".join(["2", "128", "8"][: len(self.dynamic_axes())])}"]',
            )
        return super().shape_points()

    def vocabulary(self, name: str) -> int:
        """Token ids of input ``name`` stay below this: the catalog's, else the rows of the table it indexes."""
        if self.spec.vocab_size:
            return self.spec.vocab_size
        tables = {tensor.name: list(tensor.dims) for tensor in self.graph.graph.initializer}
        for node in self.graph.graph.node:
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in tables:
                return int(tables[node.input[0]][0])
        return 2  # 0 and 1 index any table

    def sample_inputs(self, model, point: ShapePoint | None, seed: int) -> tuple:
        import torch

        generator = torch.Generator().manual_seed(seed)
        tensors = []
        for spec in self.inputs():
            shape = spec.shape_at(point) if point is not None else tuple(spec.dims)
            dtype = getattr(torch, spec.dtype)
            if spec.kind == "attention_mask":
                tensors.append(attention_mask(shape, dtype, generator, self.spec.padding))
            elif spec.kind == "token_ids":
                tensors.append(torch.randint(0, self.vocabulary(spec.name), shape, generator=generator, dtype=dtype))
            else:
                tensors.append(torch.randn(shape, generator=generator).to(dtype))
        return tuple(tensors)

    def shapes_summary(self) -> str:
        try:
            axes = " × ".join(self.dynamic_axes())
        except PipelineError:
            return ", ".join(self.spec.shapes) or "–"
        return f"{', '.join(self.spec.shapes)} ({axes})" if self.spec.shapes else "static"


@functools.lru_cache(maxsize=2)
def _load_graph(path: str, mtime_ns: int, size: int):
    """The graph without its weights' external data, read once per version of the file (every
    stage asks for its inputs)."""
    import onnx

    return onnx.load(path, load_external_data=False)

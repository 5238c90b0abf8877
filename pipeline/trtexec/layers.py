"""What an engine is made of: its layers, their data types, tactics and ONNX nodes, and its I/O tensors.

TensorRT describes an engine's layers in two places, in the same words: the JSON written by
trtexec ``--exportLayerInfo`` and the text printed by ``--dumpLayerInfo`` (and by TensorRT-RTX's
builder at detailed verbosity). The format changed in TensorRT 11.0 (recorded B200 output in
tests/data/trtexec, INDEX §g):

- 10.x: each layer tensor is ``{Name, Location, Dimensions, "Format/Datatype": "Half"}``; the I/O
  list is ``"Bindings": ["x", "y"]``; layers carry their parameters (``ParameterType``, ``Kernel``…)
  and ``TacticValue``.
- 11.x (and TensorRT-RTX): ``{Name, Dimensions, Strides, StrideOrder, "Datatype": "Half",
  "Format": "…"}``, a ``Constants`` list per layer, ``TacticName`` only, and ``"I/O Tensors"``:
  objects with ``IOMode``, ``DataType``, ``Dimensions`` and ``ProfileInfo`` (min/opt/max).

Both are read into the same typed layers. Keys this reader does not know are named in
``LayerInfo.unknown_keys`` rather than failing: a future release keeps what is still readable.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from pipeline.running.errors import PipelineError
from pipeline.trtexec.text import log_lines, read_document

# --- data types ----------------------------------------------------------------------------------

# TensorRT prints data types by name ("Half") or inside format descriptions
# ("Channel major FP16 format where channel % 8 == 0"). Checked in order: BFloat16 before Float.
_DTYPE_PATTERNS = (
    ("bf16", re.compile(r"BFloat16|BF16", re.I)),
    # "FP4E2M1" in TensorRT-RTX's layer dump: no word boundary after the 4.
    ("fp4", re.compile(r"\bFP4|\bFloat4|\bE2M1", re.I)),
    ("fp8", re.compile(r"\bFP8\b|\bFloat8|\bE4M3", re.I)),
    ("e8m0", re.compile(r"\bE8M0\b", re.I)),
    ("fp16", re.compile(r"\bHalf\b|\bFP16\b", re.I)),
    ("int4", re.compile(r"\bInt4\b", re.I)),
    ("int8", re.compile(r"\bInt8\b", re.I)),
    ("uint8", re.compile(r"\bUInt8\b", re.I)),
    ("int32", re.compile(r"\bInt32\b", re.I)),
    ("uint64", re.compile(r"\bUInt64\b", re.I)),
    ("int64", re.compile(r"\bInt64\b", re.I)),
    ("bool", re.compile(r"\bBool\b", re.I)),
    ("fp32", re.compile(r"\bFloat\b|\bFP32\b", re.I)),
)


def normalise_dtype(text: str | None) -> str:
    for name, pattern in _DTYPE_PATTERNS:
        if text and pattern.search(text):
            return name
    return "unknown"


# The data types a layer computes in, narrowest first. Scale types (e8m0) and index types (int32,
# int64) say nothing about the math precision, so they never decide a layer's precision.
MATH_TYPES = ("int4", "fp4", "int8", "fp8", "fp16", "bf16", "fp32")

# The data type a variant's layers should show when TensorRT honoured its precision.
INTENDED_DTYPE = {"fp16": "fp16", "bf16": "bf16", "int8": "int8", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}

NO_OUTPUT = "no output"


# --- the typed description -----------------------------------------------------------------------


class LayerTensor(BaseModel):
    name: str | None = None
    dtype: str = "unknown"  # normalised: "fp16", "fp32", "int64", …
    format: str | None = None  # as TensorRT printed it
    dimensions: list[int] | None = None


class EngineLayer(BaseModel):
    name: str
    layer_type: str | None = None
    inputs: list[LayerTensor] = []
    constants: list[LayerTensor] = []
    outputs: list[LayerTensor] = []
    # The kernel TensorRT chose: TacticName (10.x with detailed verbosity, 11.x), else TacticValue.
    tactic: str | None = None
    # The ONNX nodes this layer implements, from its Metadata ("[ONNX Layer: node_conv2d]…").
    onnx_nodes: list[str] = []

    @property
    def output_type(self) -> str:
        return self.outputs[0].dtype if self.outputs else NO_OUTPUT

    @property
    def precision(self) -> str:
        """The narrowest type the layer computes in: a GEMM with FP8 inputs and FP8 weights that
        writes FP16 is an FP8 layer. Layers with no floating or integer math inputs fall back to
        their first output's type."""
        seen = {tensor.dtype for tensor in self.inputs + self.constants}
        for dtype in MATH_TYPES:
            if dtype in seen:
                return dtype
        return self.output_type


class ProfileRange(BaseModel):
    min: list[int] | None = None
    opt: list[int] | None = None
    max: list[int] | None = None


class IOTensor(BaseModel):
    name: str
    io: Literal["input", "output"] | None = None  # None: a 10.x binding name, which says neither
    dtype: str = "unknown"
    dimensions: list[int] | None = None
    profiles: list[ProfileRange] = []


class PrecisionAudit(BaseModel):
    """What precision the engine's layers actually run in."""

    layers: int
    # Layers per data type of their first output ("fp16": 12, …); "unknown" without detail,
    # "no output" for layers that write nothing (TensorRT 11's L2-cache management layers).
    output_types: dict[str, int]
    # Layers per precision they compute in (see EngineLayer.precision).
    precisions: dict[str, int] = {}
    # Every data type seen on any layer input, constant or output.
    types_seen: list[str]
    intended: str | None = None
    intended_found: bool | None = None
    warning: str | None = None


class LayerInfo(BaseModel):
    """An engine's layer information in either verbosity: names only, or detailed descriptions."""

    verbosity: Literal["detailed", "layer_names_only"]
    # Which layout it was read from: "10.x json", "11.x json", "text dump", "pipeline".
    source_format: str = "pipeline"
    layer_names: list[str]
    layers: list[EngineLayer] = []
    io_tensors: list[IOTensor] = []
    # Keys this reader does not know (a newer TensorRT), "Layers[].Foo" style.
    unknown_keys: list[str] = []

    def layer(self, name: str) -> EngineLayer | None:
        return next((layer for layer in self.layers if layer.name == name), None)

    def audit(self, intended: str | None = None) -> PrecisionAudit:
        outputs: Counter[str] = Counter(layer.output_type for layer in self.layers)
        precisions: Counter[str] = Counter(layer.precision for layer in self.layers)
        seen = {t.dtype for layer in self.layers for t in layer.inputs + layer.constants + layer.outputs}
        if not self.layers:
            outputs["unknown"] = len(self.layer_names)
        audit = PrecisionAudit(
            layers=len(self.layer_names),
            output_types=dict(outputs),
            precisions=dict(precisions) if self.layers else {},
            types_seen=sorted(seen),
            intended=intended,
        )
        wanted = INTENDED_DTYPE.get(intended or "")
        known = seen - {"unknown"}
        if wanted and known:
            audit.intended_found = wanted in known
            if not audit.intended_found:
                fell_back = ", ".join(sorted(set(outputs) - {"unknown", NO_OUTPUT}))
                audit.warning = (
                    f"no layer runs in {wanted} although the variant is {intended}: TensorRT fell back to {fell_back} (a silent fallback)"
                )
        return audit


# --- reading the JSON ----------------------------------------------------------------------------

_DOCUMENT_KEYS = {"Layers", "Bindings", "I/O Tensors"}
# Per layer: what is read, and what 10.x prints per layer type (parameters kept by TensorRT,
# not needed here; listed so that they are not reported as unknown).
_LAYER_KEYS = {"Name", "LayerType", "Inputs", "Outputs", "Constants", "TacticName", "TacticValue", "StreamId", "Metadata"}
_TENSOR_KEYS = {"Name", "Location", "Dimensions", "Format/Datatype", "Datatype", "DataType", "Format", "Strides", "StrideOrder"}
_IO_KEYS = {"Name", "IOMode", "DataType", "Datatype", "Dimensions", "Location", "IsShapeInferenceIO", "ProfileInfo"}
_ONNX_NODE = re.compile(r"\[ONNX Layer: ([^\]\x1e\x1f]*)\]")


def layer_info_from_document(data: Any, where: str = "layer information") -> LayerInfo:
    """``--exportLayerInfo``'s JSON (10.x or 11.x), or this pipeline's own saved LayerInfo."""
    if isinstance(data, dict) and "verbosity" in data and "layer_names" in data:
        return _own_document(data)
    if not isinstance(data, dict) or "Layers" not in data:
        raise PipelineError(f'{where} is not a trtexec --exportLayerInfo file (no "Layers").')
    unknown = [key for key in data if key not in _DOCUMENT_KEYS]
    raw_layers = data.get("Layers") or []
    io_tensors = [_io_tensor(entry, unknown) for entry in data.get("I/O Tensors") or []]
    io_tensors += [IOTensor(name=str(name)) for name in data.get("Bindings") or [] if isinstance(name, str)]
    source_format = "11.x json" if "I/O Tensors" in data else "10.x json"
    if all(isinstance(layer, str) for layer in raw_layers):
        return LayerInfo(
            verbosity="layer_names_only",
            source_format=source_format,
            layer_names=list(raw_layers),
            io_tensors=io_tensors,
            unknown_keys=unknown,
        )
    layers = [_layer(entry, unknown) for entry in raw_layers if isinstance(entry, dict)]
    return LayerInfo(
        verbosity="detailed",
        source_format=source_format,
        layer_names=[layer.name for layer in layers],
        layers=layers,
        io_tensors=io_tensors,
        unknown_keys=sorted(set(unknown), key=unknown.index),
    )


def _own_document(data: dict) -> LayerInfo:
    layers = data.get("layers") or []
    if layers and isinstance(layers[0], dict) and "Name" in layers[0]:
        # Written by an earlier version of this pipeline: TensorRT's own layer dicts.
        unknown: list[str] = []
        data = {**data, "layers": [_layer(entry, unknown).model_dump() for entry in layers]}
    return LayerInfo.model_validate(data)


def _layer(entry: dict, unknown: list[str]) -> EngineLayer:
    # 10.x layers describe their parameters after "ParameterType" (Kernel, Weights, HasReLU…): known.
    if "ParameterType" not in entry:
        unknown += [f"Layers[].{key}" for key in entry if key not in _LAYER_KEYS]
    tactic = entry.get("TacticName") or entry.get("TacticValue")
    return EngineLayer(
        name=str(entry.get("Name", "")),
        layer_type=str(entry["LayerType"]) if entry.get("LayerType") is not None else None,
        inputs=[_tensor(t, unknown) for t in entry.get("Inputs") or [] if isinstance(t, dict)],
        constants=[_tensor(t, unknown) for t in entry.get("Constants") or [] if isinstance(t, dict)],
        outputs=[_tensor(t, unknown) for t in entry.get("Outputs") or [] if isinstance(t, dict)],
        tactic=str(tactic) if tactic not in (None, "") else None,
        onnx_nodes=onnx_nodes(str(entry.get("Metadata") or "")),
    )


def _tensor(entry: dict, unknown: list[str]) -> LayerTensor:
    unknown += [f"Layers[].Inputs[].{key}" for key in entry if key not in _TENSOR_KEYS]
    # 11.x: "Datatype" and "Format" apart; 10.x: "Format/Datatype" together ("Channel major FP16 …").
    dtype_text = entry.get("Datatype") or entry.get("DataType") or entry.get("Format/Datatype")
    return LayerTensor(
        name=entry.get("Name"),
        dtype=normalise_dtype(str(dtype_text)) if dtype_text is not None else "unknown",
        format=entry.get("Format") or entry.get("Format/Datatype"),
        dimensions=_dims(entry.get("Dimensions")),
    )


def _io_tensor(entry: Any, unknown: list[str]) -> IOTensor:
    if not isinstance(entry, dict):
        return IOTensor(name=str(entry))
    unknown += [f"I/O Tensors[].{key}" for key in entry if key not in _IO_KEYS]
    mode = str(entry.get("IOMode", "")).lower()
    profiles = [
        ProfileRange(min=_dims(p.get("MinShape")), opt=_dims(p.get("OptShape")), max=_dims(p.get("MaxShape")))
        for p in entry.get("ProfileInfo") or []
        if isinstance(p, dict) and any(key in p for key in ("MinShape", "OptShape", "MaxShape"))
    ]
    return IOTensor(
        name=str(entry.get("Name", "")),
        io=mode if mode in ("input", "output") else None,
        dtype=normalise_dtype(str(entry.get("DataType") or entry.get("Datatype") or "")),
        dimensions=_dims(entry.get("Dimensions")),
        profiles=profiles,
    )


def _dims(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    if isinstance(value, str):
        numbers = re.findall(r"-?\d+", value)
        return [int(n) for n in numbers] if numbers else None
    return None


def onnx_nodes(metadata: str) -> list[str]:
    """The ONNX node names in a layer's Metadata, in order (TensorRT joins them with \\x1e/\\x1f)."""
    return [name.strip() for name in _ONNX_NODE.findall(metadata) if name.strip()]


# --- reading the text dump -----------------------------------------------------------------------

# A layer line of the dump: "Name: …, LayerType: …, Inputs: [ { … } ], …, Metadata: …".
_DUMPED_LAYER = re.compile(r"^\s*Name: .*?, LayerType: ")
# An I/O tensor line (11.x): " Name: x, IOMode: Input, DataType: Float, …".
_DUMPED_IO = re.compile(r"^\s*Name: .*?, IOMode: ")
# Where the next field of a dumped object starts: ", Key: ".
_NEXT_KEY = re.compile(r", (?=[A-Z][A-Za-z/]*: )")
_KEY = re.compile(r"\s*([A-Za-z][A-Za-z/ ]*?): ")


def layer_info_from_dump(text: str) -> LayerInfo | None:
    """The layers of a text layer dump, as typed layers (None when the text holds none)."""
    layers: list[EngineLayer] = []
    io_tensors: list[IOTensor] = []
    unknown: list[str] = []
    for line in log_lines(text):
        if _DUMPED_LAYER.match(line):
            layers.append(_layer(_dumped_object(line.strip()), unknown))
        elif _DUMPED_IO.match(line):
            io_tensors.append(_io_tensor(_dumped_object(line.strip()), unknown))
    if not layers:
        return None
    return LayerInfo(
        verbosity="detailed",
        source_format="text dump",
        layer_names=[layer.name for layer in layers],
        layers=layers,
        io_tensors=io_tensors,
        unknown_keys=sorted(set(unknown), key=unknown.index),
    )


def _dumped_object(text: str, nested: bool = False) -> dict[str, Any]:
    """One ``Key: value, Key: value`` object of the dump, values nested as TensorRT prints them:
    ``[ { … }, { … } ]`` lists of tensors, ``[1,3,224,224]`` dimensions, anything else a string.
    ``Metadata`` is the rest of the line (it holds brackets and control characters)."""
    fields: dict[str, Any] = {}
    position = 0
    while position < len(text):
        key = _KEY.match(text, position)
        if not key:
            break
        name, position = key.group(1), key.end()
        if name == "Metadata" and not nested:
            fields[name] = text[position:]
            break
        if text.startswith("[ {", position) or text.startswith("[{", position):
            end = _closing(text, position)
            fields[name] = [_dumped_object(part, nested=True) for part in _objects(text[position + 1 : end])]
            position = end + 1
        elif text.startswith("[", position) or text.startswith("{", position):
            end = _closing(text, position)
            fields[name] = text[position : end + 1]
            position = end + 1
        else:
            following = _NEXT_KEY.search(text, position)
            end = following.start() if following else len(text)
            fields[name] = text[position:end].strip()
            position = end
        if text.startswith(", ", position):
            position += 2
    return fields


def _closing(text: str, start: int) -> int:
    """Where the bracket opened at ``start`` closes (the end of the text when it never does)."""
    pairs = {"[": "]", "{": "}"}
    stack = []
    for index in range(start, len(text)):
        char = text[index]
        if char in pairs:
            stack.append(pairs[char])
        elif stack and char == stack[-1]:
            stack.pop()
            if not stack:
                return index
    return len(text) - 1


def _objects(text: str) -> list[str]:
    """The ``{ … }`` objects of a dumped list, without their braces."""
    found = []
    position = text.find("{")
    while position >= 0:
        end = _closing(text, position)
        found.append(text[position + 1 : end].strip().rstrip("}").strip())
        position = text.find("{", end + 1)
    return found


def read_layer_info(path: Path) -> LayerInfo:
    """A file of layer information: ``--exportLayerInfo``'s JSON, this pipeline's saved layers, or a
    log holding a ``--dumpLayerInfo`` dump."""
    text, document = read_document(path)
    if document is not None:
        return layer_info_from_document(document, str(path))
    dumped = layer_info_from_dump(text)
    if dumped is None:
        raise PipelineError(f"{path} holds no layer information (neither --exportLayerInfo JSON nor a --dumpLayerInfo dump).")
    return dumped

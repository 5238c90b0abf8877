"""A user's ONNX checked before anything is built from it: what TensorRT's parser could not read
is an error naming the node, and the nodes only a plugin can build are said.

ONNX's own checker with full shape inference (``onnx.checker.check_model(full_check=True)``:
strict type and shape inference over every node) finds what no compiler reads: an input no node
makes, a node out of order, a product of incompatible shapes. Its messages name the node
("(op_type:MatMul, node name: proj/MatMul)", "name: add OpType: Add"), which the error repeats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.running.errors import UsageError

# Domains whose ops ONNX Runtime and TensorRT's parser know by their spec; a node in another
# domain is a custom op, which TensorRT builds only through a plugin of that name
# (docs.nvidia.com/deeplearning/tensorrt: "Extending TensorRT with Custom Layers", the ONNX parser's
# fallback to the plugin registry) and ONNX Runtime runs only with a custom-op library.
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})

_SHAPE_NODE = re.compile(r"\(op_type:(?P<op>\w+), node name: (?P<name>[^)]*)\)")
_ORDER_NODE = re.compile(r"name: (?P<name>.*?) OpType: (?P<op>\w+)")


@dataclass(frozen=True)
class CustomNode:
    """A node in a domain outside ONNX's standard ones."""

    name: str
    op_type: str
    domain: str

    def words(self) -> str:
        return f'"{self.name}" ({self.domain}:{self.op_type})' if self.name else f"an unnamed {self.domain}:{self.op_type} node"


def custom_nodes(model) -> list[CustomNode]:
    """The main graph's nodes in domains outside ONNX's standard ones, in graph order."""
    return [CustomNode(n.name, n.op_type, n.domain) for n in model.graph.node if n.domain not in STANDARD_DOMAINS]


def lint(path: Path, model_name: str) -> None:
    """Raise UsageError, naming the node, where ONNX's checker with full shape inference refuses
    the file."""

    try:
        _check(path)
    except Exception as exc:  # onnx.checker.ValidationError, onnx.shape_inference.InferenceError
        text = " ".join(str(exc).split())
        found = _SHAPE_NODE.search(text) or _ORDER_NODE.search(text)
        where = f' at node "{found["name"].strip()}" ({found["op"]})' if found else ""
        reason = re.sub(r"\[\w+Error\]|Inference error\(s\):", " ", _SHAPE_NODE.sub("", text))
        reason = re.sub(r"[\s:]+", " ", reason).strip() if found and _SHAPE_NODE.search(text) else reason.strip()
        raise UsageError(
            f"model {model_name!r}: {path} cannot be read as ONNX{where}: {reason}",
            hint="no compiler reads a graph ONNX's own checker refuses; fix the graph or export it again "
            "(`python -c \"import onnx; onnx.checker.check_model('FILE', full_check=True)\"` reproduces this)",
        ) from exc


# External tensors up to this size are read for the shape inference: the values of shape inputs
# (a Reshape's target, an Unsqueeze's axes), which a model saved with ``size_threshold=0`` keeps
# outside too; the weights themselves are not needed, their dims are in the graph.
_SHAPE_VALUES_BYTES = 1 << 16


def _check(path: Path) -> None:
    """ONNX's checker on the file (its path, as ONNX asks for models over 2 GB: the checker then
    also finds each external data file), with full shape inference; for a graph with external
    data, that inference runs on the graph with its small tensors read, since ONNX's own, from a
    path, does not read external data ("Cannot parse data from external tensors")."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor

    from pipeline.graph.external import external_tensors

    graph = onnx.load(str(path), load_external_data=False)
    outside = external_tensors(graph)
    if not outside:
        onnx.checker.check_model(str(path), full_check=True)
        return
    onnx.checker.check_model(str(path))
    for tensor in outside:
        length = next((int(e.value) for e in tensor.external_data if e.key == "length"), None)
        if length is not None and length <= _SHAPE_VALUES_BYTES:
            load_external_data_for_tensor(tensor, str(path.parent))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    # What check_model(full_check=True) adds to the checker (onnx/checker.py).
    onnx.shape_inference.infer_shapes(graph, check_type=True, strict_mode=True)

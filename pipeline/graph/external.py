"""A graph whose weights live outside its file (ONNX's external data): every model over 2 GB is
saved that way (protobuf cannot serialize a message over 2 GB; ``onnx.save(model, path,
save_as_external_data=True, location=...)``), its tensors naming a file and an offset relative to
the graph's own folder (onnx/external_data_helper.py: ``location`` "is a relative path", read from
the model's directory).

Every reader here resolves them that way: ONNX Runtime from a model path, TensorRT's ONNX parser
and TensorRT-RTX's from ``parse_from_file``, trtexec's ``--onnx`` inside a container where the
model's folder is mounted whole, Polygraphy's loaders. So the pipeline keeps a graph and its data
side by side: the workspace's copy is ``<name>.onnx`` with every weight in one ``<name>.onnx.data``
beside it.
"""

from __future__ import annotations

from pathlib import Path

# What one protobuf holds (onnx.checker: "Protobuf files must be less than 2GB").
PROTOBUF_LIMIT_BYTES = 2**31


def _tensors(graph):
    """Every tensor of ``graph`` that may hold weights: its initializers and its nodes' tensor
    attributes (a Constant's value), in its subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def external_tensors(model) -> list:
    """The graph's tensors whose values are in an external file."""
    import onnx

    return [t for t in _tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]


def has_external_data(model) -> bool:
    """Whether any of the graph's tensors keeps its values in an external file."""
    return bool(external_tensors(model))


def data_path(onnx_path: Path) -> Path:
    """Where the pipeline keeps the weights of its copy of a graph: beside it, ``<name>.data``."""
    return onnx_path.with_name(f"{onnx_path.name}.data")


def named_files(onnx_path: Path, model) -> list[Path]:
    """The external data files ``model`` (read from ``onnx_path`` without them) names, in the
    order first named, there or not."""
    names = dict.fromkeys(entry.value for t in external_tensors(model) for entry in t.external_data if entry.key == "location")
    return [onnx_path.parent / name for name in names]


def load_whole(onnx_path: Path):
    """The graph with its weights, external data read from the file's folder."""
    import onnx

    return onnx.load(str(onnx_path), load_external_data=True)


def weights_bytes(model) -> int:
    """The bytes of the weights a graph holds in itself."""
    return sum(len(t.raw_data) for t in _tensors(model.graph))


def save(model, path: Path, external: bool, data: Path | None = None) -> Path | None:
    """Write ``model`` (with its weights) to ``path``; with ``external`` (or where it would not fit
    one protobuf), every weight goes to the one file ``data`` beside it (default
    ``data_path(path)``; a temporary ``path`` names its final one here), written afresh: ONNX
    appends to a data file that is there. ``model`` is changed: its tensors then point at that
    file. The data file's path, or None where the graph holds its weights (an old one removed)."""
    if data is not None and data.parent != path.parent:
        raise ValueError(f"{data} is not beside {path}: ONNX names external data relative to the model's folder")
    import onnx

    data = data if data is not None else data_path(path)
    data.unlink(missing_ok=True)
    if not external and weights_bytes(model) < PROTOBUF_LIMIT_BYTES:
        onnx.save(model, str(path))
        return None
    # Tensors under 1 KB stay in the graph, as onnx.save's own default keeps them: the values of
    # shape inputs (a Reshape's target, an Unsqueeze's axes) kept outside make ONNX Runtime refuse
    # the graph ("[ShapeInferenceError] Cannot parse data from external tensors", onnxruntime 1.23).
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name, size_threshold=1024)
    return data if data.is_file() else None  # no weight of 1 KB or more: none written

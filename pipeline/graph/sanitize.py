"""Constant folding before TensorRT reads a graph, with Polygraphy (``polygraphy surgeon sanitize
--fold-constants``, as a loader: ``polygraphy.backend.onnx.fold_constants``).

Why Polygraphy: TensorRT's own troubleshooting guides and issue templates ask for a graph run
through it first, since many parser and builder failures are shape computations (``Shape`` →
``Gather`` → ``Concat`` → ``Reshape``) that folding removes once the input shapes are fixed. Its
loader runs onnx-graphsurgeon's folding with ONNX Runtime, pass after pass with shape inference
between them, until nothing more folds; onnxslim does more (it fuses and rewrites patterns), which
is more than the parity check should have to vouch for before a compiler that fuses anyway.

Where it is not safe it is not done, and the export says why: a graph with quantization nodes
(folding a constant weight through its ``DequantizeLinear`` would hand TensorRT float weights and
lose the quantization), and a graph whose weights live in external files (over 2 GB: the loader
holds the whole model in one protobuf, which cannot exceed that).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

# Why a graph was not folded when the user said not to (ExportDetails.sanitized.skipped).
NOT_ASKED = "--no-sanitize (or `sanitize = false` in pipeline.toml)"

# Ops that carry a quantization TensorRT must see as written: ONNX's Q/DQ, and the TensorRT ops
# ModelOpt writes for block formats (pipeline/stages/fp4_graph.py).
_QUANTIZATION_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


def changed(record: dict[str, Any] | None) -> bool:
    """Whether folding changed the graph, by its record (ExportDetails.sanitized)."""
    return bool(record) and "skipped" not in record and record["nodes_after"] != record["nodes_before"]


def unsafe_reason(model) -> str | None:
    """Why folding this graph is not safe (the export records it), or None."""
    import onnx

    quantizing = sorted({n.op_type for n in model.graph.node if n.op_type in _QUANTIZATION_OPS or n.op_type.startswith("TRT_")})
    if quantizing:
        return (
            f"the graph quantizes ({', '.join(quantizing)}): folding a weight through its DequantizeLinear "
            "would give TensorRT float weights"
        )
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return "its weights are in external data files (over 2 GB), which the folding would have to hold in one protobuf"
    return None


def sanitize(model, asked: bool = True) -> tuple[Any, dict[str, Any]]:
    """(the graph with its constants folded, the record the export keeps: the tool, node counts
    before and after, the ops folded away and the seconds). ``model`` itself where nothing folded,
    and with why not (``skipped``) where folding is not safe or not ``asked`` (--no-sanitize)."""
    if not asked:
        return model, {"skipped": NOT_ASKED}
    import polygraphy
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    tool = f"polygraphy {polygraphy.__version__} fold_constants"
    before = Counter(node.op_type for node in model.graph.node)
    reason = unsafe_reason(model)
    if reason is not None:
        return model, {"tool": tool, "skipped": reason, "nodes_before": sum(before.values()), "nodes_after": sum(before.values())}
    started = time.perf_counter()
    severity = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.ERROR  # its per-pass lines; -v shows the export's own
    try:
        # error_ok: a constant subgraph ONNX Runtime cannot evaluate (a custom op's) stays as it is.
        # ONNX's shape inference between passes, not ONNX Runtime's symbolic one: that one saves the
        # model into the current directory whenever it cannot infer every shape (a custom op).
        folded = fold_constants(model, error_ok=True, allow_onnxruntime_shape_inference=False)
    finally:
        G_LOGGER.module_severity = severity
    after = Counter(node.op_type for node in folded.graph.node)
    return folded if after != before else model, {
        "tool": tool,
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "folded": {op: count for op, count in sorted((before - after).items())},
        "seconds": round(time.perf_counter() - started, 3),
    }

"""Constant folding before TensorRT reads a graph, with Polygraphy (``polygraphy surgeon sanitize
--fold-constants``, as a loader: ``polygraphy.backend.onnx.fold_constants``).

Why Polygraphy: TensorRT's own troubleshooting guides and issue templates ask for a graph run
through it first, since many parser and builder failures are shape computations (``Shape`` →
``Gather`` → ``Concat`` → ``Reshape``) that folding removes once the input shapes are fixed. Its
loader runs onnx-graphsurgeon's folding with ONNX Runtime, pass after pass with shape inference
between them, until nothing more folds; onnxslim does more (it fuses and rewrites patterns), which
is more than the parity check should have to vouch for before a compiler that fuses anyway.

A graph with ONNX's quantization nodes is folded too: onnx-graphsurgeon never folds them
(``Graph.fold_constants`` in onnx_graphsurgeon/ir/graph.py, 0.6.1: its ``is_foldable`` returns False
for ``NO_FOLD_OPS = ["QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"]``, so a constant
weight keeps its ``DequantizeLinear`` and what consumes it is not folded either), and a guard below
keeps the graph as given should a release ever drop one. TensorRT's own quantization ops
(``trt::TRT_FP8QuantizeLinear``, ``TRT_FP4DynamicQuantize``, …) are not on that list: graphsurgeon
hands them to ONNX Runtime like any op whose inputs are constant, which has no kernel for them, so
the pass fails and folds nothing (polygraphy 0.53.6 on a ``TRT_FP8QuantizeLinear`` of a weight:
"trt:TRT_FP8QuantizeLinear(-1) is not a registered function/op"); with a kernel it would hand
TensorRT float weights. Graphs with them are left as written, and the export says why.

Where ONNX Runtime cannot run the graph (bfloat16, TensorRT-only or custom ops), the folded graph
cannot be checked against the one given: the record says so (``parity: "unchecked: <why>"``) and
the export warns.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from pipeline.running.errors import require_module

# Why a graph was not folded when the user said not to (ExportDetails.sanitized.skipped).
NOT_ASKED = "--no-sanitize (or `sanitize = false` in pipeline.toml)"

# ONNX's quantization ops, which graphsurgeon never folds (above); the guard counts them.
_QUANTIZATION_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
# TensorRT's own quantization ops, which ModelOpt writes for FP8 and the block formats
# (pipeline/stages/fp4_graph.py): graphsurgeon would try to fold them.
_TENSORRT_QUANTIZATION_PREFIX = "TRT_"


def changed(record: dict[str, Any] | None) -> bool:
    """Whether folding changed the graph, by its record (ExportDetails.sanitized)."""
    return bool(record) and "skipped" not in record and record["nodes_after"] != record["nodes_before"]


def unsafe_reason(model) -> str | None:
    """Why folding this graph is not safe (the export records it), or None."""
    import onnx

    quantizing = sorted({n.op_type for n in model.graph.node if n.op_type.startswith(_TENSORRT_QUANTIZATION_PREFIX)})
    if quantizing:
        return (
            f"the graph quantizes with TensorRT's own ops ({', '.join(quantizing)}), which graphsurgeon's folding would "
            "evaluate like any other (it leaves only ONNX's QuantizeLinear/DequantizeLinear alone): a weight would reach TensorRT in float"
        )
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # A graph read without its external data (an export over 2 GB): folding needs the weights.
        return "its weights are in external data files that were not read with it"
    return None


def folding_unchecked(record: dict[str, Any], why: str) -> str | None:
    """Mark a folding record whose folded graph ONNX Runtime could not check against the graph as
    given (``why``: what it cannot run); the WARNING to print, or None where nothing was folded."""
    if not changed(record):
        return None
    record["parity"] = f"unchecked: {why}"
    return f"constant folding changed the graph ({record['nodes_before']} → {record['nodes_after']} nodes), unchecked: {why}"


def sanitize(model, asked: bool = True) -> tuple[Any, dict[str, Any]]:
    """(the graph with its constants folded, the record the export keeps: the tool, node counts
    before and after, the ops folded away and the seconds). ``model`` itself where nothing folded,
    and with why not (``skipped``) where folding is not safe or not ``asked`` (--no-sanitize)."""
    if not asked:
        return model, {"skipped": NOT_ASKED}
    # Where Polygraphy is missing, an ERROR that says how to get it (or to pass --no-sanitize).
    polygraphy = require_module("polygraphy", purpose="Constant folding before TensorRT reads the graph (--no-sanitize skips it)")
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
    _ort_errors_only()
    try:
        # error_ok: a constant subgraph ONNX Runtime cannot evaluate (a custom op's) stays as it is.
        # ONNX's shape inference between passes, not ONNX Runtime's symbolic one: that one saves the
        # model into the current directory whenever it cannot infer every shape (a custom op).
        folded = fold_constants(model, error_ok=True, allow_onnxruntime_shape_inference=False)
    finally:
        G_LOGGER.module_severity = severity
    after = Counter(node.op_type for node in folded.graph.node)
    lost = {op: before[op] - after[op] for op in _QUANTIZATION_OPS if after[op] < before[op]}
    if lost:  # graphsurgeon's NO_FOLD_OPS, should a release drop them
        words = ", ".join(f"{n} {op}" for op, n in sorted(lost.items()))
        return model, {
            "tool": tool,
            "skipped": f"folding removed {words}",
            "nodes_before": sum(before.values()),
            "nodes_after": sum(before.values()),
        }
    return folded if after != before else model, {
        "tool": tool,
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "folded": {op: count for op, count in sorted((before - after).items())},
        "seconds": round(time.perf_counter() - started, 3),
    }


def _ort_errors_only() -> None:
    """ONNX Runtime's own log at errors only: the sessions the folding opens print a warning for
    each node its CPU kernels cannot evaluate (an FP16 Sqrt, say), which the folding leaves as it is."""
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
    except ImportError:  # polygraphy then says what it lacks
        pass

"""A graph whose build failed, cut down to the smallest that still fails the same way, by
Polygraphy's reducer (``polygraphy debug reduce``) with the product's own build as its check.

Polygraphy's reducer bisects the graph twice: first for the earliest outputs that still fail,
then for the latest inputs. Each candidate is a subgraph it writes to a file; the check builds it
and says whether it failed *the same way*: a failure is the same when its signature is
(pipeline/trtexec/onnx_parser.py: the op, the parser's check and its words), so a cut that fails
for another reason (an input the cut left without a shape) counts as a pass and is not kept.
Where bisection leaves more than ``SMALL_ENOUGH`` nodes, a linear pass (a node at a time) goes on
from there, as Polygraphy's own advice says ("reduce again using --mode=linear").

The reducer gives each cut's new inputs and outputs their shapes and types, and freezes the
branches a cut leaves dangling into constants, from ONNX Runtime running the graph on random
inputs. ONNX Runtime cannot run a custom op (a node a TensorRT plugin would build): there, the
graph is run with each such node replaced by a constant of its output's declared shape and type
(the graph's value_info), or, where the graph declares none, of its first input's (an elementwise
op's, said in the result: ``assumed``). The values are random either way, as the reducer's own are.

Nothing here knows a toolchain: the check is handed in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.graph.external import data_path, has_external_data, load_whole, named_files, save
from pipeline.graph.lint import STANDARD_DOMAINS
from pipeline.running.errors import PipelineError

# Where bisection may stop: the failing node with an input or an output of its own.
SMALL_ENOUGH = 3

# Nodes that hold or pass on a value and compute nothing: Polygraphy's cuts turn the Constants a
# cut carries along into weights, so a cut with fewer nodes is not a smaller graph unless it has
# fewer of the others.
NO_WORK = ("Constant", "Identity")


def working_nodes(graph) -> int:
    """The nodes of ``graph`` that compute something (not Constant or Identity)."""
    return sum(1 for node in graph.node if node.op_type not in NO_WORK)


@dataclass
class Reduction:
    """What a reduce did (BuildDetails.reduced)."""

    nodes_before: int
    nodes_after: int
    iterations: int
    seconds: float
    # The shapes the reducer had to assume (a custom op's output with no declared shape).
    assumed: list[str] = field(default_factory=list)
    # The op types left, in graph order.
    ops: list[str] = field(default_factory=list)
    # The cuts whose build ended without an answer, by why ("crashed (SIGSEGV)": 2).
    skipped: dict[str, int] = field(default_factory=dict)

    def record(self, path: str, failure: str) -> dict[str, Any]:
        return {
            "onnx": path,
            "failure": failure,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ops": self.ops,
            "iterations": self.iterations,
            "seconds": round(self.seconds, 2),
            "assumed": self.assumed,
            "skipped": self.skipped,
            "tool": _polygraphy_version(),
        }


class CutNotBuilt(Exception):
    """A cut's build that ended without an answer (it crashed, ran out of memory, ran out of
    time): it says nothing about the failure, so the cut counts as one that did not reproduce it."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class Checks:
    """The product's check as the reducer calls it, counting and reporting each iteration, and the
    cuts whose build ended without an answer (CutNotBuilt), by why."""

    def __init__(self, fails_the_same_way: Callable[[Path], tuple[bool, str]], progress: Callable[[str], None]):
        self.fails_the_same_way, self.progress = fails_the_same_way, progress
        self.count = 0
        self.skipped: Counter[str] = Counter()

    def passes(self, candidate: Path) -> bool:
        """Polygraphy's sense of a check: True when the candidate does NOT fail the same way."""
        import onnx

        self.count += 1
        cut = onnx.load(str(candidate), load_external_data=False)
        nodes = len(cut.graph.node)
        try:
            same, words = self.fails_the_same_way(candidate)
        except CutNotBuilt as exc:
            self.skipped[exc.why] += 1
            same, words = False, f"skipped, its build {exc.why}: counted as not failing the same way"
        finally:
            # A cut over 2 GB comes with its weights in a file Polygraphy names afresh each time
            # (SaveOnnx: external data past the protobuf limit); built, it is no one's.
            for data in named_files(candidate, cut):
                data.unlink(missing_ok=True)
        self.progress(f"iteration {self.count}: {nodes} node(s), {'fails the same way' if same else words}")
        return not same

    def skipped_words(self) -> str:
        """The skipped cuts for a closing line (", 2 cuts skipped: 1 crashed (SIGSEGV), 1 ran out of memory"); "" if none."""
        if not self.skipped:
            return ""
        total = sum(self.skipped.values())
        return f", {total} cut{'s' if total > 1 else ''} skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))


def reduce_graph(onnx_path: Path, output: Path, checks: Checks, input_shapes: dict[str, list[int]], workdir: Path) -> Reduction:
    """The smallest subgraph of ``onnx_path`` that ``checks`` still sees fail the same way, written
    to ``output`` (only once it is whole). ``input_shapes`` fixes the graph's dynamic inputs (the
    cuts are static graphs); ``workdir`` holds the candidates and is emptied as it goes."""
    import onnx

    started = time.perf_counter()
    model = onnx.load(str(onnx_path), load_external_data=False)
    before = len(model.graph.node)
    standins = StandIns(model, input_shapes)
    bisected = workdir / "bisected.onnx"
    _polygraphy_reduce(onnx_path, bisected, checks, standins, input_shapes, workdir, "bisect")
    result = bisected
    left = onnx.load(str(bisected), load_external_data=False).graph
    if working_nodes(left) >= working_nodes(model.graph):
        raise PipelineError(
            f"no cut of the graph fails the same way (in {checks.count} builds{checks.skipped_words()}): the failure needs "
            f"the whole graph ({working_nodes(model.graph)} nodes that compute, not counting Constant and Identity), "
            "or its dynamic shapes (the cuts are made at fixed ones).",
            hint="the build's log names the node; a graph with that node alone may still reproduce it (`polygraphy surgeon extract`)",
        )
    if working_nodes(left) > SMALL_ENOUGH:
        result = workdir / "linear.onnx"
        _polygraphy_reduce(bisected, result, checks, standins, {}, workdir, "linear")
    reduced = onnx.load(str(result), load_external_data=False)
    _write(result, output, external=has_external_data(model))
    return Reduction(
        nodes_before=before,
        nodes_after=len(reduced.graph.node),
        iterations=checks.count,
        seconds=time.perf_counter() - started,
        assumed=sorted(standins.assumed),
        ops=[node.op_type for node in reduced.graph.node],
        skipped=dict(checks.skipped),
    )


def _write(result: Path, output: Path, external: bool) -> None:
    """The reduced graph at ``output``, whole or not at all; where the graph reduced kept its
    weights in external data, with its own in ``<output>.data`` beside it (pipeline/graph/external.py),
    which loads wherever the two go together."""
    import onnx

    partial = output.with_name(f".{output.name}.partial")
    if external or has_external_data(onnx.load(str(result), load_external_data=False)):
        save(load_whole(result), partial, external=True, data=data_path(output))
    else:
        data_path(output).unlink(missing_ok=True)
        shutil.copyfile(result, partial)
    os.replace(partial, output)


def _polygraphy_reduce(source: Path, output: Path, checks: Checks, standins: StandIns, shapes: dict, workdir: Path, mode: str) -> None:
    """One run of Polygraphy's `debug reduce` tool in this process, its check and its fallback
    inference the product's (below): the tool's own argument groups (CheckCmdArgs.run_check,
    OnnxInferShapesArgs.fallback_inference, as Polygraphy 0.53 names them) answer with ours, so
    nothing is run as a shell command and no file is left in the current directory."""
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER
    from polygraphy.tools.args import OnnxInferShapesArgs
    from polygraphy.tools.debug.subtool.iterative_debug_args import CheckCmdArgs
    from polygraphy.tools.debug.subtool.reduce import Reduce

    tool = Reduce()
    parser = tool.setup_parser()
    argv = [str(source), "-o", str(output), "--mode", mode]
    argv += ["--iter-artifact", str(workdir / "candidate.onnx"), "--save-debug-replay", str(workdir / "replay.json")]
    # ONNX's shape inference, not ONNX Runtime's symbolic one, which saves the model into the
    # current directory whenever it cannot infer every shape (a custom op's output).
    argv.append("--no-onnxruntime-shape-inference")
    if shapes:
        argv += ["--model-input-shapes", *(f"{name}:[{','.join(map(str, dims))}]" for name, dims in shapes.items())]
    args = parser.parse_args(argv)
    severity = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.CRITICAL  # its own lines; the product says each iteration
    try:
        tool.parse(args)
        tool.arg_groups[CheckCmdArgs].run_check = lambda path: checks.passes(Path(path))
        shape_args = tool.arg_groups[OnnxInferShapesArgs]
        own_inference = shape_args.fallback_inference
        shape_args.fallback_inference = lambda model, outputs=None: standins.run(own_inference, model, outputs)
        status = tool.run(args)
    except PolygraphyException as exc:
        raise PipelineError(f"Polygraphy's reducer stopped: {str(exc).strip().splitlines()[0][:300]}") from exc
    finally:
        G_LOGGER.module_severity = severity
    if status or not output.is_file():
        raise PipelineError(f"Polygraphy's reducer wrote no graph ({mode}, exit status {status}).")


class StandIns:
    """Polygraphy's fallback inference (ONNX Runtime on the whole graph, random inputs) for a graph
    with ops ONNX Runtime cannot run: each replaced by a constant of its output's shape and type."""

    def __init__(self, original, input_shapes: dict[str, list[int]]):
        self.sizes = _named_sizes(original, input_shapes)
        self.assumed: set[str] = set()

    def run(self, own_inference, model, outputs):
        if not any(node.domain not in STANDARD_DOMAINS for node in model.graph.node):
            return own_inference(model, outputs)
        return own_inference(self.replaced(model), outputs)

    def replaced(self, model):
        """``model`` with every node outside ONNX's standard domains replaced by a weight of its
        output's shape and type."""
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper

        inferred = onnx.shape_inference.infer_shapes(model)
        known = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
        known.update({t.name: _tensor_type_of(t) for t in inferred.graph.initializer})
        rng = np.random.default_rng(0)
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        nodes = []
        for node in copy.graph.node:
            if node.domain in STANDARD_DOMAINS:
                nodes.append(node)
                continue
            for name in node.output:
                typed = known.get(name)
                if typed is None or not typed.HasField("shape") or not typed.elem_type:
                    typed = known.get(node.input[0]) if node.input else None
                    if typed is None or not typed.HasField("shape"):
                        raise PipelineError(
                            f'the reducer needs the shape of "{name}", the output of {node.domain}:{node.op_type} node '
                            f'"{node.name}", which ONNX Runtime cannot run and the graph does not declare.',
                            hint="export the graph with its value_info (torch.onnx's exporter writes it; "
                            "onnx.shape_inference.infer_shapes keeps what you add), then reduce again",
                        )
                    self.assumed.add(f"{name}: the shape and type of {node.input[0]} ({node.domain}:{node.op_type})")
                    known[name] = typed
                dims = [d.dim_value if d.HasField("dim_value") else self.sizes.get(d.dim_param, 1) for d in typed.shape.dim]
                dtype = helper.tensor_dtype_to_np_dtype(typed.elem_type)
                values = rng.random(dims).astype(dtype) if np.issubdtype(dtype, np.floating) else np.zeros(dims, dtype)
                # An Identity of a weight, not a Constant: Polygraphy marks only variables as outputs.
                copy.graph.initializer.append(numpy_helper.from_array(values, f"{name}.stand-in"))
                nodes.append(helper.make_node("Identity", [f"{name}.stand-in"], [name]))
        del copy.graph.node[:]
        copy.graph.node.extend(nodes)
        return copy


def _named_sizes(model, input_shapes: dict[str, list[int]]) -> dict[str, int]:
    """The size each named dynamic axis ("batch", "sequence") has at the shapes reduced at."""
    sizes = {}
    for graph_input in model.graph.input:
        shape = input_shapes.get(graph_input.name)
        if not shape:
            continue
        for dim, size in zip(graph_input.type.tensor_type.shape.dim, shape):
            if dim.dim_param:
                sizes[dim.dim_param] = size
    return sizes


def _tensor_type_of(initializer):
    from onnx import helper

    return helper.make_tensor_type_proto(initializer.data_type, list(initializer.dims)).tensor_type


def _polygraphy_version() -> str:
    import polygraphy

    return f"polygraphy {polygraphy.__version__} debug reduce"


@contextlib.contextmanager
def scratch(folder: Path):
    """A folder for the candidates, gone afterwards whatever happens (an interrupt too)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)

"""What makes two failures of a build the same failure (pipeline reduce keeps a cut only when it
fails as the whole graph did): the error's kind, and the node it names, by its op type and its
name as the exporter wrote it.

Exporters name nodes differently: TorchScript's exporter with slashes (``/blocks.0/attn/MatMul``),
the torch.export-based one (``dynamo=True``) without (``node_MatMul_12``, ``linear_3``), a hand-made
graph anything or nothing (trtexec's sample names its node ``CustomOpModel-N-0-AddScalar``). So a
node is found in a message by looking its words up in the graph's own node names, not by their
form; the rest of the message, without names, numbers and file paths (the cuts are other files),
is the error's kind.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.trtexec.onnx_parser import ParserFailure

# A run of nodes TensorRT fused: "Could not find any implementation for node {ForeignNode[Reshape_261
# + Transpose_262...Concat_526]}" (github.com/zhiqwang/yolort/issues/385; ranges also hold "(Unnamed
# Layer* 6862) [Shuffle]", NVIDIA/TensorRT#2660). Its ends move as a graph is cut down, so the range
# is the same failure whatever its ends.
_FOREIGN = re.compile(r"\{ForeignNode\[.*?\]\}")
# What separates the words of a message that may be names.
_WORD = re.compile(r"[^\s\"'(){}\[\],;]+")
# The remaining words that change from one file or run to the next: quoted strings, paths, files, numbers.
_VARYING = re.compile(r'"[^"]*"|\'[^\']*\'|\S*/\S*|\S+\.(?:onnx|engine|plan)\b|\d+')


def node_names(onnx_path: Path) -> dict[str, str]:
    """Each named node's name → its op type, in the ONNX file (its external data not read)."""
    import onnx

    return {node.name: node.op_type for node in onnx.load(str(onnx_path), load_external_data=False).graph.node if node.name}


def failure_signature(refusal: str, parser_failure: dict | None, onnx_path: Path | None = None) -> tuple:
    """The failure of a build of ``onnx_path`` as compared across cuts: ("parser", op, check,
    words, node name) where TensorRT's ONNX parser refused a node; else ("build", kind, op, node
    name), the node being the first one of the graph the message names outside a fused range
    (None, None where it names none)."""
    if parser_failure:
        failure = ParserFailure.model_validate(parser_failure)
        return ("parser", *failure.signature())
    nodes = node_names(onnx_path) if onnx_path is not None and onnx_path.is_file() else {}
    text = _FOREIGN.sub("{ForeignNode[_]}", refusal)
    named: tuple[str | None, str | None] = (None, None)

    def name(match: re.Match) -> str:
        nonlocal named
        word = match.group(0)
        for candidate in (word, word.rstrip(".:")):
            if candidate in nodes:
                if named == (None, None):
                    named = (nodes[candidate], candidate)
                return "<node>" + word[len(candidate) :]
        return word

    kind = _VARYING.sub("_", _WORD.sub(name, text))
    return ("build", " ".join(kind.split()), *named)

"""What TensorRT's ONNX parser says when it refuses a node, read from its log.

trtexec and TensorRT-RTX share the parser (onnx-tensorrt), and both log a refusal the same way:

    ModelImporter.cpp:140: While parsing node number 257 [FancyErf -> "/blocks.3/act/Erf_output_0"]:
    ModelImporter.cpp:142: --- Begin node ---
    Node name: blocks.3.act/FancyErf                 (TensorRT-RTX 1.7; trtexec dumps the node:
    ModelImporter.cpp:143: --- End node ---           name: "CustomOpModel-N-0-AddScalar")
    ModelImporter.cpp:151: ERROR: onnxOpCheckers.cpp:998 In function checkFallbackPluginImporter:
    [6] creator && "Plugin not found, are the plugin name, version, and namespace correct?"

(tests/data/trtexec/trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt is a real trtexec
one; TensorRT 8.x words the last line "[8] Assertion failed: creator && …".) The parser's own
error record (``IParserError``) keeps only the node's name and the last line, which is empty or
"false" for many checks: the log is where the node number, its op, its output and the check are.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

_PARSING = re.compile(r'While parsing node number (?P<number>\d+) \[(?P<op>[^\s\]]+)(?: -> "(?P<output>[^"]*)")?\]')
_NODE_NAME = re.compile(r'^\s*(?:Node name: (?P<rtx>.*?)|name: "(?P<dump>.*)")\s*$')
_CHECK = re.compile(r"In function (?P<check>\w+):?\s*(?:\n|\s)\s*\[(?P<code>\d+)\]\s*(?P<message>.*)")
# A log line's own prefix ("[04/24/2026-02:26:01] [E] [TRT] "), where the lines come from trtexec.
_PREFIX = re.compile(r"^\[\d\d/\d\d/\d{4}-[\d:]+\] \[\w\] (?:\[TRT\] )?")


class ParserFailure(BaseModel):
    """The node TensorRT's ONNX parser refused, and why (manifest: BuildDetails.parser_failure)."""

    model_config = ConfigDict(extra="forbid")
    # Its position in the graph's node list, as the parser counts (from 0); None where only the
    # parser's own record told of it.
    node_number: int | None = None
    op_type: str
    # The node's name where the log gives one (ONNX nodes may have none).
    node: str | None = None
    # Its first output, as the parser names it.
    output: str | None = None
    # The parser's check that refused it ("checkFallbackPluginImporter") and its error code.
    check: str | None = None
    code: int | None = None
    message: str | None = None

    def words(self) -> str:
        """``node 257 "blocks.3.act/FancyErf" (FancyErf → out): checkFallbackPluginImporter: Plugin not found…``"""
        named = f' "{self.node}"' if self.node else ""
        output = f" → {self.output}" if self.output else ""
        why = ": ".join(part for part in (self.check, self.message) if part)
        number = f"node {self.node_number}" if self.node_number is not None else "node"
        return f"{number}{named} ({self.op_type}{output})" + (f": {why}" if why else "")

    def signature(self) -> tuple[str, str | None, str | None, str | None]:
        """What makes two refusals the same failure: the op, the check, its message and the node's
        name as the exporter wrote it (with or without slashes; None for a node without one) — not
        its number, which changes as a graph is cut down (pipeline/graph/reduce.py)."""
        return (self.op_type, self.check, self.message, self.node)


def parser_failure(text: str) -> ParserFailure | None:
    """The first node the parser refused in a log (trtexec's, or TensorRT-RTX's errors joined by
    newlines); None when the log has no such refusal (a builder error, say)."""
    lines = [_PREFIX.sub("", line) for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if _PARSING.search(line)), None)
    if start is None:
        return None
    parsing = _PARSING.search(lines[start])
    failure = ParserFailure(node_number=int(parsing["number"]), op_type=parsing["op"], output=parsing["output"] or None)
    rest = lines[start + 1 :]
    for index, line in enumerate(rest):
        if _PARSING.search(line):
            break  # the next refusal's
        named = _NODE_NAME.match(line)
        if named and failure.node is None:
            failure.node = named["rtx"] or named["dump"] or None
        checked = _CHECK.search("\n".join(rest[index : index + 2]))
        if checked and "In function" in line:
            failure.check, failure.code = checked["check"], int(checked["code"])
            failure.message = check_words(checked["message"])
            break
    return failure


def check_words(message: str) -> str | None:
    """The check's words without the assertion's code: ``creator && "Plugin not found"`` → the
    quoted words; ``Assertion failed: false`` → None (it says nothing)."""
    message = message.strip().removeprefix("Assertion failed:").strip()
    quoted = re.search(r'"([^"]+)"\s*$', message)
    if quoted and "&&" in message:
        return quoted.group(1)
    return None if message in ("", "false", "0") else message

"""Reading text trtexec wrote, whichever way it reached the user's disk."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from pipeline.running.errors import PipelineError

# Byte-order marks, longest first (UTF-32's begin with UTF-16's). Windows PowerShell's `>` writes
# UTF-16 LE with a BOM; Notepad and some editors save UTF-8 with one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode(data: bytes) -> str:
    """The text of ``data``: by its byte-order mark, else UTF-16 when every other byte of the
    start is NUL (a BOM-less UTF-16 file of ASCII log lines), else UTF-8. Bytes that do not decode
    become U+FFFD, so a damaged line costs that line, not the file."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    head = data[:512]
    if len(head) >= 8 and head[1::2].count(0) >= len(head) // 2 * 0.9:
        return data.decode("utf-16-le", errors="replace")
    if len(head) >= 8 and head[0::2].count(0) >= len(head) // 2 * 0.9:
        return data.decode("utf-16-be", errors="replace")
    return data.decode("utf-8", errors="replace")


def read_text(path: Path) -> str:
    """``decode`` of a file's bytes; raises OSError like Path.read_text."""
    return decode(Path(path).read_bytes())


def log_lines(text: str) -> list[str]:
    """The lines of tool output, split at line feeds only (a CR before one is dropped).
    ``str.splitlines`` also splits at \\x1c–\\x1e, and TensorRT writes \\x1e inside a layer's
    metadata to join the ONNX nodes it fused: that would cut a layer line in two."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def read_document(path: Path) -> tuple[str, Any]:
    """A file's text and, where the text is JSON, the parsed document (None otherwise).
    An unreadable file is a user error naming it."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise PipelineError(f"cannot read {path}: {exc.strerror or exc}.") from exc
    try:
        return text, json.loads(text)
    except ValueError:
        return text, None

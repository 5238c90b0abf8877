"""The input shapes a trtexec command line asks for, read the way trtexec reads them.

A log whose options echo was cut away still names its shapes in trtexec's own banner,
``&&&& RUNNING TensorRT.trtexec [TensorRT v…] # trtexec --onnx=… --minShapes=…``. The rules are
trtexec's (samples/common/sampleOptions.cpp of the TensorRT OSS release, 10.x to 11.1:
``splitNameAndValue``, ``getShapesBuild``, ``getOptimizationProfiles``, ``processShapes`` and
``AllOptions::parse``):

* a spec is comma-separated ``name:dims`` pairs; the name is everything before the last colon, or
  what single quotes wrap (``'input:0':1x3x224x224``); ``scalar`` or nothing is a 0-D shape;
* ``--profile=N`` starts optimization profile N, and the ``--minShapes``/``--optShapes``/
  ``--maxShapes`` after it belong to it; without ``--profile`` they are profile 0;
* a missing min takes opt (else max), a missing opt takes max (else min), a missing max takes opt
  (else min), each with trtexec's warning "optShapes is being broadcasted to minShapes for tensor x";
* an input without ``--shapes`` runs at profile 0's opt shape, and an input given only ``--shapes``
  is built for exactly that shape (min = opt = max) when the command builds an engine (it does
  not load one with ``--loadEngine``).

The command is the one trtexec echoes: its arguments joined by spaces, the shell's quotes gone. A
command pasted with its quotes (``--shapes="ids:1x128,mask:1x128"``), or with Windows paths, reads
the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_BUILD_FLAGS = {"--minShapes": "min", "--optShapes": "opt", "--maxShapes": "max"}
_ARGUMENT = re.compile(r'(?:"[^"]*"|\'[^\']*\'|\S)+')


@dataclass
class CommandShapes:
    """What a command line says of each input's shapes, by name, in the order it names them."""

    # Per input: per optimization profile, its (min, opt, max) dims as trtexec prints them ("1x3x224").
    profiles: dict[str, dict[int, tuple[str, str, str]]] = field(default_factory=dict)
    # Per input: the shape inference runs at.
    inference: dict[str, str] = field(default_factory=dict)


def arguments(command: str) -> list[str]:
    """The command's arguments: split at spaces outside quotes; quotes around a whole value (a
    pasted shell line) removed, trtexec's own quotes around a name ('input:0':…) kept."""
    found = []
    for argument in _ARGUMENT.findall(command):
        if len(argument) >= 2 and argument[0] == argument[-1] == '"':  # "--onnx=C:\My Models\m.onnx"
            argument = argument[1:-1]
        flag, equals, value = argument.partition("=")
        if equals and len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" and value.count(value[0]) == 2:
            value = value[1:-1]
        found.append(flag + equals + value)
    return found


def _pairs(spec: str) -> list[tuple[str, str]]:
    """(name, dims) of each comma-separated pair of a shape spec, as splitNameAndValue splits them."""
    pairs = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if item.count("'") == 2:  # 'name:with:colons':dims
            _, name, rest = item.split("'")
            dims = rest[1:] if rest.startswith(":") else rest
        else:
            name, _, dims = item.replace("'", "").rpartition(":")
        dims = dims.strip()
        pairs.append((name.strip(), "" if dims == "scalar" else dims))
    return pairs


def read_command_shapes(command: str, release: str | None = None) -> CommandShapes:
    """Each input's build profiles and inference shape as trtexec of ``release`` ("10.16.1") would
    take them from ``command`` and echo them. A command that loads an engine (``--loadEngine``)
    builds none: TensorRT 10 and later echo no build shapes for it, 8.x echoes its options anyway
    ("Input build shape: tensor-0=4x1x28x28+…" in an 8.6 ``--loadEngine`` run)."""
    given: dict[int, dict[str, dict[str, str]]] = {}  # profile → selector → name → dims
    inference: dict[str, str] = {}
    loads = False
    profile = 0
    for argument in arguments(command):
        flag, equals, value = argument.partition("=")
        if flag == "--loadEngine":
            loads = True
        elif flag == "--profile" and value.strip().isdigit():
            profile = int(value)
        elif flag in _BUILD_FLAGS and equals:
            given.setdefault(profile, {}).setdefault(_BUILD_FLAGS[flag], {}).update(_pairs(value))
        elif flag == "--shapes" and equals:
            inference.update(_pairs(value))
    profiles: dict[str, dict[int, tuple[str, str, str]]] = {}
    for index, selectors in sorted(given.items()):
        for name in dict.fromkeys(n for selector in ("min", "opt", "max") for n in selectors.get(selector, {})):
            profiles.setdefault(name, {})[index] = _broadcast(selectors, name)
    shapes = CommandShapes()
    # An input without --shapes runs at profile 0's opt shape.
    shapes.inference = {name: ranges[0][1] for name, ranges in profiles.items() if 0 in ranges} | inference
    major = int(release.split(".")[0]) if release and release.split(".")[0].isdigit() else None
    if not loads or (major is not None and major < 10):
        shapes.profiles = profiles
        for name, dims in inference.items():  # given only --shapes: built for exactly that shape
            shapes.profiles.setdefault(name, {}).setdefault(0, (dims, dims, dims))
    return shapes


def _broadcast(selectors: dict[str, dict[str, str]], name: str) -> tuple[str, str, str]:
    """(min, opt, max) of one input, the missing ones filled as processShapes fills them (it
    looks at which of the three flags were given, not at the names each lists)."""
    has = {selector: selector in selectors for selector in ("min", "opt", "max")}
    min_from = "min" if has["min"] else ("opt" if has["opt"] else "max")
    source = {
        "min": min_from,
        "opt": "opt" if has["opt"] else ("max" if has["max"] else min_from),
        "max": "max" if has["max"] else ("opt" if has["opt"] else min_from),
    }
    return tuple(selectors.get(source[selector], {}).get(name, "") for selector in ("min", "opt", "max"))

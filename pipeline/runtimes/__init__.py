"""The registry of engine runtimes: the one place a toolchain ``kind`` is tied to its code.

Each backend is one folder here (pytorch/, tensorrt/, tensorrt_rtx/, onnxrt/) with a runtime class
for each of its kinds (behind :class:`EngineRuntime`, base.py) and the catalog settings it reads (a
:class:`~pipeline.catalog.ToolchainSpec` subclass, ``Spec``). A new backend is a new folder and
one line in RUNTIMES; nothing outside this package needs to know which kinds exist. Beside the
folders: base.py (what every runtime fills), toolchains.py (the toolchains a run selects),
process.py (running a tool and reading how it ended) and doctor.py (what this machine can run).
"""

from __future__ import annotations

import difflib
import functools
import importlib
from pathlib import Path

from pipeline.catalog import Catalog
from pipeline.catalog.file import read_catalog
from pipeline.manifest import know_tool_evidence
from pipeline.models import spec_class as model_spec_class
from pipeline.running.errors import EnvironmentMissing
from pipeline.runtimes.base import EngineRuntime

# kind → "module:class". Modules are imported when a catalog names their kind, not before.
RUNTIMES = {
    "onnxruntime": "pipeline.runtimes.onnxrt.runtime:OnnxRuntimeRuntime",
    "trtexec-container": "pipeline.runtimes.tensorrt.in_container:TrtexecContainerRuntime",
    "trtexec-local": "pipeline.runtimes.tensorrt.local:TrtexecLocalRuntime",
    "tensorrt-rtx": "pipeline.runtimes.tensorrt_rtx.runtime:TensorRtRtxRuntime",
    "torch": "pipeline.runtimes.pytorch.runtime:TorchRuntime",
}


@functools.cache
def runtime_class(kind: str) -> type[EngineRuntime]:
    if kind not in RUNTIMES:
        close = difflib.get_close_matches(str(kind), list(RUNTIMES), n=1)
        suggestion = f"did you mean {close[0]!r}? " if close else ""
        raise LookupError(f"unknown kind {kind!r}; {suggestion}known kinds: {', '.join(RUNTIMES)}")
    module, _, name = RUNTIMES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def runtime_classes() -> list[type[EngineRuntime]]:
    return [runtime_class(kind) for kind in RUNTIMES]


def product_of(kind: str) -> str:
    """What reports call a kind's runtime (its ``product``): the kind itself where it names none,
    or where this version knows no such kind (a manifest written by another)."""
    try:
        return runtime_class(kind).product or kind
    except LookupError:
        return kind


def spec_class(kind: str | None):
    """The catalog settings class of a toolchain kind (LookupError for an unknown kind)."""
    return runtime_class(kind).Spec


def load_catalog(path: Path | None = None) -> Catalog:
    """The catalog at ``path`` (default: pipeline.toml found from here up), every toolchain table
    validated against the settings of its kind and every model table against its family's. The
    manifests read after it know every runtime's evidence keys."""
    know_tool_evidence(key for cls in runtime_classes() for key in cls.Evidence.model_fields)
    return read_catalog(path, spec_class, model_spec_class)


def create_runtime(name: str, spec, reporter, workspace_root: Path, force: bool = False) -> EngineRuntime:
    try:
        cls = runtime_class(spec.kind)
    except LookupError as exc:
        raise EnvironmentMissing(f"toolchain {name!r}: {exc.args[0]}.") from exc
    return cls(name, spec, reporter, workspace_root, force)


def get_runtime(ctx, toolchain: str) -> EngineRuntime:
    """The runtime for a toolchain, one instance per run (``ctx``), so lookups happen once."""
    if toolchain not in ctx.runtimes:
        spec = ctx.catalog.toolchain(toolchain)
        ctx.runtimes[toolchain] = create_runtime(toolchain, spec, ctx.reporter, ctx.catalog.root, ctx.force)
    return ctx.runtimes[toolchain]

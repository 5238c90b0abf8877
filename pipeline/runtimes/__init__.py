"""The registry of engine runtimes, keyed by the catalog's toolchain ``kind``."""

from __future__ import annotations

from pipeline.errors import EnvironmentMissing
from pipeline.runtimes.base import EngineRuntime


def _runtime_classes() -> dict[str, type[EngineRuntime]]:
    from pipeline.runtimes.onnxruntime import OnnxRuntimeRuntime
    from pipeline.runtimes.tensorrt import TrtexecContainerRuntime, TrtexecLocalRuntime

    return {cls.kind: cls for cls in (OnnxRuntimeRuntime, TrtexecContainerRuntime, TrtexecLocalRuntime)}


def get_runtime(ctx, toolchain: str) -> EngineRuntime:
    """The runtime for a toolchain, one instance per run (``ctx``), so image lookups happen once."""
    if toolchain not in ctx.runtimes:
        spec = ctx.catalog.toolchain(toolchain)
        classes = _runtime_classes()
        if spec.kind not in classes:
            raise EnvironmentMissing(f"toolchain {toolchain!r} has unknown kind {spec.kind!r}.")
        ctx.runtimes[toolchain] = classes[spec.kind](toolchain, spec, ctx.reporter, ctx.catalog.root, ctx.force)
    return ctx.runtimes[toolchain]

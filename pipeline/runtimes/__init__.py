"""The registry of engine runtimes, keyed by the catalog's toolchain ``kind``."""

from __future__ import annotations

from pipeline.catalog import Catalog
from pipeline.errors import EnvironmentMissing
from pipeline.reporting import Reporter
from pipeline.runtimes.base import EngineRuntime


def _runtime_classes() -> dict[str, type[EngineRuntime]]:
    from pipeline.runtimes.onnxruntime import OnnxRuntimeRuntime

    return {cls.kind: cls for cls in (OnnxRuntimeRuntime,)}


def get_runtime(catalog: Catalog, toolchain: str, reporter: Reporter) -> EngineRuntime:
    spec = catalog.toolchain(toolchain)
    classes = _runtime_classes()
    if spec.kind not in classes:
        raise EnvironmentMissing(
            f"toolchain {toolchain!r} is of kind {spec.kind!r}: TensorRT toolchains are not implemented yet.",
            hint="use the embedded runtime: --toolchain onnxruntime (or `make demo`)",
        )
    return classes[spec.kind](toolchain, spec, reporter)

"""What a Ray node has, asked before anything is dispatched to it.

This module is sent to the nodes by value (``register_pickle_by_value``), not imported there, so it
answers even on a node where the pipeline is not installed: that is exactly the node it must be
able to name. It therefore uses the standard library only, inside the function, and
pipeline/machine/nvidia_smi.py, sent by value with it.
"""

from __future__ import annotations

from pipeline.machine import nvidia_smi


def probe_node() -> dict:
    """The node's identity, the pipeline's version there and its GPUs (nvidia-smi)."""
    import os
    import platform
    import sys
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    try:
        import ray

        # Outside a task, asking for the context would start (or join) a Ray instance.
        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # the probe must answer whatever else is wrong on the node
        node_id = None
    gpus = [
        {"name": fields[0], "compute_capability": fields[1], "driver": fields[2]}
        for fields in nvidia_smi.query("name,compute_cap,driver_version")
        if len(fields) >= 3
    ]
    # The package the tasks will import (installed, or on PYTHONPATH): its own version, or None.
    try:
        import importlib.util

        import pipeline

        ours = importlib.util.find_spec("pipeline.cluster.worker") is not None
        product = getattr(pipeline, "__version__", None) if ours else None
    except ImportError:
        product = None
    return {
        "node_id": node_id,
        "hostname": platform.node(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "pipeline": product,
        "packages": {name: version(name) for name in ("ray", "torch", "timm", "onnx", "onnxruntime", "nvidia-modelopt")},
        "gpus": gpus,
        "cpu_count": os.cpu_count() or 1,
    }

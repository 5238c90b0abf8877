"""Compute capability of the GPU types a Ray cluster advertises, by the names Ray uses for them.

Ray names a node's NVIDIA GPU model as an ``accelerator_type:NAME`` resource (the names below are
Ray's, from ray/util/accelerators/accelerators.py); a node can also declare ``gpu_type:NAME``.
A node that has the GPU reports its real compute capability (nvidia-smi, through the probe) and
that wins; this table serves nodes that only declare a type. The catalog's ``[cluster.gpu_types]``
adds or overrides names.

Source of the figures: NVIDIA, "CUDA GPU Compute Capability", developer.nvidia.com/cuda-gpus.
"""

from __future__ import annotations

COMPUTE_CAPABILITY = {
    "V100": "7.0",
    "T4": "7.5",
    "A100": "8.0",
    "A100-40G": "8.0",
    "A100-80G": "8.0",
    "A10G": "8.6",
    "L4": "8.9",
    "L40S": "8.9",
    "H100": "9.0",
    "H200": "9.0",
    "H20": "9.0",
    "B200": "10.0",
    "GB200": "10.0",
    "B300": "10.3",
    "GB300": "10.3",
    "RTX-PRO-6000": "12.0",
}


def compute_capability(gpu_type: str, catalog=None) -> str | None:
    declared = getattr(getattr(catalog, "cluster", None), "gpu_types", {}) or {}
    return declared.get(gpu_type) or COMPUTE_CAPABILITY.get(gpu_type)

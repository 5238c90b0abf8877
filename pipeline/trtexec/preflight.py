"""Can this GPU and this TensorRT release build a variant at all? Checked before any build.

Sources: the TensorRT support matrix (docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/
support-matrix.html) and release notes: FP8 needs compute capability 8.9 (Ada) or newer; NVFP4
arrived in TensorRT 10.8 and MXFP8 in 10.12, both for Blackwell (CC 10.0 and 12.0); structured
2:4 sparsity and BF16 need Ampere (CC 8.0); from TensorRT 10.5 INT8 needs CC 7.5 (Turing) or newer.
"""

from __future__ import annotations

from pipeline.trtexec.command import parse_version

BLACKWELL_MIN_CC = (10, 0)


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def unsupported_reasons(precision: str, sparse: bool, trt_version: str, compute_capability: str) -> list[str]:
    """Why ``precision`` (+ 2:4 sparsity) cannot be built here; empty when it can."""
    trt = parse_version(trt_version)[:2]
    cc = _cc(compute_capability)
    reasons = []
    if precision == "bf16" and cc < (8, 0):
        reasons.append(f"BF16 needs compute capability 8.0 or newer; this GPU is {compute_capability}")
    if precision == "fp8" and cc < (8, 9):
        reasons.append(f"FP8 needs compute capability 8.9 or newer; this GPU is {compute_capability}")
    if precision == "nvfp4":
        if trt < (10, 8):
            reasons.append(f"NVFP4 needs TensorRT 10.8 or newer; this toolchain is {trt_version}")
        if cc < BLACKWELL_MIN_CC:
            reasons.append(f"NVFP4 needs a Blackwell GPU (compute capability 10.0+); this GPU is {compute_capability}")
    if precision == "mxfp8":
        if trt < (10, 12):
            reasons.append(f"MXFP8 needs TensorRT 10.12 or newer; this toolchain is {trt_version}")
        if cc < BLACKWELL_MIN_CC:
            reasons.append(f"MXFP8 needs a Blackwell GPU (compute capability 10.0+); this GPU is {compute_capability}")
    if precision == "int8" and trt >= (10, 5) and cc < (7, 5):
        reasons.append(f"INT8 on TensorRT 10.5+ needs compute capability 7.5 or newer; this GPU is {compute_capability}")
    if sparse and cc < (8, 0):
        reasons.append(f"2:4 sparsity needs compute capability 8.0 or newer; this GPU is {compute_capability}")
    return reasons

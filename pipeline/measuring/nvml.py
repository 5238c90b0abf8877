"""NVML (nvidia-ml-py's ``pynvml``), opened and asked for its GPUs in one place: the SM clock of a
take (sm_clock.py), the machine watched while points run (machine_watch.py), and a GPU's free
memory (pipeline/machine/environment.py).

NVML numbers every GPU of the machine whatever CUDA_VISIBLE_DEVICES says, so a GPU is found by its
UUID (environment.measuring_gpu), never by the index CUDA gives it."""

from __future__ import annotations

from typing import Any


def opened():
    """``pynvml``, initialised; each call matched by a `close`. Raises where there is no NVML: not
    installed (ImportError), or no driver, no GPU, no permission (pynvml's NVMLError)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def close(nvml) -> None:
    """NVML shut down again (it counts its initialisations); a failure to is nothing to act on."""
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def handle(nvml, gpu_uuid: str | None):
    """NVML's handle of the GPU with this UUID, else of the first it lists."""
    if not gpu_uuid:
        return nvml.nvmlDeviceGetHandleByIndex(0)
    try:
        return nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    except Exception:  # releases of nvidia-ml-py that take the UUID as bytes only
        return nvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())


def handles(nvml, gpu_uuid: str | None = None) -> list[tuple[int, Any]]:
    """(NVML's index, handle) of every GPU, or only of the one with this UUID."""
    every = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    return [(i, h) for i, h in every if gpu_uuid is None or _text(nvml.nvmlDeviceGetUUID(h)) == gpu_uuid]


def _text(value) -> str:
    """A UUID as text: older bindings answer bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)

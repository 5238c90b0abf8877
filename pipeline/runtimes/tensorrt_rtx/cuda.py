"""CUDA for the TensorRT-RTX driver (tensorrt_rtx/driver.py), through the driver library (libcuda)
with ctypes: the release's environment holds nothing else. Devices, memory, streams, events, a
CUDA graph captured and launched, and runs timed on the GPU back to back, as trtexec times them.
It imports only the standard library; the driver loads it by its path.
"""

from __future__ import annotations

import ctypes
import time

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
CUDA_ERROR_OUT_OF_MEMORY = 2


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int, text: str):
        super().__init__(f"{call} failed: CUDA error {code} ({text})")
        self.code = code


class Cuda:
    """The few CUDA driver calls timing needs: memory, a stream, events, graphs."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError("loading libcuda.so.1", -1, f"no NVIDIA driver: {exc}") from exc
        self.call("cuInit", ctypes.c_uint(0))
        self.device = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(self.device), ctypes.c_int(0))
        self.context = ctypes.c_void_p()
        # The primary context is the one TensorRT's CUDA runtime uses too.
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
        self.call("cuCtxSetCurrent", self.context)

    def call(self, name: str, *args) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(code, ctypes.byref(text))
            raise CudaError(name, code, (text.value or b"unknown").decode())

    def name(self) -> str:
        buffer = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", buffer, ctypes.c_int(256), self.device)
        return buffer.value.decode()

    def compute_capability(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device)
        self.call("cuDeviceGetAttribute", ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device)
        return f"{major.value}.{minor.value}"

    def free_and_total(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def malloc(self, size: int) -> int:
        pointer = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(max(size, 1)))
        return pointer.value

    def upload(self, pointer: int, data: bytes) -> None:
        self.call("cuMemcpyHtoD_v2", ctypes.c_uint64(pointer), data, ctypes.c_size_t(len(data)))

    def memset_async(self, pointer: int, value: int, size: int, stream) -> None:
        self.call("cuMemsetD8Async", ctypes.c_uint64(pointer), ctypes.c_ubyte(value), ctypes.c_size_t(size), stream)

    def stream(self):
        handle = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(handle), ctypes.c_uint(CU_STREAM_NON_BLOCKING))
        return handle

    def synchronize(self, stream) -> None:
        self.call("cuStreamSynchronize", stream)

    def event(self):
        handle = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(handle), ctypes.c_uint(0))
        return handle

    def record(self, event, stream) -> None:
        self.call("cuEventRecord", event, stream)

    def elapsed_ms(self, start, end) -> float:
        self.call("cuEventSynchronize", end)
        value = ctypes.c_float()
        self.call("cuEventElapsedTime", ctypes.byref(value), start, end)
        return float(value.value)

    def capture(self, stream, enqueue):
        """``enqueue(stream)`` recorded once as a CUDA graph, returned ready to launch."""
        self.call("cuStreamBeginCapture_v2", stream, ctypes.c_int(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        graph = ctypes.c_void_p()
        try:
            enqueue(stream)
        finally:
            self.call("cuStreamEndCapture", stream, ctypes.byref(graph))
        executable = ctypes.c_void_p()
        self.call("cuGraphInstantiateWithFlags", ctypes.byref(executable), graph, ctypes.c_ulonglong(0))
        return executable

    def launch(self, executable, stream) -> None:
        self.call("cuGraphLaunch", executable, stream)


# Runs enqueued ahead of the oldest unfinished one (the product's torch runtime uses the same).
QUEUE_DEPTH = 4


def timed_runs(cuda: Cuda, stream, launch, warmup_ms: float, iterations: int, duration_s: float) -> tuple[list[float], float]:
    """trtexec's rules: warm up for ``warmup_ms`` milliseconds, then run until BOTH at least
    ``iterations`` runs and ``duration_s`` seconds are done. Runs are enqueued back to back (at
    most QUEUE_DEPTH in flight, no host synchronisation between them), each timed on the GPU by a
    pair of events around it, as trtexec times an engine."""
    warm_until = time.perf_counter() + warmup_ms / 1000.0
    while True:
        launch(stream)
        cuda.synchronize(stream)
        if time.perf_counter() >= warm_until:
            break
    slots = [(cuda.event(), cuda.event()) for _ in range(QUEUE_DEPTH)]
    times: list[float] = []
    enqueued = 0
    began = time.perf_counter()
    while True:
        start, end = slots[enqueued % QUEUE_DEPTH]
        if enqueued >= QUEUE_DEPTH:  # the slot's previous run: waits for it, keeps its time
            times.append(cuda.elapsed_ms(start, end))
        cuda.record(start, stream)
        launch(stream)
        cuda.record(end, stream)
        enqueued += 1
        if enqueued >= iterations and time.perf_counter() - began >= duration_s:
            break
    for index in range(max(0, enqueued - QUEUE_DEPTH), enqueued):  # drain, oldest first
        times.append(cuda.elapsed_ms(*slots[index % QUEUE_DEPTH]))
    return times, time.perf_counter() - began

# Appended to a copy of pipeline/measuring/takes.py on the device: each process's GC state at its
# first take and the collections (count, seconds, by generation) during its takes; GC_OFF=1 turns
# the collector off for the length of each take.
import gc as _gc
import os as _os
import time as _time

_inner_cuda_take = cuda_take  # noqa: F821
_gc_totals = {"takes": 0, "take_s": 0.0, "collections": [0, 0, 0], "gc_s": [0.0, 0.0, 0.0]}
_gc_started = {}
_gc_in_take = [False]


def _gc_watch(phase, info):
    if not _gc_in_take[0]:
        return
    if phase == "start":
        _gc_started["t"] = _time.perf_counter()
    else:
        generation = info["generation"]
        _gc_totals["collections"][generation] += 1
        _gc_totals["gc_s"][generation] += _time.perf_counter() - _gc_started.get("t", _time.perf_counter())


_gc.callbacks.append(_gc_watch)


def cuda_take(*args, **kwargs):
    path = f"/tmp/gcinfo-{_os.getpid()}.txt"
    if not _gc_totals["takes"]:
        with open(path + ".first", "w") as f:
            f.write(f"objects {len(_gc.get_objects())} count {_gc.get_count()} threshold {_gc.get_threshold()} frozen {_gc.get_freeze_count()}\n")
    off = _os.environ.get("GC_OFF") == "1"
    if off:
        _gc.disable()
    _gc_in_take[0] = True
    started = _time.perf_counter()
    try:
        return _inner_cuda_take(*args, **kwargs)
    finally:
        _gc_in_take[0] = False
        _gc_totals["takes"] += 1
        _gc_totals["take_s"] += _time.perf_counter() - started
        if off:
            _gc.enable()
        with open(path, "w") as f:
            f.write(f"{_gc_totals}\n")

"""Records the key of every graph Inductor looks up in its caches, in every Python process that
starts with this folder on PYTHONPATH and INDUCTOR_KEYS_DIR set: the run's own process, its
compile-ahead processes, a cluster's Ray workers. For diagnosing why a process compiled a graph
another had already put in the on-disk cache (docs/cluster.md): read the records with
``python scripts/inductor_keys/compare.py DIR``.

    INDUCTOR_KEYS_DIR=/tmp/keys PYTHONPATH=scripts/inductor_keys:$PYTHONPATH pipeline run ...

Each lookup is one JSON file: which cache (FX graph or AOTAutograd), the key, its components as
the cache's debug lines name them (``compiled_fx_graph_hash`` and ``autograd_cache_key``, private
torch APIs read here for diagnosis only), and the process, thread and time it came from.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import json
import os
import sys
import threading
import time

DIRECTORY = os.environ.get("INDUCTOR_KEYS_DIR")
# Module whose key function is wrapped, once the module is imported.
KEY_FUNCTIONS = {
    "torch._inductor.codecache": ("compiled_fx_graph_hash", "fx_graph"),
    "torch._functorch._aot_autograd.autograd_cache": ("autograd_cache_key", "aot_autograd"),
}
_counter = itertools.count()


def _recording(original, cache: str):
    def record(*args, **kwargs):
        key, lines = original(*args, **kwargs)
        try:
            entry = {
                "cache": cache,
                "key": key,
                "lines": list(lines),
                "pid": os.getpid(),
                "argv": sys.argv[:4],
                "thread": threading.current_thread().name,
                "main_thread": threading.current_thread() is threading.main_thread(),
                "time": time.time(),
                "env": {
                    name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
                },
            }
            path = os.path.join(DIRECTORY, f"{os.getpid()}-{next(_counter):04d}-{cache}.json")
            with open(path, "w") as file:
                json.dump(entry, file)
        except Exception as exc:  # a diagnosis never breaks the run it watches
            print(f"inductor_keys: could not record a key: {exc}", file=sys.stderr)
        return key, lines

    return record


class _Wrapper(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in KEY_FUNCTIONS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            function, cache = KEY_FUNCTIONS[name]
            setattr(module, function, _recording(getattr(module, function), cache))

        loader.exec_module = exec_module
        return spec


if DIRECTORY:
    os.makedirs(DIRECTORY, exist_ok=True)
    sys.meta_path.insert(0, _Wrapper())

"""Does a compilation in another process find the graph one process compiled — and if not, what
in Inductor's cache key differs? For the points a build compiles ahead of their profiles
(pipeline/runtimes/torch_compile_ahead.py), on one machine or on a cluster's point workers.

    python scripts/check_compile_cache_reuse.py            # a small ModernBERT, bf16 on the GPU (fp32 on a CPU)
    python scripts/check_compile_cache_reuse.py --model bert

One process compiles first, in its main thread, into an empty cache; then each case compiles the
same model at the same shape in a process of its own, differing in one thing: nothing, the thread
it compiles in, having compiled the model at another shape first (as a point worker has, in its
thread), the model's weights, PyTorch's thread count, the GPU (with two). Each prints whether Inductor's FX graph
cache hit and, for a miss, the components of the key (torch/_inductor/codecache.py's
``compiled_fx_graph_hash`` debug lines, a private API read here for diagnosis only) that differ from
the first process's. A case other than the first that misses names why a point's profile compiled
again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def compile_once(family: str, case: str) -> dict:
    """In this process: compile the model once and say what Inductor's cache did and keyed on."""
    sys.path.insert(0, str(REPO))
    from pipeline.models.torch_import import import_timm

    import_timm()  # torch, past torchvision's failing import on a CPU-only torch (transformers imports it)
    import torch
    import torch._dynamo.utils
    import torch._inductor.codecache as codecache
    import transformers

    keys: list[dict[str, str]] = []
    original = codecache.compiled_fx_graph_hash

    def recording(*args, **kwargs):
        key, lines = original(*args, **kwargs)
        components = {}
        for line in lines:
            match = re.match(r"\[(\w+)\] ([^:]+?): (.*)", line)
            if match:
                components[match.group(2)] = f"{match.group(1)} {match.group(3)[:200]}"
        keys.append(components)
        return key, lines

    codecache.compiled_fx_graph_hash = recording
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}
    torch.manual_seed(1 if case == "weights" else 0)  # other weights: is the key the graph's, or also its values'?
    if family == "bert":
        model = transformers.BertModel(transformers.BertConfig(**small))
    else:
        # Its default vocabulary: the special tokens' ids lie at its end.
        model = transformers.ModernBertModel(transformers.ModernBertConfig(**{**small, "vocab_size": 50368}))
    model = model.to(dtype).eval()
    device = "cuda" if cuda else "cpu"
    model = model.to(device)
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
    outcome: dict = {}

    def run() -> None:
        counters = torch._dynamo.utils.counters
        if case.startswith("recompile"):  # this process compiled the model at another shape first, as a point worker has
            with torch.no_grad():
                torch.compile(model, dynamic=False)(input_ids=ids[:, :32], attention_mask=torch.ones_like(ids[:, :32]))
            keys.clear()
        counters.clear()
        compiled = torch.compile(model, dynamic=False)
        with torch.no_grad():
            compiled(input_ids=ids, attention_mask=torch.ones_like(ids))
        if cuda:
            torch.cuda.synchronize()
        outcome.update(
            hits=int(counters["inductor"]["fxgraph_cache_hit"]),
            misses=int(counters["inductor"]["fxgraph_cache_miss"]),
            thread=threading.current_thread().name,
            torch_threads=torch.get_num_threads(),
            device=torch.cuda.get_device_name() if cuda else "cpu",
        )

    if case.endswith("thread"):
        worker = threading.Thread(target=run, name="not-main")
        worker.start()
        worker.join()
    else:
        run()
    outcome["keys"] = keys
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", choices=("modernbert", "bert"), default="modernbert", help="the model's family, built small from its config"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child's own run
    args = parser.parse_args()
    if args.case is not None:
        print(json.dumps(compile_once(args.model, args.case)))
        return 0

    import torch

    gpus = torch.cuda.device_count()
    cases = [("first", {}), ("again", {}), ("thread", {}), ("recompile", {}), ("recompile-thread", {}), ("weights", {})]
    cases.append(("omp1", {"OMP_NUM_THREADS": "1"}))
    if gpus >= 2:
        cases.append(("gpu1", {"CUDA_VISIBLE_DEVICES": "1"}))
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
        results = {}
        for name, env in cases:
            child_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, **env}
            if name != "gpu1" and gpus:
                child_env.setdefault("CUDA_VISIBLE_DEVICES", "0")
            done = subprocess.run(
                [sys.executable, __file__, "--model", args.model, "--case", name], env=child_env, capture_output=True, text=True
            )
            if done.returncode != 0:
                print(f"{name}: failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
                continue
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    first = (results.get("first") or {}).get("keys") or [{}]
    for name, result in results.items():
        print(
            f"{name}: {result['hits']} hit(s), {result['misses']} miss(es); thread {result['thread']}, {result['torch_threads']} torch threads, {result['device']}"
        )
        if name == "first" or not result["misses"]:
            continue
        for index, components in enumerate(result["keys"]):
            base = first[index] if index < len(first) else {}
            differ = sorted(n for n in set(base) | set(components) if base.get(n, "").split(" ")[0] != components.get(n, "").split(" ")[0])
            print(f"  graph {index}: the key differs from the first process's in {', '.join(differ[:12]) or 'nothing recorded'}")
            for component in differ[:4]:
                print(f"    {component}:\n      first: {base.get(component)}\n      here:  {components.get(component)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

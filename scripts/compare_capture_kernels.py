"""torch-reduce-overhead as the product prepares it — torch.compile's default-mode graph captured in one
CUDA graph (TorchSpec.capture) — against torch.compile's own mode "reduce-overhead" (Inductor's CUDA
graph trees, compiled on its own), timed the plainest way, independently of the product.

For each shape point: both prepared from one ModernBERT-base (random weights, the catalog's config),
the CUDA kernels one call launches under PyTorch's profiler (names and counts), and each one's
median over interleaved rounds of back-to-back calls timed by CUDA events. The kernels should be
the same and the medians within 3 %; mode reduce-overhead also copies its inputs into its own
buffers at each call (a few small copy kernels).

    python scripts/compare_capture_kernels.py --dtype bf16 --shapes 2x512 4x4096 --out DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path


def build(torch, dtype, batch: int, sequence: int):
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    model = ModernBertModel(ModernBertConfig()).eval().to("cuda", dtype)
    ids = torch.randint(0, 50000, (batch, sequence), device="cuda")
    mask = torch.ones_like(ids)
    return model, (ids, mask)


def kernels(torch, run) -> collections.Counter:
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        run()
        torch.cuda.synchronize()
    return collections.Counter(event.name for event in trace.events() if event.device_type.name == "CUDA" and "Memcpy" not in event.name)


def timed(torch, run, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--shapes", nargs="+", default=["2x512", "4x4096"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    results = {}
    for shape in args.shapes:
        batch, sequence = (int(part) for part in shape.split("x"))
        model, inputs = build(torch, dtype, batch, sequence)
        with torch.no_grad():
            began = time.perf_counter()
            compiled = torch.compile(model)
            compiled(*inputs)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    compiled(*inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                compiled(*inputs)
            captured_s = time.perf_counter() - began
            torch._dynamo.reset()
            began = time.perf_counter()
            own = torch.compile(model, mode="reduce-overhead")
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                own(*inputs)
            own_s = time.perf_counter() - began

            def mode_run(own=own, inputs=inputs):
                torch.compiler.cudagraph_mark_step_begin()
                return own(*inputs)

            runs = {"capture": graph.replay, "mode reduce-overhead": mode_run}
            found = {name: kernels(torch, run) for name, run in runs.items()}
            calls = max(5, int(200 / max(timed(torch, graph.replay, 5), 0.05)))  # about 200 ms a take
            medians = {name: [] for name in runs}
            for _ in range(args.rounds):  # interleaved: the host's spells hit both alike
                for name, run in runs.items():
                    medians[name].append(timed(torch, run, calls))
        capture, mode = (statistics.median(medians[name]) for name in runs)
        only_capture = found["capture"] - found["mode reduce-overhead"]
        only_mode = found["mode reduce-overhead"] - found["capture"]
        results[shape] = {
            "median_ms": {"capture": capture, "mode reduce-overhead": mode},
            "ratio_capture_over_mode": capture / mode,
            "kernels": {name: sum(counter.values()) for name, counter in found.items()},
            "kernels_only_in_capture": dict(only_capture),
            "kernels_only_in_mode": dict(only_mode),
            "prepare_s": {"capture (compile + capture)": captured_s, "mode reduce-overhead": own_s},
        }
        print(
            f"{shape}: capture {capture:.3f} ms, mode reduce-overhead {mode:.3f} ms (ratio {capture / mode:.3f}); "
            f"kernels {results[shape]['kernels']}, only in capture {dict(only_capture)}, only in the mode {dict(only_mode)}",
            flush=True,
        )
        del model, compiled, own, graph
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capture_kernels.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "shapes": results}, indent=2))


if __name__ == "__main__":
    main()

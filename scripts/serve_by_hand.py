"""How many inferences a second an engine serves at N concurrent streams, measured by hand: the
independent figure the product's `streams` measurement is checked against (GPU; CPU for its test).

Nothing of the product is imported. ModernBERT-base (transformers' ModernBertConfig(), random
weights) at each shape point, in each kind — eager PyTorch, the model captured in a CUDA graph,
torch.compile's default graph — is served by N threads started together, each with its own CUDA
stream, its own inputs and (for a CUDA graph) its own captured graph, for ``--seconds`` each: a
thread issues one inference, waits for it on its stream, and counts it. Inferences/s is what all
the threads completed between the common start and the common end, over that span; each request's
latency is the host's time from issue to the end of its wait.

    python scripts/serve_by_hand.py --shapes 2x512 4x4096 --streams 1 2 4 --seconds 4 --out DIR

``--padding on`` pads every sequence after the first as the product's transformers models are by
default; ``off`` (the default) leaves the requests unpadded, which is other work (``request_mask``);
``both`` serves each count unpadded and then padded, in turn, to show what the padding costs.

Writes DIR/serve-by-hand.json (a list of {shape, kind, streams, repeat, inferences, seconds, padding,
inferences_per_s, median_ms, p99_ms, started, ended}: ``started``/``ended`` are epoch seconds, for
aligning with a power sampler's records). The figures depend on the machine and its host: report
them with the GPU named, and measure both sides of a comparison on one machine start.

A launch-bound kind's figure is the host's speed while it ran, and a cloud host's vCPUs change
speed for seconds at a time: ``--repeats N`` serves every kind and count of a shape N times, in
turn (all of them once, then again), so that a spell lands on one repeat and not on all;
scripts/check_serving_agreement.py reads each count's median repeat and shows their range.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

KINDS = ("eager", "cuda graph", "compiled")


def model_and_inputs(torch, device: str, dtype, tiny: bool):
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        # A CPU torch beside PyPI's torchvision (whose ops need CUDA torch) fails registering fake
        # kernels for those ops; transformers needs none of them, so that registration is skipped.
        import types

        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    config = ModernBertConfig(attn_implementation="sdpa")
    if tiny:  # the script's own test on a CPU: the same code paths, a model that runs in milliseconds
        config = ModernBertConfig(
            attn_implementation="sdpa",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            vocab_size=512,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            cls_token_id=2,
            sep_token_id=1,
        )
    return config, ModernBertModel(config).eval().to(device, dtype)


def torch_and_model(device: str, tiny: bool):
    """(torch, the config, ModernBERT on ``device``: bf16 on a GPU, fp32 on a CPU), or None, said
    why, where a GPU was asked for and there is none."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: --device cpu measures the CPU", file=sys.stderr)
        return None
    config, model = model_and_inputs(torch, device, torch.bfloat16 if device == "cuda" else torch.float32, tiny)
    return torch, config, model


def request_mask(torch, batch: int, sequence: int, padding: bool, generator=None):
    """The attention mask of a request: ones; with ``padding``, as the product's transformers
    models have it by default (`padding = true`, docs/models.md), every sequence after the first
    cut to a random length from half of it to all of it, zeros beyond. The two differ in work: with
    no zero in the mask, transformers passes no mask to a global attention layer, whose kernel may
    then be another."""
    mask = torch.ones((batch, sequence), dtype=torch.long)
    if padding and sequence > 1:
        for row in range(1, batch):
            mask[row, int(torch.randint(max(1, sequence // 2), sequence + 1, (1,), generator=generator)) :] = 0
    return mask


def one_stream(torch, kind: str, model, compiled, batch: int, sequence: int, vocab: int, device: str, padding: bool = False):
    """A callable serving one request on its own stream (and its own inputs, and graph), and the
    stream's wait (nothing on a CPU)."""
    ids = torch.randint(0, vocab, (batch, sequence), device=device)
    mask = request_mask(torch, batch, sequence, padding).to(device)
    if device == "cpu":
        module = compiled if kind == "compiled" else model
        return (lambda: module(input_ids=ids, attention_mask=mask)), (lambda: None)
    stream = torch.cuda.Stream()
    if kind == "cuda graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on a side stream before capture, as torch.cuda.graphs asks
                model(input_ids=ids, attention_mask=mask)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            model(input_ids=ids, attention_mask=mask)

        def run():
            with torch.cuda.stream(stream):
                graph.replay()

        return run, stream.synchronize
    module = compiled if kind == "compiled" else model

    def run():
        with torch.cuda.stream(stream):
            module(input_ids=ids, attention_mask=mask)

    return run, stream.synchronize


def serve(
    torch, kind: str, model, compiled, shape: str, streams: int, seconds: float, vocab: int, device: str, padding: bool = False
) -> dict:
    batch, sequence = (int(part) for part in shape.split("x"))
    servers = [one_stream(torch, kind, model, compiled, batch, sequence, vocab, device, padding) for _ in range(streams)]
    with torch.no_grad():
        for run, wait in servers:  # every stream's first requests untimed (allocations, autotuning)
            for _ in range(3):
                run()
            wait()
    warmed, start = threading.Barrier(streams + 1), threading.Barrier(streams + 1)
    latencies: list[list[float]] = [[] for _ in range(streams)]
    window = {}

    def thread(index: int) -> None:
        run, wait = servers[index]
        with torch.no_grad():
            run()  # untimed: a thread's first request sets up what the thread needs (46-81 ms on an H100)
            wait()
            warmed.wait()
            start.wait()
            while True:
                issued = time.perf_counter()
                if issued >= window["end"]:
                    return
                run()
                wait()
                done = time.perf_counter()
                if done <= window["end"]:  # a request that ends past the span is not counted
                    latencies[index].append((done - issued) * 1e3)

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    warmed.wait()
    window["end"] = time.perf_counter() + seconds
    started = time.time()
    start.wait()
    for t in threads:
        t.join()
    ended = time.time()
    every = sorted(value for each in latencies for value in each)
    count = len(every)
    return {
        "shape": shape,
        "kind": kind,
        "streams": streams,
        "inferences": count,
        "seconds": seconds,
        "padding": padding,
        "inferences_per_s": count / seconds,
        "median_ms": every[count // 2] if count else None,
        "p99_ms": every[min(count - 1, int(0.99 * count))] if count else None,
        "started": started,
        "ended": ended,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["2x512", "4x4096"])
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=1, help="serve every kind and count this many times, in turn")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="a two-layer ModernBERT (this script's test)")
    parser.add_argument(
        "--padding",
        default="off",
        choices=["off", "on", "both"],
        help="on: pad every sequence after the first, as the product's transformers models are by default "
        "(request_mask); both: each count unpadded, then padded, in turn (what the padding costs)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    ready = torch_and_model(args.device, args.tiny)
    if ready is None:
        return 2
    torch, config, model = ready
    compiled = torch.compile(model) if "compiled" in args.kinds else None
    paddings = {"off": (False,), "on": (True,), "both": (False, True)}[args.padding]
    results = []
    for shape in args.shapes:
        for repeat in range(args.repeats):
            for kind in args.kinds:
                for streams in args.streams:
                    if kind == "cuda graph" and args.device == "cpu":
                        if repeat == 0:
                            print(f"{shape:>8} {kind:<12} skipped: a CUDA graph needs a GPU", flush=True)
                        continue
                    for padding in paddings:
                        result = serve(torch, kind, model, compiled, shape, streams, args.seconds, config.vocab_size, args.device, padding)
                        results.append({**result, "repeat": repeat})
                        print(
                            f"{shape:>8} {kind:<12} {streams} streams: {result['inferences_per_s']:9.1f} inferences/s, "
                            f"median {result['median_ms'] or float('nan'):.3f} ms (repeat {repeat + 1} of {args.repeats}"
                            f"{', padded' if padding else ''})",
                            flush=True,
                        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve-by-hand.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

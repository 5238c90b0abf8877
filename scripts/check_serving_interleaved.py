"""Does the product's serving read what serving by hand reads, when both share the host's spells?

A launch-bound engine's inferences/s is the host's speed while it was served, and the lent GPU
machines' vCPUs change speed by up to 1.8x for seconds at a time: the product's serving and
scripts/serve_by_hand.py, run a minute apart, differ by what the host did in between. Here both
serve one model in one process, take for take in turn (product, by hand, by hand, product, …), so
that a spell lands on both sides alike; each pair's ratio and their median say whether the
product's way of serving (pipeline/runtimes/pytorch/streams.py, serve_streams: threads released by
a barrier, a CUDA stream each, a request timed from its call to its stream's end) counts what the
hand-written loop counts. The host's probe (pipeline/measuring/host_speed.py) is timed before
each take, to show how the spells went.

    python scripts/check_serving_interleaved.py --shape 2x512 --kinds eager compiled --streams 1 --pairs 6 --out DIR

Writes DIR/serving-interleaved.json (every take: kind, streams, side, pair, inferences/s, probe ms)
and prints each pair's ratio (product over by hand) and each kind's median ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import serve_by_hand  # noqa: E402


def product_side(torch, model, compiled, shape: str, vocab: int, device: str, spec):
    """A serving of the product's own code, on ``model``: a Prepared whose module takes the inputs
    in order, as an engine's does."""
    from pipeline.runtimes.pytorch.prepared import Prepared
    from pipeline.runtimes.pytorch.streams import serve_streams

    batch, sequence = (int(part) for part in shape.split("x"))
    ids = torch.randint(0, vocab, (batch, sequence), device=device)
    mask = torch.ones((batch, sequence), dtype=torch.long, device=device)

    class InOrder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    eager = InOrder(model)
    prepared = Prepared(
        engine_file=(0, 0, 0),
        run=lambda: None,
        examples=(ids, mask),
        device=device,
        shape=shape,
        model=eager,
        compiled=InOrder(compiled) if compiled is not None else None,
    )

    def serve(streams: int, seconds: float):
        run = serve_streams(spec, contextlib.nullcontext, prepared, streams, seconds, None)
        return run.completed / run.span_s

    return serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="2x512")
    parser.add_argument("--kinds", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--streams", nargs="+", type=int, default=[1])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="a two-layer ModernBERT (this script's test)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from pipeline.measuring.host_speed import probe_ms
    from pipeline.runtimes.pytorch.spec import TorchSpec

    ready = serve_by_hand.torch_and_model(args.device, args.tiny)
    if ready is None:
        return 2
    torch, config, model = ready
    takes = []
    for kind in args.kinds:
        compiled = torch.compile(model) if kind == "compiled" else None
        spec = TorchSpec(kind="torch", backend="compile" if compiled is not None else "eager")
        product = product_side(torch, model, compiled, args.shape, config.vocab_size, args.device, spec)
        for streams in args.streams:
            sides = {
                "product": lambda streams=streams, product=product: product(streams, args.seconds),
                "by hand": lambda streams=streams, compiled=compiled, kind=kind: serve_by_hand.serve(
                    torch, kind, model, compiled, args.shape, streams, args.seconds, config.vocab_size, args.device
                )["inferences_per_s"],
            }
            for side in sides.values():  # untimed: allocations, compilation, autotuning
                side()
            for pair in range(args.pairs):
                order = ("product", "by hand") if pair % 2 == 0 else ("by hand", "product")
                for side in order:
                    probe = probe_ms()
                    takes.append(
                        {"kind": kind, "streams": streams, "side": side, "pair": pair, "inferences_per_s": sides[side](), "probe_ms": probe}
                    )
            ratios = []
            for pair in range(args.pairs):
                mine = {t["side"]: t for t in takes if (t["kind"], t["streams"], t["pair"]) == (kind, streams, pair)}
                ratio = mine["product"]["inferences_per_s"] / mine["by hand"]["inferences_per_s"]
                ratios.append(ratio)
                print(
                    f"{kind:<9} {streams} streams, pair {pair}: product {mine['product']['inferences_per_s']:8.1f}, "
                    f"by hand {mine['by hand']['inferences_per_s']:8.1f} inf/s, ratio {ratio:.3f} "
                    f"(probe {mine['product']['probe_ms']:.2f} / {mine['by hand']['probe_ms']:.2f} ms)",
                    flush=True,
                )
            print(
                f"{kind:<9} {streams} streams: median ratio {statistics.median(ratios):.3f} over {len(ratios)} pairs ({min(ratios):.3f}-{max(ratios):.3f})",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving-interleaved.json").write_text(json.dumps(takes, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build a planned variant's ONNX with an ahead-of-time toolchain and say, for every quantizable
layer of the model, which precision its engine layers compute in: the excluded layers should be
FP16/BF16, the others the variant's (FP4 for NVFP4, FP8 for MXFP8).

    python scripts/audit_planned_layers.py --engine vit_nvfp4_plan --toolchain trt-rtx1.7 --arch sm120 [--out audit.json]

Run from the workspace (its pipeline.toml); the ONNX is the export's (models/MODEL/VARIANT.onnx),
made wherever the variant could be exported (NVFP4 and MXFP8 need a CUDA GPU). The engine is
built into a temporary folder; nothing in the workspace changes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from pipeline.models import model_source
    from pipeline.precision.where import engine_layers_by_layer, onnx_nodes_by_layer, read_graph
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime, load_catalog
    from pipeline.stages.quantized_layers import prefix_of, quantizable_layers
    from pipeline.trtexec.layers import INTENDED_DTYPE, MATH_TYPES, read_layer_info
    from pipeline.workspace import Workspace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--toolchain", required=True)
    parser.add_argument("--arch", action="append", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    catalog = load_catalog(None)
    if args.arch:
        catalog = catalog.with_targets(args.toolchain, tuple(args.arch))
    ref = catalog.engine(args.engine)
    variant = catalog.variant(ref.variant)
    source = model_source(ref.model, catalog.model(ref.model), catalog.root)
    onnx_path = Workspace(catalog.root).onnx_path(ref)
    runtime = create_runtime(args.toolchain, catalog.toolchain(args.toolchain), Reporter(), catalog.root)
    with tempfile.TemporaryDirectory() as scratch:
        built = runtime.build(onnx_path, Path(scratch) / f"{ref.name}.engine", variant, source)
        info = read_layer_info(built.sidecars["layer_info"])
    model = source.create()
    runnable = source.runnable(model)
    layers = quantizable_layers(model, source.quantize_linear_only)
    modules = {name for name, _ in runnable.named_modules() if name}
    nodes = onnx_nodes_by_layer(read_graph(onnx_path), layers, modules, prefix_of(runnable, model))
    found = engine_layers_by_layer(info, nodes)
    excluded = set(variant.exclude)

    def narrowest(entries) -> str:
        """The layer's math precision: the narrowest its engine layers compute in (the matrix
        multiply's; the block scales' moves are FP8, a fused attention's FP16)."""
        seen = {entry["precision"] for entry in entries}
        return next((dtype for dtype in MATH_TYPES if dtype in seen), "not found")

    audit = {
        layer: {"excluded": layer in excluded, "precision": narrowest(found[layer]), "engine_layers": found[layer]} for layer in layers
    }
    for layer in sorted(excluded):
        print(f"excluded  {layer:<32} engine: {audit[layer]['precision']}")
    others = Counter(entry["precision"] for entry in audit.values() if not entry["excluded"])
    print(f"the other {sum(others.values())} layers: " + ", ".join(f"{count} in {precision}" for precision, count in others.most_common()))
    print(
        "layers not excluded that are not in the variant's precision:",
        ", ".join(
            f"{layer} ({entry['precision']})"
            for layer, entry in audit.items()
            if not entry["excluded"] and entry["precision"] != INTENDED_DTYPE[variant.precision]
        )
        or "none",
    )
    if args.out:
        args.out.write_text(json.dumps({"engine": ref.name, "toolchain": args.toolchain, "targets": args.arch, "layers": audit}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

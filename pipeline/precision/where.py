"""Where a PyTorch layer ends up: its ONNX nodes, and the engine layers built from them.

Quantized exports are written by the TorchScript exporter, which names each node after the module
scope it came from: ``/blocks/blocks.0/attn/qkv/MatMul`` for ``blocks.0.attn.qkv`` (a container's
children are named by their path from it), ``/model/encoder/layer.0/…`` under a wrapper. The
quantizers' Q/DQ nodes sit in the layer's scope (``…/qkv/input_quantizer/QuantizeLinear``). An
engine layer implements the ONNX nodes its metadata lists (``[ONNX Layer: …]``), else those its
(possibly fused) name contains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def module_path(node_name: str, modules: set[str]) -> str | None:
    """The module a node was exported from, among ``modules`` (names with the wrapper's prefix)."""
    segments = [segment for segment in node_name.split("/") if segment][:-1]
    path: list[str] = []
    for segment in segments:
        for keep in range(len(path), -1, -1):  # "blocks.0" under "blocks" replaces it
            candidate = ".".join([*path[:keep], segment])
            if candidate in modules:
                path = candidate.split(".")
                break
        else:
            return ".".join(path) or None
    return ".".join(path) or None


def onnx_nodes_by_layer(model, layers: list[str], modules: set[str], prefix: str) -> dict[str, list[dict[str, str]]]:
    """Each layer's ONNX nodes (name and op), the layer named as the model names it."""
    wanted = {prefix + layer: layer for layer in layers}
    found: dict[str, list[dict[str, str]]] = {layer: [] for layer in layers}
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        path = module_path(node.name, modules)
        while path and path not in wanted:
            path = path.rpartition(".")[0]
        if path:
            found[wanted[path]].append({"name": node.name, "op": node.op_type})
    return found


def read_graph(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False)


def engine_layers_by_layer(info, nodes_by_layer: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, Any]]]:
    """Each model layer's engine layers (name and precision), from an engine's layer information:
    those that implement any of its ONNX nodes (their metadata lists them: the matrix multiply,
    and the weights' dequantization, where FP8 weights show though the multiply runs in FP16),
    else whose fused name contains its matrix multiply's node name."""
    result: dict[str, list[dict[str, Any]]] = {layer: [] for layer in nodes_by_layer}
    for engine_layer in info.layers:
        implements = set(engine_layer.onnx_nodes)
        for layer, nodes in nodes_by_layer.items():
            compute = [node["name"] for node in nodes if node["op"] in ("MatMul", "Gemm", "Conv")]
            if implements & {node["name"] for node in nodes} or any(name in engine_layer.name for name in compute):
                result[layer].append({"name": engine_layer.name, "precision": engine_layer.precision})
    return result


def built_layer_infos(workspace, catalog, ref) -> dict[str, Any]:
    """The layer information of every build of this engine in the workspace, by toolchain."""
    from pipeline.manifest import read_manifest
    from pipeline.trtexec.layers import read_layer_info

    infos = {}
    for toolchain in catalog.toolchains:
        path = workspace.manifest_path(toolchain, ref)
        if not path.is_file():
            continue
        build = read_manifest(path).build
        artefact = next((a for a in (build.outputs if build else []) if a.role == "layer_info"), None)
        if artefact is not None and (workspace.root / artefact.path).is_file():
            infos[toolchain] = read_layer_info(workspace.root / artefact.path)
    return infos


def attach_locations(result, lab, catalog) -> None:
    """Fill each analysed layer's ONNX nodes (once the variant is exported) and engine layers
    (once an engine of it is built with its layer information)."""
    from pipeline.workspace import Workspace

    workspace = Workspace(catalog.root)
    onnx_path = workspace.onnx_path(lab.ref)
    if not onnx_path.is_file():
        return
    modules = {name for name, _ in lab.runnable.named_modules() if name}
    nodes = onnx_nodes_by_layer(read_graph(onnx_path), [layer.name for layer in result.layers], modules, lab.prefix)
    for layer in result.layers:
        layer.onnx_nodes = [node["name"] for node in nodes[layer.name]]
    for toolchain, info in built_layer_infos(workspace, catalog, lab.ref).items():
        for name, engine_layers in engine_layers_by_layer(info, nodes).items():
            result.layer(name).engine_layers += [{"toolchain": toolchain, **entry} for entry in engine_layers]

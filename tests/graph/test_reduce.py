"""A build that fails, named and reduced: a user's ONNX holding one op no compiler here can build,
buried in a real model's graph (timm's test_vit as this pipeline exports it), built to an ERROR
naming the node, then cut by `pipeline reduce` to the few nodes that still fail the same way.

With TensorRT-RTX (marked ``rtx``: real releases from the package index, building on this CPU)
and with trtexec (the stand-in replaying a recorded refusal of the custom op AddScalar); and the
bad inputs: an engine whose build did not fail, none built, a graph changed since, a failure that
does not come back (flaky), and a reduce cut short by SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, bury, write_catalog
from tests.dockerd import STANDIN, standin_files

PLUGIN_NOT_FOUND = "Plugin not found, are the plugin name, version, and namespace correct?"

USER = """
[models.user]
onnx = "user.onnx"

[toolchains."trt-rtx1.7"]
kind = "tensorrt-rtx"
release = "1.7.1.116"
archs = ["sm89"]
"""


def nodes_of(path: Path) -> list[str]:
    import onnx

    return [node.op_type for node in onnx.load(str(path)).graph.node]


# --- TensorRT-RTX -------------------------------------------------------------------------------


@pytest.fixture
def rtx_workspace(rtx_cache, exported_tiny, tmp_path):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    bury(exported_tiny, catalog.parent / "user.onnx", "FancyErf", "acme.custom")
    return catalog


@pytest.mark.rtx
def test_the_failing_node_is_named_and_the_graph_reduced_to_it(rtx_workspace, run_cli):
    ws = rtx_workspace.parent
    built = run_cli(rtx_workspace, "build", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7")
    err = " ".join(built.err.split())
    assert built.exit_code == 1, built.err
    # Linted: a node only a plugin builds is said before anything is built, and ONNX Runtime's
    # reference (it cannot run it either) leaves the accuracy unchecked, not the build refused.
    assert (
        'node(s) outside ONNX\'s standard domains, which TensorRT builds only through a plugin of that name: "blocks.3.mlp.act/FancyErf" (acme.custom:FancyErf)'
        in err
    )
    assert 'ONNX Runtime cannot run "blocks.3.mlp.act/FancyErf" (acme.custom:FancyErf), a custom op, for the FP32 reference' in err
    assert "ERROR TensorRT-RTX 1.7.1.116 could not parse models/user/fp32.onnx at node " in err
    assert '"blocks.3.mlp.act/FancyErf" (FancyErf → ' in err and f"checkFallbackPluginImporter: {PLUGIN_NOT_FOUND}" in err
    assert "`pipeline reduce --engine user_fp32 --toolchain trt-rtx1.7`" in err
    build = read_manifest(ws / "manifests" / "trt-rtx1.7" / "user_fp32.json").build
    assert build.status == "failed" and build.details.parser_failure["node"] == "blocks.3.mlp.act/FancyErf"
    before = len(nodes_of(ws / "models" / "user" / "fp32.onnx"))

    reduced = run_cli(rtx_workspace, "reduce", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7")
    assert reduced.exit_code == 0, reduced.err
    assert "iteration 1: " in reduced.err  # progress says which iteration it is on
    path = ws / "models" / "user" / "fp32.trt-rtx1.7.reduced.onnx"
    ops = nodes_of(path)
    assert len(ops) <= 3 and "FancyErf" in ops, ops
    assert f"{before} → {len(ops)} node(s)" in reduced.err and "models/user/fp32.trt-rtx1.7.reduced.onnx" in reduced.err
    record = read_manifest(ws / "manifests" / "trt-rtx1.7" / "user_fp32.json").build.details.reduced
    assert record["onnx"] == "models/user/fp32.trt-rtx1.7.reduced.onnx"
    assert (record["nodes_before"], record["nodes_after"], record["ops"]) == (before, len(ops), ops)
    assert record["iterations"] >= 2 and record["seconds"] > 0 and record["failure"] == build.reason
    assert record["tool"].startswith("polygraphy ") and "FancyErf" in " ".join(record["assumed"])
    assert not list((ws / "engines" / "trt-rtx1.7").glob(".reduce-*")), "the candidates went with the reduce"

    # The reduced graph, built as a model of its own, fails the same way.
    with rtx_workspace.open("a") as catalog:
        catalog.write('\n[models.cut]\nonnx = "models/user/fp32.trt-rtx1.7.reduced.onnx"\n')
    again = run_cli(rtx_workspace, "build", "--engine", "cut_fp32", "--toolchain", "trt-rtx1.7")
    assert again.exit_code == 1 and f"checkFallbackPluginImporter: {PLUGIN_NOT_FOUND}" in " ".join(again.err.split())
    assert read_manifest(ws / "manifests" / "trt-rtx1.7" / "cut_fp32.json").build.details.parser_failure["op_type"] == "FancyErf"


def branchy_graph_with_det(path: Path) -> None:
    """x → MatMul → Relu, then two branches met by a Mul: one through Det (a standard op ONNX
    Runtime runs and TensorRT-RTX has no importer for), one through ReduceSum; no node named."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = [
        numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype("float32"), "w"),
        numpy_helper.from_array(np.array([2.0], np.float32), "two"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Det", ["a"], ["d"]),
        helper.make_node("Unsqueeze", ["d", "axis"], ["d1"]),
        helper.make_node("Mul", ["d1", "two"], ["d2"]),
        helper.make_node("ReduceSum", ["a", "axis"], ["r"], keepdims=0),
        helper.make_node("Mul", ["r", "d2"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    onnx.save(
        helper.make_model(helper.make_graph(nodes, "user", [x], [y], weights), opset_imports=[helper.make_opsetid("", 17)]), str(path)
    )


@pytest.mark.rtx
def test_an_unnamed_standard_op_without_an_importer_is_named_by_number_and_reduced(rtx_cache, tmp_path, run_cli):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    ws = catalog.parent
    branchy_graph_with_det(ws / "user.onnx")
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7")
    assert built.exit_code == 1
    assert "could not parse models/user/fp32.onnx at node 2 (Det → d): checkDet: UNSUPPORTED_NODE" in built.err
    reference = read_manifest(ws / "manifests" / "export" / "user_fp32.json").export.details.reference
    assert all(point["output"] for point in reference["points"].values())  # ONNX Runtime ran it: checked
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7")
    assert result.exit_code == 0, result.err
    assert nodes_of(ws / "models" / "user" / "fp32.trt-rtx1.7.reduced.onnx") == ["Det"]
    assert read_manifest(ws / "manifests" / "trt-rtx1.7" / "user_fp32.json").build.details.reduced["assumed"] == []


@pytest.mark.rtx
def test_a_reduce_of_a_build_that_did_not_fail_is_refused(rtx_workspace, run_cli):
    built = run_cli(rtx_workspace, "build", "--engine", "tiny_fp32", "--toolchain", "trt-rtx1.7")
    assert built.exit_code == 0, built.err
    result = run_cli(rtx_workspace, "reduce", "--engine", "tiny_fp32", "--toolchain", "trt-rtx1.7")
    assert result.exit_code == 2
    assert "ERROR the build of tiny_fp32 on trt-rtx1.7 did not fail (built): reduce cuts down a graph the compiler refused." in result.err
    assert "TIP reduce an engine whose build failed" in result.err


@pytest.mark.rtx
def test_a_reduce_cut_short_by_sigterm_leaves_nothing_half_written(rtx_workspace, run_cli):
    ws = rtx_workspace.parent
    assert run_cli(rtx_workspace, "build", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7").exit_code == 1
    manifest = ws / "manifests" / "trt-rtx1.7" / "user_fp32.json"
    recorded = manifest.read_bytes()
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "--catalog",
        str(rtx_workspace),
        "reduce",
        "--engine",
        "user_fp32",
        "--toolchain",
        "trt-rtx1.7",
    ]
    child = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in child.stderr:
        lines.append(line)
        if "iteration 2:" in line:
            child.send_signal(signal.SIGTERM)
            break
    rest = child.stderr.read()
    assert child.wait(timeout=120) == 143, "".join(lines) + rest
    assert not (ws / "models" / "user" / "fp32.trt-rtx1.7.reduced.onnx").exists()
    assert not list((ws / "engines" / "trt-rtx1.7").glob(".reduce-*"))
    assert not list(ws.rglob("*.partial"))
    assert manifest.read_bytes() == recorded


# --- ONNX Runtime, the embedded runtime -----------------------------------------------------------


def test_onnx_runtime_refusing_a_graph_is_recorded_and_reduced(exported_tiny, tmp_path, run_cli):
    """ONNX Runtime has no kernel for the custom op: its build is a refusal, recorded like a
    compiler's, and its message (file names and numbers aside) is the failure kept."""
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    ws = catalog.parent
    bury(exported_tiny, ws / "user.onnx", "FancyErf", "acme.custom")
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "onnxruntime")
    assert built.exit_code == 1 and "acme.custom:FancyErf(-1) is not a registered function/op" in built.err
    build = read_manifest(ws / "manifests" / "onnxruntime" / "user_fp32.json").build
    assert build.status == "failed" and "ONNX Runtime could not load fp32.onnx" in build.reason
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "onnxruntime")
    assert result.exit_code == 0, result.err
    assert nodes_of(ws / "models" / "user" / "fp32.onnxruntime.reduced.onnx") == ["FancyErf"]


# --- trtexec (the stand-in) ---------------------------------------------------------------------


@pytest.fixture
def standin_workspace(exported_tiny, tmp_path, monkeypatch):
    """trtexec installed here, as the stand-in in a mode: "plugin" refuses any graph holding the
    custom op AddScalar with the recorded TensorRT 10.16 refusal; "once" refuses the first build;
    "whole" refuses only graphs holding both the first and the last layer."""

    def make(mode: str) -> Path:
        root = tmp_path / "TensorRT"
        (root / "bin").mkdir(parents=True)
        (root / "lib").mkdir()
        shutil.copy(STANDIN, root / "bin" / "trtexec")
        data = tmp_path / "standin"
        data.mkdir()
        for name, content in standin_files(mode).items():
            (data / name).write_bytes(content)
        monkeypatch.setenv("STANDIN_DIR", str(data))
        local = f'\n[toolchains.local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ntrt_root = "{root}"\ngpus = "none"\n'
        catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER + local)
        bury(exported_tiny, catalog.parent / "user.onnx", "AddScalar", "acme.plugins")
        return catalog

    return make


def test_a_trtexec_refusal_is_reduced_by_builds_in_trtexec(standin_workspace, run_cli):
    catalog = standin_workspace("plugin")
    ws = catalog.parent
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local")
    assert built.exit_code == 1
    assert 'at node 0 "CustomOpModel-N-0-AddScalar" (AddScalar → CustomOpModel-V-0-AddScalar-0)' in built.err
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    ops = nodes_of(ws / "models" / "user" / "fp32.local.reduced.onnx")
    assert len(ops) <= 3 and "AddScalar" in ops, ops
    record = read_manifest(ws / "manifests" / "local" / "user_fp32.json").build.details.reduced
    assert record["nodes_after"] == len(ops) and record["iterations"] >= 2


def test_a_failure_that_does_not_come_back_is_not_reduced(standin_workspace, run_cli):
    catalog = standin_workspace("once")
    ws = catalog.parent
    assert run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local").exit_code == 1
    recorded = (ws / "manifests" / "local" / "user_fp32.json").read_bytes()
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert result.exit_code == 1
    assert "ERROR models/user/fp32.onnx no longer fails on local as its build did (builds)" in result.err
    assert "TIP a failure that comes and goes (flaky) cannot be reduced" in result.err
    assert not (ws / "models" / "user" / "fp32.local.reduced.onnx").exists()
    assert (ws / "manifests" / "local" / "user_fp32.json").read_bytes() == recorded


def test_a_failure_no_cut_shows_is_said_and_nothing_written(standin_workspace, run_cli):
    catalog = standin_workspace("whole")
    ws = catalog.parent
    assert run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local").exit_code == 1
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert result.exit_code == 1
    assert "ERROR no cut of the graph fails the same way (in " in result.err and "the failure needs the whole graph" in result.err
    assert not (ws / "models" / "user" / "fp32.local.reduced.onnx").exists()
    assert read_manifest(ws / "manifests" / "local" / "user_fp32.json").build.details.reduced is None


def test_the_shape_point_of_a_dynamic_graph_is_named_and_chosen_by_shape(standin_workspace, run_cli):
    import onnx

    catalog = standin_workspace("plugin")
    ws = catalog.parent
    model = onnx.load(str(ws / "user.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"  # a dynamic batch
    model = onnx.shape_inference.infer_shapes(model)  # the shapes up to the custom op, and its output's as its input's
    custom = next(node for node in model.graph.node if node.op_type == "AddScalar")
    declared = next(v for v in model.graph.value_info if v.name == custom.input[0])
    model.graph.value_info.append(onnx.helper.make_value_info(custom.output[0], declared.type))
    onnx.save(model, str(ws / "user.onnx"))
    catalog.write_text(catalog.read_text().replace('onnx = "user.onnx"', 'onnx = "user.onnx"\nshapes = ["1", "2"]'))
    assert run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local").exit_code == 1
    first = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    second = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local", "--shape", "2")
    unknown = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local", "--shape", "7")
    # Said before the first cut (what the cuts then do is the other tests' business).
    assert "cutting at shape point 1 (the first of 2; --shape picks another): input 1×3×160×160" in first.err
    assert "cutting at shape point 2 (chosen by --shape): input 2×3×160×160" in second.err
    assert unknown.exit_code == 2 and "ERROR --shape 7: user_fp32 was exported at 1, 2, not at 7." in unknown.err


def test_a_reduce_needs_a_failed_build_of_the_graph_as_it_is(standin_workspace, run_cli):
    catalog = standin_workspace("plugin")
    ws = catalog.parent
    none = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert none.exit_code == 2 and "ERROR user_fp32 has no build on local yet: there is no failure to reduce." in none.err
    assert "TIP run `pipeline build --engine user_fp32 --toolchain local` first" in none.err
    assert run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local").exit_code == 1
    with (ws / "models" / "user" / "fp32.onnx").open("ab") as graph:
        graph.write(b"\0")  # another graph than the one the build refused
    changed = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert changed.exit_code == 2
    assert "ERROR models/user/fp32.onnx is not the graph the build of user_fp32 on local refused (it changed or is gone)." in changed.err
    unknown = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "nosuch")
    assert unknown.exit_code == 2 and "nosuch" in unknown.err


def dynamo_names(path: Path) -> str:
    """The graph's nodes renamed as torch.onnx.export(dynamo=True) names them (``node_MatMul_12``:
    no slash); the name of a MatMul in its middle that no other name starts with."""
    import onnx

    model = onnx.load(str(path))
    for index, node in enumerate(model.graph.node):
        node.name = f"node_{node.op_type}_{index}"
    onnx.save(model, str(path))
    names = [node.name for node in model.graph.node]
    matmuls = [name for name in names if name.startswith("node_MatMul_")]
    return next((m for m in matmuls[len(matmuls) // 2 :] if not any(n != m and n.startswith(m) for n in names)), "")


def test_a_builder_failure_naming_a_node_without_a_slash_is_reduced(standin_workspace, run_cli):
    """TensorRT's builder names a fused range from the first node the graph holds to the failing
    one: the range's start moves with each cut, the failing node does not."""
    catalog = standin_workspace("fused")
    ws = catalog.parent
    node = dynamo_names(ws / "user.onnx")
    (Path(os.environ["STANDIN_DIR"]) / "node").write_text(node)
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local")
    assert built.exit_code == 1 and "Could not find any implementation for node {ForeignNode[node_" in built.err
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    path = ws / "models" / "user" / "fp32.local.reduced.onnx"
    import onnx

    names = [n.name for n in onnx.load(str(path)).graph.node]
    assert node in names and len(names) <= 3, names


def test_cuts_whose_build_crashed_are_counted_and_the_reduce_goes_on(standin_workspace, run_cli):
    catalog = standin_workspace("crashes")  # AddScalar refused; any graph without it crashes the build
    ws = catalog.parent
    assert run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local").exit_code == 1
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    assert "skipped, its build crashed (SIGSEGV): counted as not failing the same way" in result.err
    record = read_manifest(ws / "manifests" / "local" / "user_fp32.json").build.details.reduced
    skipped = record["skipped"]["crashed (SIGSEGV)"]
    assert skipped > 0 and f"builds, {skipped} cut{'s' if skipped > 1 else ''} skipped: {skipped} crashed (SIGSEGV)," in result.err
    assert "AddScalar" in nodes_of(ws / "models" / "user" / "fp32.local.reduced.onnx")


def test_a_build_that_crashed_is_recorded_as_failed_with_its_signal(standin_workspace, run_cli):
    catalog = standin_workspace("segv")
    ws = catalog.parent
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "local")
    assert built.exit_code == 1
    assert "ERROR trtexec build crashed (SIGSEGV, exit status -11) without an error of its own" in built.err
    build = read_manifest(ws / "manifests" / "local" / "user_fp32.json").build
    assert build.status == "failed" and "SIGSEGV" in build.reason
    assert build.details.trtexec["crashed"] == {"signal": "SIGSEGV", "exit_status": -11}


@pytest.mark.rtx
def test_a_refused_node_named_without_a_slash_is_reduced_on_tensorrt_rtx(rtx_cache, tmp_path, run_cli):
    """The Det graph with its nodes named as the torch.export-based exporter names them: the real
    compiler's log names the node ("Node name: node_Det_2"), and the cuts keep that name."""
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + USER)
    ws = catalog.parent
    branchy_graph_with_det(ws / "user.onnx")
    dynamo_names(ws / "user.onnx")
    # The build's own command line, --arch included, is the reduce's.
    built = run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7", "--arch", "sm89")
    assert built.exit_code == 1 and 'at node 2 "node_Det_2" (Det → d): checkDet: UNSUPPORTED_NODE' in built.err
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "trt-rtx1.7", "--arch", "sm89")
    assert result.exit_code == 0, result.err
    assert nodes_of(ws / "models" / "user" / "fp32.trt-rtx1.7.reduced.onnx") == ["Det"]

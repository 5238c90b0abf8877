"""`--cluster`: the engine matrix on a real three-node Ray cluster (tests/raycluster.py).

A head (no CPUs: it runs nothing) and two workers, each advertising a different GPU type as a
custom resource, all started with `ray start` on loopback with token authentication on; each node
has its own cache, so nothing reaches a node but through Ray's object store. The drivers are the
real `pipeline` command. Without root or Ray the module skips and says why; `.ci/run` sets
PIPELINE_REQUIRE_CLUSTER=1, which makes that a failure.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.manifest import read_manifest
from pipeline.workspace.artifacts import sha256_file
from tests import raycluster
from tests.conftest import CPU_TOOLCHAINS, RTX_TOOLCHAINS, TINY_CATALOG, tiny_bert_catalog, write_catalog
from tests.dockerd import STANDIN, standin_files
from tests.runtimes.pytorch.test_pytorch_runtime import needs_inductor

WHY = raycluster.why_unavailable()
if WHY and os.environ.get("PIPELINE_REQUIRE_CLUSTER") == "1":
    raise RuntimeError(f"PIPELINE_REQUIRE_CLUSTER=1, but the cluster tests cannot run: {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

WORKERS = {"w-h100": {"gpu_type:H100": 1}, "w-b200": {"gpu_type:B200": 1}}

# The demo's model and variants, ONNX Runtime, TensorRT-RTX for two architectures, and trtexec
# installed on the nodes (the stand-in script replaying recorded TensorRT 10.14 output).
CATALOG = (
    TINY_CATALOG
    + RTX_TOOLCHAINS.replace('release = "1.7.1.116"', 'release = "1.7.1.116"\narchs = ["sm89", "sm120"]')
    + """
[models.vit_tiny]
timm = "vit_tiny_patch16_224"
batch_size = 4
"""
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    trt_root = root / "TensorRT"
    (trt_root / "bin").mkdir(parents=True)
    (trt_root / "lib").mkdir()
    trt_root.joinpath("bin", "trtexec").write_bytes(STANDIN.read_bytes())
    trt_root.joinpath("bin", "trtexec").chmod(0o755)
    standin = root / "standin"
    standin.mkdir()
    for name, content in standin_files("ok").items():
        (standin / name).write_bytes(content)
    cluster = raycluster.LoopbackCluster(root)
    cluster.trt_root = trt_root
    try:
        cluster.start(WORKERS, extra_env={"STANDIN_DIR": str(standin)})
        yield cluster
    finally:
        cluster.stop()


def catalog_in(tmp_path, name: str, extra: str = "") -> os.PathLike:
    return write_catalog(tmp_path / name, CATALOG + extra)


def node_ids(cluster_run_err: str) -> dict[str, str]:
    """GPU type → Ray node id, from the driver's listing of the cluster."""
    line = next(line for line in cluster_run_err.splitlines() if line.startswith("cluster "))
    found = {}
    for part in line.split("— ", 1)[1].split("; "):
        _host, short, *kinds = part.split()
        for kind in kinds:
            found[kind] = short
    return found


def test_the_demo_matrix_runs_across_the_cluster_and_equals_a_local_run(cluster, rtx_cache, tmp_path, run_cli):
    cluster.share_toolchains(rtx_cache)
    remote = catalog_in(tmp_path, "cluster")
    variants = ["--model", "vit_tiny", "--variant", "fp32", "--variant", "fp16", "--variant", "int8"]
    ran = cluster.pipeline(remote, "run", "--cluster", cluster.address, *variants)
    assert ran.returncode == 0, ran.stderr
    built = cluster.pipeline(remote, "build", "--cluster", cluster.address, "--toolchain", "trt-rtx1.7", *variants)
    assert built.returncode == 0, built.stderr
    assert "3 task(s) dispatched" in built.stderr  # the exports were reused, not run again

    local = catalog_in(tmp_path, "local")
    assert run_cli(local, "run", *variants).exit_code == 0
    assert run_cli(local, "build", "--toolchain", "trt-rtx1.7", *variants).exit_code == 0

    workers = set(node_ids(ran.stderr).values())
    assert len(workers) == 2
    for variant in ("fp32", "fp16", "int8"):
        engine = f"vit_tiny_{variant}"
        for toolchain, stages in (("onnxruntime", ("export", "build", "profile")), ("trt-rtx1.7", ("export", "build"))):
            here = read_manifest(remote.parent / "manifests" / toolchain / f"{engine}.json")
            there = read_manifest(local.parent / "manifests" / toolchain / f"{engine}.json")
            assert here.gpu_type is None  # neither toolchain is tied to a GPU type
            for stage in stages:
                record = here.stage(stage)
                assert record.status == "done", (engine, toolchain, stage, record.reason)
                for artifact in record.outputs:
                    # Every file the manifest names is in the driver's workspace, intact.
                    assert sha256_file(remote.parent / artifact.path) == artifact.sha256
            # Same ONNX, same reference batch, same engines as a local run: the cluster changes where,
            # not what. (The FP32 model's outputs on that batch are sums of floats, whose order
            # follows the thread count: a node with one CPU agrees to rounding, not to the bit.)
            exported = {a.role: a for a in here.export.outputs}
            locally = {a.role: a for a in there.export.outputs}
            for role in ("onnx", "reference_input"):
                assert exported[role].sha256 == locally[role].sha256, role
            np.testing.assert_allclose(
                np.fromfile(remote.parent / exported["reference_output"].path, dtype=np.float32),
                np.fromfile(local.parent / locally["reference_output"].path, dtype=np.float32),
                rtol=1e-4,
                atol=1e-5,
            )
            engine_file = next(a for a in here.build.outputs if a.role == "engine")
            assert engine_file.sha256 == next(a for a in there.build.outputs if a.role == "engine").sha256
            assert here.environment.cluster_node is None or here.environment.cluster_node.ray_node_id[:8] in workers
        ort = read_manifest(remote.parent / "manifests" / "onnxruntime" / f"{engine}.json")
        assert ort.environment.cluster_node.ray_node_id[:8] in workers  # the node the profile ran on
        assert ort.profile.details.accuracy["cosine_similarity"] > 0.99
        rtx = read_manifest(remote.parent / "manifests" / "trt-rtx1.7" / f"{engine}.json")
        assert rtx.build.details.settings["targets"] == ["sm89", "sm120"]
        assert rtx.environment.cluster_node.ray_node_id[:8] in workers
        export = read_manifest(remote.parent / "manifests" / "export" / f"{engine}.json")
        assert export.environment.cluster_node.ray_node_id[:8] in workers
    # The unit of work is the shape point: the three engines of vit_tiny's one point were timed in
    # one set of rounds (one group, every engine of it), by one task on one worker, as locally.
    profiles = [read_manifest(remote.parent / "manifests" / "onnxruntime" / f"vit_tiny_{v}.json") for v in ("fp32", "fp16", "int8")]
    groups = {record.group for manifest in profiles for record in manifest.profile.details.rounds}
    entrants = {tuple(sorted(record.entrants)) for manifest in profiles for record in manifest.profile.details.rounds}
    assert len(groups) == 1 and entrants == {("fp16/onnxruntime", "fp32/onnxruntime", "int8/onnxruntime")}
    assert len({manifest.environment.cluster_node.ray_node_id for manifest in profiles}) == 1
    # Runs on loopback only: every node the manifests name is 127.0.0.1.
    assert {read_manifest(p).environment.cluster_node.address for p in (remote.parent / "manifests").glob("*/*.json")} == {"127.0.0.1"}

    again = cluster.pipeline(remote, "run", "--cluster", cluster.address, *variants)
    assert again.returncode == 0, again.stderr
    # Three exports, three builds and the one point: nothing sent.
    assert "0 task(s) dispatched" in again.stderr and again.stderr.count("didn't change") == 7
    rebuilt = cluster.pipeline(remote, "build", "--cluster", cluster.address, "--toolchain", "trt-rtx1.7", *variants)
    assert rebuilt.returncode == 0 and "0 task(s) dispatched" in rebuilt.stderr


def test_each_gpu_type_gets_its_own_engine_built_and_timed_on_a_node_of_that_type(cluster, tmp_path):
    extra = f'\n[toolchains.trt-local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ntrt_root = "{cluster.trt_root}"\ngpus = "none"\n'
    catalog = catalog_in(tmp_path, "gpus", extra)
    result = cluster.pipeline(catalog, "run", "--cluster", cluster.address, "--engine", "tiny_fp32", "--toolchain", "trt-local")
    assert result.returncode == 0, result.stderr
    nodes = node_ids(result.stderr)
    ws = catalog.parent
    for gpu in ("H100", "B200"):  # by default, every GPU type the cluster has
        manifest = read_manifest(ws / "manifests" / f"trt-local@{gpu}" / "tiny_fp32.json")
        assert manifest.gpu_type == gpu and manifest.toolchain == "trt-local"
        node = manifest.environment.cluster_node
        assert node.gpu_type == gpu and node.resources[f"gpu_type:{gpu}"] == 1.0
        assert node.ray_node_id.startswith(nodes[gpu])
        assert manifest.profile.status == "done"
        engine = next(a for a in manifest.build.outputs if a.role == "engine")
        assert engine.path == f"engines/trt-local@{gpu}/tiny_fp32.engine" and sha256_file(ws / engine.path) == engine.sha256
    # The comparison has the GPU type as a dimension, and --gpu picks one.
    compared = cluster.pipeline(catalog, "compare", "--format", "json")
    rows = json.loads(compared.stdout)["rows"]
    assert sorted(r["gpu_type"] for r in rows if r["toolchain"] == "trt-local") == ["B200", "H100"]
    table = cluster.pipeline(catalog, "compare")
    assert "trt-local@H100" in table.stdout and "trt-local@B200" in table.stdout
    picked = cluster.pipeline(catalog, "compare", "--gpu", "H100")
    assert picked.returncode == 0 and "H100" in picked.stdout and "B200" not in picked.stdout

    only = cluster.pipeline(
        catalog, "build", "--cluster", cluster.address, "--engine", "tiny_fp32", "--toolchain", "trt-local", "--gpu", "A100"
    )
    assert only.returncode == 2
    assert "no node of the cluster has A100; its GPU types are: B200, H100" in only.stderr


def test_a_points_engines_of_two_toolchains_share_one_set_of_rounds(cluster, tmp_path):
    """ONNX Runtime and PyTorch eager at one point: one task times both, in one set of rounds, as
    `pipeline run` without --cluster does (their manifests name one group, and one node)."""
    catalog = catalog_in(tmp_path, "two", '\n[toolchains.torch-eager]\nkind = "torch"\nbackend = "eager"\n')
    args = ("run", "--cluster", cluster.address, "--engine", "tiny_fp32", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    result = cluster.pipeline(catalog, *args, "--gpu", "H100")
    assert result.returncode == 0, result.stderr
    ws = catalog.parent
    ort = read_manifest(ws / "manifests" / "onnxruntime" / "tiny_fp32.json")
    torch = read_manifest(ws / "manifests" / "torch-eager@H100" / "tiny_fp32.json")
    (ort_rounds,), (torch_rounds,) = ort.profile.details.rounds, torch.profile.details.rounds
    assert ort_rounds.group == torch_rounds.group
    assert sorted(ort_rounds.entrants) == sorted(torch_rounds.entrants) == ["fp32/onnxruntime", "fp32/torch-eager"]
    assert ort.environment.cluster_node.ray_node_id == torch.environment.cluster_node.ray_node_id
    assert ort.environment.cluster_node.worker_pid == torch.environment.cluster_node.worker_pid is not None  # one process
    assert torch.environment.cluster_node.gpu_type == "H100"
    # Judged as they were timed: one verdict at the point, on the H100, with both engines in it.
    compared = json.loads(cluster.pipeline(catalog, "compare", "--format", "json").stdout)
    assert [verdict["gpu_type"] for verdict in compared["verdicts"]] == ["H100"]


def test_gpus_runs_the_same_plan_on_a_ray_instance_of_this_machine(cluster, tmp_path):
    """`--gpus 0,1`: no cluster to start — a Ray instance of this machine that sees those GPUs
    (here two stand-ins: this machine has none, so Ray counts the two CUDA_VISIBLE_DEVICES names)
    runs the plan, each point's engines in one set of rounds."""
    catalog = catalog_in(tmp_path, "gpus")
    result = cluster.pipeline(catalog, "run", "--gpus", "0,1", "--model", "tiny", "--variant", "fp32", "--variant", "fp16")
    assert result.returncode == 0, result.stderr
    assert "cluster  local: 1 node(s)" in result.stderr
    profiles = [read_manifest(catalog.parent / "manifests" / "onnxruntime" / f"tiny_{v}.json") for v in ("fp32", "fp16")]
    assert len({record.group for manifest in profiles for record in manifest.profile.details.rounds}) == 1
    both = cluster.pipeline(catalog, "run", "--gpus", "0,1", "--cluster", cluster.address, "--engine", "tiny_fp32")
    assert both.returncode == 2 and "--gpus runs on this machine's GPUs, --cluster on a Ray cluster's" in both.stderr
    wrong = cluster.pipeline(catalog, "run", "--gpus", "first", "--engine", "tiny_fp32")
    assert wrong.returncode == 2 and "give GPUs of this machine by index or UUID" in wrong.stderr


@pytest.fixture
def two_gpu_node(cluster):
    """A node of two GPUs of one type (stand-ins: a declared resource) and two CPUs, for the test."""
    cluster.add_node("w-pair", {"gpu_type:L4": 2}, cpus=2)
    try:
        yield "L4"
    finally:
        cluster.remove_node("w-pair")


def test_points_measured_at_once_on_one_hosts_gpus_each_run_on_cpus_of_their_own(cluster, two_gpu_node, tmp_path):
    """Three shape points on the two GPUs of one node: each GPU's worker times its points one after
    another in one process, on its share of the node's cores (here one CPU of two), and records
    both; two points measured at once never share a CPU, and ONNX Runtime, timed in each beside
    PyTorch, stays on its worker's."""
    pytest.importorskip("transformers", reason="bert is a transformers model")
    points = ("2x8", "3x16", "2x16")
    catalog = write_catalog(tmp_path / "points", tiny_bert_catalog(list(points), ["fp32"], ["fp32"]) + CPU_TOOLCHAINS)
    args = ("run", "--cluster", cluster.address, "--gpu", two_gpu_node, "--engine", "bert_fp32")
    result = cluster.pipeline(catalog, *args, "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    assert result.returncode == 0, result.stderr
    windows, shares = [], {}
    for point in points:
        ort = read_manifest(catalog.parent / "manifests" / "onnxruntime" / f"bert_fp32@{point}.json")
        torch = read_manifest(catalog.parent / "manifests" / f"torch-eager@{two_gpu_node}" / f"bert_fp32@{point}.json")
        node = torch.environment.cluster_node
        assert node.cpus is not None and len(node.cpus) == 1 and node.cpus == ort.environment.cluster_node.cpus, node
        assert node.worker_pid == ort.environment.cluster_node.worker_pid
        shares.setdefault(node.worker_pid, set()).add(node.cpus)
        assert ort.profile.details.rounds[0].group == torch.profile.details.rounds[0].group
        record = torch.profile
        windows.append((record.finished_at.timestamp() - record.duration_s, record.finished_at.timestamp(), set(node.cpus)))
    # ONNX Runtime's time is the host's: every point held the node whole, one at a time, and the
    # run's end says so for the node of two GPUs.
    said = " ".join((result.stdout + result.stderr).split())
    assert "3 of its 3 shape points held the host whole for their rounds" in said, result.stderr
    assert "on its 2 GPUs; none ran its rounds beside another's" in said, result.stderr
    # One worker per GPU at most, each on one share throughout: three points, two processes.
    assert len(shares) <= 2 and all(len(cpus) == 1 for cpus in shares.values()), shares
    for (start_a, end_a, cpus_a), (start_b, end_b, cpus_b) in itertools.combinations(windows, 2):
        if start_a < end_b and start_b < end_a:  # measured at once: on different CPUs
            assert not cpus_a & cpus_b


def test_a_gpus_export_build_and_points_are_done_one_after_another_in_one_process(cluster, tmp_path):
    """A node of one GPU and an eager engine, which is built where it is timed: the GPU's worker
    exports the model, builds the engine and takes the three points in turn, in one process (the
    model loaded once, as in a local run), each point in a set of rounds of its own."""
    pytest.importorskip("transformers", reason="bert is a transformers model")
    points = ("2x8", "3x16", "2x16")
    catalog = write_catalog(tmp_path / "one", tiny_bert_catalog(list(points), ["fp32"], ["fp32"]) + CPU_TOOLCHAINS)
    args = ("run", "--cluster", cluster.address, "--gpu", "H100", "--engine", "bert_fp32", "--toolchain", "torch-eager")
    result = cluster.pipeline(catalog, *args)
    assert result.returncode == 0, result.stderr
    profiles = [read_manifest(catalog.parent / "manifests" / "torch-eager@H100" / f"bert_fp32@{point}.json") for point in points]
    export = read_manifest(catalog.parent / "manifests" / "export" / "bert_fp32.json")
    build = read_manifest(catalog.parent / "manifests" / "torch-eager@H100" / "bert_fp32.json")
    pids = {m.environment.cluster_node.worker_pid for m in [export, build, *profiles]}
    assert len(pids) == 1 and None not in pids, pids
    assert export.environment.cluster_node.gpu_type == "H100"  # done on the H100's worker
    assert len({p.profile.details.rounds[0].group for p in profiles}) == 3
    assert result.stderr.count("measuring profile") == 3


@needs_inductor
def test_a_compiled_engines_build_and_points_compile_on_as_many_threads(cluster, tmp_path):
    """A node of one GPU and two CPUs: a point's worker has both, and Ray would start a build's task
    of one CPU on one thread. Inductor's cache key holds PyTorch's thread count wherever a graph has
    CPU code, so the build (and whatever it compiles ahead for the points) runs on as many as the
    points, or the points' graphs compiled ahead are never found."""
    pytest.importorskip("transformers", reason="bert is a transformers model")
    cluster.add_node("w-a10", {"gpu_type:A10": 1}, cpus=2)
    try:
        points = ("2x8", "2x16")
        extra = '\n[toolchains.torch-compile]\nkind = "torch"\nbackend = "compile"\n'
        catalog = write_catalog(tmp_path / "compiled", tiny_bert_catalog(list(points), ["fp32"], ["fp32"]) + CPU_TOOLCHAINS + extra)
        args = ("run", "--cluster", cluster.address, "--gpu", "A10", "--engine", "bert_fp32", "--toolchain", "torch-compile")
        result = cluster.pipeline(catalog, *args)
    finally:
        cluster.remove_node("w-a10")
    assert result.returncode == 0, result.stderr
    # A run of a torch toolchain alone: the export on its node wrote the references, no ONNX.
    export = read_manifest(catalog.parent / "manifests" / "export" / "bert_fp32.json").export
    assert (
        export.details.onnx_skipped == "no toolchain of the run reads it"
        and not (catalog.parent / "models" / "bert" / "fp32.onnx").exists()
    )
    folder = catalog.parent / "manifests" / "torch-compile@A10"
    compiler = read_manifest(folder / "bert_fp32.json").build.details.compiler
    assert compiler["threads"] == 2, compiler
    for point in points:
        execution = read_manifest(folder / f"bert_fp32@{point}.json").profile.details.execution
        assert execution["threads"] == 2, (point, execution)
    # Where the machine has the CPUs to compile the points ahead, each was compiled on as many.
    for facts in (compiler.get("compiled_ahead") or {}).get("points", {}).values():
        assert facts.get("threads", 2) == 2, compiler["compiled_ahead"]


def test_connection_failures_are_explained(cluster, tmp_path):
    catalog = catalog_in(tmp_path, "bad")
    unreachable = cluster.pipeline(catalog, "run", "--cluster", "127.0.0.1:1", "--engine", "tiny_fp32")
    assert unreachable.returncode == 3
    assert (
        "ERROR cannot reach a Ray cluster at 127.0.0.1:1" in unreachable.stderr
        and "TIP start one with `ray start --head" in unreachable.stderr
    )
    assert "Traceback" not in unreachable.stderr
    malformed = cluster.pipeline(catalog, "run", "--cluster", "head-node", "--engine", "tiny_fp32")
    assert malformed.returncode == 2 and "is not a Ray address" in malformed.stderr

    started = time.monotonic()
    # A driver that knows nothing of the token (Ray's default mode, no token file in its home).
    no_token = cluster.pipeline(
        catalog, "run", "--cluster", cluster.address, "--engine", "tiny_fp32", env={"RAY_AUTH_TOKEN_PATH": None, "RAY_AUTH_MODE": None}
    )
    assert no_token.returncode == 3, no_token.stderr
    assert "ERROR the Ray cluster at 127.0.0.1:6379 refused this driver: it requires an authentication token." in no_token.stderr
    assert "TIP this cluster has Ray's token authentication on: `export RAY_AUTH_MODE=token`" in no_token.stderr
    assert "Traceback" not in no_token.stderr and time.monotonic() - started < 60
    # One that names a token file that is not there.
    missing = cluster.pipeline(
        catalog, "run", "--cluster", cluster.address, "--engine", "tiny_fp32", env={"RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}
    )
    assert (
        missing.returncode == 3
        and "token for the Ray cluster at 127.0.0.1:6379 is unusable: RAY_AUTH_TOKEN_PATH is set but" in missing.stderr
    )
    assert not (catalog.parent / "manifests" / "onnxruntime").exists()

    no_gpu = cluster.pipeline(catalog, "run", "--engine", "tiny_fp32", "--gpu", "H100")
    assert no_gpu.returncode == 2 and "--gpu chooses among a cluster's GPU types; it needs --cluster" in no_gpu.stderr


def test_two_drivers_on_one_cluster_keep_their_workspaces_apart(cluster, tmp_path):
    # Two workspaces whose models differ (another seed), run at the same time on the same nodes.
    first = catalog_in(tmp_path, "first")
    second = write_catalog(tmp_path / "second", CATALOG.replace('timm = "test_vit"', 'timm = "test_vit"\nseed = 7'))
    drivers = [cluster.popen(catalog, "run", "--cluster", cluster.address, "--engine", "tiny_fp32") for catalog in (first, second)]
    outputs = [driver.communicate(timeout=600) for driver in drivers]
    for driver, (_, err) in zip(drivers, outputs):
        assert driver.returncode == 0, err
    onnx = []
    for catalog in (first, second):
        manifest = read_manifest(catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json")
        for record in (manifest.export, manifest.build, manifest.profile):
            assert all(sha256_file(catalog.parent / a.path) == a.sha256 for a in record.outputs)
        onnx.append(next(a.sha256 for a in manifest.export.outputs if a.role == "onnx"))
        assert manifest.export.params["seed"] == (7 if catalog == second else 0)
    assert onnx[0] != onnx[1]  # each workspace got its own model's ONNX, not the other's


def driven_until(driver, act) -> str:
    """The driver's stderr, read a line at a time and handed to ``act`` until it says it acted
    (killed a node, say), then to the end, the driver waited for (killed if the test fails first)."""
    lines = []
    try:
        for line in driver.stderr:
            lines.append(line)
            if act(line):
                break
        err = "".join(lines) + driver.stderr.read()
        driver.wait(timeout=600)
        return err
    finally:
        if driver.poll() is None:
            driver.kill()


def test_a_worker_killed_mid_run_is_survived(cluster, tmp_path):
    catalog = catalog_in(tmp_path, "kill")
    driver = cluster.popen(
        catalog, "run", "--cluster", cluster.address, "--model", "tiny", "--variant", "fp32", "--variant", "fp16", "--variant", "int8"
    )
    victim = None

    def kill_b200_once_it_runs(line: str) -> bool:
        nonlocal victim
        if victim is None and line.startswith("cluster "):
            victim = node_ids(line)["B200"]
        if victim and line.startswith("running") and line.rstrip().endswith(f"{victim} B200"):
            cluster.nodes["w-b200"].kill(signal.SIGKILL)  # the node and every Ray process on it
            return True
        return False

    try:
        err = driven_until(driver, kill_b200_once_it_runs)
    finally:
        cluster.restart("w-b200")
    assert driver.returncode == 0, err
    assert "retrying on another node" in err
    for variant in ("fp32", "fp16", "int8"):
        manifest = read_manifest(catalog.parent / "manifests" / "onnxruntime" / f"tiny_{variant}.json")
        assert manifest.profile.status == "done"
        assert not list((catalog.parent / "models").rglob(".*.tmp"))


def ray_node_ids(cluster, marker_prefix: str) -> dict[str, str]:
    """Ray node id of each node that advertises a ``<marker_prefix>NAME`` resource, by NAME."""
    code = (
        f"import json, ray\nray.init(address='{cluster.address}', log_to_driver=False, logging_level='ERROR')\n"
        "print(json.dumps([[n['NodeID'], list(n['Resources'])] for n in ray.nodes() if n['Alive']]))\n"
    )
    nodes = json.loads(cluster.python(code).stdout.strip().splitlines()[-1])
    return {key[len(marker_prefix) :]: node for node, keys in nodes for key in keys if key.startswith(marker_prefix)}


def bert_on_l4(cluster) -> tuple[str, ...]:
    """A run of the 2-layer BERT's fp32 engine on ONNX Runtime and PyTorch eager, on the L4 nodes."""
    return (
        "run",
        "--cluster",
        cluster.address,
        "--gpu",
        "L4",
        "--engine",
        "bert_fp32",
        "--toolchain",
        "onnxruntime",
        "--toolchain",
        "torch-eager",
    )


def measured_whole_in_one_set_of_rounds(ort, torch):
    """Both engines of the point in one set of rounds, every round of it (at least 60 or the
    budget): the rounds of ONNX Runtime's."""
    (ort_rounds,), (torch_rounds,) = ort.profile.details.rounds, torch.profile.details.rounds
    assert ort_rounds.group == torch_rounds.group and len(ort_rounds.entrants) == 2
    assert ort_rounds.rounds == torch_rounds.rounds and (ort_rounds.rounds >= 60 or ort_rounds.stop == "budget")
    return ort_rounds


def test_a_worker_killed_in_a_points_rounds_leaves_nothing_and_the_point_is_measured_again_whole(cluster, tmp_path):
    """Two nodes of one GPU type; the node measuring a point is killed once the driver hears its
    rounds began. Nothing of that point comes from it: the point is measured again, whole, on the
    other node — both engines in one set of rounds there, every round of it."""
    pytest.importorskip("transformers", reason="bert is a transformers model")
    for name in ("a", "b"):
        cluster.add_node(f"w-l4-{name}", {"gpu_type:L4": 1, f"kill_test_{name}": 1})
    try:
        ids = ray_node_ids(cluster, "kill_test_")
        text = tiny_bert_catalog(["2x8", "3x16"], ["fp32"], ["fp32"]).replace("take_ms = 5", "take_ms = 50\nmin_rounds = 60")
        catalog = write_catalog(tmp_path / "rounds", text + CPU_TOOLCHAINS)
        driver = cluster.popen(catalog, *bert_on_l4(cluster))
        killed = None

        def kill_the_measuring_node(line: str) -> bool:
            nonlocal killed
            if not line.startswith("measuring"):
                return False
            point = re.search(r" at (\S+) on ", line).group(1)
            name, node = next((name, node) for name, node in ids.items() if f" {node[:8]} " in line)
            cluster.nodes[f"w-l4-{name}"].kill(signal.SIGKILL)  # the node and every Ray process on it
            killed = (point, node)
            return True

        err = driven_until(driver, kill_the_measuring_node)
        assert killed is not None, err
        assert driver.returncode == 0, err
        assert "retrying on another node" in err
        point, gone = killed
        survivor = next(node for node in ids.values() if node != gone)
        ort = read_manifest(catalog.parent / "manifests" / "onnxruntime" / f"bert_fp32@{point}.json")
        torch = read_manifest(catalog.parent / "manifests" / "torch-eager@L4" / f"bert_fp32@{point}.json")
        for manifest in (ort, torch):
            assert manifest.profile.status == "done"
            assert manifest.environment.cluster_node.ray_node_id == survivor
        measured_whole_in_one_set_of_rounds(ort, torch)
    finally:
        for name in ("a", "b"):
            if f"w-l4-{name}" in cluster.nodes:
                cluster.remove_node(f"w-l4-{name}")


def holding_the_host_whole(lock: Path) -> int | None:
    """The process whose point's rounds hold its host whole (pipeline/measuring/host_rounds.py): the holder of
    an exclusive flock on the node's lock file, as /proc/locks lists it."""
    try:
        inode = lock.stat().st_ino
        entries = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for entry in entries:
        fields = entry.split()
        if "->" in fields:  # a waiter, not the holder
            continue
        if fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and int(fields[5].rsplit(":", 1)[1]) == inode:
            return int(fields[4])
    return None


def test_a_point_worker_killed_in_its_rounds_costs_nothing_and_the_point_is_measured_again_whole(cluster, tmp_path):
    """The point worker itself — the process, not its node — is killed while its rounds hold the
    host whole (the lock says so, and whose it is). The kernel lets go of the hold with it; the
    point goes whole to a fresh worker, both engines in one set of rounds there, and nothing of the
    killed one is kept."""
    pytest.importorskip("transformers", reason="bert is a transformers model")
    cluster.add_node("w-l4-k", {"gpu_type:L4": 1})
    try:
        text = tiny_bert_catalog(["2x8"], ["fp32"], ["fp32"]).replace("take_ms = 5", "take_ms = 50\nmin_rounds = 60")
        catalog = write_catalog(tmp_path / "worker", text + CPU_TOOLCHAINS)
        driver = cluster.popen(catalog, *bert_on_l4(cluster))
        lock = cluster.root / "cache-w-l4-k" / "host-rounds.lock"
        killed = None
        deadline = time.monotonic() + 600
        while killed is None and driver.poll() is None and time.monotonic() < deadline:
            killed = holding_the_host_whole(lock)
            time.sleep(0.05)
        assert killed is not None, driver.communicate()
        time.sleep(0.5)  # some rounds taken
        os.kill(killed, signal.SIGKILL)
        _, err = driver.communicate(timeout=600)
        assert driver.returncode == 0, err
        assert "Traceback" not in err
        ort = read_manifest(catalog.parent / "manifests" / "onnxruntime" / "bert_fp32@2x8.json")
        torch = read_manifest(catalog.parent / "manifests" / "torch-eager@L4" / "bert_fp32@2x8.json")
        for manifest in (ort, torch):
            assert manifest.profile.status == "done"
            assert manifest.environment.cluster_node.worker_pid != killed  # measured by a fresh worker
        ort_rounds = measured_whole_in_one_set_of_rounds(ort, torch)
        assert ort_rounds.host_held == "whole"  # the hold the killed worker had went with it
        assert not list((catalog.parent / "manifests").rglob("*.tmp"))
    finally:
        cluster.remove_node("w-l4-k")


def test_a_kernel_that_faults_on_a_node_costs_its_point_and_its_process_is_replaced(cluster, tmp_path):
    """A user's module whose kernel faults at 2×64 (a sticky CUDA error: every later call in that
    process fails, tests/data/python_models/faulting.py): in the export's task, then in the point
    worker's preparation there. Each fault is recorded for its point and sent back; the export goes
    on in a fresh process without that point, the point's other engine is measured by a fresh
    worker, and 1×16 is measured on both toolchains; exit 1 naming the point."""
    from tests.conftest import DATA, catalog_head

    module = DATA / "python_models" / "faulting.py"  # every node of this loopback cluster reads this disk
    text = (
        catalog_head(["faulty"], ["fp32"])
        + f'\n[models.faulty]\npython = "{module}:make"\nconfig = {{ features = 8, longest = 32 }}\nshapes = ["1x16", "2x64"]\n'
        + '\n[variants.fp32]\nprecision = "fp32"\n'
        + CPU_TOOLCHAINS
    )
    catalog = write_catalog(tmp_path / "faults", text)
    args = (
        "run",
        "--cluster",
        cluster.address,
        "--gpu",
        "H100",
        "--model",
        "faulty",
        "--toolchain",
        "onnxruntime",
        "--toolchain",
        "torch-eager",
    )
    result = cluster.pipeline(catalog, *args)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert "going on in a fresh process (a kernel faulted in the last one)" in result.stderr
    ws = catalog.parent
    export = read_manifest(ws / "manifests" / "export" / "faulty_fp32.json").export
    assert export.status == "done" and set(export.details.references_faulted) == {"2x64"}
    faulted = read_manifest(ws / "manifests" / "torch-eager@H100" / "faulty_fp32@2x64.json").profile
    assert faulted.status == "faulted" and faulted.fault.error == "CUDA error: device-side assert triggered"
    assert "faulty_fp32 on torch-eager at 2x64: faulted on the GPU at shape 2×64" in result.stderr
    assert read_manifest(ws / "manifests" / "onnxruntime" / "faulty_fp32@2x64.json").profile.status == "done"
    for toolchain in ("onnxruntime", "torch-eager@H100"):
        assert read_manifest(ws / "manifests" / toolchain / "faulty_fp32@1x16.json").profile.status == "done"
    # Kept until --force: a second run dispatches nothing and names the fault again.
    again = cluster.pipeline(catalog, *args)
    assert again.returncode == 1, again.stderr
    assert "recorded earlier; `--force` tries again" in again.stderr and "0 task(s) dispatched" in again.stderr


def test_sigterm_mid_run_cancels_and_keeps_the_workspace_consistent(cluster, tmp_path):
    catalog = catalog_in(tmp_path, "term")
    driver = cluster.popen(catalog, "run", "--cluster", cluster.address, "--model", "tiny", "--variant", "fp32", "--variant", "fp16")
    lines = []
    for line in driver.stderr:
        lines.append(line)
        if line.startswith("running"):
            time.sleep(1)  # the export is under way on its node
            driver.send_signal(signal.SIGTERM)
            break
    err = "".join(lines) + driver.stderr.read()
    assert driver.wait(timeout=120) == 143, err
    assert "ERROR terminated (SIGTERM); partial outputs were removed" in err and "Traceback" not in err
    ws = catalog.parent
    # Nothing half-written: any manifest there names files that are there, and no temp file is left.
    for path in (ws / "manifests").glob("*/*.json"):
        for record in filter(None, (read_manifest(path).stage(s) for s in ("export", "build", "profile"))):
            assert all(sha256_file(ws / a.path) == a.sha256 for a in record.outputs)
    assert not [p for p in ws.rglob(".*.tmp")]
    # The same command then finishes the job.
    again = cluster.pipeline(catalog, "run", "--cluster", cluster.address, "--model", "tiny", "--variant", "fp32", "--variant", "fp16")
    assert again.returncode == 0, again.stderr


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo += children.get(current, [])
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists() and "(Z)" not in _state(pid)}


def _state(pid: int) -> str:
    try:
        return "(" + Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] + ")"
    except OSError:
        return "(gone)"


def _running_stages() -> list[str]:
    """Ray workers executing a pipeline stage now, on any node (all on this machine)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text.startswith("ray::run_stage"):
            found.append(text.strip())
    return found


def test_a_killed_cluster_command_takes_its_driver_and_work_with_it(cluster, tmp_path):
    """kill -9 of the command: the driver child it started cancels what it dispatched and ends, and
    holds the workspace lock until it has, so the next run waits instead of racing it."""
    catalog = catalog_in(tmp_path, "sigkill")
    args = ("run", "--cluster", cluster.address, "--model", "tiny", "--variant", "fp32", "--variant", "fp16", "--variant", "int8")
    driver = cluster.popen(catalog, *args)
    lock = catalog.parent / "manifests" / ".workspace.lock"
    lines = []
    for line in driver.stderr:
        lines.append(line)
        if line.startswith("running"):
            time.sleep(1)  # a stage is under way on its node
            break
    processes = _descendants(driver.pid)
    assert len(processes) >= 2, "".join(lines)  # the command and its driver child
    driver.kill()
    driver.wait(timeout=10)
    with open(lock, "a") as handle:
        with pytest.raises(BlockingIOError):  # the driver child still holds the workspace
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    deadline = time.monotonic() + 45
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(processes), {pid: _state(pid) for pid in _alive(processes)}
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the child has ended
        fcntl.flock(handle, fcntl.LOCK_UN)
    deadline = time.monotonic() + 60
    while _running_stages() and time.monotonic() < deadline:  # Ray ends a finished job's tasks
        time.sleep(0.5)
    assert not _running_stages()
    # The workspace is consistent and the same command finishes the job.
    again = cluster.pipeline(catalog, *args)
    assert again.returncode == 0, again.stderr
    assert "stopped without releasing it (killed?)" in again.stderr
    ws = catalog.parent
    for path in (ws / "manifests").glob("*/*.json"):
        for record in filter(None, (read_manifest(path).stage(s) for s in ("export", "build", "profile"))):
            assert all(sha256_file(ws / a.path) == a.sha256 for a in record.outputs)


def test_losing_the_head_is_explained_and_finished_results_are_kept(cluster, tmp_path):
    """Last in this module: it takes the cluster down."""
    catalog = catalog_in(tmp_path, "head")
    driver = cluster.popen(
        catalog, "run", "--cluster", cluster.address, "--model", "tiny", "--variant", "fp32", "--variant", "fp16", "--variant", "int8"
    )
    lines = []
    for line in driver.stderr:
        lines.append(line)
        if line.startswith("done"):
            cluster.nodes["head"].kill(signal.SIGKILL)
            break
    err = "".join(lines) + driver.stderr.read()
    assert driver.wait(timeout=120) == 3, err
    assert "ERROR the Ray driver ended without a result" in err and "usually the cluster's head at 127.0.0.1:6379, goes away" in err
    assert "TIP check the head (`ray status`)" in err
    finished = list((catalog.parent / "manifests").glob("*/*.json"))
    assert finished  # what had finished before the head went is in the workspace, whole
    for path in finished:
        for record in filter(None, (read_manifest(path).stage(s) for s in ("export", "build", "profile"))):
            assert all(sha256_file(catalog.parent / a.path) == a.sha256 for a in record.outputs)

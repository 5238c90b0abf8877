"""What `--cluster` does before and without a cluster: Ray stays out of the way, and Ray's failures
read as the pipeline's own errors. (tests/cluster/test_cluster.py runs a real cluster.)"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from pipeline.cluster.connection import Node, _connection_error, describe_node, gpu_types_of, placement_resources
from pipeline.running.errors import EnvironmentMissing
from pipeline.stages.base import RunRequest


def test_ray_is_never_imported_without_cluster():
    code = (
        "import sys; from pipeline.cli import main; main(['--help']); main(['models']); assert 'ray' not in sys.modules, 'ray was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="tests/..")
    assert result.returncode == 0, result.stderr


def test_cluster_without_ray_installed_says_how_to_install_it(tiny_catalog, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the extra sees
    result = run_cli(tiny_catalog, "run", "--cluster", "127.0.0.1:6379")
    assert result.exit_code == 3
    assert "ERROR --cluster needs Ray, which is not installed here." in result.err
    assert "TIP install the cluster extra: `make setup EXTRAS=cluster`" in result.err


def test_gpu_types_come_from_rays_accelerators_and_declared_resources():
    resources = {"CPU": 8, "GPU": 8, "accelerator_type:H100": 1, "gpu_type:H100-SXM": 8, "memory": 1}
    assert gpu_types_of(resources) == ("H100", "H100-SXM")
    # A declared type is counted per GPU; Ray's own type is a marker that goes with num_gpus.
    assert placement_resources(resources, "H100-SXM") == {"gpu_type:H100-SXM": 1.0}
    assert placement_resources(resources, "H100") == {"accelerator_type:H100": 0.001}
    assert placement_resources(resources, "H100-SXM", 0.25) == {"gpu_type:H100-SXM": 0.25}


def test_a_node_without_the_pipeline_or_with_another_version_is_named():
    from pipeline import __version__

    facts = {"hostname": "gpu-7", "python": "3.11.7", "executable": "/usr/bin/python3", "pipeline": None, "packages": {}, "gpus": []}
    node = Node("abcdef0123", "10.0.0.7", {"CPU": 4, "gpu_type:B200": 1})
    assert describe_node(node, facts) == "node gpu-7 abcdef01 B200 (10.0.0.7) cannot import trt-pipeline (its Python: /usr/bin/python3)"
    assert (
        describe_node(node, {**facts, "pipeline": "0.0.1"})
        == f"node gpu-7 abcdef01 B200 runs trt-pipeline 0.0.1, this driver {__version__}"
    )
    lacking = {**facts, "pipeline": __version__, "packages": {"torch": "2.13.0", "timm": "1.0", "onnx": None, "onnxruntime": "1.23"}}
    assert describe_node(node, lacking) == "node gpu-7 abcdef01 B200 lacks onnx"
    whole = {**lacking, "packages": {name: "1" for name in ("torch", "timm", "onnx", "onnxruntime")}}
    assert describe_node(node, whole) is None


@pytest.mark.parametrize(
    "raised, expected",
    [
        # Ray's words (ray/_private/utils.py, check_version_info) when driver and cluster differ.
        (
            RuntimeError(
                "Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: 3.12.3\n"
                "This process on node 10.0.0.2 was started with:\n    Ray: 2.59.0\n    Python: 3.11.7\n"
            ),
            "runs a different Ray or Python than this driver (cluster: Ray 2.60.0, Python 3.12.3; this driver: Ray 2.59.0, Python 3.11.7)",
        ),
        (
            ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"),
            "could not join the Ray cluster at 10.0.0.1:6379: Failed to connect",
        ),
    ],
)
def test_rays_connection_failures_become_pipeline_errors(raised, expected):
    error = _connection_error("10.0.0.1:6379", raised, "")
    assert isinstance(error, EnvironmentMissing) and expected in error.message and error.hint


def test_each_kind_of_work_is_placed_where_it_can_run(tmp_path):
    """Placement decisions for a cluster with a real H100 (Ray's own resources), a node declaring
    an RTX PRO 6000, and a CPU-only node — no Ray needed to decide them."""
    from pipeline.catalog import EngineRef
    from pipeline.cluster.connection import Cluster
    from pipeline.cluster.plan import ClusterPlan, Job, Member
    from pipeline.running.errors import UsageError
    from pipeline.runtimes import load_catalog
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace
    from tests.conftest import RTX_TOOLCHAINS, TINY_CATALOG, write_catalog

    extra = '\n[toolchains.trt-local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ngpus = "none"\n'
    extra += '\n[toolchains.torch-eager]\nkind = "torch"\nbackend = "eager"\n'
    catalog = load_catalog(
        write_catalog(
            tmp_path, TINY_CATALOG + extra + RTX_TOOLCHAINS.replace('release = "1.7.1.116"', 'release = "1.7.1.116"\narchs = ["sm120"]')
        )
    )
    ctx = RunContext(catalog=catalog, workspace=Workspace(catalog.root))

    def threads(count: int) -> dict:
        # A build and a point of one GPU type run PyTorch on as many threads, a point's CPUs:
        # Inductor's cache key holds the count, and a build compiles the points ahead for them.
        return {"env_vars": {"OMP_NUM_THREADS": str(count)}}

    h100 = Node("a" * 56, "10.0.0.1", {"CPU": 16, "GPU": 1, "accelerator_type:H100": 1})
    rtx = Node("b" * 56, "10.0.0.2", {"CPU": 8, "gpu_type:RTX-PRO-6000": 1})
    cpu = Node("c" * 56, "10.0.0.3", {"CPU": 4})
    cluster = Cluster("10.0.0.1:6379", [h100, rtx, cpu])
    engine = EngineRef("tiny", "fp16")

    trt = ClusterPlan(ctx, cluster, RunRequest([engine], ["trt-local"], "profile"))
    assert trt.targets == {"trt-local": ["H100", "RTX-PRO-6000"]}  # every GPU type the toolchain supports
    assert trt.placement(Job("build", [Member(engine, "trt-local", "H100")])) == (
        {"num_cpus": 1, "resources": {"accelerator_type:H100": 0.001}, "num_gpus": 1, "runtime_env": threads(16)},
        "H100",
    )
    # A point's profiles have their GPU's share of its node to themselves: all 8 CPUs of a one-GPU node.
    assert trt.placement(Job("profile", [Member(engine, "trt-local", "RTX-PRO-6000")], placed_on="RTX-PRO-6000")) == (
        {"num_cpus": 8.0, "resources": {"gpu_type:RTX-PRO-6000": 1.0}, "runtime_env": threads(8)},
        "RTX-PRO-6000",
    )
    # A PyTorch build (loading, compiling) shares a GPU with other builds; a TensorRT build, which
    # times its tactics there, has one to itself (above). A point holds its GPU whole either way.
    torch = ClusterPlan(ctx, cluster, RunRequest([engine], ["torch-eager"], "profile", ("H100",)))
    assert torch.placement(Job("build", [Member(engine, "torch-eager", "H100")])) == (
        {"num_cpus": 1, "resources": {"accelerator_type:H100": 0.001}, "num_gpus": 0.25, "runtime_env": threads(16)},
        "H100",
    )
    assert torch.placement(Job("build", [Member(engine, "torch-eager", "RTX-PRO-6000")]))[0]["resources"] == {"gpu_type:RTX-PRO-6000": 0.25}
    assert ClusterPlan(ctx, cluster, RunRequest([engine], ["trt-local"], "profile", ("H100",))).targets == {"trt-local": ["H100"]}
    with pytest.raises(UsageError, match="no node of the cluster has A100; its GPU types are: H100, RTX-PRO-6000"):
        ClusterPlan(ctx, cluster, RunRequest([engine], ["trt-local"], "profile", ("A100",)))

    # TensorRT-RTX for sm120: built anywhere, timed on the RTX PRO 6000 (compute capability 12.0),
    # never on the H100 (9.0), which its engines do not run on.
    aot = ClusterPlan(ctx, cluster, RunRequest([engine], ["trt-rtx1.7"], "profile"))
    assert aot.targets == {"trt-rtx1.7": [None]}
    assert aot.placement(Job("build", [Member(engine, "trt-rtx1.7")])) == ({"num_cpus": 1, "runtime_env": threads(4)}, None)
    (point,) = [job for job in aot.plan() if job.stage == "profile"]
    assert aot.placement(point) == (
        {"num_cpus": 8.0, "resources": {"gpu_type:RTX-PRO-6000": 1.0}, "runtime_env": threads(8)},
        "RTX-PRO-6000",
    )

    # Two GPUs of one host (Ray's own resources): a point each at once, each with half the CPUs.
    two = Node("d" * 56, "10.0.0.4", {"CPU": 32, "GPU": 2, "accelerator_type:H200": 1})
    pair = ClusterPlan(ctx, Cluster("10.0.0.4:6379", [two]), RunRequest([engine], ["trt-local"], "profile"))
    assert pair.placement(Job("profile", [Member(engine, "trt-local", "H200")], placed_on="H200")) == (
        {"num_cpus": 16.0, "resources": {"accelerator_type:H200": 0.001}, "num_gpus": 1, "runtime_env": threads(16)},
        "H200",
    )

    ort = ClusterPlan(ctx, cluster, RunRequest([engine], ["onnxruntime"], "profile"))
    assert ort.targets == {"onnxruntime": [None]} and ort.placement(Job("build", [Member(engine, "onnxruntime")])) == (
        {"num_cpus": 1, "runtime_env": threads(4)},
        None,
    )

    # An export has a GPU's share of the smallest node's CPUs (the CPU-only node's 4): a task of one
    # CPU would run PyTorch on one thread (Ray sets OMP_NUM_THREADS from it). Where the cluster has
    # GPUs, a quarter of one too: it computes on a GPU it sees, and must not on one a point holds.
    assert ort.placement(Job("export", [Member(engine)])) == ({"num_cpus": 4.0, "num_gpus": 0.25}, None)
    assert pair.placement(Job("export", [Member(engine)])) == ({"num_cpus": 16.0, "num_gpus": 0.25}, None)
    stand_ins = ClusterPlan(ctx, Cluster("10.0.0.2:6379", [rtx, cpu]), RunRequest([engine], ["onnxruntime"], "profile"))
    assert stand_ins.placement(Job("export", [Member(engine)])) == ({"num_cpus": 4.0}, None)  # no CUDA GPU to ask for
    # NVFP4's export needs CUDA: a node with Ray's GPU resource, and a clear error without one.
    nvfp4 = EngineRef("tiny", "nvfp4")
    assert ort.placement(Job("export", [Member(nvfp4)])) == ({"num_cpus": 4.0, "num_gpus": 1}, None)
    no_gpu = ClusterPlan(ctx, Cluster("10.0.0.3:6379", [cpu]), RunRequest([nvfp4], ["onnxruntime"], "profile"))
    with pytest.raises(EnvironmentMissing, match="exporting tiny_nvfp4 needs a CUDA GPU, and no node of the cluster has one"):
        no_gpu.placement(Job("export", [Member(nvfp4)]))


def test_a_points_engines_of_every_toolchain_are_one_job_on_one_gpu_type(tmp_path):
    """The unit of work is the shape point: every engine of a point that is timed on a GPU type is
    in that type's one job, and the engines that need no GPU (ONNX Runtime) join the first type's,
    as a local run times every engine of a point together. Each waits for its engines' builds."""
    from pipeline.catalog import EngineRef
    from pipeline.cluster.connection import Cluster
    from pipeline.cluster.plan import ClusterPlan
    from pipeline.runtimes import load_catalog
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace
    from tests.conftest import RTX_TOOLCHAINS, TINY_CATALOG, write_catalog

    extra = '\n[toolchains.trt-local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ngpus = "none"\n'
    extra += '\n[toolchains.torch-eager]\nkind = "torch"\nbackend = "eager"\n'
    rtx = RTX_TOOLCHAINS.replace('release = "1.7.1.116"', 'release = "1.7.1.116"\narchs = ["sm120"]')
    catalog = load_catalog(write_catalog(tmp_path, TINY_CATALOG + extra + rtx))
    ctx = RunContext(catalog=catalog, workspace=Workspace(catalog.root))

    def threads(count: int) -> dict:
        # A build and a point of one GPU type run PyTorch on as many threads, a point's CPUs:
        # Inductor's cache key holds the count, and a build compiles the points ahead for them.
        return {"env_vars": {"OMP_NUM_THREADS": str(count)}}

    h100 = Node("a" * 56, "10.0.0.1", {"CPU": 16, "GPU": 1, "accelerator_type:H100": 1})
    pro = Node("b" * 56, "10.0.0.2", {"CPU": 8, "gpu_type:RTX-PRO-6000": 1})
    engines = [EngineRef("tiny", "fp32"), EngineRef("tiny", "fp16")]
    plan = ClusterPlan(
        ctx, Cluster("10.0.0.1:6379", [h100, pro]), RunRequest(engines, ["trt-local", "onnxruntime", "trt-rtx1.7"], "profile")
    )
    jobs = plan.plan()
    points = {job.placed_on: job for job in jobs if job.stage == "profile"}
    assert set(points) == {"H100", "RTX-PRO-6000"}  # one model of one shape: one point, once per GPU type
    members = {on: sorted((m.engine.variant, m.toolchain, m.gpu_type) for m in job.members) for on, job in points.items()}
    assert members["H100"] == [
        ("fp16", "onnxruntime", None),
        ("fp16", "trt-local", "H100"),
        ("fp32", "onnxruntime", None),
        ("fp32", "trt-local", "H100"),
    ]
    assert members["RTX-PRO-6000"] == [
        ("fp16", "trt-local", "RTX-PRO-6000"),
        ("fp16", "trt-rtx1.7", None),
        ("fp32", "trt-local", "RTX-PRO-6000"),
        ("fp32", "trt-rtx1.7", None),
    ]
    for job in points.values():  # each member waits for its own engine's build
        assert [(b.stage, b.members[0]) for b in job.after] == [("build", member) for member in job.members]
    builds = [job for job in jobs if job.stage == "build"]
    assert len(builds) == 2 * (2 + 1 + 1) and all(job.after == [plan.exports[job.engine]] for job in builds)


class _Listener:
    """A loopback server that greets each connection its own way (runs in a thread)."""

    def __init__(self, answer):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.answer = answer
        self.held = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.held.append(connection)
            self.answer(connection)

    def close(self):
        self.server.close()
        for connection in self.held:
            connection.close()


def _http1(connection):
    connection.recv(1024)
    connection.sendall(b"HTTP/1.0 400 Bad request version\r\nContent-Type: text/html\r\n\r\n<html>nope</html>")
    connection.close()


def _redis(connection):
    connection.sendall(b"-ERR unknown command 'PRI'\r\n")
    connection.close()


def _silent(connection):
    pass  # accepts, reads nothing, says nothing: what Ray itself would retry for minutes


def _http2(connection):
    connection.sendall(bytes([0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]))  # a SETTINGS frame, as a gRPC server sends


@pytest.mark.parametrize(
    "answer, said",
    [
        (_http1, "it answered 'HTTP/1.0 400 Bad request version'"),
        (_redis, "it answered \"-ERR unknown command 'PRI'\""),
        (_silent, "it said nothing in 3 s"),
    ],
)
def test_a_port_where_something_other_than_ray_listens_is_named_within_seconds(tiny_catalog, run_cli, answer, said):
    pytest.importorskip("ray", reason="the check runs after --cluster has found Ray installed (the cluster extra)")
    listener = _Listener(answer)
    try:
        started = time.monotonic()
        result = run_cli(tiny_catalog, "run", "--cluster", listener.address, "--engine", "tiny_fp32")
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    assert result.exit_code == 3, result.err
    assert f"ERROR {listener.address} is not a Ray cluster's head: something listens there, but not Ray's GCS ({said})." in result.err
    assert "TIP give the port `ray start --head` printed" in result.err and "Traceback" not in result.err
    assert elapsed < 15
    assert not (tiny_catalog.parent / "manifests" / "onnxruntime").exists()


def test_a_server_that_speaks_http2_passes_the_check():
    from pipeline.cluster.connection import _check_reachable

    listener = _Listener(_http2)
    try:
        _check_reachable(listener.address)  # no error: Ray (gRPC) is what answers like this
    finally:
        listener.close()


def test_the_probe_answers_on_a_node_without_the_product(tmp_path):
    """The probe goes to the nodes by value, with the nvidia-smi query it uses
    (pipeline/machine/nvidia_smi.py): unpickled where `import pipeline` fails, it still says what the node
    has, and that the product is missing there."""
    pytest.importorskip("ray", reason="the probe is sent with Ray's cloudpickle (the cluster extra)")
    from ray import cloudpickle

    from pipeline.cluster import probe
    from pipeline.machine import nvidia_smi

    for module in (probe, nvidia_smi):
        cloudpickle.register_pickle_by_value(module)
    try:
        (tmp_path / "probe.pickle").write_bytes(cloudpickle.dumps(probe.probe_node))
    finally:
        for module in (probe, nvidia_smi):
            cloudpickle.unregister_pickle_by_value(module)
    elsewhere = (
        "import json, pickle, sys\n"
        "sys.modules['pipeline'] = None  # `import pipeline` fails, as on a node without it\n"
        "answer = pickle.loads(open(sys.argv[1], 'rb').read())()\n"
        "print(json.dumps(answer))\n"
    )
    done = subprocess.run([sys.executable, "-c", elsewhere, str(tmp_path / "probe.pickle")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    from pipeline.machine.environment import nvidia_gpus

    assert answer["pipeline"] is None and answer["hostname"] and answer["cpu_count"] >= 1
    assert [(gpu["name"], gpu["compute_capability"]) for gpu in answer["gpus"]] == [
        (gpu.name, gpu.compute_capability) for gpu in nvidia_gpus()
    ]


def test_a_toolchain_that_builds_for_its_machines_gpu_builds_for_the_clusters_gpus_on_every_node(tmp_path, monkeypatch):
    """TensorRT-RTX without ``archs`` compiles for the GPU of the machine that builds. On a cluster
    that is whichever node took the build: an sm89 engine from an L4 node, a portable one from a
    node without a GPU, while the driver checks the record against its own machine. The plan
    settles the targets once: the cluster's GPUs the compiler can target, on every node."""
    from pipeline.catalog import EngineRef
    from pipeline.cluster.connection import Cluster
    from pipeline.cluster.plan import ClusterPlan, Member
    from pipeline.machine.environment import GpuInfo
    from pipeline.runtimes import get_runtime, load_catalog
    from pipeline.runtimes.tensorrt_rtx import runtime as rtx_module
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace
    from tests.conftest import RTX_TOOLCHAINS, TINY_CATALOG, write_catalog

    catalog = load_catalog(write_catalog(tmp_path, TINY_CATALOG + RTX_TOOLCHAINS))
    engine = EngineRef("tiny", "fp16")
    h100 = Node("a" * 56, "10.0.0.1", {"CPU": 16, "GPU": 1, "accelerator_type:H100": 1})
    rtx = Node("b" * 56, "10.0.0.2", {"CPU": 8, "gpu_type:RTX-PRO-6000": 1})
    l4 = Node("c" * 56, "10.0.0.3", {"CPU": 8, "gpu_type:L4": 1})

    def targets_built_on(plan: ClusterPlan, local_gpu: str | None) -> tuple[str, ...]:
        """The targets the build's stage records, on a node whose own GPU has ``local_gpu``."""
        gpus = () if local_gpu is None else (GpuInfo(name="GPU", driver="580", compute_capability=local_gpu, memory_mib=1),)
        monkeypatch.setattr(rtx_module, "nvidia_gpus", lambda: gpus)
        stage = plan.stage(build, Member(engine, "trt-rtx1.7"))
        return tuple(stage.runtime.identity()["targets"])

    ctx = RunContext(catalog=catalog, workspace=Workspace(catalog.root))
    get_runtime(ctx, "trt-rtx1.7")  # one made before the plan (for this machine) is made again
    plan = ClusterPlan(ctx, Cluster("x:1", [h100, rtx, l4]), RunRequest([engine], ["trt-rtx1.7"], "build"))
    assert plan.runtimes["trt-rtx1.7"].spec.archs == ("sm89", "sm120")
    assert plan.ctx.catalog.toolchain("trt-rtx1.7").archs == ("sm89", "sm120")  # the L4's and the RTX PRO 6000's, not the H100's
    (build,) = [job for job in plan.plan() if job.stage == "build"]
    assert {targets_built_on(plan, gpu) for gpu in (None, "8.9", "12.0", "9.0")} == {("sm89", "sm120")}
    # The catalog's own archs (or --arch) stay as they are.
    pinned = catalog.with_targets("trt-rtx1.7", ("sm120",))
    plan = ClusterPlan(
        RunContext(catalog=pinned, workspace=Workspace(catalog.root)),
        Cluster("x:1", [h100, l4]),
        RunRequest([engine], ["trt-rtx1.7"], "build"),
    )
    assert plan.ctx.catalog.toolchain("trt-rtx1.7").archs == ("sm120",)
    # No GPU of the cluster it can target: the compiler's portable default, as on a machine without one.
    plan = ClusterPlan(
        RunContext(catalog=catalog, workspace=Workspace(catalog.root)),
        Cluster("x:1", [h100]),
        RunRequest([engine], ["trt-rtx1.7"], "build"),
    )
    assert plan.ctx.catalog.toolchain("trt-rtx1.7").archs == ()


def test_the_builds_that_compile_at_every_point_are_started_first(tmp_path):
    """Ten PyTorch builds on two GPUs share eight places (a quarter of a GPU each): the compiled
    ones, which compile every shape point, go first, or one waits behind an eager build."""
    from pipeline.catalog import EngineRef
    from pipeline.cluster.connection import Cluster
    from pipeline.cluster.plan import ClusterPlan
    from pipeline.runtimes import load_catalog
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace
    from tests.conftest import TINY_CATALOG, write_catalog

    torch = {
        "torch-eager": 'backend = "eager"',
        "torch-compile": 'backend = "compile"',
        "torch-cudagraphs": 'backend = "cudagraphs"',
        "torch-compile-dynamic": 'backend = "compile"\ndynamic = true',
        "torch-reduce-overhead": 'backend = "compile"\nmode = "reduce-overhead"',
    }
    extra = "".join(f'\n[toolchains.{name}]\nkind = "torch"\n{settings}\n' for name, settings in torch.items())
    catalog = load_catalog(write_catalog(tmp_path, TINY_CATALOG + extra))
    two = Node("d" * 56, "10.0.0.4", {"CPU": 32, "GPU": 2, "accelerator_type:H200": 1})
    engines = [EngineRef("tiny", "fp16"), EngineRef("tiny", "fp32")]
    plan = ClusterPlan(
        RunContext(catalog=catalog, workspace=Workspace(catalog.root)), Cluster("x:1", [two]), RunRequest(engines, list(torch), "profile")
    )
    jobs = plan.plan()
    builds = [(job.engine.variant, job.toolchain) for job in jobs if job.stage == "build"]
    assert builds == [
        ("fp16", "torch-compile"),
        ("fp16", "torch-reduce-overhead"),
        ("fp32", "torch-compile"),
        ("fp32", "torch-reduce-overhead"),
        ("fp16", "torch-eager"),
        ("fp16", "torch-cudagraphs"),
        ("fp16", "torch-compile-dynamic"),  # compiled once, for every point
        ("fp32", "torch-eager"),
        ("fp32", "torch-cudagraphs"),
        ("fp32", "torch-compile-dynamic"),
    ]
    stages = [job.stage for job in jobs]
    assert stages == ["export"] * 2 + ["build"] * 10 + ["profile"] * (len(stages) - 12)


def test_a_gpu_types_builds_and_exports_go_to_its_workers_where_every_build_is_made_where_it_is_timed(tmp_path):
    """Eager and CUDA graph builds are mostly loading the model, which the GPU's worker that times
    the points keeps: there, the export, the builds and the points of the type are one process's
    work. A type with a build that is not made where it is timed — a compiled engine compiling its
    points in processes of its own, a TensorRT builder — keeps every build and export a task."""
    from pipeline.catalog import EngineRef
    from pipeline.cluster.connection import Cluster
    from pipeline.cluster.plan import ClusterPlan
    from pipeline.runtimes import load_catalog
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace
    from tests.conftest import TINY_CATALOG, write_catalog

    torch = {"torch-eager": 'backend = "eager"', "torch-cudagraphs": 'backend = "cudagraphs"', "torch-compile": 'backend = "compile"'}
    extra = "".join(f'\n[toolchains.{name}]\nkind = "torch"\n{settings}\n' for name, settings in torch.items())
    extra += '\n[toolchains.trt-local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ngpus = "none"\n'
    catalog = load_catalog(write_catalog(tmp_path, TINY_CATALOG + extra))
    ctx = RunContext(catalog=catalog, workspace=Workspace(catalog.root))
    two = Node("d" * 56, "10.0.0.4", {"CPU": 32, "GPU": 2, "accelerator_type:H200": 1})
    declared = Node("b" * 56, "10.0.0.2", {"CPU": 8, "gpu_type:L4": 1})
    engines = [EngineRef("tiny", "fp16"), EngineRef("tiny", "nvfp4")]

    def on_workers(toolchains, nodes=(two,)):
        plan = ClusterPlan(ctx, Cluster("x:1", list(nodes)), RunRequest(engines, toolchains, "profile"))
        return {(job.stage, job.engine.variant, job.toolchain): plan.worker_for(job) for job in plan.plan()}, plan

    where, plan = on_workers(["torch-eager", "torch-cudagraphs"])
    assert set(where.values()) == {"H200"}, where  # every export, build and point: the H200s' workers
    # Each worker has its GPU whole and its share of the host's CPUs, whatever job it starts with.
    assert plan.worker_options("H200") == {
        "num_cpus": 16.0,
        "resources": {"accelerator_type:H200": 0.001},
        "num_gpus": 1.0,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "16"}},
    }

    where, _ = on_workers(["torch-eager", "torch-compile"])
    assert {stage: where[key] for key in where for stage in [key[0]]} == {"export": None, "build": None, "profile": "H200"}
    where, _ = on_workers(["torch-eager", "trt-local"])
    assert where[("build", "fp16", "torch-eager")] is None and where[("export", "fp16", None)] is None

    # A type declared by a node without Ray's GPU: NVFP4's quantizer needs CUDA, so its export is a
    # task that asks Ray for a GPU, while FP16's goes to the worker.
    where, _ = on_workers(["torch-eager"], nodes=(declared, two))
    assert where[("export", "fp16", None)] == where[("export", "nvfp4", None)] == "H200"  # the first type built for, a CUDA GPU
    plan = ClusterPlan(ctx, Cluster("x:1", [declared]), RunRequest(engines, ["torch-eager"], "profile"))
    exports = {job.engine.variant: plan.worker_for(job) for job in plan.plan() if job.stage == "export"}
    assert exports == {"fp16": "L4", "nvfp4": None}


def test_idle_gpu_workers_stay_while_their_work_is_to_come_and_give_way_to_a_task_kept_waiting(monkeypatch):
    import time
    from types import SimpleNamespace

    from pipeline.cluster.gpu_workers import TASK_WAIT_S, GpuWorkers

    workers = GpuWorkers(cluster=None)
    ended = []
    monkeypatch.setattr(workers, "_end", lambda gpu_type, actor: ended.append((gpu_type, actor)))
    h200_point = SimpleNamespace(state="waiting", on="H200")
    l4_point = SimpleNamespace(state="waiting", on="L4")

    def release(*jobs):
        ended.clear()
        workers.idle = {"H200": ["h0", "h1"], "L4": ["l0"]}
        workers.release_idle(list(jobs), lambda job: job.on)
        return sorted(ended)

    assert release(h200_point, l4_point) == []  # the next job of each type takes one
    assert release(h200_point, SimpleNamespace(state="done", on="L4")) == [("L4", "l0")]  # nothing more for the L4s
    # A task (a TensorRT build, say) sent just now may start on its own; one still waiting after
    # TASK_WAIT_S waits for what the idle workers hold, and they give it back.
    fresh = SimpleNamespace(state="queued", on=None, submitted_at=time.monotonic())
    assert release(h200_point, l4_point, fresh) == []
    kept_waiting = SimpleNamespace(state="queued", on=None, submitted_at=time.monotonic() - TASK_WAIT_S - 1)
    assert release(h200_point, l4_point, kept_waiting) == [("H200", "h0"), ("H200", "h1"), ("L4", "l0")]


def test_a_run_on_several_gpus_of_one_host_says_how_its_points_held_the_host():
    from types import SimpleNamespace

    from pipeline.cluster.host_holds import HostHolds, held_words

    assert held_words(["whole", "whole", "shared"], gpus=2).startswith("2 of its 3 shape points held the host whole")
    assert "the other one ran its rounds beside other points'" in held_words(["whole", "whole", "shared"], gpus=2)
    assert "the other 2 ran theirs beside" in held_words(["whole", "shared", "shared"], gpus=4)
    assert held_words(["shared", "shared"], gpus=2).startswith("every one of its 2 shape points ran its rounds beside")
    # Nothing could have run beside anything: one GPU, or one point; an unheld point counts for neither.
    assert held_words(["whole", "whole"], gpus=1) is None
    assert held_words(["whole", None], gpus=2) is None

    def profile_manifest(held):
        rounds = [SimpleNamespace(host_held=held)]
        return SimpleNamespace(stage=lambda name: SimpleNamespace(details=SimpleNamespace(rounds=rounds)) if name == "profile" else None)

    pair = SimpleNamespace(node_id="a" * 16, resources={"GPU": 2.0}, label=lambda: "pair-host")
    single = SimpleNamespace(node_id="b" * 16, resources={"GPU": 1.0}, label=lambda: "single-host")
    holds = HostHolds()
    for held in ("whole", "shared", "whole"):
        holds.note(pair, [profile_manifest(held), profile_manifest(held)])  # one hold per point, whatever its engines
        holds.note(single, [profile_manifest(held)])
    said = holds.sentences()
    assert len(said) == 1 and said[0].startswith("pair-host: 2 of its 3 shape points held the host whole"), said


def test_a_broken_connection_to_ray_reads_as_the_lost_node_it_is_not_as_a_bug(monkeypatch):
    """Where Ray does not end a driver whose head went away, its next call raises OSError on the
    dead socket (seen in CI: "Broken pipe" from ray.wait). The driver's loop says it is the
    connection, and the command says what it says when Ray ends the driver: the head went away,
    finished stages are kept (exit 3), not an internal error (exit 70)."""
    import types

    import pipeline.cluster.scheduler as scheduler
    from pipeline.cluster.supervisor import BUG, INTERRUPTED, driven, driver_ended

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(wait=broken))
    job = types.SimpleNamespace(handle="a task's handle")
    run = types.SimpleNamespace(advance=lambda: None, running=lambda: [job])
    with pytest.raises(scheduler.DriverDisconnected, match="its connection to Ray broke: BrokenPipeError: .*Broken pipe"):
        scheduler.ClusterRun._loop(run, None)

    def drive(*args):
        scheduler.ClusterRun._loop(run, None)

    monkeypatch.setattr(scheduler, "drive", drive)
    reply = driven(None, "127.0.0.1:6379", None, False)
    assert reply.kind == INTERRUPTED
    error = driver_ended(reply, 0, "127.0.0.1:6379")
    assert error.exit_code == 3
    assert error.message.startswith("the Ray driver ended without a result (its connection to Ray broke: BrokenPipeError: ")
    assert "usually the cluster's head at 127.0.0.1:6379, goes away. Every stage that had finished is in the workspace." in error.message
    # A driver Ray ended itself left no reply: its exit says how.
    assert "(killed by SIGKILL)" in driver_ended(None, -9, "127.0.0.1:6379").message
    # Anything else raised in the driver is still a bug.
    monkeypatch.setattr(scheduler, "drive", lambda *args: 1 / 0)
    assert driven(None, "127.0.0.1:6379", None, False).kind == BUG

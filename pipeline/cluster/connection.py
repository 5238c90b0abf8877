"""Connecting to a Ray cluster and learning what its nodes have.

Every way a connection fails (nothing listening, a missing token, Ray or Python versions that
differ from the driver's, Ray not installed) becomes one ``ERROR``/``TIP`` here, before anything
is dispatched. Each node is then probed (pipeline/cluster/probe.py) for the pipeline's version,
its Python and its GPUs, so a node that could not run a stage is named up front.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from dataclasses import dataclass, field

from pipeline import __version__
from pipeline.running.errors import EnvironmentMissing, UsageError
from pipeline.running.reporting import native_stderr_held

# Ray's own resource for a node's NVIDIA GPU model (it detects "accelerator_type:H100" from the
# driver), and the custom resource a node can declare for any GPU type (`ray start --resources
# '{"gpu_type:RTX-PRO-6000": 1}'`, one unit per GPU). Either names a GPU type to place work by.
RAY_ACCELERATOR_PREFIX = "accelerator_type:"
DECLARED_GPU_PREFIX = "gpu_type:"
# Ray's wait for the head's GCS, in seconds (its default is about 20 attempts a second apart);
# a wrong address or a missing token is reported sooner. The user's own setting wins.
CONNECT_WAIT_S = "8"
TOKEN_HELP = (
    "this cluster has Ray's token authentication on: `export RAY_AUTH_MODE=token` and give the driver "
    "the cluster's token, in ~/.ray/auth_token, a file named by RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN "
    "(`ray get-auth-token` on the head prints it)"
)
SETUP_HELP = "install the cluster extra: `make setup EXTRAS=cluster` (or pip install -e '.[cluster]')"


@dataclass
class Node:
    """One alive Ray node that can run tasks, as Ray and the probe describe it."""

    node_id: str
    address: str
    resources: dict[str, float]
    hostname: str = "?"
    python: str | None = None
    pipeline: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    gpus: list[dict] = field(default_factory=list)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return gpu_types_of(self.resources)

    @property
    def cpus(self) -> float:
        return self.resources.get("CPU", 0.0)

    def label(self) -> str:
        kinds = f" {'/'.join(self.gpu_types)}" if self.gpu_types else ""
        return f"{self.hostname} {self.node_id[:8]}{kinds}"


def compute_resources(resources: dict) -> dict[str, float]:
    """What of a node's Ray resources says what it computes with: CPUs, GPUs and GPU types."""
    return {k: float(v) for k, v in resources.items() if k in ("CPU", "GPU") or k.startswith((RAY_ACCELERATOR_PREFIX, DECLARED_GPU_PREFIX))}


def gpu_types_of(resources: dict[str, float]) -> tuple[str, ...]:
    names = []
    for key in resources:
        for prefix in (RAY_ACCELERATOR_PREFIX, DECLARED_GPU_PREFIX):
            if key.startswith(prefix) and key[len(prefix) :] not in names:
                names.append(key[len(prefix) :])
    return tuple(sorted(names))


def gpus_of(resources: dict[str, float], gpu_type: str | None = None) -> float:
    """The GPUs a node's ``resources`` count: Ray's own, else the declared ones (of ``gpu_type``, or
    of every type); 0 for none."""
    if resources.get("GPU"):
        return resources["GPU"]
    if gpu_type is not None:
        return resources.get(DECLARED_GPU_PREFIX + gpu_type, 0.0)
    return sum(v for k, v in resources.items() if k.startswith(DECLARED_GPU_PREFIX))


def placement_resources(node_resources: dict[str, float], gpu_type: str, share: float = 1.0) -> dict[str, float]:
    """What a task asks Ray for to land on a node with ``gpu_type`` and have ``share`` of one of
    its GPUs (all of it unless told): a declared type is counted per GPU; Ray's own type goes
    with ``num_gpus``."""
    declared = DECLARED_GPU_PREFIX + gpu_type
    if declared in node_resources:
        return {declared: share}
    return {RAY_ACCELERATOR_PREFIX + gpu_type: 0.001}


@dataclass
class Cluster:
    address: str
    nodes: list[Node]

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for node in self.nodes for t in node.gpu_types}))

    def nodes_with(self, gpu_type: str) -> list[Node]:
        return [node for node in self.nodes if gpu_type in node.gpu_types]

    def node(self, node_id: str) -> Node | None:
        return next((node for node in self.nodes if node.node_id == node_id), None)

    def refresh(self) -> None:
        """Which nodes are alive now (after one was lost)."""
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        self.nodes = [node for node in self.nodes if node.node_id in alive]


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise EnvironmentMissing(f"--cluster needs Ray, which is not installed here ({exc}).", hint=SETUP_HELP) from exc
    return ray


def preflight(address: str) -> None:
    """What can be checked without starting Ray: that it is installed and the head answers."""
    import importlib.util

    try:
        found = importlib.util.find_spec("ray") is not None
    except (ValueError, AttributeError):  # a module entry without a spec: not importable either
        found = False
    if not found:
        raise EnvironmentMissing("--cluster needs Ray, which is not installed here.", hint=SETUP_HELP)
    if address != "local":
        _check_reachable(address)


def connect(address: str, verbose: bool = False) -> Cluster:
    """Join the cluster at ``address`` ("local" starts a Ray instance on this machine) as a driver."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()
    local = address == "local"
    if not local:
        _check_reachable(address)
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", CONNECT_WAIT_S)
    # Ray's C++ core prints every connection retry to stderr: kept for the error, not the screen.
    with native_stderr_held(not verbose) as noise:
        try:
            ray.init(
                address=address,  # "local" always starts a new instance (None would join any on this machine)
                namespace="trt-pipeline",
                log_to_driver=verbose,
                logging_level="WARNING",
                include_dashboard=False if local else None,
                configure_logging=True,
            )
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError or its own types
            raise _connection_error(address, exc, noise()) from exc
    _keep_sigterm()
    return Cluster(address=address, nodes=_nodes(ray))


def _keep_sigterm() -> None:
    """ray.init installs its own SIGTERM handler (a stack dump, then death); SIGTERM must stay what
    it is everywhere in the pipeline: Ctrl-C's clean-up, then exit 143."""
    from pipeline.running.signals import terminate_like_interrupt

    terminate_like_interrupt()


def disconnect() -> None:
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            ray.shutdown()


def _host_port(address: str) -> tuple[str, int]:
    match = re.fullmatch(r"\[?([^\]]+?)\]?:(\d+)", address.strip())
    if not match:
        raise UsageError(
            f"--cluster {address!r} is not a Ray address.",
            hint="give the head's HOST:PORT as `ray start --head` printed it (e.g. 10.0.0.5:6379), or `local`",
        )
    return match.group(1), int(match.group(2))


def head_reachable(address: str) -> bool:
    try:
        with socket.create_connection(_host_port(address), timeout=2):
            return True
    except OSError:
        return False


# Seconds a head has to answer the HTTP/2 greeting below; Ray's answers at once.
PROTOCOL_WAIT_S = 3.0
# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 §3.4, §6.5): a server
# must answer with a SETTINGS frame of its own (frame type 0x4, the fourth byte of the 9-byte
# frame header). Ray's head is the GCS, a gRPC server, so HTTP/2; anything else listening on the
# port (an HTTP/1 server, Redis, a database, a port that accepts and says nothing) does not, and
# Ray itself would retry such a port for minutes instead of failing.
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS_FRAME = 4


def _check_reachable(address: str) -> None:
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=5) as connection:
            answer = _greet(connection)
    except OSError as exc:
        raise EnvironmentMissing(
            f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}.",
            hint="start one with `ray start --head --port=PORT` (docs/cluster.md shows how), or check the address: "
            "`ray status` on the head prints it",
        ) from exc
    if answer is not None and not (len(answer) >= 9 and answer[3] == _SETTINGS_FRAME):
        first_line = answer.strip().split(b"\n")[0][:60].decode("utf-8", "replace").strip()
        heard = f"it answered {first_line!r}" if answer else f"it said nothing in {PROTOCOL_WAIT_S:g} s"
        raise EnvironmentMissing(
            f"{address} is not a Ray cluster's head: something listens there, but not Ray's GCS ({heard}).",
            hint="give the port `ray start --head` printed (6379 unless --port chose another): `ray status` on the head prints the address",
        )


def _greet(connection: socket.socket) -> bytes | None:
    """What the server answers to an HTTP/2 greeting (its first bytes); None where it cannot be told
    (Ray with TLS on wants a TLS handshake first)."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    connection.settimeout(PROTOCOL_WAIT_S)
    answer = b""
    try:
        connection.sendall(_HTTP2_GREETING)
        while len(answer) < 9:
            chunk = connection.recv(64)
            if not chunk:
                break
            answer += chunk
    except OSError:  # a timeout: it said nothing; or reset by a server that did not like the greeting
        pass
    return answer


def _connection_error(address: str, exc: Exception, noise: str) -> EnvironmentMissing:
    text = f"{exc}\n{exc.__cause__ or ''}\n{noise}"
    if "Authentication token" in text or "InvalidAuthToken" in text or "AuthenticationError" in type(exc.__cause__).__name__:
        return EnvironmentMissing(
            f"the Ray cluster at {address} refused this driver: it requires an authentication token.", hint=TOKEN_HELP
        )
    if "RAY_AUTH_TOKEN" in text:  # a token was named but cannot be read
        first = next(line.strip() for line in text.splitlines() if "RAY_AUTH_TOKEN" in line)
        return EnvironmentMissing(f"this driver's token for the Ray cluster at {address} is unusable: {first}", hint=TOKEN_HELP)
    if "Version mismatch" in text:
        # Ray's message (ray/_private/utils.py, check_version_info) lists the cluster's Ray and
        # Python, then this process's.
        found = re.findall(r"Ray: (\S+)\s+Python: (\S+)", text)
        detail = (
            f"cluster: Ray {found[0][0]}, Python {found[0][1]}; this driver: Ray {found[1][0]}, Python {found[1][1]}"
            if len(found) >= 2
            else str(exc).strip()
        )
        return EnvironmentMissing(
            f"the Ray cluster at {address} runs a different Ray or Python than this driver ({detail}).",
            hint="a driver must run the cluster's Ray and Python versions exactly; install the cluster's versions here "
            "(`ray --version`, `python --version` on the head)",
        )
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return EnvironmentMissing(
        f"could not join the Ray cluster at {address}: {first}",
        hint="check the address (`ray status` on the head) and that this machine runs the cluster's Ray version; -v shows Ray's log",
    )


def _nodes(ray) -> list[Node]:
    nodes = []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        resources = compute_resources(info.get("Resources") or {})
        if resources.get("CPU", 0) <= 0 and not gpu_types_of(resources):
            continue  # a head started with --num-cpus=0 runs no tasks
        nodes.append(Node(node_id=info["NodeID"], address=info.get("NodeManagerAddress", "?"), resources=resources))
    return nodes


def probe(cluster: Cluster) -> None:
    """Ask every node what it has; refuse a cluster with a node that cannot run the pipeline."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pipeline.cluster import probe as probe_module
    from pipeline.machine import nvidia_smi

    if not cluster.nodes:
        raise EnvironmentMissing(
            f"the Ray cluster at {cluster.address} has no node that runs tasks (no CPUs or GPUs advertised).",
            hint="add a worker: `ray start --address HEAD:PORT` on a machine with the pipeline installed",
        )
    # Sent by value, with the nvidia-smi query it uses: the probe answers even where the pipeline
    # is not importable.
    cloudpickle.register_pickle_by_value(probe_module)
    cloudpickle.register_pickle_by_value(nvidia_smi)
    remote = ray.remote(num_cpus=0, max_retries=1)(probe_module.probe_node)
    refs = {
        node.node_id: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
        for node in cluster.nodes
    }
    problems = []
    for node in cluster.nodes:
        try:
            facts = ray.get(refs[node.node_id], timeout=120)
        except Exception as exc:
            problems.append(f"node {node.node_id[:8]} ({node.address}) did not answer: {str(exc).splitlines()[0]}")
            continue
        problem = describe_node(node, facts)
        if problem:
            problems.append(problem)
    if problems:
        raise EnvironmentMissing(
            "; ".join(problems) + ".",
            hint="install the pipeline on every node as on this one: `make setup EXTRAS=cluster` in the same checkout, "
            "then restart that node's `ray start`",
        )


def describe_node(node: Node, facts: dict) -> str | None:
    """Record what the probe found on ``node``; what would stop it running a stage, or None."""
    node.hostname = facts["hostname"]
    node.python = facts["python"]
    node.pipeline = facts["pipeline"]
    node.packages = facts["packages"]
    node.gpus = facts["gpus"]
    if node.pipeline is None:
        return f"node {node.label()} ({node.address}) cannot import trt-pipeline (its Python: {facts['executable']})"
    if node.pipeline != __version__:
        return f"node {node.label()} runs trt-pipeline {node.pipeline}, this driver {__version__}"
    missing = [name for name in ("torch", "timm", "onnx", "onnxruntime") if not facts["packages"].get(name)]
    if missing:
        return f"node {node.label()} lacks {', '.join(missing)}"
    return None

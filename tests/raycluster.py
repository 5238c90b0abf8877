"""A real multi-node Ray cluster for the tests, on loopback only.

Ray advertises a machine's routable address even when told 127.0.0.1 (it resolves loopback to
the address it would reach the network from). To keep every byte on loopback, the whole cluster
and every driver run inside a network namespace that has nothing but `lo`: there Ray falls back
to 127.0.0.1. Making one needs root (CI runs as root); without it the tests skip and say why.

Each node is a `ray start … --block` process in its own process group, with token authentication
on (RAY_AUTH_MODE=token, a token of the test's own) and its own PIPELINE_CACHE_DIR, so the nodes
share no files: everything a stage needs travels through Ray's object store. Workers advertise a
GPU type as a custom resource (`gpu_type:H100`, …), which is how the tests stand in for GPUs.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
PORT = 6379
START_TIMEOUT_S = 90


def why_unavailable() -> str | None:
    if not (BIN / "ray").exists():
        return "Ray is not installed (an optional extra: `make setup EXTRAS=cluster`; .ci/run installs it)"
    if os.geteuid() != 0:
        return "keeping a test Ray cluster on loopback needs a network namespace, which needs root"
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return "unshare, nsenter and ip (util-linux, iproute2) are needed to keep the cluster on loopback"
    return None


@dataclass
class RayNode:
    name: str
    resources: dict
    cache: Path
    log: Path
    process: subprocess.Popen | None = None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=60)


@dataclass
class LoopbackCluster:
    root: Path
    env: dict = field(default_factory=dict)
    nodes: dict[str, RayNode] = field(default_factory=dict)
    namespace: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{PORT}"

    def _in_namespace(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.namespace.pid}/ns/net", "--", *argv]

    def start(self, workers: dict[str, dict], extra_env: dict | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "HOME": str(home),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
            **(extra_env or {}),
        }
        self.env.pop("RAY_ADDRESS", None)
        self.namespace = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep infinity"], start_new_session=True
        )
        time.sleep(0.3)
        # A short temp dir: Ray's socket paths must stay under the Unix limit.
        self.temp_dir = Path(f"/tmp/rt-{secrets.token_hex(3)}")
        self._start_node("head", {}, head=True)
        for name, resources in workers.items():
            self._start_node(name, resources)

    def share_toolchains(self, cache: Path) -> None:
        """Give every node the toolchains pulled into ``cache`` (TensorRT-RTX environments), as if
        each had pulled them itself; their content-addressed caches stay their own."""
        for name in self.nodes:
            node_cache = self.root / f"cache-{name}"
            node_cache.mkdir(exist_ok=True)
            for entry in cache.iterdir():
                link = node_cache / entry.name
                if entry.name != "cluster" and not link.exists():
                    link.symlink_to(entry)

    def add_node(self, name: str, resources: dict, cpus: int = 1) -> RayNode:
        """A worker node that joins the running cluster (``remove_node`` takes it away again)."""
        node = self._start_node(name, resources, cpus=cpus)
        self.wait_for_alive(len(self.nodes))
        return node

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name).kill()
        self.wait_for_alive(len(self.nodes))

    def _start_node(self, name: str, resources: dict, head: bool = False, cpus: int = 1) -> RayNode:
        cache = self.root / f"cache-{name}"
        cache.mkdir(exist_ok=True)
        node = RayNode(name, resources, cache, self.root / f"{name}.log")
        argv = [str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={self.temp_dir}", "--block"]
        if head:
            argv += ["--head", f"--port={PORT}", "--num-cpus=0", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.address}", f"--num-cpus={cpus}", f"--resources={json.dumps(resources)}"]
        env = {**self.env, "PIPELINE_CACHE_DIR": str(cache)}
        with open(node.log, "wb") as log:
            node.process = subprocess.Popen(self._in_namespace(argv), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"Ray runtime started" not in node.log.read_bytes():
            if node.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray node {name} did not start:\n{node.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.25)
        self.nodes[name] = node
        return node

    def restart(self, name: str) -> None:
        old = self.nodes[name]
        old.kill()
        self._start_node(name, old.resources)
        self.wait_for_alive(len(self.nodes))

    def wait_for_alive(self, count: int, timeout: float = 120) -> None:
        """Until Ray counts exactly ``count`` alive nodes (a killed node is declared dead only after
        its health checks fail)."""
        code = (
            "import ray, time\n"
            f"ray.init(address='{self.address}', log_to_driver=False, logging_level='ERROR')\n"
            f"deadline = time.time() + {timeout}\n"
            f"while sum(n['Alive'] for n in ray.nodes()) != {count} and time.time() < deadline:\n"
            "    time.sleep(1)\n"
            f"print(sum(n['Alive'] for n in ray.nodes()))\n"
        )
        result = self.python(code, timeout=timeout + 30)
        lines = result.stdout.strip().splitlines()
        if not lines or lines[-1] != str(count):
            raise RuntimeError(f"the cluster did not settle at {count} alive nodes: {result.stdout} {result.stderr[-2000:]}")

    def pipeline(
        self, catalog: Path, *args: str, timeout: float = 600, cache: Path | None = None, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        """`pipeline --catalog CATALOG ARGS…` as a driver inside the cluster's namespace."""
        return subprocess.run(
            self._in_namespace([str(BIN / "pipeline"), "--catalog", str(catalog), *args]),
            env=self.driver_env(cache, env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, catalog: Path, *args: str, cache: Path | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            self._in_namespace([str(BIN / "pipeline"), "--catalog", str(catalog), *args]),
            env=self.driver_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            self._in_namespace([sys.executable, "-c", code]), env=self.driver_env(), capture_output=True, text=True, timeout=timeout
        )

    def driver_env(self, cache: Path | None = None, extra: dict | None = None) -> dict:
        env = {**self.env, "PIPELINE_CACHE_DIR": str(cache or self.root / "cache-driver"), "COLUMNS": "200", **(extra or {})}
        return {key: value for key, value in env.items() if value is not None}  # None: leave that variable out

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.kill(signal.SIGTERM)
        if self.namespace is not None:
            os.killpg(self.namespace.pid, signal.SIGKILL)
            self.namespace.wait()
        shutil.rmtree(getattr(self, "temp_dir", self.root / "none"), ignore_errors=True)

"""Run a command in a container through the Docker SDK (never the `docker` CLI).

Containers run as the invoking user (outputs are not root-owned), without network, with only the
directories they need mounted (inputs read-only), and with the GPUs requested from the NVIDIA
container runtime. Output is saved to a log file and streamed with -v. A timeout kills the
container; the container is removed on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.running.errors import EnvironmentMissing, PipelineError, ToolStopped
from pipeline.running.files import atomic_write_text
from pipeline.running.reporting import Reporter

# Exit status of a process killed by SIGKILL: a timeout, `docker kill`, or the OOM killer.
EXIT_KILLED = 137


@dataclass(frozen=True)
class Mount:
    host: Path
    container: str
    read_only: bool = True


@dataclass
class ContainerResult:
    exit_code: int
    log_text: str
    image: str
    image_id: str
    repo_digest: str | None
    argv: list[str] = field(default_factory=list)


def _docker():
    try:
        import docker
    except ImportError as exc:
        raise EnvironmentMissing(
            "TensorRT container toolchains need the Python package 'docker'.", hint="pip install docker (or `make setup`)"
        ) from exc
    return docker


class DockerRunner:
    def __init__(self, reporter: Reporter, base_url: str | None = None, timeout_s: float = 30.0):
        self.reporter = reporter
        self.base_url = base_url
        self.api_timeout_s = timeout_s
        self._client = None

    @property
    def client(self):
        if self._client is None:
            docker = _docker()
            where = self.base_url or os.environ.get("DOCKER_HOST") or "the default socket"
            try:
                client = (
                    docker.DockerClient(base_url=self.base_url, timeout=self.api_timeout_s)
                    if self.base_url
                    else docker.from_env(timeout=self.api_timeout_s)
                )
                client.ping()
            except Exception as exc:  # DockerException, requests' ConnectionError, FileNotFoundError …
                raise EnvironmentMissing(
                    f"the Docker daemon is not reachable at {where}: {str(exc).splitlines()[0][:200]}",
                    hint="start Docker (or set DOCKER_HOST); `pipeline doctor` checks it",
                ) from exc
            self._client = client
        return self._client

    # --- images ------------------------------------------------------------------------------

    def image(self, name: str):
        docker = _docker()
        try:
            return self.client.images.get(name)
        except docker.errors.ImageNotFound:
            return None

    def require_image(self, name: str, toolchain: str):
        image = self.image(name)
        if image is None:
            raise EnvironmentMissing(
                f"image {name} (toolchain {toolchain}) is not on this machine.",
                hint=f"fetch it once with `pipeline toolchains pull {toolchain}`",
            )
        return image

    def pull(self, name: str):
        """Pull with progress: one line per layer as it completes, totals with -v."""
        docker = _docker()
        repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
        done: set[str] = set()
        try:
            for event in self.client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
                if "error" in event:
                    raise PipelineError(f"pulling {name} failed: {event['error']}", hint="check `docker login nvcr.io` and the network")
                status, layer = event.get("status", ""), event.get("id")
                if layer and status in ("Pull complete", "Already exists") and layer not in done:
                    done.add(layer)
                    self.reporter.info(f"pull     {name}: layer {layer} {status.lower()} ({len(done)} done)")
                elif event.get("progress"):
                    self.reporter.detail(f"{layer}: {status} {event['progress']}")
        except docker.errors.APIError as exc:
            raise PipelineError(
                f"pulling {name} failed: {exc.explanation or exc}",
                hint="check the image name, `docker login nvcr.io`, and that this machine can reach the registry",
            ) from exc
        return self.client.images.get(name)

    def build_image(self, context: Path, dockerfile: str, tag: str, buildargs: dict[str, str] | None = None):
        docker = _docker()
        try:
            for event in self.client.api.build(
                path=str(context), dockerfile=dockerfile, tag=tag, buildargs=buildargs or {}, decode=True, rm=True
            ):
                if "error" in event:
                    raise PipelineError(f"building image {tag} from {context / dockerfile} failed: {event['error'].strip()}")
                if event.get("stream", "").strip():
                    self.reporter.detail(event["stream"].rstrip())
        except docker.errors.APIError as exc:
            raise PipelineError(f"building image {tag} failed: {exc.explanation or exc}") from exc
        return self.client.images.get(tag)

    def has_nvidia_runtime(self) -> bool:
        return nvidia_runtime(self.client.info()) is not None

    @staticmethod
    def digest(image) -> str:
        """The registry digest when the image came from one, else its local content id."""
        digests = image.attrs.get("RepoDigests") or []
        return digests[0].split("@", 1)[1] if digests else image.id

    # --- running -----------------------------------------------------------------------------

    def run(
        self,
        image: str,
        argv: list[str],
        mounts: list[Mount],
        *,
        log_path: Path,
        timeout_s: float,
        gpus: bool = True,
        workdir: str | None = None,
        what: str = "command",
    ) -> ContainerResult:
        docker = _docker()
        image_obj = self.image(image)
        if image_obj is None:
            raise EnvironmentMissing(f"image {image} is not on this machine.", hint="`pipeline toolchains pull` fetches it")
        volumes = {str(m.host): {"bind": m.container, "mode": "ro" if m.read_only else "rw"} for m in mounts}
        device_requests = [gpu_request(docker)] if gpus else None
        container = None
        chunks: list[str] = []
        try:
            container = self.client.containers.create(
                image,
                command=argv,
                user=f"{os.getuid()}:{os.getgid()}",
                network_mode="none",
                volumes=volumes,
                working_dir=workdir,
                device_requests=device_requests,
                detach=True,
                labels={"trt-pipeline": what},
            )
            try:
                container.start()
            except docker.errors.APIError as exc:
                text = str(exc.explanation or exc)
                if "could not select device driver" in text or "nvidia" in text.lower():
                    raise EnvironmentMissing(
                        f"Docker cannot give the container a GPU: {text}",
                        hint="install the NVIDIA Container Toolkit and restart Docker; `pipeline doctor` checks it",
                    ) from exc
                raise PipelineError(f"starting {what} in {image} failed: {text}") from exc

            reader = threading.Thread(target=self._follow, args=(container, chunks), daemon=True)
            reader.start()
            timed_out = False
            try:
                status = container.wait(timeout=timeout_s)
                exit_code = int(status.get("StatusCode", -1))
            except Exception as exc:  # requests' ReadTimeout/ConnectionError: the wait ran out
                if not _is_timeout(exc):
                    raise
                timed_out = True
                container.kill()
                exit_code = EXIT_KILLED
            reader.join(timeout=10)
            log_text = "".join(chunks)
            atomic_write_text(log_path, log_text)
            if timed_out:
                raise ToolStopped(
                    f"{what} in {image} ran past its {timeout_s:g} s limit and was killed.",
                    hint=f"the log so far is {log_path}; raise the toolchain's timeout_s if the model needs longer",
                    why="ran past its time limit",
                )
            return ContainerResult(
                exit_code=exit_code,
                log_text=log_text,
                image=image,
                image_id=image_obj.id,
                repo_digest=self.digest(image_obj),
                argv=list(argv),
            )
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception:  # already gone, or the daemon went away: nothing left to clean
                    pass

    def _follow(self, container, chunks: list[str]) -> None:
        pending = ""
        try:
            for data in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                text = pending + data.decode("utf-8", errors="replace")
                *lines, pending = text.split("\n")
                for line in lines:
                    chunks.append(line + "\n")
                    self.reporter.tool_output("trtexec", line)
        except Exception:  # the container was removed under us (Ctrl-C): keep what we have
            pass
        if pending:
            chunks.append(pending)
            self.reporter.detail(pending)


def nvidia_runtime(info: dict) -> str | None:
    """How a daemon (its `docker info`) hands GPUs to containers, or None when it cannot."""
    if "nvidia" in (info.get("Runtimes") or {}):
        return "nvidia runtime registered"
    if info.get("CDISpecDirs"):
        return f"CDI spec dirs {', '.join(info['CDISpecDirs'])} (not verified)"
    return None


def _is_timeout(exc: Exception) -> bool:
    name = type(exc).__name__
    return "Timeout" in name or "ConnectionError" in name


def gpu_request(docker):
    """The GPUs a container gets: those CUDA_VISIBLE_DEVICES names on this machine (by index or
    UUID), so that inside it GPU 0 is the one this run measures on, as for every other runtime;
    every GPU where it names none."""
    visible = [device.strip() for device in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if device.strip()]
    if visible:
        return docker.types.DeviceRequest(device_ids=visible, capabilities=[["gpu"]])
    return docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])

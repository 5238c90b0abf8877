"""The trtexec-container toolchain kind: trtexec inside a pinned image (NGC, or one built from
docker/), run through the Docker SDK with the workspace's models read-only and the toolchain's
engine folder writable, no network; every run records the image's digest."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from pipeline.machine.environment import nvidia_gpus
from pipeline.running.errors import EnvironmentMissing
from pipeline.runtimes.base import ToolchainStatus
from pipeline.runtimes.tensorrt.trtexec import Execution, TrtexecRuntime, TrtexecSpec

# Where the workspace appears inside the container.
CONTAINER_ROOT = "/work"


class TrtexecContainerSpec(TrtexecSpec):
    """trtexec in an NGC image (``image``), or in one built from ``docker/<dockerfile>``."""

    kind: Literal["trtexec-container"]
    image: str | None = None
    dockerfile: str | None = None

    @model_validator(mode="after")
    def _needs_an_image(self):
        if not (self.image or self.dockerfile):
            raise ValueError("a trtexec-container toolchain needs 'image' or 'dockerfile'")
        return self


class TrtexecContainerRuntime(TrtexecRuntime):
    """trtexec inside a pinned image (NGC, or built from docker/)."""

    kind = "trtexec-container"
    Spec = TrtexecContainerSpec

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._runner = None
        self._digest: str | None = None

    @property
    def image_name(self) -> str:
        """The NGC image, or the local name of the one built from docker/."""
        return self.spec.image or f"trt-pipeline/{self.name}:latest"

    def describe(self) -> str:
        return f"TensorRT {self.spec.trt} in image {self.image_name}" + (
            f" (docker/{self.spec.dockerfile})" if self.spec.dockerfile else ""
        )

    def status(self) -> ToolchainStatus:
        try:
            image = self.runner.image(self.image_name)
        except EnvironmentMissing:
            return ToolchainStatus(
                present=None, usable=False, detail=f"{self.describe()}; Docker is not reachable (start it, or set DOCKER_HOST)"
            )
        missing = [] if image is not None else ["image (`pipeline toolchains pull`)"]
        if self.spec.gpus == "all":
            if not nvidia_gpus():
                missing.append("NVIDIA GPU")
            if not self.runner.has_nvidia_runtime():
                missing.append("NVIDIA container runtime")
        detail = self.describe() + (f"; missing: {', '.join(missing)}" if missing else "")
        return ToolchainStatus(
            present=image is not None, usable=not missing, detail=detail, pin=self.runner.digest(image) if image is not None else None
        )

    def pull(self) -> None:
        if self.spec.dockerfile:
            context = self.workspace_root / "docker"
            self.reporter.info(f"build    {self.image_name} from {context / self.spec.dockerfile}")
            self.runner.build_image(context, self.spec.dockerfile, self.image_name, {"TRT_VERSION": self.spec.trt})
        else:
            self.reporter.info(f"pull     {self.image_name}")
            self.runner.pull(self.image_name)
        self.reporter.info(f"ready    {self.name}: {self.image_name}")

    def pin(self) -> dict[str, Any]:
        image = self.runner.require_image(self.image_name, self.name)
        digest = self.runner.digest(image)
        return {"pin": digest, "image": self.image_name, "digest": digest, "trt": self.spec.trt}

    @property
    def runner(self):
        if self._runner is None:
            from pipeline.runtimes.tensorrt.docker import DockerRunner

            self._runner = DockerRunner(self.reporter)
        return self._runner

    def container_path(self, host: Path) -> str:
        relative = Path(host).resolve().relative_to(self.workspace_root)
        return f"{CONTAINER_ROOT}/{relative.as_posix()}"

    def provenance(self) -> dict[str, Any]:
        if self._digest is None:
            image = self.runner.require_image(self.image_name, self.name)
            self._digest = self.runner.digest(image)
            self._check_lock(self._digest)
        return {"image": self.image_name, "digest": self._digest}

    def _check_lock(self, digest: str) -> None:
        from pipeline.runtimes.toolchains import read_lock

        locked = read_lock(self.workspace_root).get(self.name)
        if locked and locked.get("digest") and locked["digest"] != digest:
            self.reporter.warn(
                f"toolchain {self.name}: image {self.image_name} is {digest[:19]}…, but toolchains.lock.json "
                f"pins {locked['digest'][:19]}…; results may differ from the locked toolchain "
                "(`pipeline toolchains lock` records the new one)"
            )

    def execute(self, argv: list[str], log_path: Path, what: str) -> Execution:
        from pipeline.runtimes.tensorrt.docker import Mount

        root = self.workspace_root
        engine_dir = root / "engines" / self.name
        engine_dir.mkdir(parents=True, exist_ok=True)
        # Inputs read-only, this toolchain's engine directory writable; nothing else is visible.
        mounts = [Mount(root / "models", f"{CONTAINER_ROOT}/models", read_only=True)] if (root / "models").is_dir() else []
        mounts.append(Mount(engine_dir, f"{CONTAINER_ROOT}/engines/{self.name}", read_only=False))
        result = self.runner.run(
            self.image_name,
            argv,
            mounts,
            log_path=log_path,
            timeout_s=self.spec.timeout_s,
            gpus=self.spec.gpus == "all",
            workdir=f"{CONTAINER_ROOT}/engines/{self.name}",
            what=f"trtexec {what}",
        )
        return Execution(result.exit_code, result.log_text, image=result.image, image_digest=result.repo_digest)

    def where(self) -> str:
        return f"image {self.image_name}, /work = {self.workspace_root} (models ro, engines/{self.name} rw), no network"

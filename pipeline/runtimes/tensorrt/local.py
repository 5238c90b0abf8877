"""The trtexec-local toolchain kind: trtexec installed on this machine (on PATH, or under
``trt_root``, whose lib/ goes on LD_LIBRARY_PATH), run as a subprocess."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal

from pipeline.machine.environment import nvidia_gpus
from pipeline.running.errors import EnvironmentMissing
from pipeline.runtimes.base import ToolchainStatus
from pipeline.runtimes.tensorrt.trtexec import Execution, TrtexecRuntime, TrtexecSpec


class TrtexecLocalSpec(TrtexecSpec):
    """trtexec installed on this machine: on PATH, or under ``trt_root``."""

    kind: Literal["trtexec-local"]
    trt_root: Path | None = None


class TrtexecLocalRuntime(TrtexecRuntime):
    """trtexec installed on this machine (on PATH, or under ``trt_root``)."""

    kind = "trtexec-local"
    Spec = TrtexecLocalSpec

    def describe(self) -> str:
        where = f"under {self.spec.trt_root}" if self.spec.trt_root else f"`{self.spec.trtexec}` on PATH"
        return f"TensorRT {self.spec.trt}, trtexec {where}"

    def status(self) -> ToolchainStatus:
        try:
            found = self.trtexec_path()
        except EnvironmentMissing as exc:
            return ToolchainStatus(present=False, usable=False, detail=exc.message)
        usable = self.spec.gpus == "none" or bool(nvidia_gpus())
        return ToolchainStatus(present=True, usable=usable, detail=f"{found}" + ("" if usable else "; missing: NVIDIA GPU"))

    def trtexec_path(self) -> str:
        if self.spec.trt_root is not None:
            candidate = Path(self.spec.trt_root) / "bin" / "trtexec"
            if not candidate.exists():
                raise EnvironmentMissing(f"{candidate} does not exist.", hint=f"fix trt_root of toolchain {self.name}")
            return str(candidate)
        found = shutil.which(self.spec.trtexec)
        if not found:
            raise EnvironmentMissing(
                f"trtexec ({self.spec.trtexec}) is not on PATH for toolchain {self.name}.",
                hint="install TensorRT or set trt_root in pipeline.toml; or use a trtexec-container toolchain",
            )
        return found

    def provenance(self) -> dict[str, Any]:
        return {"trtexec": self.trtexec_path()}

    def execute(self, argv: list[str], log_path: Path, what: str) -> Execution:
        from pipeline.runtimes.process import run_logged

        env = dict(os.environ)
        if self.spec.trt_root is not None:
            lib = str(Path(self.spec.trt_root) / "lib")
            env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        finished = run_logged(
            argv, log_path=log_path, timeout_s=self.spec.timeout_s, reporter=self.reporter, what=f"trtexec {what}", env=env
        )
        return Execution(finished.exit_code, finished.output)

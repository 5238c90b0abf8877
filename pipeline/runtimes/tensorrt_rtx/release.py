"""A TensorRT-RTX release's own environment: a virtual environment under the product's cache
directory holding NVIDIA's two wheels of the release (in the CUDA flavour the machine's driver
takes) and nothing else, made by `pipeline toolchains pull`, and probed by running the driver
script there (pipeline/runtimes/tensorrt_rtx/driver.py). The toolchain (tensorrt_rtx/runtime.py) runs its
builds and profiles in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.machine.environment import nvidia_gpus
from pipeline.running.cache import cache_dir
from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError

# The script that drives a release from inside its environment (it imports only the release).
DRIVER = Path(__file__).with_name("driver.py")
# The wheels of one release, in the CUDA flavour chosen for the machine.
PACKAGES = ("tensorrt-rtx-{cuda}-libs", "tensorrt-rtx-{cuda}-bindings")
# CUDA 13 builds need an NVIDIA driver of branch 580 or newer on Linux. Source: CUDA Toolkit release
# notes, "CUDA Toolkit and Corresponding Driver Versions" (CUDA 13.0 GA: >= 580.65.06).
CUDA13_MIN_DRIVER = 580


def cuda_flavour(choice: str) -> str:
    if choice != "auto":
        return choice
    gpus = nvidia_gpus()
    branch = re.match(r"\d+", gpus[0].driver or "") if gpus else None
    if branch is None:
        return "cu13"  # no driver: builds need no CUDA, and cu13 is the current flavour
    return "cu13" if int(branch.group(0)) >= CUDA13_MIN_DRIVER else "cu12"


@dataclass
class ReleaseEnvironment:
    """One release's own virtual environment under the cache directory."""

    release: str
    cuda: str
    root: Path

    @property
    def path(self) -> Path:
        return self.root / "tensorrt-rtx" / f"{self.release}-{self.cuda}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.path / "pipeline-env.json"

    @property
    def packages(self) -> list[str]:
        return [f"{name.format(cuda=self.cuda)}=={self.release}" for name in PACKAGES]

    def state(self) -> tuple[str, str]:
        """("ready" | "missing" | "broken", why)."""
        if not self.path.exists():
            return "missing", f"TensorRT-RTX {self.release} ({self.cuda}) is not pulled"
        if not self.marker.is_file() or not self.python.exists():
            return "broken", f"the environment of TensorRT-RTX {self.release} at {self.path} is incomplete (an interrupted pull?)"
        try:
            facts = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return "broken", f"{self.marker} is unreadable"
        if facts.get("release") != self.release:
            return "broken", f"{self.path} holds release {facts.get('release')}, not {self.release}"
        return "ready", f"TensorRT-RTX {self.release} ({self.cuda}) at {self.path}"

    def facts(self) -> dict[str, Any]:
        return json.loads(self.marker.read_text())

    def create(self, reporter, timeout_s: float) -> dict[str, Any]:
        """Install the release into a fresh environment, check it, then move it into place.

        Everything happens in a sibling folder first: an interrupted or failed pull never leaves
        something that looks like a pulled release.
        """
        from pipeline.runtimes.process import run_logged

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".partial", dir=self.path.parent))
        except OSError as exc:
            setting = "PIPELINE_CACHE_DIR" if os.environ.get("PIPELINE_CACHE_DIR") else "the user's cache directory (XDG_CACHE_HOME)"
            raise EnvironmentMissing(
                f"cannot create the release's environment under {self.path.parent}: {exc.strerror or exc} ({exc.filename or self.path.parent}).",
                hint=f"{setting} must name a directory this user can write (it names {cache_dir()})",
            ) from exc
        log_path = self.path.parent / f"{self.path.name}.pull.log"
        try:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(partial)], check=True, capture_output=True, text=True)
            python = partial / "bin" / "python"
            report = partial / "pip-report.json"
            argv = [
                sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input", "--disable-pip-version-check",
                "--progress-bar", "off", "--report", str(report), *self.packages,
            ]  # fmt: skip
            finished = run_logged(
                argv, log_path=log_path, timeout_s=timeout_s, reporter=reporter, what="pip install of TensorRT-RTX", env=pip_environment()
            )
            if finished.exit_code != 0:
                raise pip_failure(self.release, self.packages, finished.output, log_path)
            facts = probe(python, timeout_s=120)
            if facts.get("release") != self.release:
                raise PipelineError(
                    f"the wheels installed for TensorRT-RTX {self.release} report release {facts.get('release')}.",
                    hint=f"pip's log: {log_path}",
                )
            facts.update(
                release=self.release,
                cuda=self.cuda,
                packages=self.packages,
                wheels=installed_wheels(report),
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            )
            (partial / "pipeline-env.json").write_text(json.dumps(facts, indent=2) + "\n")
            if self.path.exists():
                shutil.rmtree(self.path)
            os.replace(partial, self.path)
            return facts
        except subprocess.CalledProcessError as exc:
            raise EnvironmentMissing(f"could not create a virtual environment with {sys.executable}: {exc.stderr.strip()}") from exc
        finally:
            shutil.rmtree(partial, ignore_errors=True)


# What the caller's shell may set that would make pip look at, or install into, somewhere other
# than the new environment: with PYTHONPATH holding TensorRT-RTX (NGC containers and HPC module
# systems set it), pip reports the packages "already satisfied" and installs nothing.
_NOT_FOR_PIP = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PIP_REQUIRE_VIRTUALENV")


def pip_environment() -> dict[str, str]:
    """The environment pip installs a release with: the caller's, less what points it elsewhere.
    Where pip finds packages (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX, proxies) is kept."""
    env = {key: value for key, value in os.environ.items() if key not in _NOT_FOR_PIP}
    env["PYTHONNOUSERSITE"] = "1"  # nor the user's site-packages
    return env


def pip_failure(release: str, packages: list[str], output: str, log_path: Path) -> PipelineError:
    """pip's failure, said in the pipeline's terms."""
    versions = re.search(r"\(from versions: ([^)]*)\)", output)
    known = versions.group(1).strip() if versions else ""
    unreachable = re.search(
        r"NewConnectionError|Connection refused|Name or service not known|Temporary failure in name resolution|Max retries exceeded|ProxyError|ReadTimeoutError",
        output,
    )
    if unreachable or known == "none":
        # The wheels are on PyPI in every release: an index that offers none of them was not read
        # (offline, pip says "from versions: none", with or without its retry warnings).
        why = f" ({unreachable.group(0)})" if unreachable else ""
        return EnvironmentMissing(
            f"could not download TensorRT-RTX {release}: the package index is not reachable, or does not carry {packages[0].split('==')[0]}{why}.",
            hint=f"check the network or pip's index settings (PIP_INDEX_URL; PIP_FIND_LINKS for wheels you carry); pip's log: {log_path}",
        )
    if "No matching distribution" in output or versions:
        return UsageError(
            f"TensorRT-RTX release {release} is not on the package index ({packages[0]}).",
            hint=f"releases there: {known}; set `release` in pipeline.toml" if known else f"pip's log: {log_path}",
        )
    last = next((line for line in reversed(output.splitlines()) if line.startswith("ERROR")), "pip failed")
    return PipelineError(f"installing TensorRT-RTX {release} failed: {last}", hint=f"pip's log: {log_path}")


def installed_wheels(report: Path) -> dict[str, str]:
    """The sha256 of each wheel pip installed (from its --report), what pins a release exactly."""
    try:
        installed = json.loads(report.read_text()).get("install", [])
    except (OSError, ValueError):
        return {}
    wheels = {}
    for item in installed:
        hashes = ((item.get("download_info") or {}).get("archive_info") or {}).get("hashes") or {}
        name = (item.get("metadata") or {}).get("name", "?")
        if "sha256" in hashes:
            wheels[name] = "sha256:" + hashes["sha256"]
    return wheels


def probe(python: Path, timeout_s: float) -> dict[str, Any]:
    """What the release in an environment says about itself (its version, the targets it knows)."""
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "version.json"
        completed = subprocess.run(
            [str(python), "-I", str(DRIVER), "version", str(result)], capture_output=True, text=True, timeout=timeout_s
        )
        if completed.returncode != 0 or not result.exists():
            tail = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
            raise PipelineError(f"TensorRT-RTX in {python.parent.parent} does not load: {tail[0]}", hint="pull it again to repair it")
        return json.loads(result.read_text())


def pin_of(facts: dict[str, Any]) -> str:
    """The wheels' sha256 when pip reported them (they pin the release exactly), else their versions."""
    wheels = facts.get("wheels") or {}
    if wheels:
        # The libraries' wheel first: it is the compiler (listings show the pin's first characters).
        return " ".join(digest for _, digest in sorted(wheels.items(), key=lambda item: "_libs" not in item[0]))
    return " ".join(facts.get("packages", []))

"""What machine and software a measurement came from, captured without heavy imports."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from pipeline import __version__
from pipeline.manifest import Environment, GpuInfo

# Distributions whose versions change results; recorded in every manifest.
TRACKED_PACKAGES = (
    "torch",
    "timm",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "nvidia-modelopt",
    "numpy",
    "tensorrt",
    "docker",
)


def package_versions(names=TRACKED_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def nvidia_gpus() -> tuple[GpuInfo, ...]:
    """GPUs as nvidia-smi reports them; empty on machines without the NVIDIA driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 4:
            continue
        name, driver, cc, memory = fields[:4]
        gpus.append(
            GpuInfo(
                name=name,
                driver=driver or None,
                compute_capability=cc if cc and cc[0].isdigit() else None,
                memory_mib=int(memory) if memory.isdigit() else None,
            )
        )
    return tuple(gpus)


@functools.lru_cache(maxsize=4)
def git_state(root: Path) -> tuple[str | None, bool | None]:
    """HEAD commit of the checkout the pipeline runs from, and whether it has local changes."""
    git = shutil.which("git")
    if not git:
        return None, None
    try:
        commit = subprocess.run(
            [git, "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None, None
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10
        )
        return commit.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def capture_environment(root: Path) -> Environment:
    commit, dirty = git_state(Path(root))
    return Environment(
        hostname=platform.node(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        cpu=cpu_name(),
        cpu_count=os.cpu_count() or 1,
        gpus=list(nvidia_gpus()),
        packages=package_versions(),
        git_commit=commit,
        git_dirty=dirty,
        pipeline_version=__version__,
    )

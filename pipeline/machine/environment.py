"""What machine and software a measurement came from, captured without heavy imports."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.machine import nvidia_smi
from pipeline.manifest import Environment, GpuInfo
from pipeline.running.errors import PipelineError

SYS_CPU = Path("/sys/devices/system/cpu")

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


def package_version(name: str) -> str | None:
    """An installed distribution's version, read from its metadata (no import); None if absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_versions(names=TRACKED_PACKAGES) -> dict[str, str]:
    return {name: version for name in names if (version := package_version(name)) is not None}


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
    gpus = []
    for fields in nvidia_smi.query("name,driver_version,compute_cap,memory.total"):
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


def measuring_gpu() -> dict[str, Any] | None:
    """The GPU this process measures on, as nvidia-smi numbers it ({"index", "uuid", "name"}): the
    first that CUDA_VISIBLE_DEVICES names (by index or UUID), else GPU 0; None where no GPU is
    visible or the one named is not a whole GPU nvidia-smi lists (a MIG instance)."""
    rows = [row for row in nvidia_smi.query("index,uuid,name") if len(row) >= 3]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        rows = [
            row for row in rows if first and (row[0] == first or row[1] == first or (first.startswith("GPU-") and row[1].startswith(first)))
        ]
    if not rows or not rows[0][0].isdigit():
        return None
    index, uuid, name = rows[0][:3]
    return {"index": int(index), "uuid": uuid, "name": name}


def gpu_memory_free(uuid: str) -> tuple[int, int] | None:
    """(free, total) bytes of the GPU with this UUID, by NVML (as nvidia-smi counts them, every
    process's use together); None where NVML cannot say."""
    try:
        from pipeline.measuring import nvml

        pynvml = nvml.opened()
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(nvml.handle(pynvml, uuid))
            return int(memory.free), int(memory.total)
        finally:
            nvml.close(pynvml)
    except Exception:  # no NVML, no driver, another GPU than NVML knows
        return None


def host_memory_available(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of host memory a new process may still take without swapping: the kernel's estimate
    (MemAvailable), or less where this process's cgroup (v2: a container's ``--memory``, a
    systemd slice) allows less; None where neither can be read (not Linux)."""
    available = None
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        own = next(line[3:] for line in (proc / "self" / "cgroup").read_text().splitlines() if line.startswith("0::"))
        group = cgroups / own.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int((group / "memory.current").read_text())
            available = left if available is None else min(available, left)
    except (OSError, ValueError, StopIteration):  # no cgroup v2 here, or no limit
        pass
    return available


@functools.lru_cache(maxsize=4)
def git_state(root: Path) -> tuple[str | None, bool | None]:
    """HEAD commit of the checkout the pipeline runs from, and whether it has local changes."""
    git = shutil.which("git")
    if not git:
        return None, None
    try:
        commit = subprocess.run([git, "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None, None
        dirty = subprocess.run([git, "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10)
        return commit.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def capture_environment() -> Environment:
    """This machine and this pipeline. The commit is the pipeline's own checkout's (where this
    package lies; None when installed from a wheel), not the workspace's, which may be a repository
    of its own or none."""
    commit, dirty = git_state(Path(__file__).resolve().parents[2])
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


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def machine_load() -> dict:
    """How busy the machine is right now, for judging a measurement taken on it: the load average
    against the CPU count, and per GPU its utilisation, clocks and the processes using it (this
    process excluded). What cannot be read is left out."""
    load: dict = {"cpu_count": os.cpu_count() or 1}
    try:
        load["load_average"] = [round(value, 2) for value in os.getloadavg()]
    except OSError:  # not available on this platform
        pass
    if not nvidia_smi.present():
        return load
    fields = "name,utilization.gpu,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,memory.used"
    load["gpus"] = [
        {
            "name": row[0],
            "utilization_pct": _number(row[1]),
            "sm_clock_mhz": _number(row[2]),
            "max_sm_clock_mhz": _number(row[3]),
            "memory_clock_mhz": _number(row[4]),
            "temperature_c": _number(row[5]),
            "memory_used_mib": _number(row[6]),
        }
        for row in nvidia_smi.query(fields)
        if len(row) >= 7
    ]
    load["gpu_processes"] = [
        {"pid": int(row[0]), "name": row[1], "used_memory_mib": _number(row[2])}
        for row in nvidia_smi.query("pid,process_name,used_memory", "compute-apps")
        if len(row) >= 3 and row[0].isdigit() and int(row[0]) != os.getpid()
    ]
    return load


@contextlib.contextmanager
def running_on(cpus: tuple[int, ...] | None):
    """This thread, and what it starts meanwhile (threads, processes), on ``cpus`` only; where it
    ran before afterwards. None changes nothing."""
    if cpus is None:
        yield
        return
    if not hasattr(os, "sched_setaffinity"):
        raise PipelineError(
            f"[profile] host_cpus = {list(cpus)}: this platform ({platform.system()}) cannot pin a process to CPUs.",
            hint="remove host_cpus from [profile] in pipeline.toml",
        )
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise PipelineError(
            f"[profile] host_cpus = {list(cpus)}: this process may not run on CPU {', '.join(map(str, missing))}; "
            f"it may run on {_ranges(sorted(allowed))}.",
            hint="choose CPUs from that list in [profile] host_cpus in pipeline.toml",
        )
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def physical_cores(cpus: list[int], sys_cpu: Path = SYS_CPU) -> list[tuple[int, ...]]:
    """``cpus`` grouped by the physical core they are threads of, in socket then core order (a
    CPU whose topology the kernel does not show is a core of its own)."""
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(cpus):
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            key = (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()))
        except (OSError, ValueError):
            key = (-1, cpu)  # package -1: no real core shares its key
        cores.setdefault(key, []).append(cpu)
    return [tuple(threads) for _, threads in sorted(cores.items())]


def pinned_cores() -> int | None:
    """How many physical cores this process may run on, where that is fewer than the machine has
    ([profile] host_cpus; a cluster point's share of its node): a thread pool sized by the machine
    would put several threads on each of them. None where it may run on every CPU."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if len(allowed) >= (os.cpu_count() or 0):
        return None
    return len(physical_cores(sorted(allowed)))


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3, 8"."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)

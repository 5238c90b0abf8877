"""`pipeline doctor`: what this machine can run, and what to install for the rest."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from importlib import util

from pipeline.catalog import Catalog
from pipeline.machine.environment import nvidia_gpus, package_version


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


PYTHON_DEPS = (
    ("onnx", "onnx", True),
    ("onnxruntime", "onnxruntime", True),
    ("pydantic", "pydantic", True),
    ("torch", "torch", False),
    ("timm", "timm", False),
    ("modelopt", "nvidia-modelopt", False),
    ("docker", "docker", True),
    # Constant folding before TensorRT builds and `pipeline reduce` (pipeline/graph/).
    ("polygraphy", "polygraphy", True),
    ("onnx_graphsurgeon", "onnx-graphsurgeon", True),
    ("tensorrt", "tensorrt", False),
)


def check_python() -> list[Check]:
    checks = [Check("python", True, platform.python_version())]
    for module, dist, required in PYTHON_DEPS:
        present = util.find_spec(module) is not None
        version = package_version(dist) if present else None
        if present:
            checks.append(Check(f"package {dist}", True, version or "installed"))
        else:
            need = "required" if required else "optional: export/quantize" if module in ("torch", "timm", "modelopt") else "optional"
            checks.append(Check(f"package {dist}", False, f"not installed ({need})"))
    return checks


def check_cuda() -> Check:
    if util.find_spec("torch") is None:
        return Check("CUDA (torch)", False, "torch not installed")
    import torch

    if torch.cuda.is_available():
        return Check("CUDA (torch)", True, f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    return Check("CUDA (torch)", False, f"torch {torch.__version__} sees no CUDA device")


def check_torch_build(gpus: list | None = None) -> Check:
    """Which build of torch this is: the CPU one (``+cpu``, no CUDA) or a CUDA one and its CUDA
    release; a CPU build on a machine with an NVIDIA GPU is a "no", with what to run instead
    (PyTorch's wheel indexes, pytorch.org/get-started/locally: /whl/cpu for the CPU build,
    /whl/cuXYZ for CUDA XY.Z, a release the GPU's driver supports)."""
    if util.find_spec("torch") is None:
        return Check("torch build", False, "torch not installed (make setup installs the CPU build)")
    import torch

    cuda = torch.version.cuda
    if cuda:
        return Check("torch build", True, f"torch {torch.__version__}: the CUDA {cuda} build")
    gpus = nvidia_gpus() if gpus is None else gpus
    if not gpus:
        return Check("torch build", True, f"torch {torch.__version__}: the CPU build")
    return Check(
        "torch build",
        False,
        f"torch {torch.__version__}: the CPU build, on a machine with an NVIDIA GPU ({gpus[0].name}); for the GPU: "
        ".venv/bin/pip install torch torchvision --index-url https://download.pytorch.org/whl/cuXYZ (the CUDA release your "
        "driver supports, pytorch.org/get-started/locally), then make setup TORCH_PACKAGES=",
    )


def check_torch_pair(versions: tuple[str | None, str | None] | None = None, import_error=None) -> Check | None:
    """Whether torchvision goes with the torch installed (pipeline/runtimes/pytorch/pair.py); None
    where either is missing. ``versions`` and ``import_error`` (a function) stand in for the
    installed ones in tests."""
    from pipeline.runtimes.pytorch.pair import pair_problem, torchvision_import_error

    torch, torchvision = versions or (package_version("torch"), package_version("torchvision"))
    if not torch or not torchvision:
        return None
    problem = pair_problem(torch, torchvision, (import_error or torchvision_import_error)())
    return Check("torch/torchvision pair", problem is None, problem or f"torch {torch} with torchvision {torchvision}")


def check_gpus() -> Check:
    gpus = nvidia_gpus()
    if not gpus:
        return Check("NVIDIA GPU", False, "nvidia-smi not found or no GPU")
    text = "; ".join(f"{g.name} (CC {g.compute_capability}, driver {g.driver}, {g.memory_mib} MiB)" for g in gpus)
    return Check("NVIDIA GPU", True, text)


def check_docker() -> tuple[Check, Check]:
    try:
        from docker.errors import DockerException

        import docker
    except ImportError:
        missing = Check("Docker daemon", False, "the docker Python package is not installed")
        return missing, Check("NVIDIA container runtime", False, "no Docker")
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        info = client.info()
    except (DockerException, OSError) as exc:
        return (
            Check("Docker daemon", False, f"unreachable ({str(exc).splitlines()[0][:120]})"),
            Check("NVIDIA container runtime", False, "no Docker"),
        )
    from pipeline.runtimes.tensorrt.docker import nvidia_runtime

    daemon = Check("Docker daemon", True, f"Docker {info.get('ServerVersion', '?')}")
    how = nvidia_runtime(info)
    if how:
        return daemon, Check("NVIDIA container runtime", True, how)
    return daemon, Check("NVIDIA container runtime", False, "no 'nvidia' runtime in the daemon (install nvidia-container-toolkit)")


def check_toolchains(catalog: Catalog) -> list[Check]:
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.toolchains import status

    return [Check(f"toolchain {row.name}", row.status.usable, row.status.detail) for row in status(catalog, Reporter())]


def check_runtime_kinds() -> list[Check]:
    """What each kind of toolchain finds on this machine, named in the catalog or not."""
    from pipeline.runtimes import runtime_classes

    return [Check(*found) for found in (cls.machine_check() for cls in runtime_classes()) if found]


def run_doctor(catalog: Catalog) -> list[Check]:
    checks = check_python()
    daemon, runtime = check_docker()
    pair = [check] if (check := check_torch_pair()) is not None else []
    checks += [check_torch_build(), *pair, check_cuda(), check_gpus(), daemon, runtime]
    return checks + check_runtime_kinds() + check_toolchains(catalog)


def render(checks: list[Check]):
    from rich.table import Table

    table = Table(title="What this machine can run")
    table.add_column("check")
    table.add_column("")
    table.add_column("detail")
    for check in checks:
        table.add_row(check.name, "[green]yes[/]" if check.ok else "[red]no[/]", check.detail)
    return table


def as_dicts(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]

"""Compiled work kept in the workspace, and carried to another machine as one file.

torch.compile's caches (Inductor's FX graph cache, AOTAutograd's, the Triton kernels: Inductor keeps
Triton's under its own directory) live in ``$TORCHINDUCTOR_CACHE_DIR``, by default a folder of the
temp directory (``torchinductor_<user>``), where a cleared temp directory, another machine or a
cluster's worker finds none of them. Here they live in the workspace, ``.cache/torch/``, beside the
engines they were compiled for, unless the user named a directory of their own.

Each process that compiles or finds a graph there records it in PyTorch's Mega-Cache
(``torch.compiler.save_cache_artifacts``: "a single artifact ... that can be loaded in a different
machine" — PyTorch's Compile Time Caching in torch.compile recipe); the compiling processes save
what they recorded to ``.cache/torch/megacache/``. ``pipeline cache export`` bundles those into one
file, and ``pipeline cache import`` loads a bundle into this workspace's caches
(``torch.compiler.load_cache_artifacts``) before anything compiles.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
import zipfile
from pathlib import Path

from pipeline.running.errors import UsageError
from pipeline.running.files import atomic_output

CACHE_FOLDER = Path(".cache") / "torch"
ENVIRONMENT = "TORCHINDUCTOR_CACHE_DIR"
BUNDLE_KIND = "pipeline torch compile cache"


def torch_default_cache_dir() -> str:
    """Inductor's own default (torch/_inductor/runtime/cache_dir_utils.py, default_cache_dir),
    worked out without importing torch: a process that compiled before this module set the
    environment has it there, which is not a choice of the user's."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without one): Inductor uses the uid alike
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


# The directory this module pointed the environment at last (a process may open several workspaces).
_ours: str | None = None


def use_workspace_cache(workspace_root: Path) -> Path:
    """Point this process's torch.compile caches (and the processes it starts later) at the
    workspace's, unless the user named a directory of their own; the directory in use."""
    global _ours
    named = os.environ.get(ENVIRONMENT)
    if named and named not in (torch_default_cache_dir(), _ours):
        return Path(named)
    directory = (Path(workspace_root) / CACHE_FOLDER).resolve()
    os.environ[ENVIRONMENT] = _ours = str(directory)
    return directory


def cache_dir() -> Path:
    """The directory this process's torch.compile caches are in."""
    return Path(os.environ.get(ENVIRONMENT) or torch_default_cache_dir())


def save_recorded(name: str) -> int:
    """Save what this process compiled or found in the caches, as Mega-Cache records, to
    ``megacache/<name>.bin`` under the cache directory; how many bytes (0: nothing recorded)."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return 0
    blob, _ = saved
    folder = cache_dir() / "megacache"
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_output(folder / f"{name}.bin") as tmp:
        tmp.write_bytes(blob)
    return len(blob)


def export_bundle(out: Path) -> tuple[int, int]:
    """Every record the workspace's compiling processes saved, in one file at ``out``: (records, bytes)."""
    records = sorted((cache_dir() / "megacache").glob("*.bin"))
    if not records:
        raise UsageError(
            f"nothing compiled is recorded in {cache_dir()}: there is no compiled work to export.",
            hint='profile a compiled toolchain first (kind = "torch", backend = "compile"), then export',
        )
    with atomic_output(out) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as bundle:
        bundle.writestr("KIND", BUNDLE_KIND)
        for record in records:
            bundle.write(record, f"megacache/{record.name}")
    return len(records), out.stat().st_size


def import_bundle(path: Path) -> dict[str, int]:
    """Load a bundle ``export_bundle`` wrote into this process's caches (the workspace's): how many
    records, and how many cache entries of each kind they held."""
    import torch

    try:
        bundle = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(
            f"{path} is not a compile cache `pipeline cache export` wrote: {exc}", hint="pass the .zip `pipeline cache export` wrote"
        ) from exc
    with bundle:
        names = bundle.namelist()
        if "KIND" not in names or bundle.read("KIND").decode() != BUNDLE_KIND:
            raise UsageError(
                f"{path} is not a compile cache `pipeline cache export` wrote (it has no KIND record).",
                hint="pass the .zip `pipeline cache export` wrote",
            )
        counts: dict[str, int] = {"records": 0}
        for name in names:
            if not name.startswith("megacache/"):
                continue
            info = torch.compiler.load_cache_artifacts(bundle.read(name))
            counts["records"] += 1
            for kind, keys in (getattr(info, "artifacts", None) or {}).items():
                counts[str(kind)] = counts.get(str(kind), 0) + len(keys)
    return counts

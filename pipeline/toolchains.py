"""`pipeline toolchains list|pull|lock`: the images behind the TensorRT toolchains.

``toolchains.lock.json`` (beside pipeline.toml, meant to be committed) pins each image to the
digest it resolved to. Builds record the digest they actually ran on and warn when it differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts import atomic_write_text
from pipeline.catalog import Catalog
from pipeline.errors import PipelineError, UsageError
from pipeline.reporting import Reporter

LOCK_FILENAME = "toolchains.lock.json"


def read_lock(root: Path) -> dict[str, dict]:
    path = Path(root) / LOCK_FILENAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{path} is unreadable: {exc}.", hint="delete it and run `pipeline toolchains lock`") from exc
    return data.get("toolchains", {}) if isinstance(data, dict) else {}


@dataclass
class ToolchainStatus:
    name: str
    kind: str
    trt: str | None
    image: str | None
    present: bool | None  # None: not an image toolchain, or Docker unreachable
    digest: str | None
    locked_digest: str | None


def container_toolchains(catalog: Catalog, names: list[str] | None) -> list[str]:
    chosen = names or [n for n, s in catalog.toolchains.items() if s.kind == "trtexec-container"]
    for name in chosen:
        if catalog.toolchain(name).kind != "trtexec-container":
            raise UsageError(f"toolchain {name!r} is not a container toolchain; it has no image.", hint="pull/lock apply to trtexec-container toolchains")
    return chosen


def _runner(reporter: Reporter):
    from pipeline.docker_runner import DockerRunner

    return DockerRunner(reporter)


def image_for(name: str, spec) -> str:
    """The image a container toolchain runs in: its NGC image, or the one built from docker/."""
    return spec.image or f"trt-pipeline/{name}:latest"


def image_name(name: str, catalog: Catalog) -> str:
    return image_for(name, catalog.toolchain(name))


def status(catalog: Catalog, reporter: Reporter) -> list[ToolchainStatus]:
    lock = read_lock(catalog.root)
    runner = None
    try:
        runner = _runner(reporter)
        runner.client  # noqa: B018 - connect once; unreachable Docker leaves `present` unknown
    except PipelineError:
        runner = None
    rows = []
    for name, spec in catalog.toolchains.items():
        present = digest = None
        image = image_name(name, catalog) if spec.kind == "trtexec-container" else None
        if image and runner is not None:
            found = runner.image(image)
            present = found is not None
            digest = runner.digest(found) if found is not None else None
        rows.append(ToolchainStatus(name, spec.kind, spec.trt, image, present, digest, (lock.get(name) or {}).get("digest")))
    return rows


def pull(catalog: Catalog, names: list[str] | None, reporter: Reporter) -> None:
    runner = _runner(reporter)
    for name in container_toolchains(catalog, names):
        spec = catalog.toolchain(name)
        image = image_name(name, catalog)
        if spec.dockerfile:
            context = catalog.root / "docker"
            reporter.info(f"build    {image} from {context / spec.dockerfile}")
            runner.build_image(context, spec.dockerfile, image, {"TRT_VERSION": spec.trt or ""})
        else:
            reporter.info(f"pull     {image}")
            runner.pull(image)
        reporter.info(f"ready    {name}: {image}")


def lock(catalog: Catalog, names: list[str] | None, reporter: Reporter) -> Path:
    runner = _runner(reporter)
    entries = read_lock(catalog.root)
    for name in container_toolchains(catalog, names):
        image = image_name(name, catalog)
        found = runner.require_image(image, name)
        entries[name] = {"image": image, "digest": runner.digest(found), "trt": catalog.toolchain(name).trt}
        reporter.info(f"lock     {name}: {image} @ {entries[name]['digest']}")
    path = catalog.root / LOCK_FILENAME
    atomic_write_text(path, json.dumps({"schema_version": 1, "toolchains": entries}, indent=2, sort_keys=True) + "\n")
    return path

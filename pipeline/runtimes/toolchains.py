"""`pipeline toolchains list|pull|lock`: what each toolchain needs, fetched and pinned.

What "pull" fetches and what "lock" pins belong to each kind (an image and its digest, an
environment and its wheels); this module only walks the catalog. ``toolchains.lock.json``
(beside pipeline.toml, meant to be committed) holds what was pinned; runs warn when the toolchain
they use differs from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.catalog import Catalog
from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError
from pipeline.running.files import atomic_write_text
from pipeline.running.reporting import Reporter
from pipeline.runtimes import create_runtime
from pipeline.runtimes.base import ToolchainStatus

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
class ToolchainRow:
    name: str
    kind: str
    provides: str
    status: ToolchainStatus
    locked: str | None


def _runtime(catalog: Catalog, name: str, reporter: Reporter):
    return create_runtime(name, catalog.toolchain(name), reporter, catalog.root)


def status(catalog: Catalog, reporter: Reporter, names: list[str] | None = None) -> list[ToolchainRow]:
    lock = read_lock(catalog.root)
    rows = []
    for name in names or list(catalog.toolchains):
        runtime = _runtime(catalog, name, reporter)
        entry = lock.get(name) or {}
        locked = entry.get("pin") or entry.get("digest")  # files written before "pin" have only the digest
        rows.append(ToolchainRow(name, runtime.kind, runtime.describe(), runtime.status(), locked))
    return rows


def pull(catalog: Catalog, names: list[str] | None, reporter: Reporter) -> None:
    """Fetch what each named toolchain needs (every toolchain when none is named)."""
    for name in names or list(catalog.toolchains):
        _runtime(catalog, name, reporter).pull()


def lock(catalog: Catalog, names: list[str] | None, reporter: Reporter) -> Path:
    entries = read_lock(catalog.root)
    pinned = 0
    for name in names or list(catalog.toolchains):
        try:
            pin = _runtime(catalog, name, reporter).pin()
        except EnvironmentMissing as exc:
            if names:
                raise
            reporter.warn(f"{name} is not locked: {exc.message}")  # not here yet; the others still are
            continue
        if pin is None:
            if names:
                raise UsageError(f"toolchain {name!r} has nothing to pin.", hint="lock applies to images and pulled environments")
            continue
        entries[name] = pin
        pinned += 1
        reporter.info(f"lock     {name}: {pin['pin']}")
    if not pinned:
        raise UsageError("no toolchain in the catalog has anything to pin.", hint="lock applies to images and pulled environments")
    path = catalog.root / LOCK_FILENAME
    atomic_write_text(path, json.dumps({"schema_version": 1, "toolchains": entries}, indent=2, sort_keys=True) + "\n")
    return path

"""Where a comparison's manifests come from: the workspace's manifests/ folder (one manifest a row:
each shape point's, not the engine's own), another run's folder, or a git ref that has them
committed (`compare --baseline`). A shape point measured on a build of its engine that has since
been replaced is not among them (measured_on_earlier_builds)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from pipeline.manifest import EngineManifest, parse_manifest, read_manifest
from pipeline.running.errors import PipelineError, UsageError
from pipeline.workspace import Workspace


def manifest_paths(manifests_dir: Path, toolchains: list[str] | None = None) -> list[Path]:
    """The engine manifests under manifests/<toolchain>[@<gpu>]/, in a stable order."""
    if not manifests_dir.is_dir():
        return []
    # os.scandir, not Path.iterdir and glob: a sweep over 3000 builds has 3000 folders, and a
    # directory entry says whether it is a folder without a stat of its own.
    with os.scandir(manifests_dir) as entries:
        folders = sorted(entry.name for entry in entries if entry.is_dir() and entry.name != "export")
    paths = []
    for folder in folders:
        if toolchains and folder.split("@")[0] not in toolchains:  # <toolchain>@<gpu> for cluster runs
            continue
        directory = manifests_dir / folder
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if entry.name.endswith(".json"))
        paths.extend(directory / name for name in engine_manifest_names(names))
    return paths


def engine_manifest_names(names: list[str]) -> list[str]:
    """The manifests of one folder that are rows: a model measured at several shape points has one
    per point (``bert_fp16@2x512.json``), and its engine's own (``bert_fp16.json``, export and
    build) is left out, its build being in each of them."""
    measured_at_points = {name.partition("@")[0] for name in names if "@" in name}
    return [name for name in names if "@" in name or name.removesuffix(".json") not in measured_at_points]


def measured_on_earlier_builds(points: dict[Path, list | None], build_of: Callable[[Path], list | None]) -> list[Path]:
    """The shape points' manifests (``bert_fp16@2x512.json``, each with what its engine was built
    from: built_from) whose engine has been built again since: its own manifest
    (``bert_fp16.json``, read by ``build_of``; None where there is none) records another build,
    and the engine file the point timed is not the one that build made (a build run again for
    other reasons that made the same file leaves its points current). The model, its precision
    or the toolchain changed and the point was not measured again — it left the catalog's shapes,
    or the run stopped before it — so its figures are of an engine that no longer exists, and
    beside the others' they would answer for a model that is gone."""
    earlier, builds = [], {}
    for point, measured in points.items():
        name, at, _ = point.name.partition("@")
        if not at or measured is None:
            continue
        engine = point.with_name(f"{name}.json")
        if engine not in builds:  # an engine's points share its manifest: read once
            builds[engine] = build_of(engine)
        built = builds[engine]
        if built is None or built[0] == measured[0]:
            continue
        if measured[1] is None or measured[1] != built[1]:
            earlier.append(point)
    return earlier


def earlier_builds_words(paths: list[Path]) -> str:
    """What a comparison left out as measured on an earlier build, in one line."""
    shown = ", ".join(f"{path.parent.name}/{path.stem}" for path in paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
    return (
        f"left out {len(paths)} shape point{'s' if len(paths) != 1 else ''} measured on an earlier build of "
        f"{'their' if len(paths) != 1 else 'its'} engine ({shown}): the engine has been built again since"
    )


def built_from(manifest: EngineManifest) -> list | None:
    """What a manifest's engine was built from: [the build's fingerprint, the engine file's sha256]
    — for a shape point, the file its profile timed, else the one its build made; None where it
    has no build, and no file where the build made none (it failed, or the engine is a tool's)."""
    if manifest.build is None:
        return None
    profiled = manifest.profile.inputs if manifest.profile is not None else manifest.build.outputs
    engine = next((artifact.sha256 for artifact in profiled if artifact.role == "engine"), None)
    return [manifest.build.fingerprint, engine]


def load_manifests(
    manifests_dir: Path, toolchains: list[str] | None = None, left_out: Callable[[list[Path]], None] | None = None
) -> list[EngineManifest]:
    """The rows' manifests under ``manifests_dir``; those of an earlier build are given to ``left_out``."""
    manifests = [read_manifest(path) for path in manifest_paths(manifests_dir, toolchains)]
    points = {Path(m._source): built_from(m) for m in manifests if m._source}
    earlier = measured_on_earlier_builds(points, lambda path: built_from(read_manifest(path)) if path.is_file() else None)
    if earlier and left_out is not None:
        left_out(earlier)
    gone = set(earlier)
    return [m for m in manifests if not m._source or Path(m._source) not in gone]


def load_baseline(
    spec: str, workspace: Workspace, toolchains: list[str] | None, left_out: Callable[[list[Path]], None] | None = None
) -> list[EngineManifest]:
    """Manifests from a directory (a workspace or its manifests/) or from a git ref; those of an
    earlier build are given to ``left_out``."""
    path = Path(spec)
    if path.is_dir():
        root = path / "manifests" if (path / "manifests").is_dir() else path
        manifests = load_manifests(root, toolchains, left_out)
        if not manifests:
            raise PipelineError(f"baseline {spec} holds no engine manifests.", hint="pass the manifests/ folder of an earlier run")
        return manifests
    return _load_from_git(spec, workspace, toolchains, left_out)


def _load_from_git(
    ref: str, workspace: Workspace, toolchains: list[str] | None, left_out: Callable[[list[Path]], None] | None = None
) -> list[EngineManifest]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=workspace.root, capture_output=True, text=True)
        if result.returncode != 0:
            raise UsageError(
                f"baseline {ref!r} is neither a directory nor a git ref with manifests: {result.stderr.strip() or 'git failed'}",
                hint="pass a manifests directory, or a branch/commit that has manifests/ committed",
            )
        return result.stdout

    listing = [p for p in git("ls-tree", "-r", "--name-only", ref, "--", "manifests/").splitlines() if p.endswith(".json")]
    by_folder: dict[str, list[str]] = {}
    for name in listing:
        by_folder.setdefault(str(Path(name).parent), []).append(Path(name).name)
    listing = [f"{folder}/{name}" for folder, names in by_folder.items() for name in engine_manifest_names(sorted(names))]
    manifests = {}
    for name in listing:
        parts = Path(name).parts
        if len(parts) != 3 or parts[1] == "export" or (toolchains and parts[1].split("@")[0] not in toolchains):
            continue
        # ls-tree named it from the workspace, which may be a folder inside the repository: "./"
        # reads it from there, where a bare path is read from the repository's top.
        manifests[Path(name)] = parse_manifest(git("show", f"{ref}:./{name}"), f"{ref}:{name}")
    committed = {Path(folder, name) for folder, names in by_folder.items() for name in names}
    earlier = measured_on_earlier_builds(
        {path: built_from(m) for path, m in manifests.items()},
        lambda path: built_from(parse_manifest(git("show", f"{ref}:./{path}"), f"{ref}:{path}")) if path in committed else None,
    )
    if earlier and left_out is not None:
        left_out(earlier)
    gone = set(earlier)
    manifests = [m for path, m in manifests.items() if path not in gone]
    if not manifests:
        raise PipelineError(
            f"git ref {ref!r} has no engine manifests under manifests/ (they are git-ignored by default).",
            hint="commit manifests to a results branch, or pass a directory with --baseline",
        )
    return manifests

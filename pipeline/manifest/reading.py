"""Reading a manifest: its file, its JSON, its schema version (older ones lifted: versions.py),
validated against the schema (schema.py) with every failure said in the file's own terms."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import ValidationError

from pipeline.catalog.shape import written
from pipeline.manifest.schema import READS, SCHEMA_VERSION, EngineManifest, unknown_evidence
from pipeline.manifest.versions import lift_version_1
from pipeline.running.errors import PipelineError


def read_manifest(path: Path) -> EngineManifest:
    """Read and validate one manifest; a broken file is a user-facing error naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise PipelineError(
            f"manifest {path} is unreadable: {exc}.",
            hint="delete it and re-run the stage that wrote it (`--force`)",
        ) from exc
    return parse_manifest(text, str(path))


def _versions_read() -> str:
    """ "1, 2, 3 and 4": the schema versions this pipeline reads, in words."""
    return ", ".join(map(str, READS[:-1])) + f" and {READS[-1]}"


# A manifest this version wrote opens with its schema version (EngineManifest's first field).
_WRITTEN_BY_THIS_VERSION = re.compile(rf'\A\s*\{{\s*"schema_version"\s*:\s*{SCHEMA_VERSION}\s*[,}}]')


def parse_manifest(text: str, source: str) -> EngineManifest:
    """Validate a manifest's text; ``source`` (a path, or ``ref:path`` in git) names it in errors.
    One this version wrote is validated from its text by pydantic's own JSON parser
    (``_as_written``); any other, or one that fails there, step by step, each failure said in its
    own terms (``_step_by_step``)."""
    manifest = _as_written(text)
    if manifest is None:
        manifest = _step_by_step(text, source)
    _check_named_for(manifest, source)
    manifest._source = source
    return manifest


def _as_written(text: str) -> EngineManifest | None:
    """A manifest this version wrote, validated from its text in two thirds of the time of parsing
    it first (a compare reads thousands: scripts/benchmark_compare.py); None for any other, or one
    that does not validate here, for ``_step_by_step`` to read and say what is wrong with it. Its
    one schema version: a key written twice is read as its last, which the text's first does not say."""
    if not _WRITTEN_BY_THIS_VERSION.match(text) or text.count('"schema_version"') != 1:
        return None
    try:
        manifest = EngineManifest.model_validate_json(text)
    except ValueError:  # ValidationError among them
        return None
    return None if unknown_evidence(manifest) else manifest


def _step_by_step(text: str, source: str) -> EngineManifest:
    """A manifest's text parsed, its schema version checked (an older one lifted), validated and
    its evidence checked, each failure a PipelineError naming ``source``."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise PipelineError(
            f"manifest {source} is not JSON: {exc}.", hint="delete it and re-run the stage that wrote it (`--force`)"
        ) from exc
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise PipelineError(
            f"manifest {source} has schema_version {version}: it was written by a newer version (this one reads {_versions_read()}).",
            hint="upgrade this checkout (git pull; make setup) to read it, or compare against results written by this version",
        )
    if version not in READS:
        raise PipelineError(
            f"manifest {source} has schema_version {version!r}; this pipeline reads {_versions_read()}.",
            hint="re-run the stages with --force to rewrite it",
        )
    if version == 1:
        raw = lift_version_1(raw, SCHEMA_VERSION)
    try:
        manifest = EngineManifest.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        unknown = [_where(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            # A field this version does not know: written by a newer pipeline (a results branch
            # other machines push to), not damaged.
            raise PipelineError(
                f"manifest {source} has field(s) this version of the pipeline does not know: {', '.join(unknown[:5])}; "
                "it was written by a newer version.",
                hint="upgrade this checkout (git pull; make setup) to read it, or compare against results written by this version",
            ) from exc
        first = errors[0]
        raise PipelineError(
            f"manifest {source} does not match the schema: {first['msg']} at {_where(first['loc'])}.",
            hint="delete it and re-run the stage that wrote it (`--force`)",
        ) from exc
    unknown = unknown_evidence(manifest)
    if unknown:
        raise PipelineError(
            f"manifest {source} has field(s) this version of the pipeline does not know: {', '.join(unknown[:5])}; "
            "it was written by a newer version.",
            hint="upgrade this checkout (git pull; make setup) to read it, or compare against results written by this version",
        )
    return manifest


def _check_named_for(manifest: EngineManifest, source: str) -> None:
    """A manifest's file name (``<engine>[@<shape>].json``) and contents must name the same engine
    and shape point: reports find a point's manifest by its name and show it by its contents, so
    a file copied or edited into disagreement would be shown as another point (and compared with
    itself)."""
    name = source.replace("\\", "/").rsplit("/", 1)[-1]
    if not name.endswith(".json"):
        return
    engine, _, shape = name.removesuffix(".json").partition("@")
    named, holds = (engine, written(shape) or None), (manifest.engine, manifest.shape)
    if named != holds:

        def said(engine: str, shape: str | None) -> str:
            return f"{engine} at shape point {shape}" if shape else f"{engine} (no shape point)"

        toolchain = f" --toolchain {manifest.toolchain}" if manifest.toolchain else ""
        raise PipelineError(
            f"manifest {source} is named for {said(*named)} but holds {said(*holds)}.",
            hint=f"a copy or an edit made them differ: delete it and run `pipeline profile --engine {engine}{toolchain}` again",
        )


def _where(loc: tuple) -> str:
    """A validation error's location as the file's keys: pydantic puts the tag of the stage
    details' union (``details.profile.…``) into it, which the file does not have."""
    keys = [
        str(part)
        for index, part in enumerate(loc)
        if not (index and loc[index - 1] == "details" and part in ("export", "build", "profile"))
    ]
    return ".".join(keys)

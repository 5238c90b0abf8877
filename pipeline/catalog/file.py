"""Finding and reading the catalog file (``pipeline.toml``): TOML parsed, every table validated by
its kind's or family's settings, errors located (pipeline/catalog/errors.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.catalog import CATALOG_FILENAME, MODEL_SETTINGS, TOOLCHAIN_SETTINGS, Catalog, ModelSpec, ToolchainSpec
from pipeline.catalog.errors import describe_errors
from pipeline.running.errors import PipelineError, UsageError


def find_catalog(start: Path | None = None) -> Path:
    """``pipeline.toml`` in ``start`` or the nearest parent, like git finds its repository."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / CATALOG_FILENAME
        if candidate.is_file():
            return candidate
    raise UsageError(
        f"no {CATALOG_FILENAME} found in {here} or any parent directory.",
        hint="run from the project checkout, or pass --catalog PATH",
    )


def read_catalog(
    path: Path | None,
    toolchain_settings: Callable[[str | None], type[ToolchainSpec]],
    model_settings: Callable[[Any], type[ModelSpec]],
) -> Catalog:
    """The catalog at ``path`` (default: found from here up), each toolchain table validated by the
    settings class ``toolchain_settings(kind)`` returns (LookupError for an unknown kind), each
    model table by ``model_settings(table)``'s (LookupError when no family's key is there)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    path = Path(path) if path else find_catalog()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"catalog {path} does not exist.", hint="pass --catalog PATH to an existing file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"cannot read catalog {path}: {exc}", hint="pass --catalog PATH to a readable UTF-8 TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}.", hint="fix the line named above") from None
    try:
        catalog = Catalog.model_validate(raw, context={TOOLCHAIN_SETTINGS: toolchain_settings, MODEL_SETTINGS: model_settings})
    except ValidationError as exc:
        raise UsageError(
            f"{path} is not a valid catalog:\n{describe_errors(exc, indent='  ', model=Catalog)}",
            hint=f"see the comments in {path.name}",
        ) from None
    return catalog.model_copy(update={"root": path.parent.resolve(), "file_name": path.name})

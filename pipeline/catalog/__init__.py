"""The catalog, pipeline.toml: models, variants, toolchains and settings, validated on load
(schema.py: the specs and the Catalog; file.py: finding and reading the file; settings.py: the
settings tables each kind accepts; errors.py: a validation error in the user's words; shape.py:
a shape point's text parsed, for every layer that reads points)."""

from pipeline.catalog.schema import (
    CATALOG_FILENAME,
    MODEL_SETTINGS,
    TOOLCHAIN_SETTINGS,
    Catalog,
    EngineRef,
    ModelSpec,
    ProfileSettings,
    ToolchainSpec,
    VariantSpec,
    check_shape,
)
from pipeline.catalog.shape import STATIC_SHAPE, ShapeSizes

__all__ = [
    "CATALOG_FILENAME",
    "MODEL_SETTINGS",
    "TOOLCHAIN_SETTINGS",
    "Catalog",
    "EngineRef",
    "ModelSpec",
    "ProfileSettings",
    "ToolchainSpec",
    "VariantSpec",
    "STATIC_SHAPE",
    "ShapeSizes",
    "check_shape",
]

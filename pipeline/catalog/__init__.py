"""The catalog, pipeline.toml: models, variants, toolchains and settings, validated on load
(schema.py: the specs and the Catalog; file.py: finding and reading the file; settings.py: the
settings tables each kind accepts; errors.py: a validation error in the user's words)."""

from pipeline.catalog.schema import (
    CATALOG_FILENAME,
    MODEL_SETTINGS,
    STATIC_SHAPE,
    TOOLCHAIN_SETTINGS,
    Catalog,
    EngineRef,
    ModelSpec,
    ProfileSettings,
    ToolchainSpec,
    VariantSpec,
    check_shape,
)

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
    "check_shape",
]

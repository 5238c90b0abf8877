"""A planned variant, as catalog TOML and written into pipeline.toml (`pipeline plan --apply`).

The catalog is the user's file: it is edited with tomlkit, which keeps every comment, blank line
and table order, and the new ``[variants.NAME]`` table goes after the last variant. The file is
replaced atomically, and only if it is still the file the plan was computed from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pipeline.catalog import VariantSpec
from pipeline.running.errors import UsageError, require_module
from pipeline.running.files import atomic_write_text


def planned_table(base: VariantSpec, model: str, exclude: list[str], description: str) -> dict[str, Any]:
    """The new variant: the base variant's settings that differ from the defaults, the model it is
    for, and the layers it keeps unquantized."""
    defaults = VariantSpec(precision=base.precision)
    table: dict[str, Any] = {"precision": base.precision}
    for key in ("sparsity", "sparsity_method", "conv_policy", "weights_dtype"):
        value = getattr(base, key)
        if value != getattr(defaults, key):
            table[key] = value
    table["models"] = [model]
    table["exclude"] = list(exclude)
    table["description"] = description
    return table


def variant_toml(name: str, table: dict[str, Any]) -> str:
    tomlkit = require_module("tomlkit", purpose="Writing a planned variant", extra=None)
    document = tomlkit.document()
    variants = tomlkit.table(is_super_table=True)
    variants.add(name, _table(tomlkit, table))
    document.add("variants", variants)
    return tomlkit.dumps(document)


def _table(tomlkit, table: dict[str, Any]):
    out = tomlkit.table()
    for key, value in table.items():
        if isinstance(value, list) and len(value) > 3:
            array = tomlkit.array()
            array.extend(value)
            array.multiline(True)
            value = array
        out.add(key, value)
    return out


def _take_trailing_lines(variants, new) -> None:
    """Comments and blank lines after the last variant's values belong to what follows it (the
    next section's heading comment), so they move below the new table."""
    from tomlkit.items import Comment, Table, Whitespace

    tables = [item for _, item in variants.value.body if isinstance(item, Table)]
    if not tables:
        return
    body = tables[-1].value.body
    trailing = []
    while body and body[-1][0] is None and isinstance(body[-1][1], (Comment, Whitespace)):
        trailing.insert(0, body.pop())
    body.append((None, Whitespace("\n")))
    for key, item in trailing:
        new.value.body.append((key, item))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refuse_existing(path: Path, name: str, document=None) -> None:
    """A user error when the catalog (``document``: as already parsed) has a variant of this name."""
    if document is None:
        document = require_module("tomlkit", purpose="Writing a planned variant", extra=None).parse(path.read_text())
    if name in document.get("variants", {}):
        raise UsageError(
            f"{path.name} already has a variant named {name!r}; nothing was changed.",
            hint="name the planned variant otherwise (--name), or remove the old one first",
        )


def apply_variant(path: Path, name: str, table: dict[str, Any], expected_digest: str) -> None:
    """Add ``[variants.NAME]`` to the catalog at ``path``, which must still have ``expected_digest``."""
    tomlkit = require_module("tomlkit", purpose="Writing a planned variant", extra=None)
    if digest(path) != expected_digest:
        raise UsageError(
            f"{path.name} changed while the plan was computed; nothing was changed.",
            hint="run `pipeline plan --apply` again on the catalog as it is now",
        )
    document = tomlkit.parse(path.read_text())
    refuse_existing(path, name, document)
    variants = document.get("variants")
    if variants is None:
        variants = tomlkit.table(is_super_table=True)
        document.add("variants", variants)
    new = _table(tomlkit, table)
    if hasattr(variants, "add"):
        _take_trailing_lines(variants, new)
        variants.add(name, new)
    else:
        # Variant tables apart from each other (one added after the toolchains, say): tomlkit reads
        # them through a proxy with no body of its own, which places a new table after the first.
        new.add(tomlkit.nl())
        variants[name] = new
    atomic_write_text(path, tomlkit.dumps(document))

"""A catalog's validation errors told the way a user reads them: located ("toolchains.NAME.kind:
…", "models.NAME.shapes: …"), one problem a line, every problem of a table at once."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


def validate_by_settings(section: str, table: dict, base: type[BaseModel], settings_of, lookup_field: str) -> dict:
    """Each entry of a table validated by the settings class ``settings_of(entry)`` names (a
    toolchain's kind's, a model's family's), every problem of every entry reported at once and
    located ("toolchains.NAME.kind: …", "models.NAME.shapes: …"). ``settings_of`` raises
    LookupError for an entry it can place nowhere; that is reported at ``lookup_field``."""
    specs, problems = {}, []
    for name, raw in table.items():
        if isinstance(raw, base):
            specs[name] = raw
            continue
        try:
            specs[name] = settings_of(raw).model_validate(raw)
        except LookupError as exc:
            problems.append(f"{section}.{name}{lookup_field}: {exc.args[0]}")
        except ValidationError as exc:
            for line in describe_errors(exc).splitlines():
                whole_table = line.startswith("(top level)")
                problems.append(f"{section}.{name}{line.removeprefix('(top level)') if whole_table else '.' + line}")
    if problems:
        raise ValueError("\n".join(problems))
    return specs


def describe_errors(exc: ValidationError, indent: str = "") -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if message.startswith(where + "."):
            # Already located, one problem a line (the toolchain tables, validated by their kind).
            lines += [f"{indent}{line}" for line in message.splitlines()]
            continue
        got = error.get("input")
        got_text = "" if isinstance(got, (dict, BaseModel)) else f" (got {got!r})"
        lines.append(f"{indent}{where}: {message}{got_text}")
    return "\n".join(lines)

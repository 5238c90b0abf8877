"""A catalog's validation errors told the way a user reads them: located ("toolchains.NAME.kind:
…", "models.NAME.shapes: …"), one problem a line, every problem of a table at once."""

from __future__ import annotations

from typing import Any

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
            settings = settings_of(raw)
            specs[name] = settings.model_validate(raw)
        except LookupError as exc:
            problems.append(f"{section}.{name}{lookup_field}: {exc.args[0]}")
        except ValidationError as exc:
            for line in describe_errors(exc, model=settings).splitlines():
                whole_table = line.startswith("(top level)")
                problems.append(f"{section}.{name}{line.removeprefix('(top level)') if whole_table else '.' + line}")
    if problems:
        raise ValueError("\n".join(problems))
    return specs


def describe_errors(exc: ValidationError, indent: str = "", model: type[BaseModel] | None = None) -> str:
    """One line a problem, located; a key ``model`` (the validated class) does not take is given
    the one it most likely meant ("did you mean 'shapes'?")."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and model is not None:
            message += _meant(model, error["loc"])
        if message.startswith(where + "."):
            # Already located, one problem a line (the toolchain tables, validated by their kind).
            lines += [f"{indent}{line}" for line in message.splitlines()]
            continue
        got = error.get("input")
        got_text = "" if isinstance(got, (dict, BaseModel)) else f" (got {got!r})"
        lines.append(f"{indent}{where}: {message}{got_text}")
    return "\n".join(lines)


def _meant(model: type[BaseModel], loc: tuple) -> str:
    """ "; did you mean 'shapes'?" for an unknown key at ``loc`` of ``model``, where the table it
    sits in is a settings class and one of its keys is close; else nothing."""
    import difflib

    table: Any = model
    for part in loc[:-1]:
        field = table.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        table = annotation
    close = difflib.get_close_matches(str(loc[-1]), list(table.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""

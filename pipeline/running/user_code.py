"""Running the user's own Python — a model factory file (pipeline/models/python_module.py), a
data or metric hook (pipeline/precision/hooks.py) — so that whatever it does wrong is said as a
user error naming the file and the line, never a traceback of ours, and a ``sys.exit()`` in it
does not end the pipeline without a word."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from pipeline.running.errors import UsageError


def import_file(path: Path, error: Callable[[str, str], UsageError]) -> ModuleType:
    """The module of a Python file, imported once per content (a changed file is a new module);
    what goes wrong importing it is ``error(what, hint)``."""
    module_name = f"_pipeline_user_{digest(path)[:16]}"
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise error(f"{path} does not parse: {exc.msg} (line {exc.lineno})", f"fix the syntax error in {path.name}") from None
    except SystemExit as exc:
        raise error(exited(f"importing {path}", exc, path), f"remove the exit from {path.name}'s top level") from None
    except Exception as exc:
        raise error(f"importing {path} failed: {said(exc)}", f"fix {path.name} so that it imports") from None
    sys.modules[module_name] = module
    return module


def digest(path: Path) -> str:
    """The file's content hash."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def said(exc: BaseException) -> str:
    """ "ValueError: the first line of its message"."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__


def where_in(exc: BaseException, path: Path) -> str:
    """ " (FILE, line N)": the last frame of the traceback in the user's file, where there is one."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if Path(frame.filename).resolve() == path.resolve()]
    return f" ({path.name}, line {frames[-1].lineno})" if frames else ""


def exited(what: str, exc: SystemExit, path: Path) -> str:
    """ "importing F called sys.exit(2) (F, line 3)"."""
    return f"{what} called sys.exit({exc.code!r}){where_in(exc, path)}"

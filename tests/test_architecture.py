"""The house as its imports and sizes show it, held by CI: no module imports itself back through
others (no circle), no module over 450 lines and no function over 100 — past that, a part of the
code has become two things that want names of their own. (The layers themselves are import-linter's
contracts in pyproject.toml, run by `make lint`.)"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 100


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("pipeline", include_external_packages=False)


def circles(graph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm): each is a circle
    of imports, lazy ones inside functions included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back(graph):
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    class TwoModules:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(module):
            return {"a": {"b"}, "b": {"a", "c"}, "c": set()}[module]

    assert circles(TwoModules) == [["a", "b"]]


def test_the_profile_stage_records_what_the_measurement_of_its_point_gives_it(graph):
    """The measurement of a shape point (stages/point.py) calls the profiles, never the reverse."""
    assert "pipeline.stages.point" not in graph.find_modules_directly_imported_by("pipeline.stages.profile")


def _sizes():
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        functions = [
            (node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        yield path.relative_to(PACKAGE.parent), text.count("\n"), functions


def test_no_module_is_over_450_lines_and_no_function_over_100():
    too_long = [f"{path}: {lines} lines" for path, lines, _ in _sizes() if lines > MAX_MODULE_LINES]
    too_long += [
        f"{path}: {name}() {size} lines" for path, _, functions in _sizes() for name, size in functions if size > MAX_FUNCTION_LINES
    ]
    assert too_long == []


def test_no_module_sits_loose_at_the_top_and_the_import_contracts_name_packages():
    """The core is a few packages by meaning (catalog, manifest, workspace, measuring, machine,
    running), each with a face: at pipeline/ itself only the package's face and __main__."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the catalog's own reader
        import tomli as tomllib

    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert loose == []
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    contracts = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = {
        module
        for contract in contracts
        for key in ("layers", "source_modules", "forbidden_modules")
        for entry in contract.get(key, [])
        for module in entry.split(" | ")
    }
    assert {name.removeprefix("pipeline.") for name in named} == packages  # every package in a contract, nothing but packages


def test_only_the_process_room_starts_processes_its_own_way():
    """Work leaves the command's process through pipeline/launchers/ only: no other module imports
    multiprocessing, opens a Pipe or replaces the process (execve)."""
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "launchers":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            imported = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            called = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if any(name.split(".")[0] == "multiprocessing" for name in imported) or called in ("Pipe", "execve", "execv", "fork"):
                elsewhere.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert elsewhere == []


def test_each_backend_is_a_folder_of_its_own_and_few_modules_sit_beside_them():
    """runtimes/ holds a sub-package per backend, each kind registered in one place (RUNTIMES), and at
    most four loose modules beside them (what every backend shares)."""
    from pipeline.runtimes import RUNTIMES

    runtimes = PACKAGE / "runtimes"
    loose = sorted(path.name for path in runtimes.glob("*.py") if path.name != "__init__.py")
    assert len(loose) <= 4, loose
    backends = {path.name for path in runtimes.iterdir() if (path / "__init__.py").is_file()}
    registered = {target.split(":")[0].split(".")[2] for target in RUNTIMES.values()}
    assert registered == backends  # every kind's class in a backend's folder, every folder registered
    tested = {path.name for path in (Path(__file__).parent / "runtimes").iterdir() if path.is_dir() and any(path.glob("test_*.py"))}
    assert tested == backends  # each backend's tests in a folder of the same name
    # Without a package's __init__.py, pytest puts tests/runtimes/ on sys.path and its folder
    # tensorrt/ answers `find_spec("tensorrt")` as if TensorRT were installed.
    assert all((Path(__file__).parent / "runtimes" / name / "__init__.py").is_file() for name in ("", *tested))

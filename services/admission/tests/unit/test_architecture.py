"""Admission's layers, checked on its source: SQL stays in adapters (no SQLAlchemy in the service
layer or the entry points, no session or query calls there), the domain stays pure, the service
layer never reaches into entry points, and no module imports itself round in a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tessera.admission

PACKAGE = "tessera.admission"
ROOT = Path(tessera.admission.__file__).resolve().parent
SQL = ("sqlalchemy", "asyncpg")
INFRASTRUCTURE = (*SQL, "nats", "fastapi", "starlette", "uvicorn")
DATABASE_CALLS = {"session", "sessions", "execute", "scalar", "scalars", "connect", "begin_nested"}
"""Attributes that only code talking to the database reaches for."""
HANDS_THE_SESSION_ON = "tessera.admission.service_layer.unit_of_work"
"""Builds the repositories on the session (`open_repositories`), so it names its type, for mypy alone."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def tree(module: str) -> ast.Module:
    path = MODULES[module]
    return ast.parse(path.read_text(), str(path))


def type_checking_only(module: str) -> set[int]:
    """Line numbers of the statements under `if TYPE_CHECKING:`."""
    lines: set[int] = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def imported(module: str, *, at_run_time: bool = False) -> Iterator[str]:
    """Every module `module` imports (for type checking too, unless `at_run_time`)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped = type_checking_only(module) if at_run_time else set()
    for node in ast.walk(tree(module)):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def internal_imports(module: str, *, at_run_time: bool = False) -> set[str]:
    return {name for name in imported(module, at_run_time=at_run_time) if name in MODULES and name != module}


def layer(*names: str) -> list[str]:
    prefixes = tuple(f"{PACKAGE}.{name}" for name in names)
    return [m for m in MODULES if m in prefixes or m.startswith(tuple(f"{p}." for p in prefixes))]


def test_there_is_something_to_check() -> None:
    assert len(layer("domain")) > 15 and len(layer("service_layer")) > 5 and len(layer("entrypoints")) > 5
    assert len(layer("adapters")) > 4


@pytest.mark.parametrize("module", layer("service_layer", "entrypoints"))
def test_the_service_layer_and_the_entrypoints_import_no_sql(module: str) -> None:
    found = {name for name in imported(module) if name.split(".")[0] in SQL}
    if module == HANDS_THE_SESSION_ON:
        found = {name for name in imported(module, at_run_time=True) if name.split(".")[0] in SQL}
    assert not found, f"{module} imports {sorted(found)}: move the query into a repository in adapters/"


@pytest.mark.parametrize("module", layer("service_layer", "entrypoints"))
def test_the_service_layer_and_the_entrypoints_make_no_database_calls(module: str) -> None:
    calls = sorted(
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(tree(module))
        if isinstance(node, ast.Attribute) and node.attr in DATABASE_CALLS
    )
    assert not calls, f"{module} talks to the database ({', '.join(calls)}): go through a repository"


@pytest.mark.parametrize("module", layer("service_layer", "entrypoints"))
def test_no_sql_text_outside_adapters(module: str) -> None:
    words = ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM", "pg_advisory")
    strings = [
        node.value
        for node in ast.walk(tree(module))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [s for s in strings if any(w in s for w in words)], f"{module} holds SQL text"


@pytest.mark.parametrize("module", layer("domain"))
def test_the_domain_imports_no_infrastructure_nor_outer_layers(module: str) -> None:
    outer = tuple(
        f"{PACKAGE}.{name}" for name in ("adapters", "service_layer", "entrypoints", "bootstrap", "config")
    )
    wrong = {
        name
        for name in imported(module)
        if name.split(".")[0] in (*INFRASTRUCTURE, "opentelemetry")
        or name.startswith(outer)
        or name.startswith("tessera.core")
    }
    assert not wrong, f"{module} imports {sorted(wrong)}"


def test_importing_the_whole_domain_loads_no_infrastructure() -> None:
    """The transitive check: what the domain imports (libs included) must not pull them in either."""
    script = (
        "import importlib, sys\n"
        f"for name in {sorted(layer('domain'))!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {INFRASTRUCTURE!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("module", layer("service_layer"))
def test_the_service_layer_does_not_import_entrypoints_or_bootstrap(module: str) -> None:
    wrong = {
        name
        for name in internal_imports(module)
        if name.startswith(f"{PACKAGE}.entrypoints") or name == f"{PACKAGE}.bootstrap"
    }
    assert not wrong, f"{module} imports {sorted(wrong)}"


def test_no_import_cycles() -> None:
    """At run time: a type named for mypy alone (`if TYPE_CHECKING:`) does not make a cycle."""
    graph = {module: internal_imports(module, at_run_time=True) for module in MODULES}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])

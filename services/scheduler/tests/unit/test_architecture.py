"""The scheduler's layers, checked on its source: no import cycles, the service layer never reaches
into entry points, the domain stays pure, and SQL stays in adapters."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tessera.scheduler

PACKAGE = "tessera.scheduler"
ROOT = Path(tessera.scheduler.__file__).resolve().parent
INFRASTRUCTURE = ("sqlalchemy", "asyncpg", "nats", "fastapi", "kubernetes", "pynvml")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported(module: str) -> Iterator[str]:
    """Every module ``module`` imports, at run time or for type checking alone."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def internal_imports(module: str) -> set[str]:
    return {name for name in imported(module) if name in MODULES and name != module}


def layer(name: str) -> list[str]:
    prefix = f"{PACKAGE}.{name}"
    return [m for m in MODULES if m == prefix or m.startswith(f"{prefix}.")]


def test_there_is_something_to_check() -> None:
    assert len(layer("domain")) > 20 and layer("service_layer") and layer("adapters")


def test_no_import_cycles() -> None:
    graph = {module: internal_imports(module) for module in MODULES}
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


@pytest.mark.parametrize("module", layer("service_layer"))
def test_the_service_layer_does_not_import_entrypoints_or_bootstrap(module: str) -> None:
    wrong = {
        name
        for name in internal_imports(module)
        if name.startswith(f"{PACKAGE}.entrypoints") or name == f"{PACKAGE}.bootstrap"
    }
    assert not wrong, f"{module} imports {sorted(wrong)}"


@pytest.mark.parametrize("module", layer("domain"))
def test_the_domain_imports_no_infrastructure_nor_outer_layers(module: str) -> None:
    outer = tuple(
        f"{PACKAGE}.{name}" for name in ("adapters", "service_layer", "entrypoints", "bootstrap", "config")
    )
    wrong = {
        name
        for name in imported(module)
        if name.split(".")[0] in INFRASTRUCTURE or name.startswith(outer) or name.startswith("tessera.core")
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


@pytest.mark.parametrize("module", [m for m in MODULES if not m.startswith(f"{PACKAGE}.adapters")])
def test_sql_stays_in_adapters(module: str) -> None:
    assert not any(name.split(".")[0] in ("sqlalchemy", "asyncpg") for name in imported(module)), (
        f"{module} uses SQL outside adapters/: move the query into the repository"
    )

"""The forecaster service's layers, checked on its source: a pure domain (no model library either), SQL only in adapters, and a
service layer that never reaches into entry points or the wiring."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tessera.forecaster

ROOT = Path(tessera.forecaster.__file__).resolve().parent
MODULES = {str(path.relative_to(ROOT).with_suffix("")): path for path in sorted(ROOT.rglob("*.py"))}
INFRASTRUCTURE = (
    "sqlalchemy",
    "asyncpg",
    "nats",
    "fastapi",
    "kubernetes",
    "grpc",
    "darts",
    "statsforecast",
    "numpy",
    "tessera.core",
    "tessera.cluster",
)


def imports(module: str) -> set[str]:
    """What `module` imports at run time (imports for type checking alone are left out)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(MODULES[module].read_text()))
    return found


def in_layer(layer: str) -> list[str]:
    return [m for m in MODULES if m.startswith(f"{layer}/")]


@pytest.mark.parametrize("module", in_layer("domain"))
def test_the_domain_is_pure(module: str) -> None:
    outer = (
        "tessera.forecaster.adapters",
        "tessera.forecaster.service_layer",
        "tessera.forecaster.entrypoints",
    )
    wrong = {name for name in imports(module) if name.startswith(INFRASTRUCTURE + outer)}
    assert not wrong, f"{module} imports {sorted(wrong)}"


@pytest.mark.parametrize("module", [m for m in MODULES if not m.startswith("adapters/")])
def test_sql_stays_in_adapters(module: str) -> None:
    assert not any(name.split(".")[0] in ("sqlalchemy", "asyncpg") for name in imports(module))


@pytest.mark.parametrize("module", in_layer("service_layer"))
def test_the_service_layer_does_not_import_entrypoints_or_bootstrap(module: str) -> None:
    wrong = {
        n
        for n in imports(module)
        if n.startswith(("tessera.forecaster.entrypoints", "tessera.forecaster.bootstrap"))
    }
    assert not wrong, f"{module} imports {sorted(wrong)}"

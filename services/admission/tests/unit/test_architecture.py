"""Admission's layers, checked on its source: SQL stays in adapters (no SQLAlchemy in the service
layer or the entry points, no session or query calls there), the domain stays pure, the service
layer never reaches into entry points, and no module imports itself round in a cycle."""

from __future__ import annotations

import ast

import pytest

from tessera.testing.architecture import SQL, SourceTree

PACKAGE = "tessera.admission"
INFRASTRUCTURE = (*SQL, "nats", "fastapi", "starlette", "uvicorn")
DATABASE_CALLS = {"session", "sessions", "execute", "scalar", "scalars", "connect", "begin_nested"}
"""Attributes that only code talking to the database reaches for."""
HANDS_THE_SESSION_ON = "tessera.admission.service_layer.unit_of_work"
"""Builds the repositories on the session (`open_repositories`), so it names its type, for mypy alone."""


SOURCE = SourceTree(PACKAGE)
tree = SOURCE.tree
layer = SOURCE.layer


def test_there_is_something_to_check() -> None:
    assert len(layer("domain")) > 15 and len(layer("service_layer")) > 5 and len(layer("entrypoints")) > 5
    assert len(layer("adapters")) > 4


@pytest.mark.parametrize("module", layer("service_layer", "entrypoints"))
def test_the_service_layer_and_the_entrypoints_import_no_sql(module: str) -> None:
    found = SOURCE.sql_imports(module, at_run_time=module == HANDS_THE_SESSION_ON)
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
    wrong = SOURCE.impure_domain_imports(module, (*INFRASTRUCTURE, "opentelemetry"))
    assert not wrong, f"{module} imports {sorted(wrong)}"


def test_importing_the_whole_domain_loads_no_infrastructure() -> None:
    """The transitive check: what the domain imports (libs included) must not pull them in either."""
    assert SOURCE.loaded_by_importing(layer("domain"), INFRASTRUCTURE) == []


@pytest.mark.parametrize("module", layer("service_layer"))
def test_the_service_layer_does_not_import_entrypoints_or_bootstrap(module: str) -> None:
    wrong = SOURCE.service_layer_reaches_out(module)
    assert not wrong, f"{module} imports {sorted(wrong)}"


def test_no_import_cycles() -> None:
    """At run time: a type named for mypy alone (`if TYPE_CHECKING:`) does not make a cycle."""
    cycle = SOURCE.import_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])

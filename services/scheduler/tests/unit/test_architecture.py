"""The scheduler's layers, checked on its source: no import cycles, the service layer never reaches
into entry points, the domain stays pure, and SQL stays in adapters."""

from __future__ import annotations

import pytest

from tessera.testing.architecture import SourceTree

SOURCE = SourceTree("tessera.scheduler")
INFRASTRUCTURE = ("sqlalchemy", "asyncpg", "nats", "fastapi", "kubernetes", "pynvml")
layer = SOURCE.layer


def test_there_is_something_to_check() -> None:
    assert len(layer("domain")) > 20 and layer("service_layer") and layer("adapters")


def test_no_import_cycles() -> None:
    cycle = SOURCE.import_cycle(at_run_time=False)  # type-only imports count here too
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", layer("service_layer"))
def test_the_service_layer_does_not_import_entrypoints_or_bootstrap(module: str) -> None:
    wrong = SOURCE.service_layer_reaches_out(module)
    assert not wrong, f"{module} imports {sorted(wrong)}"


@pytest.mark.parametrize("module", layer("domain"))
def test_the_domain_imports_no_infrastructure_nor_outer_layers(module: str) -> None:
    wrong = SOURCE.impure_domain_imports(module, INFRASTRUCTURE)
    assert not wrong, f"{module} imports {sorted(wrong)}"


def test_importing_the_whole_domain_loads_no_infrastructure() -> None:
    """The transitive check: what the domain imports (libs included) must not pull them in either."""
    assert SOURCE.loaded_by_importing(layer("domain"), INFRASTRUCTURE) == []


@pytest.mark.parametrize("module", SOURCE.outside("adapters"))
def test_sql_stays_in_adapters(module: str) -> None:
    assert not SOURCE.sql_imports(module), (
        f"{module} uses SQL outside adapters/: move the query into the repository"
    )

"""The slicing service's layers, checked on its source: a pure domain (the cluster library's catalogue
and value types are pure; its Kubernetes adapter is not), SQL only in adapters, a service layer that
never reaches into entry points or the wiring, and no import cycle."""

from __future__ import annotations

import pytest

from tessera.testing.architecture import SourceTree

SOURCE = SourceTree("tessera.slicing")
INFRASTRUCTURE = (
    "sqlalchemy",
    "asyncpg",
    "nats",
    "fastapi",
    "kubernetes",
    "tessera.cluster.kube",
    "tessera.core",
)


def test_there_is_something_to_check() -> None:
    assert SOURCE.layer("domain") and SOURCE.layer("service_layer") and SOURCE.layer("adapters")


@pytest.mark.parametrize("module", SOURCE.layer("domain"))
def test_the_domain_is_pure(module: str) -> None:
    wrong = SOURCE.impure_domain_imports(module, INFRASTRUCTURE)
    assert not wrong, f"{module} imports {sorted(wrong)}"


@pytest.mark.parametrize("module", SOURCE.outside("adapters"))
def test_sql_stays_in_adapters(module: str) -> None:
    assert not SOURCE.sql_imports(module, at_run_time=True), f"{module} uses SQL outside adapters/"


@pytest.mark.parametrize("module", SOURCE.layer("service_layer"))
def test_the_service_layer_does_not_import_entrypoints_or_bootstrap(module: str) -> None:
    wrong = SOURCE.service_layer_reaches_out(module)
    assert not wrong, f"{module} imports {sorted(wrong)}"


def test_no_import_cycles() -> None:
    assert SOURCE.import_cycle() is None, " -> ".join(SOURCE.import_cycle() or [])

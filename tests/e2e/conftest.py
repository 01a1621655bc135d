"""The end-to-end tests share one running stack for the session.

A test marked `e2e_last` takes part of that stack away for good (a spot interruption deletes a node):
it runs after every other test of the session, whatever file it is in."""

from __future__ import annotations

import pytest

from tests.e2e.harness import stack  # noqa: F401  (the session's `tessera up`)

LAST = "e2e_last"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{LAST}: changes the shared stack for good; runs after the others")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(
        key=lambda item: item.get_closest_marker(LAST) is not None
    )  # stable: the rest keep their order

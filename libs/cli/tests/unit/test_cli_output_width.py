"""The CLI's output is as wide as COLUMNS says when it is written, not when the module was imported (a
console built at import with COLUMNS set kept that width for every later command)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
from rich.console import Console

MODULES = ("client", "jobs", "main", "queues", "tokens", "usage", "devcluster")


def outputs() -> list[tuple[str, Callable[[], Console]]]:
    found = []
    for name in MODULES:
        module = importlib.import_module(f"tessera.cli.{name}")
        for attr in ("console", "err"):
            if hasattr(module, attr):
                found.append((f"{name}.{attr}", getattr(module, attr)))
    return found


def test_every_cli_output_follows_columns_when_written(monkeypatch: pytest.MonkeyPatch) -> None:
    found = outputs()
    assert len(found) >= 10
    for columns in ("40", "250"):
        monkeypatch.setenv("COLUMNS", columns)
        widths = {name: make().width for name, make in found}
        assert set(widths.values()) == {int(columns)}, widths

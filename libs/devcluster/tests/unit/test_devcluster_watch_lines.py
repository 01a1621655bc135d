"""Each watch event is encoded once for all the watchers that get it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera.devcluster.apiserver import routes
from tessera.devcluster.apiserver.routes import WatchLines


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    line = routes._line

    def counting(event: dict[str, Any]) -> bytes:
        calls.append(event)
        return line(event)

    monkeypatch.setattr(routes, "_line", counting)
    return calls


def test_the_same_event_to_two_watchers_is_encoded_once(encoded: list[dict[str, Any]]) -> None:
    lines = WatchLines()
    obj = {"metadata": {"name": "a", "resourceVersion": "7"}}

    first = lines.line({"type": "MODIFIED", "object": obj})
    second = lines.line({"type": "MODIFIED", "object": obj})  # another watcher's dict, same object

    assert (
        first == second == b'{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"7"}}}\n'
    )
    assert len(encoded) == 1


def test_another_type_or_a_newer_object_is_encoded_anew(encoded: list[dict[str, Any]]) -> None:
    lines = WatchLines()
    obj = {"metadata": {"name": "a", "resourceVersion": "7"}}
    newer = {"metadata": {"name": "a", "resourceVersion": "8"}}

    seen = [
        json.loads(lines.line({"type": kind, "object": o}))
        for kind, o in (("MODIFIED", obj), ("DELETED", obj), ("MODIFIED", newer))
    ]

    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in seen] == [
        ("MODIFIED", "7"),
        ("DELETED", "7"),
        ("MODIFIED", "8"),
    ]
    assert len(encoded) == 3


def test_only_the_newest_are_kept() -> None:
    lines = WatchLines(size=2)
    objects = [{"metadata": {"name": str(i)}} for i in range(3)]
    for obj in objects:
        lines.line({"type": "ADDED", "object": obj})

    assert [held[0] for held in lines._held.values()] == objects[1:]

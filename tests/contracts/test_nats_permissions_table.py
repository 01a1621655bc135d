"""The NATS permission table (`tessera.core.messaging.permissions.TRAFFIC`) says what each service
reads and sends; each user's permissions are made from it. Here it is checked against the code: the
durable consumers each service's wiring declares, and the commands for other services its source
constructs. A consumer added or a command sent without the table following fails here, before a
stack running with those permissions would refuse it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tessera.contracts import subjects
from tessera.contracts.events import ALL
from tessera.core.messaging.permissions import TRAFFIC, Consumption, service_permissions

ROOT = Path(__file__).parents[2]


def declared_consumers(service: str) -> set[Consumption]:
    """What the service's wiring subscribes to, from its own consumer specs."""
    deps: Any = SimpleNamespace(engine=None, ledger=object(), templates_required=False)
    if service == "telemetry":
        from tessera.telemetry.bootstrap import build
        from tessera.telemetry.config import TelemetrySettings

        specs = build(TelemetrySettings()).consumers(deps)
    else:
        specs = importlib.import_module(f"tessera.{service}.bootstrap").consumers(deps)
    return {Consumption(s.name, s.stream_owner, s.filter_subject) for s in specs}


def constructed_messages(service: str) -> set[str]:
    """Names of contract messages the service's source calls (constructs)."""
    names = {model.__name__ for model in ALL}
    found = set()
    for path in (ROOT / "services" / service / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in names:
                    found.add(name)
    return found


def test_the_table_covers_every_service() -> None:
    assert set(TRAFFIC) == set(subjects.SERVICES)


@pytest.mark.parametrize("service", subjects.SERVICES)
def test_the_consumers_in_the_table_are_those_the_service_declares(service: str) -> None:
    assert set(TRAFFIC[service].consumes) == declared_consumers(service)


@pytest.mark.parametrize("service", subjects.SERVICES)
def test_the_commands_a_service_sends_to_others_are_in_the_table(service: str) -> None:
    by_name = {model.__name__: model for model in ALL}
    own = f"{subjects.ROOT}.{service}."
    foreign = {
        by_name[name].SUBJECT
        for name in constructed_messages(service)
        if not by_name[name].SUBJECT.startswith(own)
    }
    assert foreign == set(TRAFFIC[service].sends)


@pytest.mark.parametrize("service", subjects.SERVICES)
def test_a_service_may_publish_in_its_own_stream_and_no_other_but_what_it_sends(service: str) -> None:
    publish = service_permissions(service).publish
    plain = {p for p in publish if not p.startswith("$")}
    assert plain == {subjects.stream_subjects(service), *TRAFFIC[service].sends}
    # JetStream: its own stream's administration, and the info (configuration and counters, no
    # message) of the streams it reads; consumers only those it reads, each with its filter
    own = subjects.stream_name(service)
    by_verb: dict[str, set[str]] = {}
    for p in publish:
        if p.startswith("$JS.API.STREAM."):
            verb, stream = p.split(".")[3:5]
            by_verb.setdefault(verb, set()).add(stream)
    consumed = {c.stream for c in TRAFFIC[service].consumes}
    assert by_verb == {"CREATE": {own}, "UPDATE": {own}, "INFO": {own} | consumed}
    for consumer in TRAFFIC[service].consumes:
        create = f"$JS.API.CONSUMER.CREATE.{consumer.stream}.{consumer.name}.{consumer.filter_subject}"
        assert create in publish
    names = {f"{c.stream}.{c.name}" for c in TRAFFIC[service].consumes}
    for subject in publish:
        if subject.startswith(("$JS.API.CONSUMER.", "$JS.ACK.")):
            assert any(f".{name}." in subject + "." for name in names), subject

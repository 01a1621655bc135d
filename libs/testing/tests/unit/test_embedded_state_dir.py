"""The embedded stack's state directory: remembered ports, exclusive use, endpoints.json."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.core.embedded import (
    Endpoints,
    ServiceEndpoint,
    StateDir,
    StateDirBusy,
    database_url,
    is_port_free,
    pick_port,
    read_endpoints,
    write_endpoints,
)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_pick_port_skips_busy_and_missing_preferences(busy_port: int) -> None:
    assert not is_port_free(busy_port)
    chosen = pick_port([None, busy_port])
    assert chosen != busy_port and chosen > 0


def test_pick_port_takes_the_first_free_preference(busy_port: int) -> None:
    free = pick_port([])
    assert pick_port([busy_port, free]) == free


def test_state_dir_remembers_ports_across_instances(tmp_path: Path) -> None:
    StateDir(tmp_path).remember_ports({"nats": 14222})
    StateDir(tmp_path).remember_ports({"postgres": 15432})

    assert StateDir(tmp_path).remembered_ports() == {"nats": 14222, "postgres": 15432}


def test_choose_port_prefers_the_remembered_one(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    remembered = pick_port([])
    state.remember_ports({"nats": remembered})

    assert state.choose_port("nats", default=None) == remembered


def test_choose_port_moves_on_when_the_remembered_one_is_taken(tmp_path: Path, busy_port: int) -> None:
    state = StateDir(tmp_path)
    state.remember_ports({"nats": busy_port})

    assert state.choose_port("nats", default=None) != busy_port


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"nats": "x"}'])
def test_a_damaged_ports_file_is_ignored(tmp_path: Path, content: str) -> None:
    state = StateDir(tmp_path)
    state.ports_file.write_text(content)
    assert state.remembered_ports() == {}


def test_state_dir_is_exclusive(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    with (
        state.exclusive(),
        pytest.raises(StateDirBusy, match="is in use by pid"),
        StateDir(tmp_path / "s").exclusive(),
    ):
        pass
    with StateDir(tmp_path / "s").exclusive():  # released after use
        pass


def test_endpoints_round_trip(tmp_path: Path) -> None:
    endpoints = Endpoints(
        nats_url="nats://127.0.0.1:14222",
        database_url=database_url("127.0.0.1", 15432, "tessera", "tessera", "p@ss/word"),
        admission_api_url="http://127.0.0.1:18080",
        services={
            "admission": ServiceEndpoint(
                "admission",
                "http://127.0.0.1:18080",
                "http://127.0.0.1:18080/healthz",
                "http://127.0.0.1:18080/readyz",
                "/s/logs/admission.log",
            )
        },
    )
    path = tmp_path / "endpoints.json"
    write_endpoints(path, endpoints)

    assert read_endpoints(path) == endpoints
    assert json.loads(path.read_text())["database_url"] == (
        "postgresql://tessera:p%40ss%2Fword@127.0.0.1:15432/tessera"
    )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"database_url": "postgresql://x"}, "endpoints.nats_url"),
        ({"nats_url": "nats://x", "database_url": 3}, "endpoints.database_url"),
        ({"nats_url": "n", "database_url": "d", "admission_api_url": 1}, "endpoints.admission_api_url"),
        ({"nats_url": "n", "database_url": "d", "services": []}, "endpoints.services"),
    ],
)
def test_bad_endpoints_name_the_field(tmp_path: Path, raw: dict[str, object], field: str) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=field):
        read_endpoints(path)


def test_missing_endpoints_say_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is 'tessera up' running"):
        read_endpoints(tmp_path / "endpoints.json")

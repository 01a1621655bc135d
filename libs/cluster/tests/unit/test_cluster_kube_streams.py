"""The adapter's pure parts: error translation and the threaded watch stream, on canned responses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tessera.cluster.conventions import parse_node
from tessera.cluster.kube.errors import translate
from tessera.cluster.kube.watch import stream_events
from tessera.cluster.port import (
    AlreadyBound,
    ClusterError,
    Conflict,
    EventType,
    EvictionBlocked,
    NotFound,
    Unparseable,
    WatchExpired,
)


def _api_error(status: int, message: str) -> ApiException:
    error = ApiException(status=status, reason="x")
    error.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return error


@pytest.mark.parametrize(
    ("status", "message", "binding", "kind"),
    [
        (404, 'pods "p" not found', False, NotFound),
        (409, 'pod p is already assigned to node "n"', True, AlreadyBound),
        (409, "the object has been modified", False, Conflict),
        (410, "too old resource version", False, WatchExpired),
        (429, "Cannot evict pod as it would violate the pod's disruption budget", False, EvictionBlocked),
        (500, "boom", False, ClusterError),
    ],
)
def test_api_errors_become_port_errors(
    status: int, message: str, binding: bool, kind: type[ClusterError]
) -> None:
    error = translate(_api_error(status, message), binding=binding)
    assert type(error) is kind
    assert message in str(error)
    assert error.code == status


class CannedResponse:
    """Enough of urllib3's HTTPResponse for iter_resp_lines: chunks that split lines anywhere."""

    def __init__(self, events: list[dict[str, Any]], chunk: int = 7) -> None:
        body = "".join(json.dumps(e) + "\n" + ("\n" if i == 0 else "") for i, e in enumerate(events)).encode()
        self._chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)]
        self.released = False

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._chunks

    def release_conn(self) -> None:
        self.released = True

    def shutdown(self) -> None:
        pass


def _node(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": {"allocatable": {"cpu": "1"}}}


async def test_stream_parses_events_split_across_chunks_and_skips_bookmarks_and_bad_objects() -> None:
    response = CannedResponse(
        [
            {"type": "ADDED", "object": _node("a", "5")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
            {"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "7"}}},  # no name: skipped
            {"type": "DELETED", "object": _node("a", "8")},
        ]
    )
    events = [e async for e in stream_events(lambda: response, parse_node, "nodes")]
    assert [(e.type, e.object.name, e.resource_version) for e in events] == [
        (EventType.ADDED, "a", "5"),
        (EventType.DELETED, "a", "8"),
    ]
    assert response.released


async def test_an_object_that_stops_parsing_is_reported_deleted_under_its_key() -> None:
    bad = _node("a", "6")
    bad["metadata"]["labels"] = {"nvidia.com/mig.config.state": "maybe"}
    pod = {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"}, "spec": "not a spec"}
    response = CannedResponse(
        [
            {"type": "ADDED", "object": _node("a", "5")},
            {"type": "MODIFIED", "object": bad},
            {"type": "ADDED", "object": pod},
        ]
    )
    events = [e async for e in stream_events(lambda: response, parse_node, "nodes")]
    assert [(e.type, e.resource_version) for e in events] == [
        (EventType.ADDED, "5"),
        (EventType.DELETED, "6"),
        (EventType.DELETED, "7"),
    ]
    gone, gone_pod = events[1].object, events[2].object
    assert isinstance(gone, Unparseable) and gone.key == "a" and "maybe" in gone.error
    assert isinstance(gone_pod, Unparseable) and gone_pod.key == "ns/p"


async def test_an_error_event_of_410_expires_the_watch() -> None:
    response = CannedResponse(
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}]
    )
    with pytest.raises(WatchExpired, match="too old"):
        async for _ in stream_events(lambda: response, parse_node, "nodes"):
            pass


async def test_a_410_status_on_the_request_expires_the_watch() -> None:
    def refuse() -> Any:
        raise _api_error(410, "too old resource version: 3 (9)")

    with pytest.raises(WatchExpired, match="too old"):
        async for _ in stream_events(refuse, parse_node, "nodes"):
            pass


async def test_a_dropped_connection_is_a_cluster_error() -> None:
    def drop() -> Any:
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ClusterError, match="reset by peer"):
        async for _ in stream_events(drop, parse_node, "nodes"):
            pass

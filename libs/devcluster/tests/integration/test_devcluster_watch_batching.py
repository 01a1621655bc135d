"""Watch events already queued go to a watcher in one chunk; the official client reads them all, in order."""

from __future__ import annotations

import json
import logging
import socket
import time
from urllib.parse import urlsplit

import pytest
from kubernetes import client, watch

from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.routes import WATCH_BATCH

pytestmark = pytest.mark.integration

BACKLOG = WATCH_BATCH + 44  # more than one write's worth


def _pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


def _backlog(core: client.CoreV1Api) -> str:
    since = str(core.list_namespaced_pod("default").metadata.resource_version)
    for i in range(BACKLOG):
        core.create_namespaced_pod("default", _pod(f"p{i:03d}"))
    return since


def test_a_backlog_of_events_is_read_whole_and_in_order_by_the_official_client(
    core: client.CoreV1Api,
) -> None:
    since = _backlog(core)

    events = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=since, timeout_seconds=1
    )
    seen = [(e["type"], e["object"].metadata.name) for e in events]

    assert seen == [("ADDED", f"p{i:03d}") for i in range(BACKLOG)]


def test_queued_events_share_chunks_rather_than_one_chunk_each(core: client.CoreV1Api) -> None:
    since = _backlog(core)

    response = core.list_namespaced_pod(
        "default", watch=True, resource_version=since, timeout_seconds=1, _preload_content=False
    )
    try:
        chunks = [chunk for chunk in response.read_chunked() if chunk]
    finally:
        response.release_conn()
    lines = [json.loads(line) for chunk in chunks for line in chunk.splitlines() if line.strip()]

    assert [e["object"]["metadata"]["name"] for e in lines] == [f"p{i:03d}" for i in range(BACKLOG)]
    assert all(chunk.endswith(b"\n") for chunk in chunks)  # an event never straddles two chunks
    assert len(chunks) < BACKLOG / 10


def test_a_watcher_that_hangs_up_ends_its_watch_without_a_server_error(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = urlsplit(apiserver.url).hostname, urlsplit(apiserver.url).port
    assert host is not None and port is not None
    with socket.create_connection((host, port)) as raw:
        raw.sendall(b"GET /api/v1/namespaces/default/pods?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    caplog.set_level(logging.ERROR, logger="aiohttp.server")
    time.sleep(2.5)  # the watch notices the closed transport at its next idle tick (1 s)

    assert [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"] == []

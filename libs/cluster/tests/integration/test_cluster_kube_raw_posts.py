"""Binds and evictions are POSTed as the client's generated methods would send them, without them:
those validate the body into the client's model and serialise it back, more CPU than the request."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from urllib3.connection import HTTPConnection
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

from tessera.cluster.domain import PodRef
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.cluster.port import AlreadyBound, ClusterError, NotFound
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.resources import NODES, PODS

pytestmark = pytest.mark.integration


def _refused(*_: Any, **__: Any) -> Any:
    raise AssertionError("the client's generated method was called")


async def test_bind_and_evict_post_without_the_generated_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s.CoreV1Api, "create_namespaced_pod_binding", _refused)
    monkeypatch.setattr(k8s.CoreV1Api, "create_namespaced_pod_eviction", _refused)
    async with ApiServer() as server:
        server.store.create(NODES, None, {"metadata": {"name": "n1"}})
        for name in ("a", "b"):
            server.store.create(
                PODS, "ns", {"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}}
            )
        cluster = KubernetesCluster(api_client(url=server.url))
        try:
            assignment = DeviceAssignment("n1", (GpuShare("GPU-1", 500),))
            await cluster.bind(PodRef("ns", "a"), "n1", assignment)
            with pytest.raises(AlreadyBound):
                await cluster.bind(PodRef("ns", "a"), "n1")
            with pytest.raises(NotFound):
                await cluster.bind(PodRef("ns", "gone"), "n1")
            await cluster.evict(PodRef("ns", "b"), grace_period_seconds=0)
            with pytest.raises(NotFound):
                await cluster.evict(PodRef("ns", "gone"))
        finally:
            await cluster.close()

        bound = server.store.get(PODS, "ns", "a")
        assert bound["spec"]["nodeName"] == "n1"
        assert "tessera.io/gpu-assignment" in bound["metadata"]["annotations"]
        with pytest.raises(Exception, match="not found"):
            server.store.get(PODS, "ns", "b")


async def test_a_bind_body_goes_as_it_is_without_the_clients_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[Any] = []
    sanitize = k8s.ApiClient.sanitize_for_serialization

    def recording(self: k8s.ApiClient, obj: Any) -> Any:
        walked.append(obj)
        return sanitize(self, obj)

    monkeypatch.setattr(k8s.ApiClient, "sanitize_for_serialization", recording)
    async with ApiServer() as server:
        server.store.create(NODES, None, {"metadata": {"name": "n1"}})
        server.store.create(PODS, "ns", {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c"}]}})
        cluster = KubernetesCluster(api_client(url=server.url))
        try:
            await cluster.bind(PodRef("ns", "a"), "n1", DeviceAssignment("n1", (GpuShare("GPU-1", 250),)))
        finally:
            await cluster.close()
        bound = server.store.get(PODS, "ns", "a")

    assert bound["spec"]["nodeName"] == "n1"
    assert "GPU-1" in bound["metadata"]["annotations"]["tessera.io/gpu-assignment"]
    assert not [obj for obj in walked if isinstance(obj, dict) and obj.get("kind") == "Binding"]


async def test_a_blocking_bind_needs_no_event_loop_and_raises_as_bind_does() -> None:
    async with ApiServer() as server:
        server.store.create(NODES, None, {"metadata": {"name": "n1"}})
        server.store.create(PODS, "ns", {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c"}]}})
        cluster = KubernetesCluster(api_client(url=server.url))
        try:
            bind = cluster.blocking_binds()
            assert bind is not None
            # on a thread of its own, as the scheduler's binding threads call it
            await asyncio.to_thread(bind, PodRef("ns", "a"), "n1", DeviceAssignment("n1", ()))
            with pytest.raises(AlreadyBound):
                await asyncio.to_thread(bind, PodRef("ns", "a"), "n1")
            with pytest.raises(NotFound):
                await asyncio.to_thread(bind, PodRef("ns", "gone"), "n1")
        finally:
            await cluster.close()
        assert server.store.get(PODS, "ns", "a")["spec"]["nodeName"] == "n1"


def test_a_blocking_bind_without_an_answer_in_time_is_a_timeout() -> None:
    with socket.socket() as silent:  # accepts the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        cluster = KubernetesCluster(api_client(url=f"http://127.0.0.1:{silent.getsockname()[1]}"))
        with pytest.raises(TimeoutError):
            cluster.bind_blocking(PodRef("ns", "a"), "n1", timeout_s=0.2)


def test_a_subclass_that_binds_its_own_way_is_not_bound_around() -> None:
    class Scripted(KubernetesCluster):
        async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
            raise AssertionError("scripted")

    api = api_client(url="http://127.0.0.1:1")
    assert Scripted(api).blocking_binds() is None
    assert KubernetesCluster(api).blocking_binds() is not None


def _answering_201() -> socket.socket:
    """A listener that answers every request 201 with an empty object, on a thread of its own."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    threading.Thread(target=serve, daemon=True).start()
    return listener


async def test_the_credentials_are_refreshed_off_the_event_loop() -> None:
    """Serialising a request runs the configuration's refresh hook (a kubeconfig's exec plugin,
    which may block): binds and evictions serialise on the pool, never on the loop's thread."""
    threads: list[str] = []
    with _answering_201() as listener:
        configuration = k8s.Configuration()
        configuration.host = f"http://127.0.0.1:{listener.getsockname()[1]}"
        configuration.api_key = {"authorization": "token"}
        configuration.refresh_api_key_hook = lambda _: threads.append(threading.current_thread().name)
        cluster = KubernetesCluster(k8s.ApiClient(configuration))
        try:
            await cluster.evict(PodRef("ns", "a"))
            await cluster.bind(PodRef("ns", "a"), "n1")
        finally:
            await cluster.close()
    assert len(threads) == 2
    assert threading.current_thread().name not in threads


def test_a_blocking_bind_that_cannot_connect_in_time_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool retries a failed connection three times, each with a fresh timeout: a bind given
    one second waited four. A bind tries to connect once, and its timeout bounds the whole call."""
    attempts: list[HTTPConnection] = []

    def timing_out(conn: HTTPConnection) -> Any:
        attempts.append(conn)
        raise ConnectTimeoutError(conn, "timed out")

    monkeypatch.setattr(HTTPConnection, "_new_conn", timing_out)
    cluster = KubernetesCluster(api_client(url="http://127.0.0.1:1"))
    with pytest.raises(TimeoutError):
        cluster.bind_blocking(PodRef("ns", "a"), "n1", timeout_s=1.0)
    assert len(attempts) == 1


def test_a_blocking_bind_refused_a_connection_never_reached_the_server() -> None:
    """urllib3 makes a refused connection a ConnectTimeoutError: the bind did not land, and is no
    timeout (after which the binder must allow that it may have)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    cluster = KubernetesCluster(api_client(url=f"http://127.0.0.1:{port}"))
    with pytest.raises(ClusterError) as raised:
        cluster.bind_blocking(PodRef("ns", "a"), "n1", timeout_s=1.0)
    assert not isinstance(raised.value, TimeoutError)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (lambda conn: NameResolutionError("nowhere.invalid", conn, OSError("unknown")), ClusterError),
        (lambda conn: NewConnectionError(conn, "refused"), ClusterError),
        (lambda conn: ConnectTimeoutError(conn, "timed out"), TimeoutError),
    ],
)
def test_a_blocking_bind_is_a_timeout_only_when_one_ran_out(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[HTTPConnection], Exception], raised: type[Exception]
) -> None:
    def failing(conn: HTTPConnection) -> Any:
        raise error(conn)

    monkeypatch.setattr(HTTPConnection, "_new_conn", failing)
    cluster = KubernetesCluster(api_client(url="http://127.0.0.1:1"))
    with pytest.raises(raised) as caught:
        cluster.bind_blocking(PodRef("ns", "a"), "n1", timeout_s=1.0)
    assert isinstance(caught.value, TimeoutError) == (raised is TimeoutError)


async def test_calls_that_reach_no_server_raise_cluster_errors_not_urllib3s() -> None:
    """The port promises ClusterError (or TimeoutError) when the API server does not answer; the
    scheduler's evictions and preemptions catch those, and a raw urllib3 error went past them."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    cluster = KubernetesCluster(api_client(url=f"http://127.0.0.1:{port}"))
    try:
        for call in (
            cluster.evict(PodRef("ns", "a"), grace_period_seconds=0),
            cluster.bind(PodRef("ns", "a"), "n1"),
            cluster.get_pod(PodRef("ns", "a")),
        ):
            with pytest.raises(ClusterError) as raised:
                await call
            assert not isinstance(raised.value, TimeoutError)
    finally:
        await cluster.close()


async def test_an_eviction_without_an_answer_in_time_is_a_timeout() -> None:
    with socket.socket() as silent:  # accepts the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        cluster = KubernetesCluster(
            api_client(url=f"http://127.0.0.1:{silent.getsockname()[1]}"), request_timeout=0.3
        )
        try:
            with pytest.raises(TimeoutError):
                await cluster.evict(PodRef("ns", "a"))
        finally:
            await cluster.close()


async def test_a_body_that_stalls_is_a_timeout_read_off_the_event_loop() -> None:
    """The headers come, then 5 of 100 bytes of body and nothing more: the read runs out on the
    pool, not on the event loop, and raises TimeoutError as the port says, not urllib3's error."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        held: list[socket.socket] = []

        def serve() -> None:
            conn, _ = listener.accept()
            held.append(conn)
            conn.recv(65536)
            conn.sendall(
                b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":'
            )

        threading.Thread(target=serve, daemon=True).start()
        cluster = KubernetesCluster(
            api_client(url=f"http://127.0.0.1:{listener.getsockname()[1]}"), request_timeout=0.5
        )
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            with pytest.raises(TimeoutError):
                await cluster.get_pod(PodRef("ns", "a"))
        finally:
            ticker.cancel()
            await cluster.close()
            for conn in held:
                conn.close()
    assert ticks >= 3, "the event loop ran while the body was awaited"

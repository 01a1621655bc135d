"""The devcluster API server: kmock's Kubernetes emulator, with a versioned object store, on loopback.

kmock serves the HTTP side and the discovery documents (/api, /apis, /apis/<g>/<v>); resource
requests go to our router and store, which close the gaps of kmock's own in-memory store
(resourceVersions, selectors, binding, eviction, PUT, watch resume and timeouts).
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import k8s as kmock_k8s
from kmock._internal import rendering as kmock_rendering

from tessera.devcluster.apiserver import aggregation, openapi
from tessera.devcluster.apiserver.resources import (
    NAMESPACES,
    ResourceRegistry,
    ResourceType,
    crd_resource_types,
)
from tessera.devcluster.apiserver.routes import ResourceRouter, parse_route
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.apiserver.webhooks import MutatingWebhooks

SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-tessera-devcluster",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_KEEP_REQUESTS = 256  # kmock records requests for assertions; a long-running server keeps only the last few


@attrs.define(kw_only=True)
class DevClusterEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    store: ObjectStore = attrs.field(factory=ObjectStore)
    registry: ResourceRegistry = attrs.field(factory=ResourceRegistry)
    webhooks: MutatingWebhooks | None = attrs.field(default=None)
    _router: ResourceRouter | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        # Only the scaffold's discovery reactions: resource requests never reach kmock's own store.
        kmock_k8s.KubernetesScaffold.__attrs_post_init__(self)
        self._router = ResourceRouter(
            self.store, self.registry, on_crd=self.serve_crd, webhooks=self.webhooks
        )
        self.fallback["get /openapi/v3"] << (lambda: openapi.root_document(self.registry))
        self.fallback["get", re.compile(r"/openapi/v3/.+")] << self._serve_openapi
        for rtype in self.registry:
            self._discover(rtype)

    def _discover(self, rtype: ResourceType) -> None:
        self.resources[kmock.resource(rtype.group, rtype.version, rtype.plural)] = kmock.ResourceInfo(
            kind=rtype.kind,
            singular=rtype.singular,
            namespaced=rtype.namespaced,
            verbs=set(rtype.verbs),
            shortnames=set(rtype.short_names),
            categories=set(rtype.categories),
            subresources=set(rtype.subresources),
        )

    def serve_crd(self, crd: dict[str, Any]) -> None:
        """Serve the resources of a CustomResourceDefinition once it is written. A resource the
        server already serves (PodGroups are built in) keeps its built-in type, and the objects stored
        under it; deleting the CRD does not stop serving it."""
        for rtype in crd_resource_types(crd):
            if self.registry.find(rtype.group, rtype.version, rtype.plural) is None:
                self.registry.add(rtype)
                self._discover(rtype)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        apiservice = aggregation.proxied(raw_request.path, self.registry, self.store)
        if apiservice is not None:  # a group another server provides: kube-aggregator's proxy
            return await aggregation.handle(self.store, apiservice, raw_request)
        route = parse_route(raw_request.path)
        if route is not None and self._router is not None:
            return await self._router.handle(raw_request, route)
        del self._requests[:-_KEEP_REQUESTS]
        for errors in self._errors:
            del errors[:-_KEEP_REQUESTS]
        if len(raw_request.path) > 1 and raw_request.path.endswith("/"):
            # The official clients ask for /api/v1/ and /version/; kmock matches paths exactly.
            raw_request = raw_request.clone(
                rel_url=raw_request.rel_url.with_path(raw_request.path.rstrip("/"))
            )
        response: aiohttp.web.StreamResponse = await super().__call__(raw_request)
        return response

    async def _serve_version(self, request: kmock_rendering.Request) -> dict[str, Any]:
        """/api/v1 and /apis/<group>/<version>: the APIResourceList, subresources with their own verbs."""
        wanted = request.resource
        group = wanted.group if wanted is not None else None
        version = wanted.version if wanted is not None else None
        types = [t for t in self.registry if t.group == group and t.version == version]
        if not types:
            raise kmock_k8s.KubernetesResourceNotFoundError()
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": types[0].api_version,
            "resources": [entry for t in types for entry in discovery_entries(t)],
        }

    async def _serve_openapi(self, request: kmock_rendering.Request) -> dict[str, Any]:
        document = openapi.group_version_document(
            self.registry, request.url.path.removeprefix("/openapi/v3/")
        )
        if document is None:
            raise kmock_k8s.KubernetesNotFoundError()
        return document

    async def _serve_server_version(self, request: kmock_rendering.Request) -> dict[str, str]:
        return dict(SERVER_VERSION)


_SUBRESOURCE_VERBS = {
    "status": ["get", "patch", "update"],
    "scale": ["get", "patch", "update"],
    "binding": ["create"],
    "eviction": ["create"],
}


def discovery_entries(rtype: ResourceType) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [
        {
            "name": rtype.plural,
            "singularName": rtype.singular,
            "namespaced": rtype.namespaced,
            "kind": rtype.kind,
            "verbs": sorted(rtype.verbs),
            "shortNames": list(rtype.short_names),
            "categories": list(rtype.categories),
        }
    ]
    for sub in sorted(rtype.subresources):
        kind = {"binding": "Binding", "eviction": "Eviction", "scale": "Scale"}.get(sub, rtype.kind)
        entry = {
            "name": f"{rtype.plural}/{sub}",
            "singularName": "",
            "namespaced": rtype.namespaced,
            "kind": kind,
            "verbs": _SUBRESOURCE_VERBS.get(sub, ["get"]),
        }
        if sub == "scale":
            entry.update(group="autoscaling", version="v1")
        entries.append(entry)
    return entries


class ApiServer:
    """An emulated Kubernetes API server on a loopback port.

    Use it as an async context manager inside a running event loop::

        async with ApiServer() as server:
            client = ...(server.url)

    or from synchronous code, on a background thread with its own loop::

        server = ApiServer()
        url = server.start()
        server.write_kubeconfig(".tessera/kubeconfig")
        ...
        server.stop()
    """

    def __init__(
        self,
        *,
        store: ObjectStore | None = None,
        registry: ResourceRegistry | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        history: int = 10_000,
    ) -> None:
        self.store = store or ObjectStore(history=history)
        for namespace in DEFAULT_NAMESPACES:
            if self.store.find(NAMESPACES, None, namespace) is None:
                self.store.create(NAMESPACES, None, {"metadata": {"name": namespace}})
        #: the mutating admission webhooks, for API creates and the devcluster controllers' own
        self.webhooks = MutatingWebhooks(self.store)
        self.emulator = DevClusterEmulator(
            store=self.store, registry=registry or ResourceRegistry(), webhooks=self.webhooks
        )
        self._host = host
        self._port = port
        self._runner: aiohttp.web.ServerRunner | None = None
        self._bound_port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self._host, self._host)
        return f"http://{host}:{self.port}"

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("the API server is not running")
        return self._bound_port

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server runs on (the background thread's loop after `start()`)."""
        if self._loop is None:
            raise RuntimeError("the API server is not running")
        return self._loop

    async def __aenter__(self) -> Self:
        await self.emulator.__aenter__()
        # The emulator is an aiohttp low-level handler. kmock.Server would serve it too, but it
        # also patches aiohttp's resolver process-wide, which breaks with several servers per process.
        self._runner = aiohttp.web.ServerRunner(
            aiohttp.web.Server(self.emulator), handle_signals=False, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        address = self._runner.addresses[0]
        self._bound_port = int(address[1])
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.store.close_watches()
        await asyncio.sleep(0)  # let the open watch streams see that they are closed
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._bound_port = None
        await self.emulator.__aexit__(exc_type, exc, tb)

    # ---- background-thread mode --------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> str:
        """Run the server on a background thread with its own event loop; returns its URL."""
        if self._thread is not None:
            raise RuntimeError("the API server is already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._stopping = asyncio.Event()
            try:
                async with self:
                    ready.set()
                    await self._stopping.wait()
            except BaseException as exc:
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(
            target=asyncio.run, args=(serve(),), name="devcluster-apiserver", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"the API server did not start within {timeout} seconds")
        if failure:
            raise RuntimeError("the API server failed to start") from failure[0]
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        self._thread = None

    def call(self, fn: Any, *args: Any) -> Any:
        """Run a coroutine function on the server's loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result()

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace=namespace)


def kubeconfig(url: str, *, namespace: str = "default", name: str = "tessera-devcluster") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, *, namespace: str = "default") -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(kubeconfig(url, namespace=namespace), sort_keys=False))
    return target

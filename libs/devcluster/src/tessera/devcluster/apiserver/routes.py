"""HTTP routing of resource requests (everything under /api/v1/<resource> and /apis/<g>/<v>/<resource>)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import yaml

from tessera.devcluster.apiserver import errors, ownership, scale
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.patching import APPLY_PATCH
from tessera.devcluster.apiserver.resources import (
    BINDINGS,
    CUSTOMRESOURCEDEFINITIONS,
    PODS,
    ResourceRegistry,
    ResourceType,
)
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.apiserver.tables import Printer, crd_printer, has_printer, to_table, wants_table
from tessera.devcluster.apiserver.webhooks import MutatingWebhooks

WATCH_BATCH = 256
"""At most this many watch events already queued go to a watcher in one write."""


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_route(path: str) -> Route | None:
    """Split a resource path; None for discovery and other non-resource paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    namespace_subresource = len(rest) == 3 and rest[2] in ("status", "finalize") and group == ""
    if rest[0] == "namespaces" and len(rest) >= 3 and not namespace_subresource:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) >= 2 else None
    subresource = "/".join(rest[2:]) or None
    return Route(group, version, plural, namespace, name, subresource)


def _json(body: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type="application/json"
    )


def _success(code: int, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ResourceRouter:
    def __init__(
        self,
        store: ObjectStore,
        registry: ResourceRegistry,
        on_crd: Callable[[dict[str, Any]], None] | None = None,
        webhooks: MutatingWebhooks | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.on_crd = on_crd
        """Called with every CustomResourceDefinition written, to serve its resources."""
        self.webhooks = webhooks
        """The mutating admission webhooks that objects created through the API pass."""
        self._lines = WatchLines()

    async def handle(self, request: aiohttp.web.BaseRequest, route: Route) -> aiohttp.web.StreamResponse:
        try:
            return await self._dispatch(request, route)
        except ApiError as error:
            return _json(error.status(), error.code)

    async def _body(self, request: aiohttp.web.BaseRequest) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            if _media(request) != APPLY_PATCH:
                raise errors.bad_request(f"the request body is not valid JSON: {exc}") from None
        try:  # an apply configuration may be YAML
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"the apply configuration is not valid YAML: {exc}") from None

    async def _dispatch(self, request: aiohttp.web.BaseRequest, route: Route) -> aiohttp.web.StreamResponse:
        resource = self.registry.find(route.group, route.version, route.plural)
        if resource is None:
            raise errors.ApiError(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            )
        if resource.namespaced is False and route.namespace is not None:
            raise errors.ApiError(404, "NotFound", f"{resource.plural} are cluster-scoped ({request.path})")
        if route.subresource and route.subresource not in resource.subresources:
            raise errors.ApiError(
                404,
                "NotFound",
                f"{resource.plural} have no subresource {route.subresource!r} ({request.path})",
            )
        query = request.query
        method = request.method.upper()
        if route.subresource == "scale" and route.name is not None:
            body = await self._body(request) if method in ("PUT", "PATCH") else None
            return _json(
                scale.handle(self.store, resource, route.namespace, route.name, method, body, request)
            )
        if method == "GET":
            if query.get("watch", "").lower() in ("true", "1"):
                return await self._watch(request, resource, route)
            if route.name is None:
                return self._list(request, resource, route)
            return self._maybe_table(request, resource, self.store.get(resource, route.namespace, route.name))
        body = await self._admit(request, method, resource, route, await self._body(request))
        response = self._write(request, method, resource, route, body)
        written = method in ("POST", "PUT", "PATCH") and response.status < 300
        if resource == CUSTOMRESOURCEDEFINITIONS and written and self.on_crd is not None:
            assert isinstance(response.body, bytes)
            self.on_crd(json.loads(response.body))
        return response

    async def _admit(
        self, request: aiohttp.web.BaseRequest, method: str, resource: ResourceType, route: Route, body: Any
    ) -> Any:
        """A create passes the mutating admission webhooks (a server-side apply that creates, too)."""
        if self.webhooks is None or not isinstance(body, dict) or route.subresource is not None:
            return body
        if method == "POST" and route.name is None and resource != BINDINGS:
            return await self.webhooks.admit_create(resource, route.namespace, body)
        if (
            method == "PATCH"
            and _media(request) == APPLY_PATCH
            and route.name is not None
            and self.store.find(resource, route.namespace, route.name) is None
        ):
            metadata = {**(body.get("metadata") or {}), "name": route.name}
            return await self.webhooks.admit_create(resource, route.namespace, {**body, "metadata": metadata})
        return body

    def _write(
        self, request: aiohttp.web.BaseRequest, method: str, resource: ResourceType, route: Route, body: Any
    ) -> aiohttp.web.Response:
        if method == "POST":
            return self._post(resource, route, body)
        if route.name is None:
            if method == "DELETE":
                return self._delete_collection(request, resource, route)
            raise errors.method_not_allowed(f"{method} is not allowed on a collection of {resource.plural}")
        if method == "PUT":
            obj = self.store.replace(resource, route.namespace, route.name, body, route.subresource)
            return _json(obj)
        if method == "PATCH" and _media(request) == APPLY_PATCH and route.subresource is None:
            obj, created = self.store.apply(resource, route.namespace, route.name, body)
            return _json(obj, 201 if created else 200)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "application/strategic-merge-patch+json")
            obj = self.store.patch(
                resource, route.namespace, route.name, body, content_type, route.subresource
            )
            return _json(obj)
        if method == "DELETE":
            return self._delete(request, resource, route, body)
        raise errors.method_not_allowed(f"{method} is not allowed on {request.path}")

    def _delete(
        self, request: aiohttp.web.BaseRequest, resource: ResourceType, route: Route, body: Any
    ) -> aiohttp.web.Response:
        assert route.name is not None
        preconditions = (body or {}).get("preconditions") if isinstance(body, dict) else None
        policy = ownership.propagation_policy(resource, body, request.query.get("propagationPolicy"))

        def propagate(owner: dict[str, Any]) -> None:  # once the preconditions hold
            uid = owner["metadata"]["uid"]
            if policy == "Orphan":
                ownership.orphan_dependents(self.store, uid)
            elif policy == "Foreground":
                ownership.delete_dependents(self.store, uid)
            # Background: the garbage collector deletes the dependents once the owner is gone.

        return _json(self.store.delete(resource, route.namespace, route.name, preconditions, propagate))

    def _selector(self, request: aiohttp.web.BaseRequest) -> Selector:
        return Selector.parse(request.query.get("labelSelector"), request.query.get("fieldSelector"))

    def _list(
        self, request: aiohttp.web.BaseRequest, resource: ResourceType, route: Route
    ) -> aiohttp.web.Response:
        items, revision = self.store.list(resource, route.namespace, self._selector(request))
        if wants_table(request.headers.get("Accept")):
            return _json(to_table(resource, items, str(revision), self._printer(resource)))
        return _json(
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(revision)},
                "items": items,
            }
        )

    def _printer(self, resource: ResourceType) -> Printer | None:
        """A custom resource's printer columns, from its CustomResourceDefinition."""
        if not resource.group or has_printer(resource):
            return None
        try:
            crd = self.store.get(CUSTOMRESOURCEDEFINITIONS, None, f"{resource.plural}.{resource.group}")
        except ApiError:
            return None
        return crd_printer(crd, resource.version)

    def _maybe_table(
        self, request: aiohttp.web.BaseRequest, resource: ResourceType, obj: dict[str, Any]
    ) -> aiohttp.web.Response:
        if wants_table(request.headers.get("Accept")):
            printer = self._printer(resource)
            return _json(to_table(resource, [obj], obj["metadata"]["resourceVersion"], printer))
        return _json(obj)

    def _post(self, resource: ResourceType, route: Route, body: Any) -> aiohttp.web.Response:
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON object")
        if resource == PODS and route.name is not None and route.subresource == "binding":
            return self._bind(route.namespace, route.name, body)
        if resource == PODS and route.name is not None and route.subresource == "eviction":
            self.store.delete(
                PODS, route.namespace, route.name, (body.get("deleteOptions") or {}).get("preconditions")
            )
            return _json(_success(201), 201)
        if resource == BINDINGS:
            name = (body.get("metadata") or {}).get("name")
            if not name:
                raise errors.invalid("Binding", "", "metadata.name", "Required value: the name of the pod")
            return self._bind(route.namespace or (body.get("metadata") or {}).get("namespace"), name, body)
        if route.name is not None:
            raise errors.method_not_allowed(f"POST is not allowed on a named {resource.kind}")
        return _json(self.store.create(resource, route.namespace, body), 201)

    def _bind(self, namespace: str | None, pod: str, body: dict[str, Any]) -> aiohttp.web.Response:
        target = body.get("target") or {}
        if target.get("kind", "Node") != "Node":
            raise errors.invalid("Binding", pod, "target.kind", "must be Node")
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if not (isinstance(annotations, dict) and all(isinstance(v, str) for v in annotations.values())):
            raise errors.invalid("Binding", pod, "metadata.annotations", "must be a map of strings")
        preconditions = {field: str(meta[field]) for field in ("uid", "resourceVersion") if meta.get(field)}
        # The answer is a Status, not the pod: no copy of it
        self.store.bind(
            namespace or "default", pod, target.get("name", ""), annotations, preconditions, copy_result=False
        )
        return _json(_success(201), 201)

    def _delete_collection(
        self, request: aiohttp.web.BaseRequest, resource: ResourceType, route: Route
    ) -> aiohttp.web.Response:
        items, _ = self.store.list(resource, route.namespace, self._selector(request))
        deleted = []
        for item in items:
            meta = item["metadata"]
            try:
                deleted.append(self.store.delete(resource, meta.get("namespace"), meta["name"]))
            except ApiError as error:
                if error.code != 404:
                    raise
        return _json(
            {"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": {}, "items": deleted}
        )

    async def _watch(
        self, request: aiohttp.web.BaseRequest, resource: ResourceType, route: Route
    ) -> aiohttp.web.StreamResponse:
        field_selector = request.query.get("fieldSelector")
        if route.name is not None:
            field_selector = ",".join(filter(None, [field_selector, f"metadata.name={route.name}"]))
        selector = Selector.parse(request.query.get("labelSelector"), field_selector)
        timeout = _timeout_seconds(request.query.get("timeoutSeconds"))
        table = wants_table(request.headers.get("Accept"))
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        try:
            watch = self.store.watch(
                resource, route.namespace, selector, request.query.get("resourceVersion")
            )
        except ApiError as error:
            # The watch cache answers a too-old resourceVersion inside a 200 stream, as an ERROR event.
            await response.prepare(request)
            await response.write(_line({"type": "ERROR", "object": error.status()}))
            await response.write_eof()
            return response
        await response.prepare(request)
        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            while True:
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    break
                event = await watch.next(wait, copy_object=False)
                if event is None:
                    if watch.closed or request.transport is None or request.transport.is_closing():
                        break
                    continue
                # The events already queued behind this one go in the same write (one chunk of
                # newline-delimited events, as a client reads them anyway): one send, not one each.
                events = [event, *watch.ready(WATCH_BATCH - 1, copy_object=False)]
                if table:
                    printer = self._printer(resource)
                    events = [
                        {"type": e["type"], "object": to_table(resource, [e["object"]], "", printer)}
                        for e in events
                    ]
                line = _line if table else self._lines.line
                await response.write(b"".join(line(e) for e in events))
        except (ConnectionError, asyncio.CancelledError):
            watch.close()
            raise
        finally:
            watch.close()
        with contextlib.suppress(ConnectionError):  # the client left first: nothing to end
            await response.write_eof()
        return response


def _media(request: aiohttp.web.BaseRequest) -> str:
    return request.headers.get("Content-Type", "").split(";")[0].strip().lower()


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class WatchLines:
    """Watch events as lines, each encoded once for all the watchers it goes to.

    Every watcher of a change gets the stored object itself (never changed once stored, see
    `Watch.next`), so its line is the same for all who see the same type; the newest ``size`` are
    kept, each with its object, whose id cannot then be reused while it is kept."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._held: OrderedDict[tuple[int, str], tuple[dict[str, Any], bytes]] = OrderedDict()

    def line(self, event: dict[str, Any]) -> bytes:
        obj, kind = event["object"], event["type"]
        held = self._held.get((id(obj), kind))
        if held is not None and held[0] is obj:
            return held[1]
        encoded = _line(event)
        self._held[(id(obj), kind)] = (obj, encoded)
        if len(self._held) > self._size:
            self._held.popitem(last=False)
        return encoded


def _timeout_seconds(text: str | None) -> float | None:
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise errors.bad_request(f"timeoutSeconds {text!r} is not a number") from None
    if value < 0:
        raise errors.bad_request(f"timeoutSeconds {text!r} must not be negative")
    return value

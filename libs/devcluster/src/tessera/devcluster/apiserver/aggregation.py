"""The aggregation layer: requests for an API group another server provides (an `APIService`,
`apiregistration.k8s.io/v1`) are proxied to it, as kube-aggregator does for `external.metrics.k8s.io`.

An APIService names a Service (`spec.service`: namespace, name, port, 443 by default). The devcluster runs
no Service network, so the backend is found as kube-aggregator finds it with `--enable-aggregator-routing`:
through the Service's `Endpoints` (the same namespace and name), the endpoint port named as the Service
port (or its only port). A Service without a selector and an Endpoints object naming `127.0.0.1` is how a
process on the developer's machine is registered. The backend is called over HTTPS, verified against
`spec.caBundle` under the name `<service>.<namespace>.svc`, or not verified with
`spec.insecureSkipTLSVerify`. A backend that cannot be found or reached answers 503, as the aggregator
does. Only groups the API server does not serve itself are proxied, their discovery document
(`/apis/<group>/<version>`) included; `/apis` does not list them."""

from __future__ import annotations

import base64
import binascii
import ssl
from typing import Any

import aiohttp
import aiohttp.web

from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import APISERVICES, ENDPOINTS, SERVICES, ResourceRegistry
from tessera.devcluster.apiserver.store import ObjectStore

PROXY_TIMEOUT_S = 30.0
_FORWARDED_HEADERS = ("Accept", "Content-Type", "User-Agent")


class Unavailable(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(503, "ServiceUnavailable", message)


def proxied(path: str, registry: ResourceRegistry, store: ObjectStore) -> dict[str, Any] | None:
    """The APIService a request path goes to: `/apis/<group>/<version>[/...]` of a group and version the
    server does not serve itself and an APIService names. None for everything else (one dict lookup for
    the server's own resources)."""
    if not path.startswith("/apis/"):
        return None
    parts = [p for p in path.split("/") if p]
    if len(parts) < 3:
        return None
    group, version = parts[1], parts[2]
    rest = parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if rest and registry.find(group, version, rest[0]) is not None:
        return None
    if not rest and any(t.group == group and t.version == version for t in registry):
        return None
    return find_apiservice(store, group, version)


def find_apiservice(store: ObjectStore, group: str, version: str) -> dict[str, Any] | None:
    """The APIService registered for a group and version (named `<version>.<group>`), if any."""
    found = store.find(APISERVICES, None, f"{version}.{group}")
    if found is None:
        return None
    spec = found.get("spec") or {}
    if spec.get("group") != group or spec.get("version") != version or not spec.get("service"):
        return None  # a local APIService, or one whose spec does not match its name
    return found


def backend_address(store: ObjectStore, apiservice: dict[str, Any]) -> tuple[str, int, str]:
    """(host, port, TLS server name) of the APIService's backend, through its Service's Endpoints."""
    name = apiservice["metadata"]["name"]
    ref = apiservice["spec"]["service"]
    namespace, service_name = str(ref.get("namespace") or ""), str(ref.get("name") or "")
    port = int(ref.get("port") or 443)
    service = store.find(SERVICES, namespace, service_name)
    if service is None:
        raise Unavailable(f'service "{namespace}/{service_name}" of APIService "{name}" not found')
    ports = (service.get("spec") or {}).get("ports") or []
    service_port = next((p for p in ports if int(p.get("port") or 0) == port), None)
    if service_port is None:
        raise Unavailable(f'service "{namespace}/{service_name}" has no port {port} (APIService "{name}")')
    endpoints = store.find(ENDPOINTS, namespace, service_name)
    for subset in (endpoints or {}).get("subsets") or []:
        addresses = [a.get("ip") for a in subset.get("addresses") or [] if a.get("ip")]
        candidates = subset.get("ports") or []
        wanted = service_port.get("name")
        chosen = next((p for p in candidates if p.get("name") == wanted), None)
        if chosen is None and len(candidates) == 1:
            chosen = candidates[0]
        if addresses and chosen is not None and chosen.get("port"):
            return str(addresses[0]), int(chosen["port"]), f"{service_name}.{namespace}.svc"
    raise Unavailable(
        f'no endpoints available for service "{namespace}/{service_name}" (APIService "{name}")'
    )


def tls_context(apiservice: dict[str, Any]) -> ssl.SSLContext:
    spec = apiservice["spec"]
    if spec.get("insecureSkipTLSVerify"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    bundle = spec.get("caBundle")
    if not bundle:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    except (binascii.Error, UnicodeDecodeError, ssl.SSLError) as exc:
        name = apiservice["metadata"]["name"]
        raise Unavailable(f'APIService "{name}": spec.caBundle is not a base64 PEM bundle: {exc}') from None


async def handle(
    store: ObjectStore, apiservice: dict[str, Any], request: aiohttp.web.BaseRequest
) -> aiohttp.web.Response:
    """The proxied answer, or the aggregator's Status when the backend cannot be reached."""
    try:
        return await proxy(store, apiservice, request)
    except ApiError as error:
        return aiohttp.web.json_response(error.status(), status=error.code)


async def proxy(
    store: ObjectStore, apiservice: dict[str, Any], request: aiohttp.web.BaseRequest
) -> aiohttp.web.Response:
    """Forward the request (method, path, query, body) to the backend and relay its answer."""
    host, port, server_name = backend_address(store, apiservice)
    context = tls_context(apiservice)
    url = f"https://{host}:{port}{request.rel_url}"
    headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
    body = await request.read()
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROXY_TIMEOUT_S)) as session,
            session.request(
                request.method,
                url,
                data=body or None,
                headers=headers,
                ssl=context,
                server_hostname=None if context.check_hostname is False else server_name,
            ) as reply,
        ):
            payload = await reply.read()
            return aiohttp.web.Response(
                body=payload,
                status=reply.status,
                headers={"Content-Type": reply.headers.get("Content-Type", "application/json")},
            )
    except TimeoutError:
        raise Unavailable(f"the backend of {apiservice['metadata']['name']} timed out ({url})") from None
    except aiohttp.ClientError as exc:
        name = apiservice["metadata"]["name"]
        raise Unavailable(f'error trying to reach service of APIService "{name}": {exc}') from None

"""The `Cluster` port on a real (or emulated) Kubernetes API server, with the official client.

Every blocking client call runs on the adapter's own thread pool and every watch stream on a
thread of its own, so the event loop never waits on the network. Requests ask for the raw
response (``_preload_content=False``) and the JSON is parsed by Tessera's own parsers: that is both
faster and immune to the client's model validation, which rejects the Status the server answers a
Binding with (kubernetes-client/python#825).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from tessera.cluster.conventions.assignment import encode_assignment
from tessera.cluster.conventions.kube_dict import get, string_map
from tessera.cluster.conventions.names import (
    GPU_ASSIGNMENT_ANNOTATION,
    POD_GROUP_API_GROUP,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
)
from tessera.cluster.conventions.nodes import parse_node
from tessera.cluster.conventions.pods import parse_pod, parse_pod_group
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import Pod, PodGroup, PodRef
from tessera.cluster.kube.errors import translate
from tessera.cluster.kube.watch import stream_events
from tessera.cluster.port import (
    ClusterError,
    ConfigMap,
    ConfigMapMutation,
    Listing,
    NotFound,
    PodSelector,
    Unparseable,
    WatchEvent,
)
from tessera.cluster.retry import update_config_map_with_retry

T = TypeVar("T")
log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class KubernetesCluster:
    """The Cluster port over an ``ApiClient`` (see :func:`api_client` for ways to build one).

    Calls run on a pool of ``max_workers`` threads of its own, so a burst of bindings neither
    waits on nor starves the event loop's default executor.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout: float = 30.0,
        max_workers: int = 16,
    ) -> None:
        self._api = api
        # Typed as Any: the client's signatures want its models, and we send and read raw JSON.
        self._core: Any = k8s.CoreV1Api(api)
        self._custom: Any = k8s.CustomObjectsApi(api)
        self._watch_timeout = watch_timeout_seconds
        self._request_timeout = request_timeout
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="k8s-call")

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._api.close)
        self._executor.shutdown(wait=False)

    # ---- reads --------------------------------------------------------------------------------

    async def list_nodes(self) -> Listing[Node]:
        return await self._list(self._core.list_node, (), parse_node, {})

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent[Node | Unparseable]]:
        return self._watch(self._core.list_node, (), parse_node, resource_version, {}, "nodes")

    async def list_pods(self, selector: PodSelector = PodSelector()) -> Listing[Pod]:
        method, args, params = self._pod_query(selector)
        return await self._list(method, args, parse_pod, params)

    def watch_pods(
        self, resource_version: str, selector: PodSelector = PodSelector()
    ) -> AsyncIterator[WatchEvent[Pod | Unparseable]]:
        method, args, params = self._pod_query(selector)
        return self._watch(method, args, parse_pod, resource_version, params, "pods")

    async def list_pod_groups(self, namespace: str | None = None) -> Listing[PodGroup]:
        method, args = self._pod_group_query(namespace)
        return await self._list(method, args, parse_pod_group, {})

    def watch_pod_groups(
        self, resource_version: str, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent[PodGroup | Unparseable]]:
        method, args = self._pod_group_query(namespace)
        return self._watch(method, args, parse_pod_group, resource_version, {}, "podgroups")

    async def get_pod(self, ref: PodRef) -> Pod:
        return parse_pod(await self._call(self._core.read_namespaced_pod, ref.name, ref.namespace))

    async def get_node(self, name: str) -> Node:
        return parse_node(await self._call(self._core.read_node, name))

    # ---- writes -------------------------------------------------------------------------------

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        """POST the Binding, carrying the device assignment as an annotation: one call.

        The API server's binding storage writes a Binding's annotations onto the pod in the same
        update that sets its node, and only while the pod is unbound (409 otherwise, raised as
        AlreadyBound), so the assignment never lands on a pod bound elsewhere. The uid the
        assignment names is the Binding's ``metadata.uid``, as kube-scheduler sends the pod's: the
        API server refuses the Binding (409, raised as Conflict) when the pod of that name has
        another uid (made again under the same name), so that pod is not bound with an assignment
        written for the one before it.
        """
        await self._post(*_binding(ref, node, assignment), binding=True)

    def blocking_binds(self) -> Callable[..., None] | None:
        """:meth:`bind_blocking`, unless a subclass binds its own way (overrides :meth:`bind`)."""
        return self.bind_blocking if type(self).bind is KubernetesCluster.bind else None

    def bind_blocking(
        self,
        ref: PodRef,
        node: str,
        assignment: DeviceAssignment | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """:meth:`bind` on the calling thread, for a caller that waits for it on a thread of its own:
        no hop to the event loop and the pool and back. Not on the event loop. Raises as :meth:`bind`
        does, and TimeoutError when no answer came in ``timeout_s`` (default: the request timeout;
        the bind may still land); ClusterError when it never reached the server."""
        try:
            response = self._send_post(
                *_binding(ref, node, assignment),
                _preload_content=False,
                _request_timeout=self._request_timeout if timeout_s is None else timeout_s,
            )
            _ = response.data  # read whole: the connection goes back to the pool
        except ApiException as exc:
            raise translate(exc, binding=True) from None
        except urllib3.exceptions.HTTPError as exc:
            raise _unanswered(f"bind {ref}", exc) from exc

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": ref.name, "namespace": ref.namespace},
        }
        if grace_period_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}
        await self._post(f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/eviction", body)

    async def patch_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Node:
        metadata: dict[str, Any] = {}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        return await self._patch_node(name, {"metadata": metadata})

    async def cordon(self, name: str, unschedulable: bool = True) -> Node:
        return await self._patch_node(name, {"spec": {"unschedulable": unschedulable or None}})

    async def get_config_map(self, namespace: str, name: str) -> ConfigMap | None:
        try:
            raw = await self._call(self._core.read_namespaced_config_map, name, namespace)
        except NotFound:
            return None
        return _config_map(raw)

    async def apply_config_map(
        self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> ConfigMap:
        return await update_config_map_with_retry(
            lambda: self.get_config_map(namespace, name),
            lambda new, current: self._write_config_map(namespace, name, new, current, labels),
            lambda _: dict(data),
        )

    async def update_config_map(self, namespace: str, name: str, mutate: ConfigMapMutation) -> ConfigMap:
        return await update_config_map_with_retry(
            lambda: self.get_config_map(namespace, name),
            lambda new, current: self._write_config_map(namespace, name, new, current, None),
            mutate,
        )

    # ---- internals ----------------------------------------------------------------------------

    async def _write_config_map(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        current: ConfigMap | None,
        labels: Mapping[str, str] | None,
    ) -> ConfigMap:
        """Create (``current`` None) or replace exactly the version read; labels are kept unless given."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        kept = labels if labels is not None else (current.labels if current is not None else None)
        if kept is not None:
            metadata["labels"] = dict(kept)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": dict(data),
        }
        if current is None:
            raw = await self._call(self._core.create_namespaced_config_map, namespace, body)
        else:
            metadata["resourceVersion"] = current.resource_version
            raw = await self._call(self._core.replace_namespaced_config_map, name, namespace, body)
        return _config_map(raw)

    async def _patch_node(self, name: str, patch: dict[str, Any]) -> Node:
        return parse_node(await self._call(self._core.patch_node, name, patch, _content_type=MERGE_PATCH))

    def _pod_query(self, selector: PodSelector) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        params: dict[str, Any] = {}
        if (fields := selector.field_selector()) is not None:
            params["field_selector"] = fields
        if (labels := selector.label_selector()) is not None:
            params["label_selector"] = labels
        if selector.namespace is not None:
            return self._core.list_namespaced_pod, (selector.namespace,), params
        return self._core.list_pod_for_all_namespaces, (), params

    def _pod_group_query(self, namespace: str | None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        group, version, plural = POD_GROUP_API_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL
        if namespace is not None:
            return self._custom.list_namespaced_custom_object, (group, version, namespace, plural)
        return self._custom.list_cluster_custom_object, (group, version, plural)

    async def _list(
        self,
        method: Callable[..., Any],
        args: tuple[Any, ...],
        parse: Callable[[dict[str, Any]], T],
        params: dict[str, Any],
    ) -> Listing[T]:
        raw = await self._call(method, *args, **params)
        items = []
        for obj in get(raw, "items", []):
            try:
                items.append(parse(obj))
            except Exception as exc:  # a malformed object of any kind, not only a ValueError
                log.warning("skipping an object that does not parse", extra={"error": str(exc)})
        return Listing(tuple(items), str(get(get(raw, "metadata", {}), "resourceVersion", "")))

    def _watch(
        self,
        method: Callable[..., Any],
        args: tuple[Any, ...],
        parse: Callable[[dict[str, Any]], T],
        resource_version: str,
        params: dict[str, Any],
        name: str,
    ) -> AsyncIterator[WatchEvent[T | Unparseable]]:
        timeout = self._watch_timeout

        def open_stream() -> Any:
            return method(
                *args,
                watch=True,
                resource_version=resource_version,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(self._request_timeout, timeout + 30),
                **params,
            )

        return stream_events(open_stream, parse, name)

    async def _post(self, path: str, body: dict[str, Any], binding: bool = False) -> dict[str, Any]:
        """POST ``body`` to ``path`` below the server, on the pool, as the client's generated method
        would (its headers and authentication), but without its argument checks: those validate
        the body into the client's model and serialise it back, which cost a bind more CPU than
        the request itself. Names and namespaces are DNS labels and subdomains: nothing to quote."""
        return await self._call(self._send_post, path, body, binding=binding)

    def _send_post(
        self, path: str, body: dict[str, Any], *, _preload_content: bool, _request_timeout: Any
    ) -> Any:
        """Serialise and send on the calling thread, never the event loop's: serialising runs the
        configuration's ``refresh_api_key_hook`` (a kubeconfig's exec plugin), which may block."""
        request = self._serialise_post(path, body)
        return _send(self._api, request, _preload_content=_preload_content, _request_timeout=_request_timeout)

    def _serialise_post(self, path: str, body: dict[str, Any]) -> Any:
        """The client's request (URL, headers, authentication) for ``body``, which goes as it is:
        the client's ``sanitize_for_serialization`` walks a body to turn its models into JSON, and
        ours is JSON already (strings, numbers, dicts), so the walk was only CPU."""
        method, url, headers, _, post_params = self._api.param_serialize(
            method="POST",
            resource_path=path,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=None,
            auth_settings=["BearerToken"],
        )
        return method, url, headers, body, post_params

    async def _call(
        self, method: Callable[..., Any], *args: Any, binding: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        """Run one client call on the pool, asking for the raw response, read its body there too
        (a body that stalls must not block the event loop), and parse its JSON."""

        def call() -> Any:
            response = method(*args, _preload_content=False, _request_timeout=self._request_timeout, **kwargs)
            return response.data if hasattr(response, "data") else response

        try:
            data = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except ApiException as exc:
            raise translate(exc, binding=binding) from None
        except urllib3.exceptions.HTTPError as exc:  # no answer: raised as the port says, not raw
            raise _unanswered(getattr(method, "__name__", "request"), exc) from exc
        if not data:
            return {}
        parsed = json.loads(data)
        return parsed if isinstance(parsed, dict) else {}


def _unanswered(what: str, exc: urllib3.exceptions.HTTPError) -> Exception:
    """A request the server did not answer: TimeoutError when a timeout ran out (it may have
    landed), else ClusterError. A refused connection or an unknown name (NewConnectionError,
    NameResolutionError: urllib3 makes both ConnectTimeoutErrors) never reached the server; a
    connection dropped mid-request (ProtocolError) may have."""
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    refused = isinstance(reason, urllib3.exceptions.NewConnectionError)
    if isinstance(reason, urllib3.exceptions.TimeoutError) and not refused:
        return TimeoutError(f"{what}: {reason}")
    return ClusterError(f"{what}: {exc}")


def _binding(ref: PodRef, node: str, assignment: DeviceAssignment | None) -> tuple[str, dict[str, Any]]:
    """The Binding of ``ref`` to ``node`` (see :meth:`KubernetesCluster.bind`) and where it goes."""
    metadata: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace}
    if assignment is not None:
        metadata["annotations"] = {GPU_ASSIGNMENT_ANNOTATION: encode_assignment(assignment)}
        if assignment.pod_uid:
            metadata["uid"] = assignment.pod_uid
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    return f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/binding", body


def _send(api: k8s.ApiClient, request: Any, *, _preload_content: bool, _request_timeout: float | None) -> Any:
    """One serialised request (``ApiClient.param_serialize``) of a JSON body, answered raw; any
    status but 2xx raised as the generated methods raise it (``ApiException`` with the status and
    body). Sent on the client's own connection pool, but never retried: the pool retries a failed
    connection three times, each with a fresh timeout, so a bind could wait four times its own."""
    method, url, headers, body, _ = request
    try:
        response = api.rest_client.pool_manager.request(
            method,
            url,
            body=json.dumps(body),
            headers=headers,
            timeout=urllib3.Timeout(total=_request_timeout) if _request_timeout else None,
            retries=False,
            preload_content=False,
        )
    except urllib3.exceptions.SSLError as exc:  # as the client's RESTClient reports it
        raise ApiException(status=0, reason=f"{type(exc).__name__}\n{exc}") from None
    if not 200 <= response.status <= 299:
        answer = RESTResponse(response)
        answer.read()  # type: ignore[no-untyped-call]
        raise ApiException.from_response(http_resp=answer, body=None, data=None)
    return response


def _config_map(raw: Mapping[str, Any]) -> ConfigMap:
    metadata = get(raw, "metadata", {})
    return ConfigMap(
        namespace=get(metadata, "namespace", "default"),
        name=get(metadata, "name", ""),
        data=string_map(raw, "data", "configmap.data"),
        labels=string_map(metadata, "labels", "configmap.metadata.labels"),
        resource_version=get(metadata, "resourceVersion"),
    )


def api_client(
    *,
    url: str | None = None,
    kubeconfig: str | None = None,
    in_cluster: bool = False,
    connections: int | None = None,
) -> k8s.ApiClient:
    """An ApiClient for a server URL (no auth, e.g. the devcluster), a kubeconfig file, or in-cluster.

    ``connections``: how many connections to the server it keeps open (the client's default is five
    per CPU, ten on two, which open watches and a pool of callers overrun: every call beyond it then
    opens a connection of its own and throws it away)."""
    from kubernetes import config as k8s_config

    configuration = k8s.Configuration()
    if url is not None:
        configuration.host = url
    elif in_cluster:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    return k8s.ApiClient(configuration)

"""Mutating admission webhooks: the registered MutatingWebhookConfigurations, called on CREATE.

For every object created through the API (and every pod a devcluster controller creates), the
webhooks whose rules, namespaceSelector and objectSelector match are called in order (configurations
sorted by name, then their webhooks in order) with an `admission.k8s.io/v1` AdmissionReview; each
returned JSONPatch is applied before the next webhook sees the object. A webhook that cannot be
called, answers badly or times out follows its failurePolicy: `Fail` (the default) refuses the
create with a 500, `Ignore` goes on without it. A webhook that denies the request refuses the create
with its own status. Not done: UPDATE/DELETE/CONNECT operations, matchConditions, reinvocation,
matchPolicy Equivalent, and service references (the devcluster reaches webhooks by URL).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import ssl
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp

from tessera.devcluster.apiserver import workloads
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.patching import json_patch
from tessera.devcluster.apiserver.resources import (
    MUTATINGWEBHOOKCONFIGURATIONS,
    NAMESPACES,
    ResourceType,
)
from tessera.devcluster.apiserver.selectors import Requirement
from tessera.devcluster.apiserver.store import ObjectStore

DEFAULT_TIMEOUT_SECONDS = 10
_ADMIN_USER = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}


class WebhookCallError(Exception):
    """The webhook could not be called, or its answer cannot be used."""


class MutatingWebhooks:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def admit_create(
        self, resource: ResourceType, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        """The object as the matching webhooks leave it; raises ApiError when one refuses it."""
        if resource == MUTATINGWEBHOOKCONFIGURATIONS:
            return body  # the real server never calls webhooks on webhook configurations
        configurations, _ = self.store.list(MUTATINGWEBHOOKCONFIGURATIONS)
        hooks = [
            hook
            for config in configurations
            for hook in config.get("webhooks") or []
            if isinstance(hook, dict)
        ]
        if not hooks:
            return body
        obj = dict(body)
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        metadata = dict(obj.get("metadata") or {})
        ns = (namespace or metadata.get("namespace")) if resource.namespaced else None
        if ns:
            metadata["namespace"] = ns
        obj["metadata"] = metadata
        workloads.apply_defaults(resource, obj)
        for hook in hooks:
            if self._matches(hook, resource, ns, obj):
                obj = await self._call(hook, resource, ns, obj)
        return obj

    # ---- matching ----------------------------------------------------------------------------

    def _matches(
        self, hook: dict[str, Any], resource: ResourceType, namespace: str | None, obj: dict[str, Any]
    ) -> bool:
        if not any(_rule_matches(rule, resource) for rule in hook.get("rules") or []):
            return False
        if not label_selector_matches(
            hook.get("objectSelector"), (obj.get("metadata") or {}).get("labels") or {}
        ):
            return False
        if namespace is None:
            return True
        found = self.store.find(NAMESPACES, None, namespace)
        labels = dict(((found or {}).get("metadata") or {}).get("labels") or {})
        labels.setdefault("kubernetes.io/metadata.name", namespace)
        return label_selector_matches(hook.get("namespaceSelector"), labels)

    # ---- calling -----------------------------------------------------------------------------

    async def _call(
        self, hook: dict[str, Any], resource: ResourceType, namespace: str | None, obj: dict[str, Any]
    ) -> dict[str, Any]:
        name = str(hook.get("name") or "")
        try:
            return await self._review(hook, resource, namespace, obj)
        except WebhookCallError as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return obj
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{name}": {exc}',
                {"causes": [{"message": f'failed calling webhook "{name}": {exc}'}]},
            ) from None

    async def _review(
        self, hook: dict[str, Any], resource: ResourceType, namespace: str | None, obj: dict[str, Any]
    ) -> dict[str, Any]:
        name = str(hook.get("name") or "")
        request_uid = str(uuid.uuid4())
        review = admission_review(request_uid, resource, namespace, obj)
        answer = await _post(hook, review)
        response = answer.get("response") if isinstance(answer, dict) else None
        if not isinstance(response, dict):
            raise WebhookCallError("the AdmissionReview answered has no response")
        if response.get("uid") != request_uid:
            raise WebhookCallError(f"expected response.uid={request_uid!r}, got {response.get('uid')!r}")
        if not response.get("allowed"):
            raise denial(name, response.get("status"))
        patch = response.get("patch")
        if not patch:
            return obj
        if response.get("patchType") != "JSONPatch":
            raise WebhookCallError(f"unsupported patchType {response.get('patchType')!r}: only JSONPatch")
        try:
            operations = json.loads(base64.b64decode(patch, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise WebhookCallError(f"the patch is not base64-encoded JSON: {exc}") from None
        try:
            patched = json_patch(obj, operations)
        except ApiError as exc:
            raise WebhookCallError(f"the JSONPatch does not apply: {exc.message}") from None
        if not isinstance(patched, dict):
            raise WebhookCallError("the JSONPatch did not leave an object")
        return patched


def admission_review(
    uid: str, resource: ResourceType, namespace: str | None, obj: dict[str, Any]
) -> dict[str, Any]:
    kind = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    gvr = {"group": resource.group, "version": resource.version, "resource": resource.plural}
    request: dict[str, Any] = {
        "uid": uid,
        "kind": kind,
        "resource": gvr,
        "requestKind": kind,
        "requestResource": gvr,
        "name": (obj.get("metadata") or {}).get("name", ""),
        "operation": "CREATE",
        "userInfo": _ADMIN_USER,
        "object": obj,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if namespace:
        request["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def denial(webhook: str, status: Any) -> ApiError:
    """The refusal the real server answers when a webhook denies a request (its ToStatusErr)."""
    status = status if isinstance(status, dict) else {}
    denied_by = f'admission webhook "{webhook}" denied the request'
    code = status.get("code") if isinstance(status.get("code"), int) else 400
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return ApiError(max(400, code), str(status.get("reason") or ""), message)


async def _post(hook: dict[str, Any], review: dict[str, Any]) -> Any:
    client_config = hook.get("clientConfig") or {}
    url = client_config.get("url")
    if not url:
        service = client_config.get("service") or {}
        raise WebhookCallError(
            f"service {service.get('namespace')}/{service.get('name')} cannot be reached from the "
            "devcluster: give the webhook a clientConfig.url"
        )
    timeout = hook.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS
    target = f"{url}{'&' if '?' in url else '?'}timeout={timeout}s"
    ssl_context: ssl.SSLContext | bool = True
    if client_config.get("caBundle"):
        try:
            ca = base64.b64decode(client_config["caBundle"]).decode()
            ssl_context = ssl.create_default_context(cadata=ca)
        except (binascii.Error, UnicodeDecodeError, ssl.SSLError) as exc:
            raise WebhookCallError(f"clientConfig.caBundle is not a base64 PEM bundle: {exc}") from None
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=float(timeout))) as session,
            session.post(target, json=review, ssl=ssl_context) as reply,
        ):
            if reply.status != 200:
                raise WebhookCallError(f'Post "{target}": the webhook answered HTTP {reply.status}')
            return await reply.json(content_type=None)
    except TimeoutError:
        raise WebhookCallError(f'Post "{target}": context deadline exceeded') from None
    except (aiohttp.ClientError, ValueError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise WebhookCallError(f'failed to call webhook: Post "{target}": {exc}') from None


def _rule_matches(rule: Any, resource: ResourceType) -> bool:
    if not isinstance(rule, dict):
        return False
    scope = rule.get("scope", "*")
    if (scope == "Cluster" and resource.namespaced) or (scope == "Namespaced" and not resource.namespaced):
        return False
    return (
        _listed(rule.get("operations"), "CREATE")
        and _listed(rule.get("apiGroups"), resource.group)
        and _listed(rule.get("apiVersions"), resource.version)
        and _listed(rule.get("resources"), resource.plural)
    )


def _listed(values: Any, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def label_selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions); an absent or empty one matches all."""
    if not isinstance(selector, dict):
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    operators = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expression in selector.get("matchExpressions") or []:
        operator = operators.get(expression.get("operator"))
        if operator is None:
            return False
        requirement = Requirement(str(expression.get("key")), operator, tuple(expression.get("values") or ()))
        if not requirement.matches(labels.get(requirement.key)):
            return False
    return True

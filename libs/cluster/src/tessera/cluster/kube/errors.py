"""Turning the kubernetes client's ApiException into the port's errors."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from tessera.cluster.port import AlreadyBound, ClusterError, Conflict, EvictionBlocked, NotFound, WatchExpired


def status_message(body: Any) -> str:
    if isinstance(body, bytes | str):
        try:
            parsed = json.loads(body)
        except ValueError:
            return str(body)[:500]
        if isinstance(parsed, dict):
            return str(parsed.get("message") or parsed.get("reason") or parsed)
    return str(body)[:500]


def translate(exc: ApiException, *, binding: bool = False) -> ClusterError:
    message = status_message(exc.body) if exc.body else str(exc.reason)
    code = int(exc.status or 0)
    error: ClusterError
    if code == 404:
        error = NotFound(message)
    elif code == 409:
        error = AlreadyBound(message) if binding and "already" in message else Conflict(message)
    elif code == 410:
        error = WatchExpired(message)
    elif code == 429:
        error = EvictionBlocked(message)
    else:
        error = ClusterError(f"HTTP {code}: {message}")
        error.code = code
    return error

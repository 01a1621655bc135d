"""Defaults and validation of MutatingWebhookConfigurations, as the real API server applies them.

One departure: a real server accepts only `https` URLs; the devcluster also accepts `http` to a
loopback address, so a webhook can be served without TLS on the developer's machine.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from tessera.devcluster.apiserver.errors import invalid

_KIND = "MutatingWebhookConfiguration"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_ENUMS = {
    "failurePolicy": ("Fail", "Ignore"),
    "matchPolicy": ("Exact", "Equivalent"),
    "reinvocationPolicy": ("Never", "IfNeeded"),
    "sideEffects": ("None", "NoneOnDryRun"),
}


def prepare(configuration: dict[str, Any]) -> None:
    """Default then validate, in place (create and update alike)."""
    name = configuration["metadata"]["name"]
    hooks = configuration.get("webhooks") or []
    if not isinstance(hooks, list):
        raise invalid(_KIND, name, "webhooks", "Invalid value: must be a list")
    seen: set[str] = set()
    for i, hook in enumerate(hooks):
        path = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            raise invalid(_KIND, name, path, "Invalid value: must be an object")
        hook.setdefault("failurePolicy", "Fail")
        hook.setdefault("matchPolicy", "Equivalent")
        hook.setdefault("reinvocationPolicy", "Never")
        hook.setdefault("timeoutSeconds", 10)
        hook.setdefault("namespaceSelector", {})
        hook.setdefault("objectSelector", {})
        for rule in hook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        _validate(name, path, hook, seen)


def _validate(name: str, path: str, hook: dict[str, Any], seen: set[str]) -> None:
    hook_name = hook.get("name")
    if not hook_name:
        raise invalid(_KIND, name, f"{path}.name", "Required value")
    if len(str(hook_name).split(".")) < 3:
        raise invalid(
            _KIND,
            name,
            f"{path}.name",
            f'Invalid value: "{hook_name}": should be a domain with at least three segments separated by dots',
        )
    if hook_name in seen:
        raise invalid(_KIND, name, f"{path}.name", f'Duplicate value: "{hook_name}"')
    seen.add(str(hook_name))
    versions = hook.get("admissionReviewVersions") or []
    if "v1" not in versions and "v1beta1" not in versions:
        raise invalid(
            _KIND, name, f"{path}.admissionReviewVersions", "Required value: must specify one of v1, v1beta1"
        )
    if hook.get("sideEffects") is None:
        raise invalid(
            _KIND, name, f"{path}.sideEffects", 'Required value: must specify one of "None", "NoneOnDryRun"'
        )
    for field, allowed in _ENUMS.items():
        if hook[field] not in allowed:
            supported = ", ".join(f'"{a}"' for a in allowed)
            raise invalid(
                _KIND,
                name,
                f"{path}.{field}",
                f'Unsupported value: "{hook[field]}": supported values: {supported}',
            )
    timeout = hook["timeoutSeconds"]
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 30:
        raise invalid(
            _KIND,
            name,
            f"{path}.timeoutSeconds",
            f"Invalid value: {timeout!r}: the timeout value must be between 1 and 30 seconds",
        )
    _validate_client_config(name, f"{path}.clientConfig", hook.get("clientConfig") or {})


def _validate_client_config(name: str, path: str, config: dict[str, Any]) -> None:
    url, service = config.get("url"), config.get("service")
    if bool(url) == bool(service):
        raise invalid(_KIND, name, path, "Required value: exactly one of url or service is required")
    if not url:
        return
    parsed = urllib.parse.urlsplit(str(url))
    if parsed.scheme == "https" or (parsed.scheme == "http" and parsed.hostname in _LOOPBACK):
        if not parsed.hostname:
            raise invalid(_KIND, name, f"{path}.url", f'Invalid value: "{url}": host must be specified')
        return
    raise invalid(
        _KIND,
        name,
        f"{path}.url",
        f"Invalid value: \"{url}\": 'https' is the only allowed URL scheme (the devcluster also allows "
        "http to a loopback address)",
    )

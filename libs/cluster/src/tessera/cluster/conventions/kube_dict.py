"""Reading Kubernetes objects given as dicts, whether camelCase (raw JSON) or snake_case (``to_dict()``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


def get(obj: Mapping[str, Any] | None, name: str, default: Any = None) -> Any:
    """``obj[name]`` under its camelCase or snake_case spelling; ``default`` when absent or null."""
    if not obj:
        return default
    value = obj.get(name)
    if value is None:
        value = obj.get(snake(name))
    return default if value is None else value


def string_map(obj: Mapping[str, Any] | None, name: str, field: str) -> dict[str, str]:
    """A map of strings such as labels. Its keys are data, so they are never respelled."""
    value = get(obj, name, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: expected a mapping")
    return {str(k): str(v) for k, v in value.items()}

"""API errors in the shape of the Kubernetes `Status` object."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error the API server answers with a `Status` body and an HTTP code."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(kind: str, name: str, group: str = "") -> dict[str, Any]:
    return {"name": name, "group": group, "kind": kind}


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', _details(plural, name, group))


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(
        409, "AlreadyExists", f'{qualified} "{name}" already exists', _details(plural, name, group)
    )


def conflict(plural: str, name: str, why: str, group: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        _details(plural, name, group),
    )


def invalid(kind: str, name: str, field: str, why: str) -> ApiError:
    details = {"name": name, "kind": kind, "causes": [{"field": field, "message": why}]}
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {field}: {why}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", message)

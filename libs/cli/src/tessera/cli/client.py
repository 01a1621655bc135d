"""How the CLI reaches a running stack, and how it reports what went wrong: one line, no traceback.

The state directory comes from ``tessera --state-dir DIR`` (or ``TESSERA_STATE_DIR``); its
``endpoints.json``, written by ``tessera up``, says where admission and telemetry listen, and its
``admin-token`` is the bearer token sent when ``TESSERA_TOKEN`` is not set. Every
client made here answers an error response the commands do not handle themselves (401, 403, 413,
429, 5xx) with one line on stderr and exit code 1, and a connection that fails with one line and
exit code 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from tessera.cli.endpoints import admission_url

STATE_DIR_ENV = "TESSERA_STATE_DIR"
DEFAULT_STATE_DIR = Path(".tessera")
TOKEN_ENV = "TESSERA_TOKEN"
ADMIN_TOKEN_FILE = "admin-token"
"""The admin token's file in the state directory (``tessera.admission.admin_token`` writes it)."""
#: statuses every command reports the same way (a command handles 404, 409, 422 itself)
_REPORTED_BY_ALL = frozenset({401, 403, 413, 429})


def err() -> Console:
    """Standard error, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console(stderr=True)


@dataclass
class CliSettings:
    """What ``tessera``'s own options said for this invocation (set by its callback before a command)."""

    state_dir: Path | None = None


#: one invocation per process; the callback sets it afresh each time (in-process test runs included)
settings = CliSettings()


def use_state_dir(path: Path | None) -> None:
    settings.state_dir = path


def state_dir() -> Path:
    """``--state-dir`` of this invocation, else ``TESSERA_STATE_DIR``, else ``.tessera``."""
    if settings.state_dir is not None:
        return settings.state_dir
    configured = os.environ.get(STATE_DIR_ENV)
    return Path(configured) if configured else DEFAULT_STATE_DIR


def bearer_token() -> str | None:
    """``TESSERA_TOKEN``, else the admin token ``tessera up`` wrote in the state directory (a file
    only its owner may read), else none."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    try:
        return (state_dir() / ADMIN_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def admission_client(api: str | None, *, handled: frozenset[int] = frozenset()) -> httpx.Client:
    """A client of admission at ``api``, else where the state directory's stack runs; sends
    ``bearer_token()`` when there is one. Statuses in ``handled`` are left to the caller."""
    token = bearer_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def report(response: httpx.Response) -> None:
        if response.status_code not in handled:
            _report_common_errors(response)

    return httpx.Client(
        base_url=api or admission_url(state_dir()),
        timeout=15,
        headers=headers,
        event_hooks={"response": [report]},
    )


RETRY_WAIT_MAX_S = 30.0
"""The longest a command waits before trying again, whatever ``Retry-After`` asks."""


def retry_wait(response: httpx.Response, default: float = 1.0) -> float:
    """Seconds to wait before trying again: the response's ``Retry-After`` (seconds), within
    0..``RETRY_WAIT_MAX_S``, else ``default``."""
    try:
        after = float(response.headers.get("Retry-After", default))
    except ValueError:
        after = default
    return min(max(after, 0.0), RETRY_WAIT_MAX_S)


def error_message(response: httpx.Response) -> str:
    """One line for an error response: the service's JSON ``message`` (and ``field``), else its text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or body.get("detail") or response.reason_phrase)
        field = body.get("field")
        message += f" (field {field})" if field else ""
    else:
        text = response.text.strip().splitlines()
        message = text[0] if text else response.reason_phrase
    return message


def advice(response: httpx.Response) -> str:
    """What to do about an error status, when there is something to say."""
    code = response.status_code
    if code == 401:
        return (
            f"pass a token: set {TOKEN_ENV} (an admin creates one with `tessera tokens create TENANT`; "
            f"the admin token is in {state_dir() / ADMIN_TOKEN_FILE})"
        )
    if code == 403:
        return f"the token in {TOKEN_ENV} may not do this"
    if code in (429, 503):
        after = response.headers.get("Retry-After")
        return f"retry in {after}s" if after else "retry shortly"
    if code >= 500:
        return "see the service's log (endpoints.json names it)"
    return ""


def fail(response: httpx.Response) -> typer.Exit:
    """Print ``error CODE: message; advice`` and return the exit to raise."""
    line = f"error {response.status_code}: {error_message(response)}"
    hint = advice(response)
    err().print(f"[red]{escape(line)}[/]" + (f"; {escape(hint)}" if hint else ""), soft_wrap=True)
    return typer.Exit(1)


def fail_on_error(response: httpx.Response) -> None:
    """Exit 1 with one line when ``response`` is an error."""
    if response.status_code >= 400:
        raise fail(response)


def unreachable(url: str, exc: httpx.HTTPError) -> typer.Exit:
    """Print why ``url`` cannot be reached, one line, and return the exit (code 2) to raise."""
    endpoints = state_dir() / "endpoints.json"
    if isinstance(exc, httpx.ConnectError):
        why = (
            f"the stack in {state_dir()} is not running (start it with `tessera up`)"
            if endpoints.exists()
            else f"no stack is running: {endpoints} does not exist (start one with `tessera up`, "
            "or pass --state-dir or --api)"
        )
    elif isinstance(exc, httpx.TimeoutException):
        why = "it did not answer in time"
    else:
        why = f"{type(exc).__name__}: {exc}"
    err().print(f"[red]cannot reach {escape(url)}[/]: {escape(why)}", soft_wrap=True)
    return typer.Exit(2)


def _report_common_errors(response: httpx.Response) -> None:
    if response.status_code in _REPORTED_BY_ALL or response.status_code >= 500:
        response.read()
        raise fail(response)

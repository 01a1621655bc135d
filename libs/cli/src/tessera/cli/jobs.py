"""`tessera jobs`: submit, get and list jobs through admission's REST API."""

from __future__ import annotations

import json
import math
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tessera.cli.client import admission_client, error_message, fail_on_error, retry_wait, unreachable
from tessera.cli.explain import explain as explain_job
from tessera.cli.explain import render

app = typer.Typer(help="Submit and inspect jobs.", no_args_is_help=True)


def console() -> Console:
    """Standard output, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console()


def err() -> Console:
    """Standard error, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console(stderr=True)


ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api", help="admission URL; default: TESSERA_ADMISSION_URL, else the --state-dir's endpoints.json"
    ),
]


def _client(api: str | None, handled: frozenset[int] = frozenset()) -> httpx.Client:
    """A client of admission (see `tessera.cli.client`: the state directory, the token, errors);
    statuses in ``handled`` are left to the command."""
    return admission_client(api, handled=handled)


class _StringTimesLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a date or a timestamp stays the string written
    (``release: 2024-01-01`` reaches the API as "2024-01-01", not as a date JSON cannot carry)."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def _check_json(value: Any, where: str, path: Path, seen: frozenset[int] = frozenset()) -> None:
    """Refuse, naming the field, what JSON cannot carry: bytes (``!!binary``), a set, a date
    (an explicit ``!!timestamp``), NaN or infinity, a structure that contains itself."""
    field = where or "the document"
    if isinstance(value, dict | list):
        if id(value) in seen:
            raise typer.BadParameter(
                f"{path}: {field} refers back to a mapping or list that holds it (a YAML alias inside its own anchor)"
            )
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            inner = f"{where}.{key}" if where else str(key)
            if isinstance(value, dict):
                _check_json(key, f"the key {inner}", path)
            _check_json(item, inner, path, seen | {id(value)})
    elif isinstance(value, float) and not math.isfinite(value):
        raise typer.BadParameter(
            f"{path}: {field} is {value!r}, which JSON cannot carry; give a finite number"
        )
    elif not isinstance(value, str | int | float | bool) and value is not None:
        raise typer.BadParameter(
            f"{path}: {field} is a {type(value).__name__} ({value!r}), which JSON cannot carry; "
            "quote it to send it as a string"
        )


def load_job_file(path: Path) -> Any:
    """The document in ``path``, YAML or JSON (by its suffix), as JSON values: a YAML date or
    timestamp stays the string written; anything JSON cannot carry is refused, naming the field."""
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise typer.BadParameter(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    try:
        document = json.loads(text) if kind == "JSON" else yaml.load(text, Loader=_StringTimesLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"{path} is not valid {kind}: {exc}") from exc
    except RecursionError:
        raise typer.BadParameter(f"{path} is nested too deeply to read") from None
    try:
        _check_json(document, "", path)
    except RecursionError:
        raise typer.BadParameter(f"{path} is nested too deeply to send") from None
    return document


def _fail_unreachable(api: str, exc: httpx.HTTPError) -> typer.Exit:
    return unreachable(f"admission at {api}", exc)


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="a job spec, YAML or JSON")],
    api: ApiOption = None,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            help="times to submit again while admission answers 503 (its database or messaging is "
            "briefly away), waiting what its Retry-After asks; every try sends the same "
            "Idempotency-Key, so the job is stored once",
        ),
    ] = 5,
) -> None:
    """Submit a job; prints its id. A rejected job prints each offending field and the reason."""
    spec = load_job_file(file)
    key = str(uuid.uuid4())
    with _client(api, frozenset({503})) as client:
        for attempt in range(1, retries + 2):
            try:
                response = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing listens: say so now
                raise _fail_unreachable(str(client.base_url), exc) from exc
            except httpx.TransportError as exc:  # sent, but the answer was lost: the key makes it safe
                if attempt > retries:
                    raise _fail_unreachable(str(client.base_url), exc) from exc
                why, wait = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, 1.0
            else:
                if response.status_code != 503 or attempt > retries:
                    break
                why, wait = error_message(response), retry_wait(response)
            err().print(
                f"admission is unavailable ({escape(why)}); trying again in {wait:g}s ({attempt} of {retries})",
                soft_wrap=True,
            )
            time.sleep(wait)
    if response.status_code != 422:
        fail_on_error(response)
    body = response.json()
    if response.status_code == 422:
        stored = f" {body['job_id']}" if body.get("job_id") else ""  # an invalid spec is not stored
        err().print(f"[red]rejected[/] job{stored}: {body.get('message', '')}")
        for error in body.get("errors", []):
            err().print(f"  {error['field']}: {error['reason']}")
        raise typer.Exit(1)
    console().print(body["id"])


@app.command()
def get(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="print the raw JSON")] = False,
    api: ApiOption = None,
) -> None:
    """Show a job, why it waits, its state history, its Kubernetes objects and the checkpoints it saved."""
    with _client(api) as client:
        try:
            response = client.get(f"/v1/jobs/{job_id}")
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    if response.status_code == 404:
        err().print(f"[red]no job with id {job_id}[/]")
        raise typer.Exit(1)
    fail_on_error(response)
    job = response.json()
    if as_json:
        console().print_json(data=job)
        return
    console().print(
        f"[bold]{job['name']}[/] ({job['id']}) tenant={job['tenant']} queue={job['queue']} "
        f"state=[bold]{job['state']}[/]"
    )
    if job.get("waiting"):
        console().print(f"waiting: [bold]{job['waiting']['reason']}[/]: {job['waiting']['message']}")
    table = Table("at", "state", "reason")
    for step in job["history"]:
        table.add_row(step["at"], step["state"], step["reason"])
    console().print(table)
    if job.get("kubernetes"):
        kube = job["kubernetes"]
        made = Table("kind", "name", title=f"Kubernetes objects in {kube['namespace']}: {kube['state']}")
        for obj in kube["objects"]:
            made.add_row(obj["kind"], obj["name"])
        console().print(made)
    if job.get("checkpoints"):
        saved = Table(
            "saved at", "step", "bytes", "uri", title="checkpoints, newest first (it resumes from the first)"
        )
        for checkpoint in job["checkpoints"]:
            saved.add_row(
                checkpoint["at"], str(checkpoint["step"]), f"{checkpoint['bytes']:,}", checkpoint["uri"]
            )
        console().print(saved)


@app.command()
def explain(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    as_json: Annotated[bool, typer.Option("--json", help="print the explanation as JSON")] = False,
    api: ApiOption = None,
) -> None:
    """Tell a job's story from its history, and why it is where it is: admission's latest decision
    (waiting and why, admitted where) and the scheduler's (placed where, or why it cannot be)."""
    with _client(api) as client:
        try:
            response = client.get(f"/v1/jobs/{job_id}")
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    if response.status_code == 404:
        err().print(f"[red]no job with id {escape(job_id)}[/]: check the id with `tessera jobs list`")
        raise typer.Exit(1)
    fail_on_error(response)
    explanation = explain_job(response.json())
    if as_json:
        console().print_json(data=explanation.to_json())
        return
    for line in render(explanation):
        console().print(escape(line), highlight=False, soft_wrap=True)


@app.command("list")
def list_jobs(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's jobs")] = None,
    state: Annotated[str | None, typer.Option(help="only jobs in this state")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    api: ApiOption = None,
) -> None:
    """List the most recent jobs."""
    params: dict[str, str | int] = {"limit": limit}
    if tenant:
        params["tenant"] = tenant
    if state:
        params["state"] = state
    with _client(api) as client:
        try:
            response = client.get("/v1/jobs", params=params)
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    fail_on_error(response)
    table = Table("id", "name", "tenant", "queue", "state", "submitted")
    for job in response.json():
        table.add_row(job["id"], job["name"], job["tenant"], job["queue"], job["state"], job["submitted_at"])
    console().print(table)


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="the job's id")], api: ApiOption = None) -> None:
    """Cancel a queued or running job; the quota it held is free for the next admission cycle."""
    with _client(api) as client:
        try:
            response = client.post(f"/v1/jobs/{job_id}/cancel")
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    fail_on_error(response)
    console().print(f"cancelled {job_id}")

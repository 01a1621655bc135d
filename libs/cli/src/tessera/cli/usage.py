"""`tessera usage`: who uses which GPU, how much, what it costs and what is wasted (telemetry's
`GET /v1/usage`), as tables or JSON; `tessera usage report`: allocated vs used GPUs over time for the
busiest groups (`GET /v1/usage/series`), as a PNG or JSON."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from tessera.cli.client import state_dir
from tessera.cli.endpoints import telemetry_url

app = typer.Typer(
    help="GPU-hours allocated, used and idle, and their cost, per tenant, queue, job or flavor.",
    invoke_without_command=True,
)


def console() -> Console:
    """Standard output, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console()


def err() -> Console:
    """Standard error, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console(stderr=True)


_RELATIVE = re.compile(r"^-?(?P<n>\d+(\.\d+)?)(?P<unit>[smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

By = Annotated[str, typer.Option("--by", help="tenant, queue, job or flavor")]
From = Annotated[str, typer.Option("--from", help="ISO 8601 time, or an age such as 24h, 7d")]
To = Annotated[str | None, typer.Option("--to", help="ISO 8601 time; default: now")]
Tenant = Annotated[str | None, typer.Option("--tenant", help="only this tenant")]
Api = Annotated[
    str | None,
    typer.Option("--api", help="telemetry URL; default: TESSERA_TELEMETRY_URL or .tessera/endpoints.json"),
]


def parse_time(text: str, now: datetime, option: str = "--from") -> datetime:
    """An ISO 8601 time (UTC when it has no zone), or an age before `now` such as `24h` or `-7d`;
    one that is not, or that lies outside the years 1..9999, is refused naming ``option``."""
    match = _RELATIVE.match(text.strip())
    try:
        if match:
            return now - timedelta(seconds=float(match["n"]) * _UNIT_S[match["unit"]])
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise typer.BadParameter(
                f"{text!r}: give an ISO 8601 time or an age such as 24h or 7d", param_hint=option
            ) from None
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except OverflowError:  # an age too long, or a time whose UTC falls outside the years 1..9999
        raise typer.BadParameter(
            f"{text!r} is out of range: the time (in UTC) must fall in the years 1 to 9999", param_hint=option
        ) from None


def fetch(
    by: str,
    start: str,
    end: str | None,
    tenant: str | None,
    top: int,
    api: str | None,
    path: str = "/v1/usage",
) -> dict[str, Any]:
    if by not in ("tenant", "queue", "job", "flavor"):
        raise typer.BadParameter(f"{by!r}: one of tenant, queue, job, flavor", param_hint="--by")
    now = datetime.now(UTC)
    to = parse_time(end, now, "--to") if end else now
    params: dict[str, Any] = {
        "by": by,
        "from": parse_time(start, to, "--from").isoformat(),
        "to": to.isoformat(),
        "top": top,
    }
    if tenant:
        params["tenant"] = tenant
    token = os.environ.get("TESSERA_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = api or telemetry_url(state_dir())
    try:
        response = httpx.get(f"{base}{path}", params=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        err().print(f"[red]telemetry at {base} does not answer[/]: {exc}. Is the stack up (tessera up)?")
        raise typer.Exit(1) from exc
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        if isinstance(detail, list):  # validation errors: where, and why
            detail = "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in detail if isinstance(e, dict))
        err().print(f"[red]error {response.status_code}[/]: {detail}")
        raise typer.Exit(1)
    body: dict[str, Any] = response.json()
    return body


def _hours(value: float) -> str:
    return f"{value:,.2f}"


def usage_table(body: dict[str, Any], title: str, rows: list[dict[str, Any]], by: str) -> Table:
    currency = body.get("currency", "USD")
    table = Table(title=title, title_justify="left")
    table.add_column(by)
    if by == "job":
        table.add_column("tenant")
        table.add_column("queue")
    for name in ("allocated GPU-h", "used GPU-h", "used %", "idle GPU-h", "memory GiB-h", f"cost {currency}"):
        table.add_column(name, justify="right")
    for r in rows:
        labels = [r["group"]] + ([r["tenant"], r["queue"]] if by == "job" else [])
        table.add_row(
            *labels,
            _hours(r["allocated_gpu_hours"]),
            _hours(r["used_gpu_hours"]),
            f"{r['utilisation_pct']:.1f}",
            _hours(r["idle_gpu_hours"]),
            _hours(r["memory_gib_hours"]),
            f"{r['cost']:,.2f}",
        )
    return table


def render(body: dict[str, Any], out: Console | None = None) -> None:
    """The report as tables and a total line, on `out` (standard output by default)."""
    out = out or console()
    by = body["by"]
    scope = f" (tenant {body['tenant']})" if body.get("tenant") else ""
    period = f"{body['from'][:16]} .. {body['to'][:16]} UTC"
    if not body["rows"]:
        out.print(f"No GPU usage by {by}{scope} from {period}.")
        return
    out.print(usage_table(body, f"GPU usage by {by}{scope}, {period}", body["rows"], by))
    rows = body["rows"]
    allocated = sum(r["allocated_gpu_hours"] for r in rows)
    used = sum(r["used_gpu_hours"] for r in rows)
    idle = sum(r["idle_gpu_hours"] for r in rows)
    cost = sum(r["cost"] for r in rows)
    share = 100 * used / allocated if allocated else 0.0
    out.print(
        f"total: {_hours(allocated)} GPU-h allocated, {_hours(used)} used ({share:.1f}%), "
        f"{_hours(idle)} idle, {cost:,.2f} {body.get('currency', 'USD')}"
    )
    if body.get("top_wasters"):
        out.print(usage_table(body, "Top wasters (jobs by idle GPU-hours)", body["top_wasters"], "job"))


@app.callback()
def usage(
    ctx: typer.Context,
    by: By = "tenant",
    start: From = "24h",
    end: To = None,
    tenant: Tenant = None,
    top: Annotated[int, typer.Option("--top", help="top wasters to list")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="print telemetry's answer as JSON")] = False,
    api: Api = None,
) -> None:
    """GPU-hours allocated, used and idle, memory and cost, with the top wasters. With a tenant's
    TESSERA_TOKEN only that tenant's usage is shown."""
    if ctx.invoked_subcommand is not None:
        return
    body = fetch(by, start, end, tenant, top, api)
    if as_json:
        console().print_json(json.dumps(body))
        return
    render(body)


@app.command()
def report(
    png: Annotated[Path | None, typer.Option("--png", help="write the chart here")] = None,
    by: By = "tenant",
    start: From = "24h",
    end: To = None,
    tenant: Tenant = None,
    top: Annotated[int, typer.Option("--top", help="groups to draw; the rest as `other`")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="print telemetry's series as JSON")] = False,
    api: Api = None,
) -> None:
    """Allocated vs used GPUs over time (hourly means) for the busiest groups, with their cost."""
    if png is None and not as_json:
        raise typer.BadParameter("give --png FILE, --json, or both", param_hint="--png")
    body = fetch(by, start, end, tenant, top, api, path="/v1/usage/series")
    if as_json:
        console().print_json(json.dumps(body))
    if png is not None:
        write_series_png(body, png)
        if not as_json:
            console().print(f"wrote {png}")


def _naive_utc(text: str) -> datetime:
    """An ISO 8601 time as naive UTC, which numpy's datetime64 takes without a warning."""
    parsed = datetime.fromisoformat(text)
    return (parsed.astimezone(UTC) if parsed.tzinfo else parsed).replace(tzinfo=None)


_COLOURS = ("#264653", "#2a9d8f", "#e76f51", "#8d5fd3", "#e9c46a", "#457b9d", "#f4a261", "#6c757d")


def write_series_png(body: dict[str, Any], path: Path) -> dict[str, list[float]]:
    """The chart of `GET /v1/usage/series`: per group, allocated GPUs dashed and used GPUs solid, the
    group's cost in the legend. Returns what was plotted: `<group>/allocated` and `<group>/used`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import numpy as np

    currency = body.get("currency", "USD")
    scope = f" (tenant {body['tenant']})" if body.get("tenant") else ""
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, s in enumerate(body["series"]):
        colour = _COLOURS[i % len(_COLOURS)]
        # each hour's mean drawn at the middle of its hour
        hours = np.array(
            [_naive_utc(p["hour"]) + timedelta(minutes=30) for p in s["points"]], dtype="datetime64[s]"
        )
        ax.plot(
            hours,
            [p["allocated_gpus"] for p in s["points"]],
            linestyle="--",
            color=colour,
            gid=f"{s['group']}/allocated",
        )
        ax.plot(
            hours,
            [p["used_gpus"] for p in s["points"]],
            color=colour,
            label=f"{s['group']}: {s['allocated_gpu_hours']:,.1f} GPU-h, {s['cost']:,.2f} {currency}",
            gid=f"{s['group']}/used",
        )
    if not body["series"]:
        ax.text(0.5, 0.5, "no GPU usage in this period", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.plot([], [], linestyle="--", color="grey", label="allocated (dashed)")
        ax.plot([], [], color="grey", label="used (solid)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))  # type: ignore[no-untyped-call]
    fig.autofmt_xdate()
    ax.set_ylabel("GPUs (hourly mean)")
    ax.set_ylim(bottom=0)
    limits = [_naive_utc(body["from"]), _naive_utc(body["to"])]
    ax.set_xlim(*np.array(limits, dtype="datetime64[s]"))  # type: ignore[arg-type]
    ax.grid(alpha=0.3)
    ax.set_title(
        f"GPUs allocated vs used by {body['by']}{scope}, {body['from'][:16]} .. {body['to'][:16]} UTC"
    )
    plotted = {
        str(line.get_gid()): np.asarray(line.get_ydata(), dtype=float).tolist()
        for line in ax.get_lines()
        if line.get_gid()
    }
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return plotted

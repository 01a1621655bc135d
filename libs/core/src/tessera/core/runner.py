"""The service runner: one FastAPI app per service with health, readiness, metrics and a clean shutdown.

Start-up: connect to NATS and Postgres, provision the stream, start the outbox relay, the consumers and
the background tasks. Shutdown (SIGTERM via uvicorn): stop fetching, let the in-flight message finish,
then drain NATS and dispose of the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fastapi import APIRouter, FastAPI, Response
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import Table, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts import subjects
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.retention import Clock, RetentionRule, purge, utc_now
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.connection import connect_nats
from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.messaging.streams import ensure_stream
from tessera.core.observability.http import TraceIdMiddleware
from tessera.core.observability.http_limits import RequestLimitsMiddleware
from tessera.core.observability.http_metrics import HttpMetricsMiddleware
from tessera.core.observability.metrics import Metrics
from tessera.core.outage import answer_outages_with_503
from tessera.core.settings import ServiceSettings
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)


DepsT = TypeVar("DepsT")


@dataclass
class ServiceContext:
    """What a running service holds: its connections, settings and lifecycle. Each service builds
    its own typed dependencies from it in `bootstrap.py` (`ServiceDefinition.dependencies`)."""

    name: str
    settings: ServiceSettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    nc: NATS
    js: JetStreamContext
    outbox: Table
    inbox: Table
    metrics: Metrics
    stop: asyncio.Event
    unit_of_work: type[UnitOfWork] = UnitOfWork
    relay: OutboxRelay | None = None

    def uow(self) -> Any:
        """A new unit of work of the service's own class; a commit that queued events wakes the relay."""
        relay = self.relay
        return self.unit_of_work(
            self.sessions,
            self.outbox,
            self.inbox,
            f"tessera/{self.name}",
            after_commit=relay.wake if relay is not None else None,
        )


async def context_only(ctx: ServiceContext) -> ServiceContext:
    """The dependencies of a service that needs nothing beyond its context."""
    return ctx


def _no_consumers(deps: Any) -> list[ConsumerSpec[Any]]:
    return []


@dataclass
class ServiceDefinition(Generic[DepsT]):
    """Everything the runner needs to run a service; `bootstrap.build(settings)` returns one.

    `dependencies` builds the service's typed dependencies once connected; consumers, background
    tasks and routes receive them (routes through `request.app.state.deps`)."""

    name: str
    outbox: Table
    inbox: Table
    dependencies: Callable[[ServiceContext], Awaitable[DepsT]]
    unit_of_work: type[UnitOfWork] = UnitOfWork
    consumers: Callable[[DepsT], Sequence[ConsumerSpec[Any]]] = _no_consumers
    routers: list[APIRouter] = field(default_factory=list)
    background: list[Callable[[DepsT], Coroutine[Any, Any, None]]] = field(default_factory=list)
    retention: list[RetentionRule] = field(default_factory=list)
    configure_app: Callable[[FastAPI], None] | None = None


async def start_context(
    definition: ServiceDefinition[Any], settings: ServiceSettings, metrics: Metrics | None = None
) -> ServiceContext:
    engine = make_engine(
        settings.database_url.get_secret_value(),
        pool_size=settings.db_pool_size,
        application_name=f"tessera-{definition.name}",
    )
    metrics = metrics or Metrics()
    nc = await connect_nats(
        settings.nats_url,
        f"tessera-{definition.name}",
        metrics,
        reconnect_wait_s=settings.nats_reconnect_wait_s,
        ping_interval_s=settings.nats_ping_interval_s,
        inbox_prefix=settings.nats_inbox_prefix,
    )
    js = nc.jetstream()
    await ensure_stream(js, definition.name, settings.stream.limits())
    return ServiceContext(
        name=definition.name,
        settings=settings,
        engine=engine,
        sessions=make_session_factory(engine),
        nc=nc,
        js=js,
        outbox=definition.outbox,
        inbox=definition.inbox,
        metrics=metrics,
        stop=asyncio.Event(),
        unit_of_work=definition.unit_of_work,
    )


class RunningService(Generic[DepsT]):
    """The tasks of one service instance; usable without HTTP (tests, benchmarks) and inside the app."""

    def __init__(self, definition: ServiceDefinition[DepsT], ctx: ServiceContext) -> None:
        self.definition = definition
        self.ctx = ctx
        self.tasks: list[asyncio.Task[None]] = []
        self.consumers: list[ConsumerRunner[Any]] = []
        self._deps: DepsT | None = None
        self.retention_rules = [
            RetentionRule(ctx.inbox, "received_at", ctx.settings.retention.inbox_s),
            *definition.retention,
        ]
        self.clock: Clock = utc_now

    @property
    def deps(self) -> DepsT:
        if self._deps is None:
            raise RuntimeError(f"{self.ctx.name} has not started")
        return self._deps

    async def start(self) -> None:
        ctx = self.ctx
        s = ctx.settings
        ctx.relay = OutboxRelay(
            ctx.js,
            ctx.sessions,
            ctx.outbox,
            ctx.metrics,
            ctx.stop,
            poll_s=s.outbox_poll_s,
            max_attempts=s.outbox_max_attempts,
            max_payload=self._max_payload,
        )
        self._deps = deps = await self.definition.dependencies(ctx)
        self._spawn(ctx.relay.run(), "outbox-relay")
        for spec in self.definition.consumers(deps):
            runner = ConsumerRunner(
                ctx.js,
                spec.configured(s.consumer),
                ctx.uow,
                ctx.name,
                ctx.metrics,
                ctx.stop,
                max_payload=self._max_payload,
                ensure_stream=self._ensure_own_stream if spec.stream_owner == ctx.name else None,
            )
            self.consumers.append(runner)
            self._spawn(runner.run(), spec.name)
        for task in self.definition.background:
            self._spawn(task(deps), task.__name__)
        self._spawn(self._retain(), "retention")

    async def _ensure_own_stream(self) -> None:
        """Create the service's stream again (a consumer found it gone), with its configured limits."""
        await ensure_stream(self.ctx.js, self.ctx.name, self.ctx.settings.stream.limits())

    def _max_payload(self) -> int:
        """The server's limit on one message, from the connection's INFO."""
        return int(self.ctx.nc.max_payload)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=f"{self.ctx.name}-{name}")
        task.add_done_callback(self._task_ended)
        self.tasks.append(task)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if self.ctx.stop.is_set():
            return
        if task.cancelled():
            log.error(
                "a service task was cancelled; the service is no longer live", extra={"task": task.get_name()}
            )
        elif (error := task.exception()) is not None:
            log.error(
                "a service task crashed; the service is no longer live",
                extra={"task": task.get_name(), "error": repr(error)},
                exc_info=(type(error), error, error.__traceback__),
            )
        else:
            log.info("a service task finished", extra={"task": task.get_name()})

    async def purge(self) -> dict[str, int]:
        """Delete what the retention rules no longer keep, as of `self.clock()`."""
        return await purge(self.ctx.sessions, self.retention_rules, self.clock())

    async def _retain(self) -> None:
        interval = self.ctx.settings.retention.interval_s
        while not await wait_any(self.ctx.stop, timeout=interval):
            try:
                deleted = await self.purge()
                if any(deleted.values()):
                    log.info("retention", extra={"deleted": deleted})
            except Exception as exc:  # the database may be restarting; the next round tries again
                log.warning("retention failed", extra={"error": repr(exc)})

    async def stop(self) -> None:
        self.ctx.stop.set()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=self.ctx.settings.shutdown_grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.ctx.nc.drain()
        await self.ctx.engine.dispose()

    def liveness(self) -> dict[str, str]:
        """Component -> problem that only a restart cures: a task that crashed or was cancelled (a
        background task may return when it has nothing to do), or a NATS connection closed for good.
        Empty while live, and while stopping."""
        if self.ctx.stop.is_set():
            return {}
        problems: dict[str, str] = {}
        if self.ctx.nc.is_closed:
            problems["nats"] = "connection closed for good"
        for task in self.tasks:
            if not task.done():
                continue
            if task.cancelled():
                problems[f"task {task.get_name()}"] = "cancelled"
            elif (error := task.exception()) is not None:
                problems[f"task {task.get_name()}"] = f"crashed: {error!r}"
        return problems

    def waiting_for(self) -> list[str]:
        """Consumers still waiting for their upstream stream: reported, but not a reason to be unready,
        since the service's own API and stream work without them."""
        return [r.spec.name for r in self.consumers if not r.subscribed.is_set()]

    async def ready(self) -> dict[str, str]:
        """Component -> problem; empty when ready."""
        problems: dict[str, str] = {}
        try:
            async with self.ctx.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:
            problems["database"] = repr(exc)
        if not self.ctx.nc.is_connected:
            problems["nats"] = "not connected"
        else:
            try:
                await self.ctx.js.stream_info(subjects.stream_name(self.ctx.name))
            except Exception as exc:
                problems["stream"] = repr(exc)
        problems.update(self.liveness())
        return problems


#: the exit code of a service that stopped being live (EX_SOFTWARE): its supervisor restarts it
NOT_LIVE_EXIT_CODE = 70


async def watch_liveness(
    service: RunningService[Any], after_s: float, on_not_live: Callable[[dict[str, str]], None]
) -> None:
    """Call `on_not_live` once the service has stayed not live for `after_s`: a crashed task or a
    closed connection does not come back by itself, and a restart does."""
    failing_since: float | None = None
    loop = asyncio.get_running_loop()
    while not await wait_any(service.ctx.stop, timeout=min(1.0, after_s / 4)):
        problems = service.liveness()
        if not problems:
            failing_since = None
            continue
        failing_since = failing_since if failing_since is not None else loop.time()
        if loop.time() - failing_since >= after_s:
            log.error(
                "not live for %.0f s; exiting so that the supervisor restarts the service",
                after_s,
                extra={"problems": problems},
            )
            on_not_live(problems)
            return


def create_app(
    definition: ServiceDefinition[Any],
    settings: ServiceSettings,
    on_not_live: Callable[[dict[str, str]], None] | None = None,
) -> FastAPI:
    """The service's app. With `on_not_live` (what `serve` passes: stop and exit non-zero), a service
    not live for `settings.liveness_exit_after_s` calls it."""
    holder: dict[str, RunningService[Any]] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = await start_context(definition, settings)
        service = RunningService(definition, ctx)
        await service.start()
        holder["service"] = service
        app.state.ctx = ctx
        app.state.deps = service.deps
        log.info("service started", extra={"http_port": settings.http_port})
        watchdog: asyncio.Task[None] | None = None
        if on_not_live is not None and settings.liveness_exit_after_s > 0:
            watchdog = asyncio.create_task(
                watch_liveness(service, settings.liveness_exit_after_s, on_not_live), name="liveness-watchdog"
            )
        try:
            yield
        finally:
            log.info("service stopping")
            if watchdog is not None:
                watchdog.cancel()
                await asyncio.gather(watchdog, return_exceptions=True)
            await service.stop()

    app = FastAPI(title=f"Tessera {definition.name}", version="0.1.0", lifespan=lifespan)

    @app.get("/healthz", tags=["health"])
    async def healthz(response: Response) -> dict[str, Any]:
        """Liveness: fails when a consumer, the relay or a background task stopped, or the NATS
        connection closed for good, so the supervisor (or Kubernetes) restarts the service."""
        service = holder.get("service")
        problems = service.liveness() if service else {}
        response.status_code = 200 if not problems else 503
        return {
            "status": "ok" if not problems else "failing",
            "service": definition.name,
            "problems": problems,
        }

    @app.get("/readyz", tags=["health"])
    async def readyz(response: Response) -> dict[str, Any]:
        service = holder.get("service")
        problems = await service.ready() if service else {"service": "starting"}
        response.status_code = 200 if not problems else 503
        waiting = service.waiting_for() if service else []
        return {"ready": not problems, "problems": problems, "consumers_waiting_for_stream": waiting}

    @app.get("/metrics", tags=["health"])
    async def metrics() -> Response:
        service = holder.get("service")
        body = generate_latest(service.ctx.metrics.registry) if service else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    answer_outages_with_503(app)  # the database unreachable: JSON 503 with Retry-After, not a 500
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=settings.max_request_body_bytes)
    app.add_middleware(HttpMetricsMiddleware)  # requests and latency by route, the limits' answers too
    app.add_middleware(TraceIdMiddleware)  # outermost: the limits' 500 names the request's trace id
    for router in definition.routers:
        app.include_router(router)
    if definition.configure_app is not None:
        definition.configure_app(app)
    return app


def serve(definition: ServiceDefinition[Any], settings: ServiceSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    import uvicorn

    from tessera.core.observability.logs import configure_logging
    from tessera.core.observability.tracing import configure_tracing

    configure_logging(definition.name, settings.log_level)
    configure_tracing(definition.name)
    exit_code = 0

    def not_live(problems: dict[str, str]) -> None:
        nonlocal exit_code
        exit_code = NOT_LIVE_EXIT_CODE
        server.should_exit = True  # uvicorn shuts down cleanly, then the process exits non-zero

    app = create_app(definition, settings, on_not_live=not_live)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.http_host,
            port=settings.http_port,
            log_config=None,
            timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        )
    )
    server.run()
    if exit_code:
        sys.exit(exit_code)

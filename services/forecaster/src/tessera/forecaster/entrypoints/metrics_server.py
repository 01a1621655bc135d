"""The external metrics API over HTTPS on its own port, for the `v1beta1.external.metrics.k8s.io`
APIService: the aggregation layer calls its backend over TLS only, trusting the APIService's
`caBundle`. A second server in the service's process (`tessera.core.https`, as admission serves its
webhook), serving the external metrics routes alone; a renewed certificate is loaded without a restart."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import uvicorn
from fastapi import FastAPI

from tessera.core import https
from tessera.core.observability.http import TraceIdMiddleware
from tessera.forecaster.config import ForecasterSettings, MetricsTlsSettings
from tessera.forecaster.entrypoints.api import metrics_router
from tessera.forecaster.service_layer.dependencies import ForecasterDeps


def check_certificate(tls: MetricsTlsSettings) -> None:
    """A certificate that does not load stops the service at start, naming the setting."""
    https.check_certificate(tls.cert_file, tls.key_file, "metrics_tls")


def metrics_app(deps: ForecasterDeps | None = None) -> FastAPI:
    """The external metrics routes alone, with the service's dependencies."""
    app = FastAPI(title="Tessera external metrics", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.deps = deps
    app.add_middleware(TraceIdMiddleware)
    app.include_router(metrics_router)
    return app


def metrics_tls_server(app: FastAPI, host: str, tls: MetricsTlsSettings) -> uvicorn.Server:
    return https.tls_server(app, host, tls.port, tls.cert_file, tls.key_file)


def https_metrics(settings: ForecasterSettings) -> Callable[[ForecasterDeps], Coroutine[Any, Any, None]]:
    """The background task serving the external metrics API over HTTPS until the service stops; one
    that cannot start (the port taken) or ends on its own fails, so the service is no longer live."""

    async def external_metrics_https(deps: ForecasterDeps) -> None:
        tls = settings.metrics_tls
        server = metrics_tls_server(metrics_app(deps), settings.http_host, tls)
        reloader = https.reloader_of(server, tls.cert_file, tls.key_file)
        await https.serve_https(
            server, reloader, deps.stop, reload_interval_s=tls.reload_interval_s, what="external metrics API"
        )

    return external_metrics_https

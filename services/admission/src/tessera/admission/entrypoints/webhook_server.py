"""The webhook over HTTPS on its own port, for a Kubernetes API server (which calls webhooks over TLS
only, trusting the `caBundle` of the MutatingWebhookConfiguration).

A second uvicorn server in the service's process (`tessera.core.https`), serving the webhook route
alone: the admission API and its bearer tokens stay on the plain HTTP port. A renewed certificate is
loaded again without a restart."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import uvicorn
from fastapi import FastAPI

from tessera.admission.config import AdmissionSettings, WebhookSettings
from tessera.admission.entrypoints.webhook import router
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.core import https
from tessera.core.https import CertificateError, CertificateReloader
from tessera.core.observability.http import TraceIdMiddleware

__all__ = ["CertificateError", "CertificateReloader", "check_certificate", "https_webhook", "webhook_app"]


def check_certificate(webhook: WebhookSettings) -> None:
    """Load the certificate and key once, so that a wrong file stops the service at start with the
    setting and the reason, not later in a background task."""
    https.check_certificate(webhook.cert_file, webhook.key_file, "webhook")


def webhook_app(deps: AdmissionDeps | None = None) -> FastAPI:
    """The webhook route alone, with the service's dependencies where the route needs them."""
    app = FastAPI(title="Tessera admission webhook", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.deps = deps
    app.add_middleware(TraceIdMiddleware)
    app.include_router(router)
    return app


def tls_server(app: FastAPI, host: str, webhook: WebhookSettings) -> uvicorn.Server:
    if webhook.cert_file is None or webhook.key_file is None:
        raise ValueError("webhook.cert_file and webhook.key_file are required to serve HTTPS")
    return https.tls_server(app, host, webhook.port, webhook.cert_file, webhook.key_file)


def reloader_of(server: uvicorn.Server, webhook: WebhookSettings) -> CertificateReloader:
    return https.reloader_of(server, webhook.cert_file, webhook.key_file)


def https_webhook(settings: AdmissionSettings) -> Callable[[AdmissionDeps], Coroutine[Any, Any, None]]:
    """The background task that serves the webhook over HTTPS until the service stops; a server
    that cannot start (the port taken) or that ends on its own fails the task, so the service is no
    longer live."""

    async def webhook_https(deps: AdmissionDeps) -> None:
        server = tls_server(webhook_app(deps), settings.http_host, settings.webhook)
        await https.serve_https(
            server,
            reloader_of(server, settings.webhook),
            deps.ctx.stop,
            reload_interval_s=settings.webhook.reload_interval_s,
            what="webhook",
        )

    return webhook_https

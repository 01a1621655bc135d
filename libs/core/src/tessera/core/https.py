"""A second server over HTTPS in a service's process, for callers that only speak TLS (a Kubernetes API
server calling a webhook or an aggregated API), on its own port and with its own routes: the service's
plain HTTP port and its bearer tokens stay as they are. A renewed certificate (cert-manager rewrites the
Secret, the kubelet swaps the mounted files) is loaded again without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Generator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from tessera.core.waits import wait_any

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """A serving certificate or its key cannot be loaded."""


def check_certificate(cert_file: Path | None, key_file: Path | None, setting: str) -> None:
    """Load the certificate and key once, so that a wrong file stops the service at start with the
    setting (`setting.cert_file`, `setting.key_file`) and the reason, not later in a background task."""
    if cert_file is None or key_file is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as error:
        raise CertificateError(
            f"{setting}.cert_file {cert_file} / {setting}.key_file {key_file}: "
            f"cannot be loaded as a PEM certificate and its key: {error}"
        ) from error


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server inside a process whose main server owns the signals: stopping it is the
    service's stop event, not SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def tls_server(
    app: FastAPI, host: str, port: int, cert_file: Path | None, key_file: Path | None
) -> uvicorn.Server:
    if cert_file is None or key_file is None:
        raise ValueError("a certificate and its key are required to serve HTTPS")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(cert_file),
        ssl_keyfile=str(key_file),
        log_config=None,
        lifespan="off",
    )
    config.load()  # makes the TLS context now, so that a reloader can hold it
    return EmbeddedServer(config)


class CertificateReloader:
    """Loads the certificate and key again into the server's TLS context when their files change:
    new handshakes get the new certificate, open connections keep theirs."""

    def __init__(self, context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
        self._context, self._cert, self._key = context, cert_file, key_file
        self._seen = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in map(os.stat, (self._cert, self._key)))
        except OSError:
            return None

    def reload_if_changed(self) -> bool:
        """True when a changed pair was loaded; a pair that does not load (caught between two
        writes) is kept out, the old one served, and tried again next time."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return False
        try:
            self._context.load_cert_chain(self._cert, self._key)
        except (OSError, ssl.SSLError) as error:
            log.warning(
                "certificate not reloaded", extra={"cert_file": str(self._cert), "error": repr(error)}
            )
            return False
        self._seen = stamp
        log.info("certificate reloaded", extra={"cert_file": str(self._cert)})
        return True


def reloader_of(server: uvicorn.Server, cert_file: Path | None, key_file: Path | None) -> CertificateReloader:
    if server.config.ssl is None or cert_file is None or key_file is None:
        raise ValueError("the server serves no TLS")
    return CertificateReloader(server.config.ssl, cert_file, key_file)


async def serve_https(
    server: uvicorn.Server,
    reloader: CertificateReloader,
    stop: asyncio.Event,
    *,
    reload_interval_s: float,
    what: str,
) -> None:
    """Serve until `stop`, checking for a renewed certificate every `reload_interval_s`. A server that
    cannot start (the port taken) or that ends on its own raises, so the service is no longer live."""
    port = server.config.port

    async def stop_with_service() -> None:
        while not await wait_any(stop, timeout=reload_interval_s):
            reloader.reload_if_changed()
        server.should_exit = True

    stopper = asyncio.create_task(stop_with_service(), name=f"{what}-https-stop")
    log.info("serving HTTPS", extra={"what": what, "port": port})
    try:
        await server.serve()
    except SystemExit as exit_:  # uvicorn exits the process when it cannot bind
        raise RuntimeError(f"the {what}'s HTTPS server could not start on port {port}") from exit_
    finally:
        stopper.cancel()
        await asyncio.gather(stopper, return_exceptions=True)
    if not stop.is_set():
        raise RuntimeError(f"the {what}'s HTTPS server on port {port} stopped")

"""A loopback TCP proxy a test can cut: every open connection is closed at once, as a network fault
or a server restart would, while the server behind it keeps running for the other tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.accepted = 0
        self.refusing = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._clients: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, scheme: str = "nats") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    async def cut(self) -> int:
        """Close every connection through the proxy; the number closed."""
        writers, self._writers = list(self._writers), set()
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        return len(writers)

    async def inject(self, data: bytes) -> int:
        """Send `data` to every client as if the server had sent it (a protocol error, say); the
        number of clients it reached."""
        clients = list(self._clients)
        for writer in clients:
            writer.write(data)
            with contextlib.suppress(Exception):
                await writer.drain()
        return len(clients)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self.cut()
            await self._server.wait_closed()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_writer.close()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            client_writer.close()
            return
        self.accepted += 1
        self._writers.update((client_writer, server_writer))
        self._clients.add(client_writer)
        await asyncio.gather(
            _pipe(client_reader, server_writer), _pipe(server_reader, client_writer), return_exceptions=True
        )
        self._clients.discard(client_writer)
        for writer in (client_writer, server_writer):
            self._writers.discard(writer)
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@asynccontextmanager
async def cuttable_proxy(url: str) -> AsyncIterator[CuttableProxy]:
    """A proxy in front of the server at `url` (any scheme with a host and a port)."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"url must name a host and a port, got {url!r}")
    proxy = CuttableProxy(parts.hostname, parts.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()

"""Stand-ins for the six services and for migrations, to test ``tessera up`` on its own.

    python fake_stack.py service NAME          serve /healthz and /readyz like a real service
    python fake_stack.py up STATE_DIR [SVCS]   run ``tessera up`` with these fakes

``FAKE_NOT_READY=name`` makes that service answer 503 on /readyz forever; ``FAKE_DEVCLUSTER=0`` runs
without the devcluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def serve(name: str) -> None:
    host = os.environ[f"TESSERA_{name.upper()}_HTTP_HOST"]
    port = int(os.environ[f"TESSERA_{name.upper()}_HTTP_PORT"])
    not_ready = os.environ.get("FAKE_NOT_READY") == name

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/healthz", "/readyz"):
                self.send_error(404)
                return
            status = 503 if self.path == "/readyz" and not_ready else 200
            body = json.dumps(
                {
                    "service": name,
                    "pid": os.getpid(),
                    "nats_url": os.environ["TESSERA_NATS_URL"],
                    "database_url": os.environ["TESSERA_DATABASE_URL"],
                    "kubeconfig": os.environ.get("TESSERA_KUBECONFIG"),
                }
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer((host, port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"{name} listening on {host}:{port}", flush=True)
    server.serve_forever()
    print(f"{name} stopped", flush=True)


def migrate(database_url: str) -> None:
    """Records each start, so a test can tell that the second run found the first run's data."""
    import asyncpg  # type: ignore[import-untyped]

    async def _run() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("CREATE TABLE IF NOT EXISTS boots (n serial PRIMARY KEY)")
            await conn.execute("INSERT INTO boots DEFAULT VALUES")
        finally:
            await conn.close()

    asyncio.run(_run())


def up(state_dir: str, services: str | None) -> int:
    from tessera.cli.up import SERVICES, UpOptions, run_up

    options = UpOptions(
        state_dir=Path(state_dir),
        services=tuple(services.split(",")) if services else SERVICES,
        # generous: on a loaded 2-core CI machine a devcluster once took over 30 s to answer
        ready_timeout=float(os.environ.get("FAKE_READY_TIMEOUT", "120")),
        stop_timeout=5,
        use_default_ports=False,
        devcluster=os.environ.get("FAKE_DEVCLUSTER", "1") == "1",
    )
    return run_up(options, migrate=migrate, service_argv=lambda n: [sys.executable, __file__, "service", n])


if __name__ == "__main__":
    if sys.argv[1] == "service":
        serve(sys.argv[2])
    else:
        sys.exit(up(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))

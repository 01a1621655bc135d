"""`tessera jobs submit` tries again while admission answers 503, under one Idempotency-Key.

The real entry point (`python -m tessera.cli`) posts to a local HTTP server that answers as admission
does while its database is away (503, a JSON message, Retry-After), then as it does once it is back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

UNAVAILABLE = (503, {"message": "the database is unavailable; retry shortly"})
DROPPED = 0


@dataclass
class Admission:
    url: str
    #: answers in turn, the last one repeated
    answers: list[tuple[int, dict[str, str]]]
    keys: list[str | None] = field(default_factory=list)


@pytest.fixture
def admission() -> Iterator[Admission]:
    state = Admission("", [])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            key = self.headers.get("Idempotency-Key")
            state.keys.append(key)
            status, body = state.answers[min(len(state.keys), len(state.answers)) - 1]
            if status == DROPPED:  # the request arrived; the answer is lost with the connection
                self.close_connection = True
                return
            data = json.dumps({"id": key, **body} if status == 201 else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 503:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def submit(admission: Admission, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: train\ntenant: research\npod_groups: []\n")
    command = [sys.executable, "-m", "tessera.cli", "jobs", "submit", str(spec), "--api", admission.url]
    return subprocess.run([*command, *extra], capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_a_submit_tries_again_through_503s_with_the_same_key(admission: Admission, tmp_path: Path) -> None:
    admission.answers = [UNAVAILABLE, UNAVAILABLE, (201, {})]
    result = submit(admission, tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(admission.keys) == 3 and len(set(admission.keys)) == 1 and admission.keys[0]
    assert result.stdout.strip() == admission.keys[0], "the id admission answered with"
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "admission is unavailable (the database is unavailable; retry shortly); trying again in 0s (1 of 5)",
        "admission is unavailable (the database is unavailable; retry shortly); trying again in 0s (2 of 5)",
    ]


def test_a_submit_gives_up_after_its_retries_with_one_line(admission: Admission, tmp_path: Path) -> None:
    admission.answers = [UNAVAILABLE]
    result = submit(admission, tmp_path, "--retries", "1")
    assert result.returncode == 1
    assert len(admission.keys) == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error 503: the database is unavailable; retry shortly; retry in 0s"
    )


def test_other_errors_are_not_tried_again(admission: Admission, tmp_path: Path) -> None:
    admission.answers = [(500, {"message": "boom"})]
    result = submit(admission, tmp_path)
    assert (result.returncode, len(admission.keys)) == (1, 1)
    assert "error 500: boom" in result.stderr


def test_a_lost_answer_is_tried_again_with_the_same_key(admission: Admission, tmp_path: Path) -> None:
    admission.answers = [(DROPPED, {}), (201, {})]
    result = submit(admission, tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(admission.keys) == 2 and admission.keys[0] == admission.keys[1]
    assert "RemoteProtocolError" in result.stderr and "trying again in 1s (1 of 5)" in result.stderr

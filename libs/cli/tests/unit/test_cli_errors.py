"""The `tessera` command finds the stack through --state-dir and reports errors in one line, no traceback.

Each test runs the real entry point (`python -m tessera.cli`) against a local HTTP server that answers
as admission does (its JSON error bodies), or against a port where nothing listens.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


@dataclass
class Answer:
    status: int = 200
    body: bytes = b"[]"
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Admission:
    url: str
    answer: Answer
    seen: list[tuple[str, str | None]]  # (path, Authorization header)


@pytest.fixture
def admission() -> Iterator[Admission]:
    answer = Answer()
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Admission(f"http://127.0.0.1:{server.server_address[1]}", answer, seen)
    server.shutdown()
    server.server_close()


def write_endpoints(state_dir: Path, admission_url: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    endpoints = {
        "nats_url": "nats://127.0.0.1:4222",
        "database_url": "postgresql://tessera@127.0.0.1:5432/tessera",
        "admission_api_url": admission_url,
        "services": {},
        "kubeconfig": None,
    }
    (state_dir / "endpoints.json").write_text(json.dumps(endpoints))


def tessera(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, "COLUMNS": "200", **env},
        timeout=60,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_state_dir_option_finds_the_stack_through_its_endpoints(admission: Admission, tmp_path: Path) -> None:
    write_endpoints(tmp_path / "elsewhere", admission.url)
    result = tessera("--state-dir", str(tmp_path / "elsewhere"), "jobs", "list", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [path for path, _ in admission.seen] == ["/v1/jobs?limit=50"]


def test_state_dir_from_the_environment(admission: Admission, tmp_path: Path) -> None:
    write_endpoints(tmp_path / "env-state", admission.url)
    result = tessera(
        "jobs", "list", cwd=tmp_path, TESSERA_STATE_DIR=str(tmp_path / "env-state"), TESSERA_TOKEN="t0k"
    )
    assert result.returncode == 0, result.stderr
    assert admission.seen == [("/v1/jobs?limit=50", "Bearer t0k")]


def test_a_401_says_to_pass_a_token(admission: Admission, tmp_path: Path) -> None:
    admission.answer.status = 401
    admission.answer.body = json.dumps(
        {"code": "unauthorized", "message": "a bearer token is required"}
    ).encode()
    write_endpoints(tmp_path / "state", admission.url)
    for command in (["jobs", "list"], ["jobs", "get", "j-1"], ["queues", "status", "q"]):
        result = tessera("--state-dir", str(tmp_path / "state"), *command, cwd=tmp_path)
        assert result.returncode == 1, (command, result.stderr)
        line = one_line(result)
        assert line.startswith("error 401: a bearer token is required"), line
        assert "set TESSERA_TOKEN" in line


def test_a_503_names_the_retry_delay_and_a_plain_text_500_is_one_line(
    admission: Admission, tmp_path: Path
) -> None:
    write_endpoints(tmp_path / "state", admission.url)
    admission.answer.status = 503
    admission.answer.body = json.dumps({"code": "unavailable", "message": "the database is down"}).encode()
    admission.answer.headers = {"Retry-After": "5"}
    result = tessera("--state-dir", str(tmp_path / "state"), "jobs", "get", "j-1", cwd=tmp_path)
    assert result.returncode == 1
    assert one_line(result) == "error 503: the database is down; retry in 5s"

    admission.answer.status, admission.answer.headers = 500, {}
    admission.answer.body, admission.answer.content_type = b"Internal Server Error\nmore", "text/plain"
    result = tessera("--state-dir", str(tmp_path / "state"), "jobs", "list", cwd=tmp_path)
    assert result.returncode == 1
    assert one_line(result).startswith("error 500: Internal Server Error; see the service's log")


def test_a_stopped_stack_is_named_without_a_traceback(tmp_path: Path) -> None:
    write_endpoints(tmp_path / "state", f"http://127.0.0.1:{closed_port()}")
    result = tessera("--state-dir", str(tmp_path / "state"), "jobs", "list", cwd=tmp_path)
    assert result.returncode == 2
    assert f"the stack in {tmp_path / 'state'} is not running (start it with `tessera up`)" in one_line(
        result
    )


def test_no_stack_at_all_says_where_it_looked(tmp_path: Path) -> None:
    result = tessera(
        "--state-dir",
        str(tmp_path / "none"),
        "jobs",
        "list",
        cwd=tmp_path,
        TESSERA_ADMISSION_URL=f"http://127.0.0.1:{closed_port()}",
    )
    assert result.returncode == 2
    line = one_line(result)
    assert f"no stack is running: {tmp_path / 'none' / 'endpoints.json'} does not exist" in line


def test_a_malformed_endpoints_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "endpoints.json").write_text('{"nats_url": 3}')
    result = tessera("--state-dir", str(tmp_path / "state"), "jobs", "list", cwd=tmp_path)
    assert result.returncode == 1
    assert "endpoints.nats_url: expected a string URL" in one_line(result)

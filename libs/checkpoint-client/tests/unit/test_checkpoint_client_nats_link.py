"""The NATS link says when NATS cannot be reached, now and then, and never writes the password its URL
may carry: not in its logs, not in its repr."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from tessera.checkpoint_client.nats_link import NatsLink, without_credentials


def test_credentials_are_taken_out_of_each_server_of_the_url() -> None:
    url = "nats://trainer:s3cret@a:4222, nats://b:4222,tls://x:y@c:4443"
    assert without_credentials(url) == "nats://a:4222,nats://b:4222,tls://c:4443"


def test_an_unreachable_server_is_logged_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    link = NatsLink(f"nats://trainer:s3cret@127.0.0.1:{port}", "job-1", lambda _: None, source="test")
    with caplog.at_level(logging.WARNING, logger="tessera.checkpoint_client.nats_link"):
        link.start()
        deadline = time.monotonic() + 30
        while f"NATS at nats://127.0.0.1:{port}" not in caplog.text:
            assert time.monotonic() < deadline, "no warning about the unreachable server"
            time.sleep(0.05)
        link.close(timeout=30)
        assert not link._thread.is_alive(), "closing waits for no server"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1, "one warning, not a flood"
    assert "s3cret" not in caplog.text and "s3cret" not in repr(link)

"""Loopback TCP ports: probe whether one is free, or ask the kernel for any free one."""

from __future__ import annotations

import socket
from collections.abc import Iterable

LOOPBACK = "127.0.0.1"


def is_port_free(port: int, host: str = LOOPBACK) -> bool:
    """True when nothing listens on ``host:port`` and we could bind it right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A port the kernel says is free now (another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def pick_port(preferred: Iterable[int | None], host: str = LOOPBACK) -> int:
    """The first free port among ``preferred`` (``None`` entries are skipped), else any free port."""
    for port in preferred:
        if port is not None and is_port_free(port, host):
            return port
    return free_port(host)


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False

"""Message size limits: what fits in one NATS message, counted the way the server counts it.

The server refuses any message whose headers and body together exceed its `max_payload` (1 MiB by
default), and it answers by closing the connection. nats.py checks the body alone before sending, so
a body just under the limit plus its CloudEvents headers reaches the server and costs the whole
connection. Every publish in Tessera is therefore measured here first, headers included."""

from __future__ import annotations

from collections.abc import Mapping

NATS_HEADER_LINE = b"NATS/1.0\r\n"
CRLF = b"\r\n"

#: headers a dead-letter copy carries about a body it had to cut
TRUNCATED = "tessera-dlq-truncated"
ORIGINAL_SIZE = "tessera-dlq-original-size"
ORIGINAL_STREAM = "tessera-dlq-original-stream"
ORIGINAL_SEQUENCE = "tessera-dlq-original-sequence"


class MessageTooLarge(ValueError):
    """A message that cannot be published at all: its size is over the server's limit."""

    def __init__(self, size: int, limit: int, subject: str) -> None:
        super().__init__(
            f"message to {subject} is {size} bytes with its headers, over the limit of {limit} bytes"
        )
        self.size = size
        self.limit = limit
        self.subject = subject


def header_bytes(headers: Mapping[str, str] | None) -> int:
    """The size of the header block nats.py writes for `headers` (0 for none)."""
    if not headers:
        return 0
    size = len(NATS_HEADER_LINE) + len(CRLF)
    for key, value in headers.items():
        key = key.strip()
        if key:
            size += len(key.encode()) + 2 + len(value.strip().encode()) + len(CRLF)
    return size


def wire_size(headers: Mapping[str, str] | None, body: bytes) -> int:
    """What the server counts against `max_payload`: the header block plus the body."""
    return header_bytes(headers) + len(body)


def surely_fits(headers: Mapping[str, str] | None, body: bytes, limit: int) -> bool:
    """True when the message is within `limit` whatever its headers encode to: a bound counted at
    C speed (a character is at most 4 bytes of UTF-8), so the exact count runs only near the limit."""
    if not headers:
        return len(body) <= limit
    bound = len(NATS_HEADER_LINE) + len(CRLF) + 4 * (len(headers) + sum(map(len, headers)))
    return len(body) + bound + 4 * sum(map(len, headers.values())) <= limit


def check_fits(subject: str, headers: Mapping[str, str] | None, body: bytes, limit: int) -> None:
    """Raise `MessageTooLarge` when the message would be over `limit` bytes on the wire."""
    if surely_fits(headers, body, limit):
        return
    size = wire_size(headers, body)
    if size > limit:
        raise MessageTooLarge(size, limit, subject)


def fit_body(headers: dict[str, str], body: bytes, limit: int) -> tuple[dict[str, str], bytes]:
    """`headers` and `body` cut to fit `limit`: the body is truncated and the headers say so (and
    how big it was); the caller has already named where the original lies (stream and sequence)."""
    if wire_size(headers, body) <= limit:
        return headers, body
    cut = {**headers, TRUNCATED: "true", ORIGINAL_SIZE: str(len(body))}
    room = limit - header_bytes(cut)
    if room < 0:
        raise MessageTooLarge(header_bytes(cut), limit, "(headers alone)")
    return cut, body[:room]

"""CloudEvents 1.0 in binary mode over NATS; the implementation lives in `tessera.contracts.envelope`."""

from __future__ import annotations

from tessera.contracts.envelope import (
    MSG_ID,
    SPEC_VERSION,
    TRACE_HEADERS,
    Envelope,
    EnvelopeError,
    decode,
    encode,
)

__all__ = ["MSG_ID", "SPEC_VERSION", "TRACE_HEADERS", "Envelope", "EnvelopeError", "decode", "encode"]

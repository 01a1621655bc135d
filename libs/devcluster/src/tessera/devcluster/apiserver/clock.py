"""Timestamps in the RFC 3339 form Kubernetes writes."""

from __future__ import annotations

import datetime


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_now() -> str:
    return rfc3339(datetime.datetime.now(datetime.UTC))


def parse_rfc3339(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)

"""Where the running stack is: `.tessera/endpoints.json` written by `tessera up`, or the environment."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.core.embedded import read_endpoints

#: the port `tessera up` gives admission when it is free
DEFAULT_ADMISSION_URL = "http://127.0.0.1:18080"


def admission_url(state_dir: Path = Path(".tessera")) -> str:
    """`TESSERA_ADMISSION_URL`, else the running stack's endpoints file, else `tessera up`'s default port."""
    configured = os.environ.get("TESSERA_ADMISSION_URL")
    if configured:
        return configured.rstrip("/")
    endpoints = state_dir / "endpoints.json"
    if endpoints.exists():
        url = read_endpoints(endpoints).admission_api_url
        if url:
            return url.rstrip("/")
    return DEFAULT_ADMISSION_URL


#: the port `tessera up` gives telemetry when it is free
DEFAULT_TELEMETRY_URL = "http://127.0.0.1:18081"


def telemetry_url(state_dir: Path = Path(".tessera")) -> str:
    """`TESSERA_TELEMETRY_URL`, else the running stack's endpoints file, else `tessera up`'s default port."""
    configured = os.environ.get("TESSERA_TELEMETRY_URL")
    if configured:
        return configured.rstrip("/")
    endpoints = state_dir / "endpoints.json"
    if endpoints.exists():
        service = read_endpoints(endpoints).services.get("telemetry")
        if service is not None:
            return service.base_url.rstrip("/")
    return DEFAULT_TELEMETRY_URL

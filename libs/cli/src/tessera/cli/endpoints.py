"""Where the running stack is: `.tessera/endpoints.json` written by `tessera up`, or the environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_ADMISSION_URL = "http://127.0.0.1:8080"


def admission_url(state_dir: Path = Path(".tessera")) -> str:
    """`TESSERA_ADMISSION_URL`, else the running stack's endpoints file, else the default port."""
    configured = os.environ.get("TESSERA_ADMISSION_URL")
    if configured:
        return configured.rstrip("/")
    endpoints = state_dir / "endpoints.json"
    if endpoints.exists():
        data = json.loads(endpoints.read_text())
        url = data.get("admission_api_url")
        if url:
            return str(url).rstrip("/")
    return DEFAULT_ADMISSION_URL

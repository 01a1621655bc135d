"""The public traces Tessera ships (see README.md here): one copy, read by the devcluster, the CLI,
the benchmarks and the tests.

`data_dir()` is `$TESSERA_DATA_DIR` when it is set (a directory with the same `openb/` and `genai/`
layout), else this package's directory, which the `tessera-devcluster` wheel includes. The names
below are relative to it.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

ENV_VAR = "TESSERA_DATA_DIR"

OPENB_NODES = Path("openb") / "openb_node_list_gpu_node.csv"
OPENB_PODS = Path("openb") / "openb_pod_list_default.csv"
GENAI_DUTY_CYCLE = Path("genai") / "pod_gpu_duty_cycle.csv.gz"
GENAI_QPS = Path("genai") / "qps.csv.gz"


def bundled_dir() -> Path:
    """This package's directory: the traces as shipped with the repository and the wheel."""
    return Path(str(resources.files(__name__)))


def data_dir() -> Path:
    """`$TESSERA_DATA_DIR` when set, else the bundled traces."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured) if configured else bundled_dir()


def trace(name: Path | str) -> Path:
    """`name` (e.g. `OPENB_PODS`) under `data_dir()`."""
    return data_dir() / name

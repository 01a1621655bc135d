"""Named fault points for crash tests, in the spirit of failpoints: inert unless `TESSERA_FAULTS` names them.

`TESSERA_FAULTS=consumer.after_commit` makes the process SIGKILL itself the first time it reaches that point,
which is how the fault tests prove that a crash between commit and ack, or between publish and mark,
loses and doubles nothing."""

from __future__ import annotations

import os
import signal


def hit(point: str) -> None:
    armed = os.environ.get("TESSERA_FAULTS", "")
    if armed and point in armed.split(","):
        os.kill(os.getpid(), signal.SIGKILL)

"""A child process that we start, watch and stop: the shared base of the embedded servers.

Children run in their own session so that a Ctrl-C in the terminal reaches only us and we can stop
them in order. On Linux each child also asks the kernel for a signal when its parent dies, so even
a parent killed with SIGKILL leaves no orphan behind.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil  # type: ignore[import-untyped]

_PR_SET_PDEATHSIG = 1


class ComponentError(RuntimeError):
    """A component failed to start or stop; the message names it and its log file."""

    def __init__(self, component: str, reason: str, log_file: Path | None = None) -> None:
        where = f" (log: {log_file})" if log_file is not None else ""
        super().__init__(f"{component}: {reason}{where}")
        self.component = component
        self.reason = reason
        self.log_file = log_file


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)

    def _arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return _arm


def tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a log file, for error messages."""
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


class ManagedProcess(abc.ABC):
    """Start/stop/restart of one server process whose output goes to a log file."""

    component = "process"
    #: signals sent in turn by ``stop`` until the process is gone
    stop_signals: Sequence[int] = (signal.SIGTERM, signal.SIGKILL)
    death_signal: int = signal.SIGTERM

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        atexit.register(self.stop)

    # -- to be provided by subclasses ---------------------------------------------------------------
    @abc.abstractmethod
    def command(self) -> list[str]:
        """The command line that starts the process."""

    @abc.abstractmethod
    def is_ready(self) -> bool:
        """Whether the started process serves yet."""

    def prepare(self) -> None:  # noqa: B027 - a hook with nothing to do by default
        """Work done before each start (create directories, initialise data)."""

    def run_as_ids(self) -> tuple[int | None, int | None]:
        """``(uid, gid)`` to run the process as; ``(None, None)`` keeps ours."""
        return None, None

    def env(self) -> Mapping[str, str] | None:
        return None

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The code the last started process exited with; ``None`` while it runs or before a start."""
        return self._proc.poll() if self._proc is not None else None

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until it is ready; raise ``ComponentError`` on failure."""
        if self.is_running:
            return
        self.prepare()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_file.open("ab")
        uid, gid = self.run_as_ids()
        env = self.env()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death_signal(self.death_signal),
            env=dict(env) if env is not None else None,
            user=uid,
            group=gid,
            extra_groups=[] if uid is not None else None,
        )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc is not None else None
                self._close_log()
                raise ComponentError(
                    self.component,
                    f"exited with code {code} while starting\n{tail(self.log_file)}",
                    self.log_file,
                )
            if self.is_ready():
                return
            time.sleep(0.05)
        self.stop()
        raise ComponentError(self.component, f"not ready after {timeout:.0f}s", self.log_file)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process, escalating through ``stop_signals``; a no-op when not running."""
        proc = self._proc
        if proc is None:
            return
        for sig in self.stop_signals:
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        proc.wait()
        # children left in its process group must not outlive it (PostgreSQL's backends are not
        # among them: each runs in a session of its own, and ends once it sees the postmaster gone)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._proc = None
        self._close_log()

    def restart(self, timeout: float = 30.0) -> None:
        """Stop, then start again with the same port and data."""
        self.stop()
        self.start(timeout=timeout)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ManagedProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    """True when ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        status: str = psutil.Process(pid).status()
        return status != str(psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False

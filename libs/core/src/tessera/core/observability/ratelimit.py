"""Rate-limited logging of repeated failures: a failure loop logs once per interval, not per try.

The first occurrence of a key is logged in full (with its traceback when asked); repeats inside the
interval are counted, and the next line logged for that key says how many were left out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

#: keys remembered at most; the oldest are forgotten first (a key per consumer or per error type)
MAX_KEYS = 1024


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(
        self,
        level: int,
        key: str,
        msg: str,
        *,
        extra: Mapping[str, Any] | None = None,
        exc_info: bool = False,
    ) -> bool:
        """Log `msg` unless `key` was logged less than `interval_s` ago; True when it was logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        if last is None and len(self._last) >= MAX_KEYS:
            oldest = min(self._last, key=self._last.__getitem__)
            self._last.pop(oldest)
            self._suppressed.pop(oldest, None)
        self._last[key] = now
        fields = dict(extra or {})
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            fields["suppressed"] = suppressed
        self.logger.log(level, msg, extra=fields, exc_info=exc_info)
        return True

    def warning(self, key: str, msg: str, **kwargs: Any) -> bool:
        return self.log(logging.WARNING, key, msg, **kwargs)

    def error(self, key: str, msg: str, **kwargs: Any) -> bool:
        return self.log(logging.ERROR, key, msg, **kwargs)

"""The models warmed at start: every candidate that can be fit on the synthetic series is fit once; one
that fails is logged and the others are still warmed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest

from tessera.forecaster.domain.selection import Fitted
from tessera.forecaster.entrypoints.loops import WARM_STEPS, warm


@dataclass
class Recording:
    name: str
    needs: int = 10
    fails: bool = False
    fits: list[int] = field(default_factory=list)

    def min_history(self, horizon: int) -> int:
        return self.needs

    def fit(self, history: Sequence[float], horizon: int) -> Fitted:
        self.fits.append(len(history))
        if self.fails:
            raise RuntimeError("no convergence")
        return cast(Fitted, None)  # warm keeps nothing it fits


def test_every_candidate_that_fits_the_series_is_fit_once_and_a_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ok, failing, too_long = Recording("ok"), Recording("bad", fails=True), Recording("long", WARM_STEPS + 1)
    seconds = warm([failing, ok, too_long], horizon=15)
    assert (failing.fits, ok.fits, too_long.fits) == ([WARM_STEPS], [WARM_STEPS], [])
    assert seconds >= 0
    assert [getattr(r, "model", None) for r in caplog.records if r.msg == "warming a model failed"] == ["bad"]


def test_warming_stops_after_the_fit_in_progress_once_the_service_stops() -> None:
    first, second, third = Recording("first"), Recording("second"), Recording("third")
    stop = [False]

    class StopsTheService(Recording):
        def fit(self, history: Sequence[float], horizon: int) -> Fitted:
            stop[0] = True  # the service is told to stop while this fit runs
            return super().fit(history, horizon)

    stopping = StopsTheService("stopping")
    warm([first, stopping, second, third], horizon=15, stopped=lambda: stop[0])
    assert (first.fits, stopping.fits, second.fits, third.fits) == ([WARM_STEPS], [WARM_STEPS], [], [])

"""Per-series forecasting: a backtest chooses the model on a schedule, and every step the chosen model
forecasts from the newest data; the margin learns from resolved forecasts. CPU-bound and synchronous:
the loop runs it in a worker thread, and the benchmark runs it as it is. Nothing here fits on a request."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tessera.forecaster.domain.blend import WeightChooser, blend
from tessera.forecaster.domain.checks import Degraded, InputPolicy, prepare
from tessera.forecaster.domain.forecast import Forecast
from tessera.forecaster.domain.margin import MarginLearner
from tessera.forecaster.domain.selection import (
    MEAN,
    BacktestPlan,
    Candidate,
    Fitted,
    MeanOf,
    Selection,
    backtest,
)


@dataclass(frozen=True)
class EngineConfig:
    horizon: int = 12
    """steps forecast ahead (at least the widest window served)"""
    window_steps: int = 6
    """the window whose maximum is served, and over which forecasts are judged for the margin"""
    refit_every_steps: int = 60
    train_steps: int = 720
    backtest_origins: int = 8
    backtest_stride: int = 6
    margin_q: float = 0.9
    margin_window: int = 240
    min_errors: int = 10
    combine: bool = True
    """serve the mean of every candidate the backtest could score (a forecast combination) rather than
    the single best one; the backtest still scores each, and chooses among them when it is off"""
    prefer: str | None = "level"
    """the candidate served whenever the backtest could score it (the level smoothed for the lead, ADR
    0029; "level-cusum": the same reset by a CUSUM, ADR 0030, measured and not served by default); the
    combination or the best one otherwise. None: the backtest alone decides"""
    calibrate: bool = True
    """seed the margin, while it holds fewer errors than its window, with the served model's
    out-of-sample errors at the window on its training history (where the model gives them)"""
    blend: bool = True
    """serve `w * forecast + (1 - w) * last value`, w chosen each step by `WeightChooser` (the pinball
    loss at `margin_q` of the last `margin_window` judged origins; ADR 0031: never dearer than the
    learnt-margin reactive at 19 of 20 points of five real series, against 12 for the level alone);
    off: the forecast alone"""
    inputs: InputPolicy = field(default_factory=InputPolicy)

    @property
    def plan(self) -> BacktestPlan:
        return BacktestPlan(self.horizon, self.backtest_origins, self.backtest_stride, self.train_steps)


@dataclass
class _Model:
    name: str
    fitted: Fitted
    fitted_at: datetime
    steps_since_fit: int = 0


@dataclass
class _Pending:
    """A forecast not yet judged: its served base (window maximum) is judged against the load at the
    window's end, when replicas started at its origin are up (the window is the actuation lag)."""

    origin: datetime
    base: float
    model: str
    model_base: float = math.nan
    """the model's own window maximum, before blending with the last value"""
    last: float = math.nan


@dataclass(frozen=True)
class Update:
    """One step of one series: a forecast, or the reason there is none; a new selection when it refit;
    errors judged in this step (origin, model, forecast, actual)."""

    forecast: Forecast | None
    degraded: Degraded | None
    last_value: float | None
    selection: Selection | None = None
    fit_seconds: float = 0.0
    judged: tuple[tuple[datetime, str, float, float], ...] = ()
    seeded: tuple[float, ...] = ()
    """errors that calibrated the margin in this step, before any judged ones (oldest first)"""


@dataclass
class SeriesForecaster:
    """The in-memory state of one series: its fitted model, its margin learner, its pending forecasts."""

    config: EngineConfig
    candidates: Callable[[], Sequence[Candidate]]
    clock: Callable[[], float] = time.perf_counter
    model: _Model | None = None
    learner: MarginLearner = field(init=False)
    chooser: WeightChooser = field(init=False)
    pending: list[_Pending] = field(default_factory=list)
    fit_seconds: list[float] = field(default_factory=list)
    calibrated: bool = False
    chooser_seeded: bool = False
    margin_from: datetime | None = None
    """the oldest origin whose judged error the margin learner holds (restored ones included): a
    calibration seeds the margin only with origins before it, so that none is counted twice"""
    margin_until: datetime | None = None
    """the newest restored origin, while nothing has been judged since: a calibration whose origins are
    all newer (the forecaster was down longer than its training history) overlaps none of them"""
    chooser_from: datetime | None = None
    """the same for the chooser's judged pairs"""

    def __post_init__(self) -> None:
        c = self.config
        self.learner = MarginLearner(c.margin_q, c.margin_window, c.min_errors)
        self.chooser = WeightChooser(c.margin_q, c.margin_window, c.min_errors)

    def seed_errors(
        self, errors: Sequence[float], since: datetime | None = None, until: datetime | None = None
    ) -> None:
        """Errors kept from before a restart, oldest first; `since` and `until` are the oldest and the
        newest one's origins (without them, a calibration may seed origins these errors judged)."""
        self.learner.extend(errors)
        if errors and since is not None and self.margin_from is None:
            self.margin_from = since
            self.margin_until = until

    def judge(
        self, values: Sequence[float | None], end: datetime, step_s: float
    ) -> list[tuple[datetime, str, float, float]]:
        """Judge pending forecasts whose window has passed: `values` end at step `end`."""
        judged = []
        keep = []
        w = self.config.window_steps
        for p in self.pending:
            offset = round((end - p.origin).total_seconds() / step_s)  # steps after the origin now known
            if offset < w:
                keep.append(p)
                continue
            at_end = len(values) - offset + w - 1  # the window's last step
            actual = values[at_end] if 0 <= at_end < len(values) else None
            if actual is not None and math.isfinite(actual):
                if math.isfinite(self.learner.observe(p.base, actual)):
                    self.margin_until = None  # judged in this process: up to now
                    if self.margin_from is None:
                        self.margin_from = p.origin
                before = len(self.chooser.pairs)
                self.chooser.observe(actual - p.model_base, actual - p.last)
                if len(self.chooser.pairs) != before and self.chooser_from is None:
                    self.chooser_from = p.origin
                judged.append((p.origin, p.model, p.base, actual))
        self.pending = keep
        return judged

    def _served_model(self, selection: Selection) -> Candidate:
        candidates = self.candidates()
        if self.config.prefer is not None and self.config.prefer in selection.passed:
            return next(c for c in candidates if c.name == self.config.prefer)
        if selection.chosen == MEAN:
            return MeanOf(tuple(c for c in candidates if c.name in selection.passed))
        return next(c for c in candidates if c.name == selection.chosen)

    def _calibrate(
        self, fitted: Fitted, history: Sequence[float], end: datetime, step_s: float
    ) -> tuple[float, ...]:
        """Seed the margin with the fitted model's own errors at the window, once, while it is short;
        blended as the first forecast will be when the chooser could be seeded from the same history.
        Each is seeded only with origins older than the first it has judged (a refit after some were
        judged, or a restart with errors restored, would otherwise count the newest origins twice)."""
        calibration = getattr(fitted, "calibration", None)
        if calibration is None:
            return ()
        calibration = tuple(calibration)
        lead: int | None = getattr(fitted, "lead", None)
        if self.config.blend and not self.chooser_seeded and len(self.chooser.pairs) < self.chooser.window:
            pairs = self._pairs(calibration, history, lead)
            self._seed_chooser(pairs[: self._older(len(pairs), lead, end, step_s, self.chooser_from)])
        if not self.config.calibrate or self.calibrated:
            return ()
        if self.config.blend:
            w = self.chooser.weight()
            w_errors = [blend(m, r, w) for m, r in self._pairs(calibration, history, lead)]
            calibration = tuple(w_errors) if len(w_errors) == len(calibration) else calibration
        since = self.margin_from
        if since is not None and self.margin_until is not None:
            oldest = self._origin(0, len(calibration), lead, end, step_s)
            since = None if self.margin_until < oldest else since
        calibration = calibration[: self._older(len(calibration), lead, end, step_s, since)]
        if len(self.learner.errors) >= self.learner.window:
            return ()
        self.calibrated = True
        kept = self.learner.seed(calibration)
        return tuple(calibration[len(calibration) - kept :]) if kept else ()

    def _pairs(
        self, calibration: Sequence[float], history: Sequence[float], lead: int | None
    ) -> list[tuple[float, float]]:
        """The calibration's errors (the newest origins of the training history, judged `lead` steps
        later) paired with the last value's errors at the same origins; none if they cannot be aligned
        (judged at another lead than `window_steps`, or longer than the history)."""
        values = history[-self.config.train_steps :]
        w, n = self.config.window_steps, len(calibration)
        first = len(values) - w - n
        if n == 0 or first < 0 or lead != w:
            return []
        return [(calibration[i], values[first + i + w] - values[first + i]) for i in range(n)]

    def _origin(self, i: int, n: int, lead: int | None, end: datetime, step_s: float) -> datetime:
        """The origin of the i-th of `n` calibration errors: the newest is judged at `end` (the
        history's last step), `lead` steps (the window where not given) after its origin."""
        steps = (lead if lead is not None else self.config.window_steps) + n - 1 - i
        return end - timedelta(seconds=steps * step_s)

    def _older(self, n: int, lead: int | None, end: datetime, step_s: float, since: datetime | None) -> int:
        """How many of the first of `n` calibration errors have origins before `since`."""
        if since is None or n == 0:
            return n
        newest = self._origin(n - 1, n, lead, end, step_s)
        newer = math.floor((newest - since).total_seconds() / step_s) + 1  # origins from `since` on
        return max(0, min(n, n - newer))

    def _seed_chooser(self, pairs: Sequence[tuple[float, float]]) -> None:
        """Rebuild the chooser from the history (at the first fit, and after a restart): the judged
        origins are not persisted, but the model's out-of-sample errors on its training history are known."""
        if pairs:
            self.chooser.seed(pairs)
            self.chooser_seeded = True

    def step(self, values: Sequence[float | None], end: datetime, step_s: float) -> Update:
        """Forecast the steps after `end` (the newest complete step) from `values`, which end there."""
        judged = tuple(self.judge(values, end, step_s))
        last = next((v for v in reversed(values) if v is not None and math.isfinite(v)), None)
        prepared = prepare(values, self.config.inputs)
        if prepared.degraded is not None:
            return Update(None, prepared.degraded, last, judged=judged)
        history = prepared.values
        selection: Selection | None = None
        seeded: tuple[float, ...] = ()
        fit_s = 0.0
        c = self.config
        if self.model is None or self.model.steps_since_fit >= c.refit_every_steps:
            started = self.clock()
            selection = backtest(history, self.candidates(), c.plan, self.clock, combine=c.combine)
            if selection.chosen is None:
                self.model = None
                fit_s = self.clock() - started
                return Update(None, Degraded.FIT_FAILED, last, selection, fit_s, judged)
            chosen = self._served_model(selection)
            try:
                fitted = chosen.fit(history[-c.train_steps :], c.horizon)
            except Exception:
                self.model = None
                return Update(None, Degraded.FIT_FAILED, last, selection, self.clock() - started, judged)
            self.model = _Model(chosen.name, fitted, end)
            if chosen.name != selection.chosen:
                selection = dataclasses.replace(selection, chosen=chosen.name)
            stale = len(values) - next(  # steps after the newest reading, which prepare() left out
                (i + 1 for i in range(len(values) - 1, -1, -1) if _present(values[i])), len(values)
            )
            seeded = self._calibrate(fitted, history, end - timedelta(seconds=stale * step_s), step_s)
            fit_s = self.clock() - started
            self.fit_seconds.append(fit_s)
        assert self.model is not None
        self.model.steps_since_fit += 1
        try:
            predicted = self.model.fitted.predict(history[-c.train_steps :], c.horizon)
        except Exception:
            self.model = None  # refit at the next step
            return Update(None, Degraded.FIT_FAILED, last, selection, fit_s, judged)
        if len(predicted) < c.horizon or not all(math.isfinite(v) for v in predicted):
            self.model = None
            return Update(None, Degraded.FIT_FAILED, last, selection, fit_s, judged)
        predicted = [max(0.0, v) for v in predicted]  # a load is never negative
        model_base = max(predicted[: c.window_steps])
        name = self.model.name
        if c.blend:
            weight = self.chooser.weight()
            predicted = [blend(v, history[-1], weight) for v in predicted]
            name = served_name(name, weight)
        margin = self.learner.margin() or 0.0
        hour = history[-max(1, round(3600 / step_s)) :]
        forecast = Forecast(
            origin=end,
            step_s=step_s,
            values=tuple(predicted),
            model=name,
            margin=margin,
            level=sum(hour) / len(hour),
            last_value=history[-1],
        )
        self.pending.append(_Pending(end, max(predicted[: c.window_steps]), name, model_base, history[-1]))
        return Update(forecast, None, last, selection, fit_s, judged, seeded)


def _present(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def served_name(model: str, weight: float) -> str:
    """What is served: the model's name, with the last value's share when it has one."""
    if weight >= 1.0:
        return model
    if weight <= 0.0:
        return "last-value"
    return f"{model}*{weight:g}+last-value"

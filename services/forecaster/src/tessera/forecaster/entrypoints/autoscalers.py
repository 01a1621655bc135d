"""The PredictiveAutoscaler controller's loop: with a kubeconfig, every autoscaler is reconciled each
`controller_interval_s` (level-triggered: a missed change is caught at the next pass)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from tessera.core.waits import wait_any
from tessera.forecaster.adapters.kube_autoscalers import KubeAutoscalers
from tessera.forecaster.adapters.prometheus import PrometheusSource
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.service_layer.autoscaling import AutoscalerController
from tessera.forecaster.service_layer.dependencies import ForecasterDeps

log = logging.getLogger(__name__)


def scaler_address(settings: ForecasterSettings, deps: ForecasterDeps) -> Callable[[], str]:
    def address() -> str:
        if settings.scaler_address:
            return settings.scaler_address
        return f"127.0.0.1:{deps.scaler_port or settings.grpc_port}"

    return address


def autoscaler_task(
    settings: ForecasterSettings,
) -> Callable[[ForecasterDeps, asyncio.Event], Coroutine[Any, Any, None]]:
    """The controller's passes until the service stops, or `until` is set (this replica stopped leading)."""

    async def control_autoscalers(deps: ForecasterDeps, until: asyncio.Event) -> None:
        cluster = KubeAutoscalers(settings.kubeconfig)
        prometheus = PrometheusSource(settings.prometheus_url) if settings.prometheus_url else None
        controller = AutoscalerController(deps, cluster, scaler_address(settings, deps), prometheus)
        try:
            while not (deps.stop.is_set() or until.is_set()):
                try:
                    await controller.reconcile_all()
                except Exception as exc:  # the API server may be away; the next pass tries again
                    log.warning("autoscaler pass failed", extra={"error": repr(exc)})
                deps.autoscaler_passes += 1
                await wait_any(deps.stop, until, timeout=settings.controller_interval_s)
        finally:
            cluster.close()

    return control_autoscalers

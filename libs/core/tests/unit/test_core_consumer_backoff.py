from __future__ import annotations

import asyncio

import pytest

from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings


async def _noop(*_: object) -> None:
    return None


@pytest.mark.parametrize(("deliveries", "delay"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (10, 30.0)])
def test_retry_delay_doubles_per_delivery_up_to_the_cap(deliveries: int, delay: float) -> None:
    spec = ConsumerSpec("c", "admission", "s", _noop).configured(
        ConsumerSettings(backoff_base_s=0.5, backoff_max_s=30)
    )
    runner = ConsumerRunner(None, spec, lambda: None, "admission", Metrics(), asyncio.Event())  # type: ignore[arg-type]
    assert runner.backoff(deliveries) == delay
    assert runner.dlq_subject == "tessera.admission.dlq.c"

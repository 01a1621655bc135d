"""The closed autoscaling loop under `tessera up`: the GenAI QPS trace replayed fast (a trace minute a
forecaster step, one second here) into two Deployments applied with kubectl. One is scaled by a plain
HPA on the metric as it is now; the other by the HPA a PredictiveAutoscaler (`via: hpa`, `Auto`) owns,
on the forecast. Both HPAs read the same series through the same path: the devcluster's simulated HPA
controller asks its API server, which proxies `external.metrics.k8s.io` to the forecaster (the APIService
`tessera up` registered, over HTTPS with the stack's CA); the plain one asks for a window of 0 (the last
reading), the owned one for the prediction window. Both have the owned HPA's scale-down window, so only
the metric differs. The load each step is published as a `record_metric` CloudEvent and shared by each
Deployment's ready pods; a step is short when fewer pods are ready than it needs.

The history the forecaster fits on is published first, stamped in the past; the replay then goes on
live from the next trace minute. Its first PRE_ROLL steps let the forecaster choose a model on the
history (as a running forecaster has long before) and are not compared."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
import yaml
from kubernetes import client

from bench.forecast import load_series
from tessera.cli.devcluster import devcluster_url
from tessera.cluster.kube import api_client
from tessera.contracts.events import RecordMetric
from tessera.core.messaging.envelope import encode
from tessera.devcluster.data import GENAI_QPS, trace
from tessera.devcluster.sim.load import LoadGenerator, LoadStep
from tessera.forecaster.domain.autoscaler import HPA_SCALE_DOWN_WINDOW_S
from tests.e2e.harness import ROOT, Stack, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NS = "autoscaling-e2e"
METRIC, SERIES = "requests_per_s", {"app": "chat-e2e"}
PREDICTIVE, REACTIVE = "chat-predictive", "chat-reactive"
STEP_S = 1.0  # the stack's forecaster step (tests/e2e/harness.py)
HISTORY = 230  # trace minutes published as history, stamped in the past
PRE_ROLL = 40  # replayed steps while the forecaster fits on the history; not compared
COMPARED = 60  # then the next hour: load rises from under one replica's worth to about nine
CAPACITY = 1.0  # requests per second one ready pod carries
# the whole actuation lag, in the forecaster's seconds: the step a forecast is behind, an HPA sync
# (15 simulated seconds: 1.5 s at the stack's speed x10), the pods' binding and start
WINDOW_S = 5
CRD = ROOT / "deploy" / "crds" / "tessera.io_predictiveautoscalers.yaml"


def printer_columns() -> list[str]:
    """The headers `kubectl get` prints by default: the name, then the CRD's printer columns that are
    not `-o wide` ones (the age among them)."""
    version = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]
    return [
        "NAME",
        *(c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")),
    ]


def qps_trace() -> list[float]:
    """The GenAI QPS per minute, as bench.forecast reads it (windows summed, minutes averaged)."""
    y, _ = load_series(trace(GENAI_QPS), "timestamp_anon", "value", False, 60.0)
    return [float(v) for v in y[: HISTORY + PRE_ROLL + COMPARED]]


def deployment(name: str) -> dict[str, Any]:
    """A serving Deployment whose CPU-only pods Tessera's scheduler binds."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "schedulerName": "tessera",
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                        }
                    ],
                },
            },
        },
    }


def manifests() -> list[dict[str, Any]]:
    plain_hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": REACTIVE, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": REACTIVE},
            "minReplicas": 1,
            "maxReplicas": 20,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        # window 0: the last reading, not a forecast
                        "metric": {"name": METRIC, "selector": {"matchLabels": {**SERIES, "window": "0"}}},
                        "target": {"type": "AverageValue", "averageValue": str(CAPACITY)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": HPA_SCALE_DOWN_WINDOW_S}},
        },
    }
    autoscaler = {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "PredictiveAutoscaler",
        "metadata": {"name": PREDICTIVE, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": PREDICTIVE},
            "minReplicas": 1,
            "maxReplicas": 20,
            "metric": {"type": "events", "events": {"name": METRIC}, "selector": SERIES},
            "target": CAPACITY,
            "predictionWindowSeconds": WINDOW_S,
            "mode": "Auto",
            "via": "hpa",
        },
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    return [namespace, deployment(PREDICTIVE), deployment(REACTIVE), plain_hpa, autoscaler]


async def publish_history(js: Any, rates: list[float], last: datetime) -> None:
    for i, value in enumerate(rates):
        at = last - timedelta(seconds=STEP_S * (len(rates) - 1 - i))
        subject, headers, body = encode(
            RecordMetric(metric=METRIC, labels=SERIES, value=value, at=at), "tessera/e2e"
        )
        await js.publish(subject, body, headers=headers)


def autoscaler_status(custom: client.CustomObjectsApi) -> dict[str, Any]:
    found: Any = custom.get_namespaced_custom_object(
        "tessera.io", "v1alpha1", NS, "predictiveautoscalers", PREDICTIVE
    )
    return dict(found.get("status") or {})


async def watch_sources(
    custom: client.CustomObjectsApi, steps: list[LoadStep], seen: list[tuple[int, str]]
) -> None:
    """The PredictiveAutoscaler's `status.source` once a step, with the replay step it was read at."""
    while True:
        status = await asyncio.to_thread(autoscaler_status, custom)
        seen.append((len(steps), str(status.get("source"))))
        await asyncio.sleep(STEP_S)


async def test_a_predictive_autoscaler_is_short_on_fewer_steps_than_a_plain_hpa(stack: Stack) -> None:
    rates = qps_trace()
    stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(manifests()))
    url = devcluster_url(stack.kubeconfig)
    api = api_client(kubeconfig=str(stack.kubeconfig))
    custom = client.CustomObjectsApi(api)
    connection = await nats.connect(stack.nats_url)
    js = connection.jetstream()

    async def record(load: float, at: datetime) -> None:
        subject, headers, body = encode(
            RecordMetric(metric=METRIC, labels=SERIES, value=load, at=at), "tessera/e2e"
        )
        await js.publish(subject, body, headers=headers)

    replay = rates[HISTORY:]
    predictive = LoadGenerator(url, NS, PREDICTIVE, replay, CAPACITY, STEP_S, on_load=record)
    reactive = LoadGenerator(url, NS, REACTIVE, replay, CAPACITY, STEP_S)
    sources: list[tuple[int, str]] = []
    try:
        until(
            lambda: predictive.ready_pods() >= 1 and reactive.ready_pods() >= 1,
            "a ready pod of each Deployment",
            60,
        )
        # the history ends at the last complete step; the replay publishes from the current one on
        last = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=STEP_S)
        await publish_history(js, rates[:HISTORY], last)
        watching = asyncio.create_task(watch_sources(custom, predictive.steps, sources))
        try:
            await asyncio.gather(predictive.run(), reactive.run())
        finally:
            watching.cancel()
        shown = stack.kubectl("get", "predictiveautoscalers", "-n", NS)
        owned = json.loads(stack.kubectl("get", "hpa", PREDICTIVE, "-n", NS, "-o", "json"))
        selector = f"app%3D{SERIES['app']}%2Cwindow%3D{WINDOW_S}"
        raw = stack.kubectl(
            "get",
            "--raw",
            f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/{METRIC}?labelSelector={selector}",
        )
    finally:
        await predictive.close()
        await reactive.close()
        await connection.close()
        api.close()  # type: ignore[no-untyped-call]
        cleanup = yaml.safe_dump_all(list(reversed(manifests())))
        stack.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=cleanup)

    forecasting = [step for step, source in sources if source == "forecast"]
    assert forecasting and forecasting[0] <= PRE_ROLL, (
        f"the forecaster served no forecast within the {PRE_ROLL}-step pre-roll: {sources}"
    )
    compared = [s.index for s in predictive.steps if s.index >= PRE_ROLL]
    assert len(compared) == COMPARED
    predictive_short = predictive.under_provisioned(since=PRE_ROLL)
    reactive_short = reactive.under_provisioned(since=PRE_ROLL)
    served = [source for step, source in sources if step >= PRE_ROLL]
    print(
        f"short steps of {COMPARED}: plain HPA {reactive_short}, PredictiveAutoscaler {predictive_short}; "
        f"forecast served at {served.count('forecast')} of {len(served)} readings"
    )
    assert served.count("forecast") > len(served) / 2, sources
    assert predictive_short < reactive_short

    # the HPA it owns, and what kubectl shows of it
    assert [r["kind"] for r in owned["metadata"]["ownerReferences"]] == ["PredictiveAutoscaler"]
    header, row = shown.splitlines()[:2]
    assert header.split() == printer_columns(), shown
    cells = row.split()
    assert cells[:4] == [PREDICTIVE, PREDICTIVE, "Auto", "hpa"], shown
    assert cells[4] != "<none>" and float(cells[5]) > 0 and int(cells[6]) >= 1, shown
    # the metric the HPAs read, through the API server's aggregation layer, from the forecaster
    (item,) = json.loads(raw)["items"]
    assert (item["metricName"], item["windowSeconds"]) == (METRIC, WINDOW_S), item
    assert item["metricLabels"]["tessera.io/source"] in ("forecast", "reactive"), item
    assert math.isfinite(float(item["value"].removesuffix("m")))

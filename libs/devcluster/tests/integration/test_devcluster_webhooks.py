"""Mutating admission webhooks, through the official client: a registered
MutatingWebhookConfiguration is called with an AdmissionReview for matching creates, its JSONPatch is
applied, its denial and an unreachable webhook (failurePolicy Fail) refuse the create, Ignore lets it
through, and unmatched objects are untouched. Pods a controller creates pass the webhooks too."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import api_client, start_cluster, wait_for

pytestmark = pytest.mark.integration

QUEUE = "tessera.io/queue"
NS = "default"


class Webhook:
    """A webhook server on loopback: records each AdmissionReview; suspends labelled Jobs, gates pods,
    and denies objects labelled `deny`."""

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.reviews: list[dict[str, Any]] = []
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                webhook.reviews.append(review)
                if "slow" in (review["request"]["object"]["metadata"].get("labels") or {}):
                    time.sleep(3)  # past the webhook's timeoutSeconds
                body = json.dumps(webhook.answer(review["request"])).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the API server gave up waiting (the timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/mutate"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        labels = request["object"]["metadata"].get("labels") or {}
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if "deny" in labels:
            response = {
                "uid": request["uid"],
                "allowed": False,
                "status": {"code": 403, "reason": "Forbidden", "message": "queue closed"},
            }
        elif request["kind"]["kind"] == "Job":
            patch = [
                {"op": "add", "path": "/spec/suspend", "value": True},
                {"op": "add", "path": "/spec/template/spec/schedulerName", "value": "tessera"},
            ]
            response.update(
                patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode()
            )
        elif request["kind"]["kind"] == "Pod":
            patch = [
                {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "tessera.io/admission"}]}
            ]
            response.update(
                patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode()
            )
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def configuration(name: str, url: str, resources: list[str], **hook: Any) -> dict[str, Any]:
    group = {"jobs": "batch", "pods": ""}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.tessera.io",
                "clientConfig": {"url": url},
                "rules": [
                    {
                        "apiGroups": [group[r]],
                        "apiVersions": ["v1"],
                        "resources": [r],
                        "operations": ["CREATE"],
                    }
                    for r in resources
                ],
                "objectSelector": {"matchExpressions": [{"key": QUEUE, "operator": "Exists"}]},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "timeoutSeconds": 5,
                **hook,
            }
        ],
    }


def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                    ],
                },
            }
        },
    }


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    with api_client(cluster) as api:
        yield api


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    server = Webhook()
    yield server
    server.close()


def register(api: client.ApiClient, body: dict[str, Any]) -> None:
    client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(body)


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/mutate"


def test_a_matching_create_is_patched_and_an_unlabelled_one_is_untouched(
    api: client.ApiClient, webhook: Webhook
) -> None:
    register(api, configuration("queue", webhook.url, ["jobs"]))
    batch = client.BatchV1Api(api)

    batch.create_namespaced_job(NS, job("queued", {QUEUE: "team-a"}))
    batch.create_namespaced_job(NS, job("plain", {"team": "a"}))

    queued, plain = batch.read_namespaced_job("queued", NS), batch.read_namespaced_job("plain", NS)
    assert queued.spec.suspend is True and queued.spec.template.spec.scheduler_name == "tessera"
    assert plain.spec.suspend is False and plain.spec.template.spec.scheduler_name != "tessera"
    (review,) = webhook.reviews
    request = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", NS, "queued")
    assert request["kind"] == {"group": "batch", "version": "v1", "kind": "Job"}
    assert request["resource"] == {"group": "batch", "version": "v1", "resource": "jobs"}
    assert request["object"]["spec"]["suspend"] is False  # defaulted before the webhook sees it


def test_a_denial_refuses_the_create_with_the_webhooks_message(
    api: client.ApiClient, webhook: Webhook
) -> None:
    register(api, configuration("queue", webhook.url, ["jobs"]))

    with pytest.raises(ApiException) as refused:
        client.BatchV1Api(api).create_namespaced_job(NS, job("closed", {QUEUE: "team-a", "deny": "yes"}))

    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert message == 'admission webhook "queue.tessera.io" denied the request: queue closed'
    with pytest.raises(ApiException) as missing:
        client.BatchV1Api(api).read_namespaced_job("closed", NS)
    assert missing.value.status == 404


def test_an_unreachable_webhook_refuses_with_fail_and_is_skipped_with_ignore(api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    register(api, configuration("strict", closed_port_url(), ["jobs"]))

    with pytest.raises(ApiException) as refused:
        batch.create_namespaced_job(NS, job("refused", {QUEUE: "team-a"}))
    assert refused.value.status == 500
    assert 'failed calling webhook "strict.tessera.io"' in json.loads(refused.value.body)["message"]
    batch.create_namespaced_job(NS, job("unlabelled", {"team": "a"}))  # not matched, never called

    client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("strict")
    register(api, configuration("lenient", closed_port_url(), ["jobs"], failurePolicy="Ignore"))
    batch.create_namespaced_job(NS, job("let-through", {QUEUE: "team-a"}))
    assert batch.read_namespaced_job("let-through", NS).spec.suspend is False


def test_a_namespace_selector_limits_the_webhook_to_labelled_namespaces(
    api: client.ApiClient, webhook: Webhook
) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": "team-a", "labels": {"tessera.io/tenant": "a"}}})
    core.create_namespace({"metadata": {"name": "elsewhere"}})
    selector = {"matchLabels": {"tessera.io/tenant": "a"}}
    register(api, configuration("queue", webhook.url, ["jobs"], namespaceSelector=selector))

    batch.create_namespaced_job("team-a", job("inside", {QUEUE: "q"}))
    batch.create_namespaced_job("elsewhere", job("outside", {QUEUE: "q"}))

    assert batch.read_namespaced_job("inside", "team-a").spec.suspend is True
    assert batch.read_namespaced_job("outside", "elsewhere").spec.suspend is False
    assert [r["request"]["namespace"] for r in webhook.reviews] == ["team-a"]


def test_the_pods_a_controller_creates_pass_the_webhooks(api: client.ApiClient, webhook: Webhook) -> None:
    register(api, configuration("gate", webhook.url, ["pods"]))
    client.BatchV1Api(api).create_namespaced_job(NS, job("gated", {QUEUE: "team-a"}))

    core = client.CoreV1Api(api)
    pods = wait_for(
        lambda: core.list_namespaced_pod(NS, label_selector="batch.kubernetes.io/job-name=gated").items
    )

    (pod,) = pods
    assert [g.name for g in pod.spec.scheduling_gates] == ["tessera.io/admission"]
    assert [r["request"]["kind"]["kind"] for r in webhook.reviews] == ["Pod"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"clientConfig": {"url": "http://webhook.example.com/mutate"}}, "webhooks[0].clientConfig.url"),
        ({"sideEffects": None}, "webhooks[0].sideEffects"),
        ({"admissionReviewVersions": ["v2"]}, "webhooks[0].admissionReviewVersions"),
        ({"timeoutSeconds": 45}, "webhooks[0].timeoutSeconds"),
        ({"name": "queue"}, "webhooks[0].name"),
    ],
    ids=["http off loopback", "no side effects", "no known review version", "timeout too long", "short name"],
)
def test_a_bad_configuration_is_refused_naming_the_field(
    api: client.ApiClient, change: dict[str, Any], field: str
) -> None:
    body = configuration("bad", "http://127.0.0.1:9/mutate", ["jobs"])
    hook = body["webhooks"][0]
    hook.update(change)
    for key in [k for k, v in change.items() if v is None]:
        del hook[key]  # left out altogether

    # posted as is: the official client would refuse some of these before sending them
    request = urllib.request.Request(
        f"{api.configuration.host}/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)

    assert refused.value.code == 422
    assert json.loads(refused.value.read())["details"]["causes"][0]["field"] == field


def test_a_registered_configuration_gets_the_servers_defaults(api: client.ApiClient) -> None:
    body = configuration("defaults", "http://127.0.0.1:9/mutate", ["jobs"])
    del body["webhooks"][0]["timeoutSeconds"]
    register(api, body)

    stored = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration("defaults")
    (hook,) = stored.webhooks
    assert (hook.failure_policy, hook.match_policy, hook.timeout_seconds) == ("Fail", "Equivalent", 10)
    assert hook.reinvocation_policy == "Never" and hook.rules[0].scope == "*"


def test_a_pod_the_webhook_refuses_is_a_failed_create_event_on_the_job_and_retried(
    api: client.ApiClient,
) -> None:
    register(api, configuration("gate", closed_port_url(), ["pods"]))
    client.BatchV1Api(api).create_namespaced_job(NS, job("blocked", {QUEUE: "team-a"}))
    core = client.CoreV1Api(api)

    def failed_creates() -> list[client.CoreV1Event]:
        events = core.list_namespaced_event(NS, field_selector="involvedObject.name=blocked").items
        return [e for e in events if e.reason == "FailedCreate"]

    (event,) = wait_for(lambda: (found := failed_creates()) and found[0].count >= 2 and found, what="retries")
    assert event.type == "Warning" and 'failed calling webhook "gate.tessera.io"' in event.message
    assert core.list_namespaced_pod(NS, label_selector="batch.kubernetes.io/job-name=blocked").items == []


def test_a_webhook_past_its_timeout_refuses_the_create(api: client.ApiClient, webhook: Webhook) -> None:
    register(api, configuration("queue", webhook.url, ["jobs"], timeoutSeconds=1))

    with pytest.raises(ApiException) as refused:
        client.BatchV1Api(api).create_namespaced_job(NS, job("slow", {QUEUE: "team-a", "slow": "yes"}))

    assert refused.value.status == 500
    message = json.loads(refused.value.body)["message"]
    assert 'failed calling webhook "queue.tessera.io"' in message and "context deadline exceeded" in message


def self_signed_certificate(directory: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 that is its own CA, made with the openssl binary."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the openssl binary is needed to make a test certificate: apt-get install openssl")
    cert, key = directory / "webhook.crt", directory / "webhook.key"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    output = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject, *output],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_an_https_webhook_is_called_with_its_ca_bundle_and_refused_without(
    api: client.ApiClient, tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server = Webhook(tls=(cert, key))
    try:
        batch = client.BatchV1Api(api)
        bundle = base64.b64encode(Path(cert).read_bytes()).decode()
        trusted = configuration("queue", server.url, ["jobs"])
        trusted["webhooks"][0]["clientConfig"]["caBundle"] = bundle
        register(api, trusted)

        batch.create_namespaced_job(NS, job("over-tls", {QUEUE: "team-a"}))
        assert batch.read_namespaced_job("over-tls", NS).spec.suspend is True

        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("queue")
        register(api, configuration("untrusted", server.url, ["jobs"]))  # no caBundle: system roots
        with pytest.raises(ApiException) as refused:
            batch.create_namespaced_job(NS, job("unverified", {QUEUE: "team-a"}))
        assert refused.value.status == 500 and "certificate" in json.loads(refused.value.body)["message"]
    finally:
        server.close()

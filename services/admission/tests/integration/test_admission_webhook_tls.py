"""Admission serves its webhook over HTTPS on its own port when given a certificate: a real TLS
handshake against a CA made for the test (the openssl binary), and the devcluster's API server
calling the webhook with that CA as the configuration's `caBundle`, as a real API server does."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from kubernetes import client as k8s

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings, WebhookSettings
from tessera.admission.entrypoints.webhook import MUTATE_PATH, webhook_configuration
from tessera.admission.entrypoints.webhook_server import reloader_of, tls_server, webhook_app
from tessera.cluster.kube import api_client
from tessera.core.embedded import free_port
from tessera.core.runner import create_app
from tessera.devcluster.runner import DevCluster
from tessera.testing.pki import Pki, make_pki
from tessera.testing.services import eventually, settings_for

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), "test-ca")


@dataclass(frozen=True)
class Serving:
    http: str
    """The plain HTTP base URL (API, health, and the webhook for `tessera up`)."""
    https: str
    """The webhook's HTTPS base URL."""


@contextlib.asynccontextmanager
async def serving(db: tuple[str, str], pki: Pki) -> AsyncIterator[Serving]:
    """The whole admission service, as `serve` runs it, with the webhook's certificate."""
    https_port = free_port()
    webhook = {"port": https_port, "cert_file": str(pki.cert), "key_file": str(pki.key)}
    settings = settings_for(AdmissionSettings, *db, webhook=webhook)
    server = uvicorn.Server(uvicorn.Config(create_app(build(settings), settings), host="127.0.0.1", port=0))
    task = asyncio.create_task(server.serve())
    https = f"https://127.0.0.1:{https_port}"
    trusted = ssl.create_default_context(cafile=str(pki.ca))

    async def both_listening() -> bool:
        if not server.started:
            return False
        try:
            async with httpx.AsyncClient(verify=trusted) as client:
                await client.get(f"{https}/")
        except httpx.TransportError:
            return False
        return True

    try:
        await eventually(both_listening, what="admission serving HTTP and the webhook over HTTPS")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield Serving(f"http://127.0.0.1:{port}", https)
    finally:
        server.should_exit = True
        await task


def review(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "b5a4c3d2-0000-4000-8000-000000000001",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "namespace": "team-a",
            "operation": "CREATE",
            "object": job("train", labels),
        },
    }


def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completions": 1,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                },
            },
        },
    }


async def test_the_webhook_answers_over_tls_to_a_client_that_trusts_its_ca(
    admission_db: tuple[str, str], pki: Pki
) -> None:
    async with serving(admission_db, pki) as urls:
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        async with httpx.AsyncClient(verify=trusted) as client:
            answer = await client.post(urls.https + MUTATE_PATH, json=review({"tessera.io/queue": "team-a"}))
            assert answer.status_code == 200
            response = answer.json()["response"]
            assert response["uid"] == "b5a4c3d2-0000-4000-8000-000000000001"
            assert response["allowed"] is True and response["patchType"] == "JSONPatch"
            assert {"op": "add", "path": "/spec/suspend", "value": True} in _patch(response)
            # the HTTPS port serves the webhook alone: the API and its tokens stay on the HTTP port
            assert (await client.get(urls.https + "/v1/jobs")).status_code == 404

        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            async with httpx.AsyncClient(verify=ssl.create_default_context()) as untrusting:
                await untrusting.post(urls.https + MUTATE_PATH, json=review({"tessera.io/queue": "a"}))

        async with httpx.AsyncClient() as plain:  # loopback HTTP, as `tessera up` registers it
            answer = await plain.post(urls.http + MUTATE_PATH, json=review({"tessera.io/queue": "team-a"}))
            assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        yield dev.write_kubeconfig(tmp_path / "kubeconfig")


async def test_the_api_server_calls_the_https_webhook_with_the_ca_bundle_and_the_job_is_held(
    admission_db: tuple[str, str], pki: Pki, cluster: Path
) -> None:
    api = api_client(kubeconfig=str(cluster))
    batch = k8s.BatchV1Api(api)
    registrations = k8s.AdmissionregistrationV1Api(api)
    async with serving(admission_db, pki) as urls:
        bundle = base64.b64encode(pki.ca.read_bytes()).decode()
        config = webhook_configuration(urls.https, ca_bundle=bundle)
        await asyncio.to_thread(registrations.create_mutating_webhook_configuration, config)
        await asyncio.to_thread(
            batch.create_namespaced_job, "default", job("held", {"tessera.io/queue": "team-a"})
        )
        held = await asyncio.to_thread(batch.read_namespaced_job, "held", "default")
        assert held.spec.suspend is True
        assert held.spec.template.spec.scheduler_name == "tessera"

        # the same webhook without the CA: the API server cannot verify it, and Fail refuses the create
        await asyncio.to_thread(
            registrations.delete_mutating_webhook_configuration, config["metadata"]["name"]
        )
        await asyncio.to_thread(
            registrations.create_mutating_webhook_configuration, webhook_configuration(urls.https)
        )
        with pytest.raises(k8s.ApiException) as refused:
            await asyncio.to_thread(
                batch.create_namespaced_job, "default", job("unverified", {"tessera.io/queue": "team-a"})
            )
        assert refused.value.status == 500 and "certificate" in str(refused.value.body)


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    first, renewed = make_pki(tmp_path / "first", "first-ca"), make_pki(tmp_path / "renewed", "renewed-ca")
    mounted = tmp_path / "mounted"  # the Secret's files, as the kubelet mounts them
    mounted.mkdir()
    cert, key = mounted / "tls.crt", mounted / "tls.key"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    webhook = WebhookSettings(port=free_port(), cert_file=cert, key_file=key)
    server = tls_server(webhook_app(), "127.0.0.1", webhook)
    reloader = reloader_of(server, webhook)
    task = asyncio.create_task(server.serve())
    url = f"https://127.0.0.1:{webhook.port}{MUTATE_PATH}"

    async def answers(ca: Path) -> bool:
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
            try:
                reply = await client.post(url, json=review({"tessera.io/queue": "team-a"}))
            except httpx.ConnectError as error:
                assert "CERTIFICATE_VERIFY_FAILED" in str(error)
                return False
        return reply.status_code == 200

    try:
        await eventually(lambda: _started(server), what="the webhook serving HTTPS")
        assert await answers(first.ca) and not await answers(renewed.ca)
        assert reloader.reload_if_changed() is False  # nothing changed yet

        key.write_text("half written\n")  # caught between the two files: the old pair stays
        assert reloader.reload_if_changed() is False
        assert await answers(first.ca)

        cert.write_bytes(renewed.cert.read_bytes())
        key.write_bytes(renewed.key.read_bytes())
        assert reloader.reload_if_changed() is True
        assert await answers(renewed.ca) and not await answers(first.ca)
    finally:
        server.should_exit = True
        await task


async def _started(server: uvicorn.Server) -> bool:
    return server.started

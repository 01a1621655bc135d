"""`tessera up`'s side of the autoscaling loop: the devcluster's HPA flag, the forecaster's HTTPS
settings, the certificate it is given, and where the CRD is found."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import typer
from typer.testing import CliRunner

from tessera.cli.up import plan_services, register
from tessera.cli.up_autoscaling import (
    CRD_FILE,
    DNS_NAMES,
    AutoscalingDevcluster,
    ExternalMetrics,
    crd_file,
)
from tessera.cli.up_certs import ServingCertificate, serving_certificate
from tessera.core.embedded import StateDir


def devcluster(hpa_sync_seconds: float | None) -> AutoscalingDevcluster:
    return AutoscalingDevcluster(
        hpa_sync_seconds=hpa_sync_seconds,
        cluster_file=Path("/c.yaml"),
        kubeconfig=Path("/k"),
        port=16443,
        log_file=Path("/l.log"),
    )


def test_the_devcluster_runs_its_hpa_controller_only_when_asked() -> None:
    assert devcluster(15.0).command()[-2:] == ["--hpa-sync-seconds", "15"]
    assert "--hpa-sync-seconds" not in devcluster(None).command()


def test_the_forecaster_serves_the_external_metrics_api_over_https_when_given_a_certificate() -> None:
    certificate = ServingCertificate(Path("/p/ca.crt"), Path("/p/tls.crt"), Path("/p/tls.key"))
    specs, _ = plan_services(
        ["forecaster", "scheduler"],
        {"forecaster": 1, "scheduler": 2},
        nats_url="nats://n",
        database_url="postgresql://d",
        kubeconfig=Path("/k"),
        state=StateDir(Path("/s")),
        service_argv=lambda n: [n],
        external_metrics=ExternalMetrics(18443, certificate),
    )
    forecaster, scheduler = specs
    assert {k: v for k, v in forecaster.env.items() if "METRICS_TLS" in k} == {
        "TESSERA_FORECASTER_METRICS_TLS__CERT_FILE": "/p/tls.crt",
        "TESSERA_FORECASTER_METRICS_TLS__KEY_FILE": "/p/tls.key",
        "TESSERA_FORECASTER_METRICS_TLS__PORT": "18443",
    }
    assert not any("METRICS_TLS" in k for k in scheduler.env)
    assert ExternalMetrics(18443, certificate).endpoint()["url"] == "https://127.0.0.1:18443"


def test_the_serving_certificate_is_signed_by_its_ca_for_the_service_name_and_reused(tmp_path: Path) -> None:
    made = serving_certificate(tmp_path / "pki", "tessera-forecaster", DNS_NAMES)
    context = ssl.create_default_context(cafile=str(made.ca))
    context.load_cert_chain(made.cert, made.key)  # the key is the certificate's
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(made.ca), str(made.cert)], capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stderr
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(made.cert)], capture_output=True, text=True
    ).stdout
    assert "DNS:tessera-forecaster.tessera.svc" in text and "IP Address:127.0.0.1" in text
    assert made.key.stat().st_mode & 0o077 == 0
    before = made.cert.read_bytes()
    assert serving_certificate(tmp_path / "pki", "tessera-forecaster", DNS_NAMES) == made
    assert made.cert.read_bytes() == before  # still valid: kept, so the registered CA stays right
    made.cert.write_text("not a certificate")
    serving_certificate(tmp_path / "pki", "tessera-forecaster", DNS_NAMES)
    assert made.cert.read_bytes() != b"not a certificate"


def test_the_crd_is_found_in_the_repository_and_missing_elsewhere(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[4]
    assert crd_file((tmp_path, root)) == root / CRD_FILE
    assert crd_file((tmp_path,)) is None
    assert crd_file() == root / CRD_FILE  # beside the package, wherever tessera up runs from


def test_up_help_says_it_closes_the_autoscaling_loop() -> None:
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # a second command, so that "up" is a subcommand
    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0
    for words in ("--hpa-sync-seconds", "HPA controller", "PredictiveAutoscaler CRD", "APIService", "18443"):
        assert words in result.output, result.output

"""The webhook's HTTPS settings: a certificate and its key come together, and a file that is not
one stops the service at start naming the settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings, WebhookSettings
from tessera.admission.entrypoints.webhook_server import CertificateError


def test_without_a_certificate_the_webhook_is_plain_http_only() -> None:
    settings = AdmissionSettings()
    assert settings.webhook.tls is False
    assert [task.__name__ for task in build(settings).background] == [
        "admission_cycle",
        "workload_sync",
        "reconciliation",
    ]


@pytest.mark.parametrize(("given", "missing"), [("cert_file", "key_file"), ("key_file", "cert_file")])
def test_a_certificate_without_its_key_is_refused_naming_the_missing_one(given: str, missing: str) -> None:
    with pytest.raises(ValidationError, match=f"webhook.{missing} is required with webhook.{given}"):
        WebhookSettings.model_validate({given: "/etc/tessera/webhook/tls.pem"})


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_ADMISSION_WEBHOOK__PORT", "8443")
    monkeypatch.setenv("TESSERA_ADMISSION_WEBHOOK__CERT_FILE", "/etc/tessera/webhook/tls.crt")
    monkeypatch.setenv("TESSERA_ADMISSION_WEBHOOK__KEY_FILE", "/etc/tessera/webhook/tls.key")
    webhook = AdmissionSettings().webhook
    assert (webhook.port, webhook.tls) == (8443, True)
    assert webhook.key_file == Path("/etc/tessera/webhook/tls.key")


def test_a_file_that_is_not_a_certificate_stops_the_service_at_build(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    settings = AdmissionSettings.model_validate({"webhook": {"cert_file": cert, "key_file": key}})
    with pytest.raises(CertificateError, match=r"webhook.cert_file .*tls.crt / webhook.key_file .*tls.key"):
        build(settings)

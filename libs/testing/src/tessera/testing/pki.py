"""Test certificates made with the openssl binary: a CA and a serving certificate it signed, for the
services that serve HTTPS to a Kubernetes API server (admission's webhook, the forecaster's external
metrics API)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the openssl binary is needed to make a test certificate: apt-get install openssl")
    subprocess.run([openssl, *args], check=True, capture_output=True)


def make_pki(d: Path, name: str, subject: str = "tessera-test", dns_names: tuple[str, ...] = ()) -> Pki:
    """A CA, and a serving certificate for 127.0.0.1 (and `dns_names`) that it signed (not its own CA)."""
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key, csr = (d / n for n in ("ca.crt", "ca.key", "tls.crt", "tls.key", "tls.csr"))
    ext = d / "serving.ext"
    names = ",".join(["IP:127.0.0.1", *(f"DNS:{n}" for n in dns_names)])
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={names}\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        "-keyout", str(ca_key), "-out", str(ca),
    )  # fmt: skip
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={subject}",
             "-keyout", str(key), "-out", str(csr))  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return Pki(ca, cert, key)

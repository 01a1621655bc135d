"""The certificate ``tessera up`` gives the forecaster's external metrics API: the devcluster's
aggregation layer calls an APIService's backend over HTTPS only, verifying it against the APIService's
``caBundle`` under the Service's DNS name (``<service>.<namespace>.svc``), as kube-aggregator does.

A CA of the stack's own and a serving certificate it signed, made with the ``openssl`` binary (the
``cryptography`` package is not among the stack's dependencies) and kept under the state directory. A
later run reuses them while they are valid for another day; otherwise both are made anew (the
APIService is registered again with the new CA at every start)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: how long a made certificate is valid; a run within a day of its end makes new ones
VALID_DAYS = 365
RENEW_WITHIN_S = 86_400


class CertificateError(RuntimeError):
    """The certificate could not be made (no openssl, or openssl failed): the message says why."""


@dataclass(frozen=True)
class ServingCertificate:
    ca: Path
    cert: Path
    key: Path

    def ca_pem(self) -> bytes:
        return self.ca.read_bytes()


def serving_certificate(directory: Path, common_name: str, dns_names: tuple[str, ...]) -> ServingCertificate:
    """The CA and serving certificate under ``directory`` (for ``127.0.0.1`` and ``dns_names``), made
    when missing, unreadable or within a day of their end. Raises ``CertificateError``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CertificateError("the openssl binary is not on PATH (apt-get install openssl)")
    found = ServingCertificate(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if _still_valid(openssl, found):
        return found
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        work = Path(scratch)
        ca_key, csr, ext = work / "ca.key", work / "tls.csr", work / "serving.ext"
        names = ",".join(["IP:127.0.0.1", *(f"DNS:{n}" for n in dns_names)])
        ext.write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={names}\n"
            "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
        )
        ca, cert, key = work / "ca.crt", work / "tls.crt", work / "tls.key"
        days = str(VALID_DAYS)
        _run(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", days,
             "-subj", f"/CN={common_name}-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign", "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
        _run(openssl, "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={common_name}",
             "-keyout", str(key), "-out", str(csr))  # fmt: skip
        _run(openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", days, "-extfile", str(ext), "-out", str(cert))  # fmt: skip
        key.chmod(0o600)
        # the key first: a certificate never sits beside a key that is not its own
        for made, kept in ((key, found.key), (cert, found.cert), (ca, found.ca)):
            made.replace(kept)
    return found


def _still_valid(openssl: str, found: ServingCertificate) -> bool:
    if not (found.ca.is_file() and found.cert.is_file() and found.key.is_file()):
        return False
    return all(
        subprocess.run(
            [openssl, "x509", "-checkend", str(RENEW_WITHIN_S), "-noout", "-in", str(path)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
        for path in (found.ca, found.cert)
    )


def _run(openssl: str, *args: str) -> None:
    done = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")

"""Certificate authorities and client certificates for TLS tests, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True, slots=True)
class Issued:
    """A PEM certificate and its key on disk."""

    cert_file: Path
    key_file: Path

    @property
    def pem(self) -> str:
        return self.cert_file.read_text()


def make_ca(directory: Path, name: str) -> Issued:
    """A self-signed CA called `name` (P-256, one day)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Issued(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl("req", "-x509", *_EC, "-keyout", str(ca.key_file), "-out", str(ca.cert_file),
             "-days", "1", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return ca


def issue_client(ca: Issued, directory: Path, *, common_name: str,
                 organizations: Sequence[str] = ()) -> Issued:
    """A client certificate (extendedKeyUsage clientAuth) signed by `ca`; O = groups."""
    stem = f"{ca.cert_file.stem}-{common_name}".replace(":", "_")
    leaf = Issued(directory / f"{stem}.crt", directory / f"{stem}.key")
    request = directory / f"{stem}.csr"
    extensions = directory / f"{stem}.ext"
    extensions.write_text("extendedKeyUsage=clientAuth\n")
    subject = "".join(f"/O={org}" for org in organizations) + f"/CN={common_name}"
    _openssl("req", "-new", *_EC, "-keyout", str(leaf.key_file), "-out", str(request),
             "-subj", subject)
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca.cert_file),
             "-CAkey", str(ca.key_file), "-CAcreateserial", "-days", "1",
             "-extfile", str(extensions), "-out", str(leaf.cert_file))
    return leaf

"""TLS for the external metrics API: a certificate pair from files, or a self-signed one."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CertificatePair:
    cert_file: Path
    key_file: Path


def _subject_alt_names(hosts: Sequence[str]) -> str:
    names = []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            names.append(f"DNS:{host}")
        else:
            names.append(f"IP:{host}")
    return ",".join(names)


async def self_signed(directory: Path, *, hosts: Sequence[str], days: int = 365) -> CertificatePair:
    """Make a self-signed P-256 certificate for `hosts` in `directory` with the openssl CLI.

    For development only: the APIService then needs insecureSkipTLSVerify. The
    `cryptography` package is not a dependency, and openssl ships with every base image
    that has Python's ssl module.
    """
    if not hosts:
        raise ValueError("a self-signed certificate needs at least one host name")
    directory.mkdir(parents=True, exist_ok=True)
    pair = CertificatePair(cert_file=directory / "tls.crt", key_file=directory / "tls.key")
    process = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(pair.key_file), "-out", str(pair.cert_file),
        "-days", str(days), "-subj", f"/CN={hosts[0]}",
        "-addext", f"subjectAltName={_subject_alt_names(hosts)}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"openssl failed ({process.returncode}): {stderr.decode().strip()}")
    pair.key_file.chmod(0o600)
    return pair


def server_context(pair: CertificatePair, *, client_cas: str = "") -> ssl.SSLContext:
    """A TLS server context (TLS 1.2+, as the kube-apiserver aggregator speaks).

    With `client_cas` (PEM) it requests, not requires, a client certificate verified
    against those CAs only, as an aggregated API server does: the aggregator presents its
    front-proxy certificate, other callers may come with a bearer token and none. A
    certificate that does not verify fails the handshake. Not
    `ssl.create_default_context(CLIENT_AUTH)`: that would also trust the system's public
    CAs for client certificates.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(pair.cert_file), keyfile=str(pair.key_file))
    if client_cas.strip():
        context.load_verify_locations(cadata=client_cas)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context

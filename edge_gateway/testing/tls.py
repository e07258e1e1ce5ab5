"""Throw-away certificates for TLS tests and benchmarks (``cryptography``, a test dependency).

:func:`make_tls_files` writes a CA, a server certificate signed by it for
the given names (IP addresses become IP SANs), its key, and optionally a
client certificate, all PEM, into a folder::

    files = make_tls_files(tmp_path, names=("127.0.0.1", "localhost"))
    # [api] tls_cert = files.cert, tls_key = files.key; clients: ca_file=files.ca

Keys are P-256 (quick to make); certificates are valid from a minute ago
for a day. Never for production: the CA's key is written next to them.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["TlsFiles", "make_tls_files"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of the PEM files :func:`make_tls_files` wrote."""

    #: The CA's certificate: what clients verify with.
    ca: Path
    #: The server's certificate (signed by the CA) and its key.
    cert: Path
    key: Path
    #: A client certificate signed by the same CA, and its key (or None).
    client_cert: Path | None
    client_key: Path | None
    #: A self-signed server certificate for the same names, and its key:
    #: it verifies with nothing but itself.
    self_signed: Path
    self_signed_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    names: Sequence[str] = (),
    client: bool = False,
) -> x509.Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer is not None else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if issuer is not None:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                critical=False,
            )
    if names:
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def make_tls_files(
    folder: Path, names: Sequence[str] = ("127.0.0.1", "localhost"), *, client: bool = True
) -> TlsFiles:
    """Write a CA, a server certificate for ``names`` and (``client``) a client certificate."""
    from cryptography.hazmat.primitives import serialization

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_cert = _cert("edgegw test CA", ca_key, None, ca=True)
    issuer = ("edgegw test CA", ca_key)
    server_key = _key()
    server_cert = _cert(names[0], server_key, issuer, names=names)
    own_key = _key()
    own_cert = _cert(names[0], own_key, None, names=names)
    client_cert = client_key = None
    if client:
        key = _key()
        client_key = _write(folder / "client-key.pem", _pem_key(key))
        client_cert = _write(
            folder / "client.pem", pem(_cert("device-7", key, issuer, client=True))
        )
    return TlsFiles(
        ca=_write(folder / "ca.pem", pem(ca_cert)),
        cert=_write(folder / "server.pem", pem(server_cert)),
        key=_write(folder / "server-key.pem", _pem_key(server_key)),
        client_cert=client_cert,
        client_key=client_key,
        self_signed=_write(folder / "self-signed.pem", pem(own_cert)),
        self_signed_key=_write(folder / "self-signed-key.pem", _pem_key(own_key)),
    )

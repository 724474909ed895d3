"""The lab's own certificate authority, for the emulators that speak TLS (Azure's: its
driver logs in and calls ARM over https only).

``lab up`` makes a CA and a server certificate for 127.0.0.1 under the lab's state
directory, once; the emulator serves with the certificate, and the lab's provider
profile names the CA in its ``ca_file`` option. Nothing outside the lab trusts it: the
machine's trust store is not touched.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

DAYS = 3650


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` anew (never through a link), with ``mode``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def ensure(directory: Path) -> tuple[Path, Path, Path]:
    """The CA's certificate, the server's certificate and its key (0600) under
    ``directory``, made on first use: (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_pem, cert_pem, key_pem = (directory / n for n in ("ca.pem", "server.pem", "server.key"))
    if ca_pem.exists() and cert_pem.exists() and key_pem.exists():
        return ca_pem, cert_pem, key_pem
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "slurm-burst lab CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(key_pem, key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()), 0o600)  # fmt: skip
    _write(cert_pem, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(ca_pem, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    return ca_pem, cert_pem, key_pem

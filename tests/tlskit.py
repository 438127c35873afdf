"""Certificates for TLS tests, made with `cryptography`: a CA, a server certificate for
127.0.0.1/localhost, client certificates (one expired), and a certificate from a CA nobody trusts."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PASSWORD = "s3cret-key-pw"


@dataclass
class Pair:
    cert: Path
    key: Path


@dataclass
class Pki:
    ca: Path  # the trusted CA's certificate (what --ssl-ca and clients' ssl.ca.location name)
    server: Pair  # for 127.0.0.1 and localhost; key unencrypted
    server_encrypted: Pair  # same certificate, key encrypted with KEY_PASSWORD
    alice: Pair  # client CN=alice,OU=eng,O=loglake
    expired: Pair  # client CN=old, expired yesterday
    untrusted: Pair  # client CN=mallory, signed by another CA
    untrusted_ca: Path
    #: More trusted clients, CN=<name>,O=loglake, by name (`make_pki(..., clients=[...])`): the
    #: principals of ACL tests.
    clients: dict[str, Pair] = field(default_factory=dict)


def _name(**parts: str) -> x509.Name:
    oids = {"O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "CN": NameOID.COMMON_NAME}
    # x509 order is most general first: O, OU, CN (RFC 2253 writes it reversed: CN=..,OU=..,O=..)
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in sorted(parts.items(), key=lambda kv: ["O", "OU", "CN"].index(kv[0]))])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
    expired: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    start, end = (now - dt.timedelta(days=30), now - dt.timedelta(days=1)) if expired else (now - dt.timedelta(hours=1), now + dt.timedelta(days=30))
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        b = b.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        ).add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return b.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, password: str | None = None) -> Pair:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    return Pair(cert_path, key_path)


def make_pki(directory: Path, clients: tuple[str, ...] = ()) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = _key(), _key()
    ca_name, other_name = _name(O="loglake-test", CN="loglake test CA"), _name(O="elsewhere", CN="untrusted CA")
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    other = _cert(other_name, other_key, other_name, other_key, ca=True)
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "other-ca.crt").write_bytes(other.public_bytes(serialization.Encoding.PEM))
    skey = _key()
    scert = _cert(_name(O="loglake-test", CN="localhost"), skey, ca_name, ca_key, server=True)
    alice_key, old_key, mallory_key = _key(), _key(), _key()
    return Pki(
        ca=directory / "ca.crt",
        server=_write(directory / "server", scert, skey),
        server_encrypted=_write(directory / "server-enc", scert, skey, KEY_PASSWORD),
        alice=_write(directory / "alice", _cert(_name(O="loglake", OU="eng", CN="alice"), alice_key, ca_name, ca_key), alice_key),
        expired=_write(directory / "old", _cert(_name(O="loglake", CN="old"), old_key, ca_name, ca_key, expired=True), old_key),
        untrusted=_write(directory / "mallory", _cert(_name(CN="mallory"), mallory_key, other_name, other_key), mallory_key),
        untrusted_ca=directory / "other-ca.crt",
        clients={
            name: _write(directory / f"client-{name}", _cert(_name(O="loglake", CN=name), key, ca_name, ca_key), key)
            for name, key in ((name, _key()) for name in clients)
        },
    )


def ssl_args(pki: Pki, *, client_auth: str = "none", encrypted: bool = False) -> list[str]:
    """`loglake serve` flags for an SSL listener with `pki`'s server certificate."""
    pair = pki.server_encrypted if encrypted else pki.server
    args = ["--ssl-cert", str(pair.cert), "--ssl-key", str(pair.key), "--ssl-ca", str(pki.ca), "--ssl-client-auth", client_auth]
    return args + (["--ssl-key-password", KEY_PASSWORD] if encrypted else [])

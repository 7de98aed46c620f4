"""TLS on the listener (STATEGATE_TLS_CERT_FILE / STATEGATE_TLS_KEY_FILE): the real
Terraform CLI over https with a private CA (`client_ca_certificate_pem`), and a clean
x509 failure without it. Runs on the local store and on Garage.

Certificates are made here with the `cryptography` package (installed into the test
venv by scripts/setup-test-deps.sh).
"""

from __future__ import annotations

import datetime
import http.client as http_client
import ipaddress
import socket
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import BACKEND_HTTP, Server, data_resource, http, resources_of
from store_support import server_factory  # noqa: F401 (fixtures)

X509_ERROR = ("x509", "certificate signed by unknown authority", "failed to verify certificate")


@dataclass
class Pki:
    ca_pem: str
    cert_file: Path
    key_file: Path
    other_ca_pem: str  # a CA that did NOT sign the server cert


def _make_ca(name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pytest.fail("the `cryptography` package is missing from the test venv: run scripts/setup-test-deps.sh")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = _make_ca("stategate e2e test CA")
    _, other_ca = _make_ca("some other CA")

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = d / "server.crt", d / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM).decode()  # noqa: E731
    return Pki(pem(ca), cert_file, key_file, pem(other_ca))


class TlsServer(Server):
    """`stategate serve` with TLS: https URLs, health checked over https with the test CA."""

    ca_pem: str = ""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem)

    def healthy(self) -> bool:
        return https_get(f"{self.url}/healthz", self.ssl_context())[0] == 200


def https_get(url: str, ctx: ssl.SSLContext, password: str | None = None) -> tuple[int, bytes]:
    import base64
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, method="GET")
    if password is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"x:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def tls_server(pki, store, server_factory):
    class _S(TlsServer):
        ca_pem = pki.ca_pem

    kind, s3 = store
    return server_factory.new(s3 if kind == "s3" else None, cls=_S,
                              STATEGATE_TLS_CERT_FILE=pki.cert_file, STATEGATE_TLS_KEY_FILE=pki.key_file)


def _ws_name(store) -> str:
    return f"tls-{store[0]}-{uuid.uuid4().hex[:8]}"


def test_terraform_over_https_with_custom_ca(tls_server, pki, store, make_tf):
    ws = tls_server.workspace(_ws_name(store))
    for k in ("TF_HTTP_ADDRESS", "TF_HTTP_LOCK_ADDRESS", "TF_HTTP_UNLOCK_ADDRESS"):
        if k in ws.env:
            assert ws.env[k].startswith("https://127.0.0.1:"), (k, ws.env[k])

    tf = make_tf("w", {**ws.env, "TF_HTTP_CLIENT_CA_CERTIFICATE_PEM": pki.ca_pem})
    tf.write(BACKEND_HTTP + data_resource("a", "over-tls"))
    tf.init()
    assert "1 added" in tf.apply().stdout
    tf.write(BACKEND_HTTP + data_resource("a", "over-tls") + data_resource("b", "still-tls"))
    assert "1 added" in tf.apply().stdout
    tf.plan_no_changes()
    assert tf.state_list() == ["terraform_data.a", "terraform_data.b"]
    assert not (tf.dir / "terraform.tfstate").exists()

    status, body = https_get(ws.address, tls_server.ssl_context(), ws.password)
    assert status == 200, body[:300]
    import json
    assert resources_of(json.loads(body)) == ["terraform_data.a", "terraform_data.b"]

    # The same CA given as the backend attribute instead of the environment.
    tf2 = make_tf("attr", ws.env)
    ca = pki.ca_pem.strip()
    tf2.write('terraform {\n  backend "http" {\n    client_ca_certificate_pem = <<-EOT\n'
              + "\n".join("    " + line for line in ca.splitlines())
              + '\n    EOT\n  }\n}\n' + data_resource("a", "over-tls") + data_resource("b", "still-tls"))
    tf2.init()
    tf2.plan_no_changes()


def test_https_without_the_ca_fails_cleanly(tls_server, pki, store, make_tf):
    ws = tls_server.workspace(_ws_name(store))
    for name, extra in (("no-ca", {}), ("wrong-ca", {"TF_HTTP_CLIENT_CA_CERTIFICATE_PEM": pki.other_ca_pem})):
        tf = make_tf(name, {**ws.env, **extra})
        tf.write(BACKEND_HTTP + data_resource("a", "never"))
        r = tf.init(check=False)
        assert r.returncode != 0, f"terraform trusted a certificate it has no CA for ({name}):\n{r}"
        assert any(s in r.output for s in X509_ERROR), f"expected an x509 error ({name}):\n{r}"
        assert "panic" not in r.output.lower(), r
        assert tls_server.alive(), tls_server.log_tail()

    # Nothing was written, and the server still serves clients that trust it.
    status, _ = https_get(ws.address, tls_server.ssl_context(), ws.password)
    assert status == 404, status


def test_tls_listener_refuses_plain_http(tls_server):
    """The listener speaks HTTPS only: a plaintext request never gets an HTTP answer."""
    port = tls_server.port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    assert b'"status":"ok"' not in got and not got.startswith(b"HTTP/1.1 200"), got[:200]
    # plain-http client from the harness fails too (and the server survives it)
    with pytest.raises((OSError, http_client.HTTPException)):
        http("GET", f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert tls_server.alive()

"""Client certificates as Terraform backend credentials (`tls.client_ca`,
`[[tls.client_grants]]`): the real Terraform CLI with a private CA and NO password
applies, a read-scope certificate serves `terraform_remote_state` but cannot apply,
and every refused certificate (another CA, expired, no grant for the workspace, the
wrong scope) changes nothing. A resumed TLS session (1.2 and 1.3) keeps the identity
of the certificate verified at its full handshake, and not past that certificate's
expiry. Refusals are checked twice: with Terraform, and with a
raw client that shows where each one happens (the handshake, or the same 401 as a
wrong password).

Certificates are made here with the `cryptography` package (installed into the test
venv by scripts/setup-test-deps.sh). The listener's behaviour does not depend on the
store, so these run on the local store only.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import os
import socket
import sqlite3
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import Server, data_resource, lock_info, resources_of, stategate_bin
from store_support import server_factory  # noqa: F401 (fixture)
from test_tls import _make_ca

GRANTS = """
[[tls.client_grants]]
subject = "ci-prod"
workspaces = "mtls-prod-*"
scope = "write"

[[tls.client_grants]]
subject = "reader"
workspaces = "*"
scope = "read"
"""


@dataclass
class Client:
    """A client certificate and its key, as files and as PEM text."""

    cert_file: Path
    key_file: Path

    @property
    def cert_pem(self) -> str:
        return self.cert_file.read_text()

    @property
    def key_pem(self) -> str:
        return self.key_file.read_text()


@dataclass
class Pki:
    dir: Path
    server_ca_pem: str
    server_cert: Path
    server_key: Path
    client_ca_file: Path
    ci_prod: Client      # SAN DNS:ci-prod (and a CN that must be ignored)
    reader: Client       # CN "reader" only
    expired: Client      # SAN DNS:ci-prod, from the client CA, expired yesterday
    foreign: Client      # SAN DNS:ci-prod, from another CA
    revoked: Client      # SAN DNS:ci-prod, from the client CA, listed in `crl_file`
    crl_file: Path       # the client CA's revocation list
    client_ca_key: object = None  # to issue certificates in a test
    client_ca: object = None


def _pem(obj) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return obj.public_bytes(serialization.Encoding.PEM)


def _issue(d: Path, name: str, ca_key, ca, *, cn: str, dns: list[str] | None = None,
           client: bool = True, ip: str | None = None, days=(-1 / 288, 1)) -> Client:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
         .issuer_name(ca.subject)
         .public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now + datetime.timedelta(days=days[0]))
         .not_valid_after(now + datetime.timedelta(days=days[1]))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage(
             [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    names = [x509.DNSName(n) for n in dns or []]
    if ip:
        names.append(x509.IPAddress(ipaddress.ip_address(ip)))
    if names:
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    cert_file, key_file = d / f"{name}.crt", d / f"{name}.key"
    cert_file.write_bytes(_pem(cert))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return Client(cert_file, key_file)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pytest.fail("the `cryptography` package is missing from the test venv: run scripts/setup-test-deps.sh")
    d = tmp_path_factory.mktemp("mtls-pki")
    server_ca_key, server_ca = _make_ca("stategate mtls server CA")
    client_ca_key, client_ca = _make_ca("stategate mtls client CA")
    other_key, other = _make_ca("some other CA")
    server = _issue(d, "server", server_ca_key, server_ca, cn="localhost", dns=["localhost"],
                    ip="127.0.0.1", client=False)
    client_ca_file = d / "client-ca.pem"
    client_ca_file.write_bytes(_pem(client_ca))
    revoked = _issue(d, "revoked", client_ca_key, client_ca, cn="ci-prod", dns=["ci-prod"])
    crl_file = d / "client-ca.crl.pem"
    crl_file.write_bytes(_crl(client_ca_key, client_ca, [revoked]))
    return Pki(
        dir=d,
        server_ca_pem=_pem(server_ca).decode(),
        server_cert=server.cert_file,
        server_key=server.key_file,
        client_ca_file=client_ca_file,
        ci_prod=_issue(d, "ci-prod", client_ca_key, client_ca, cn="ignored-cn", dns=["ci-prod"]),
        reader=_issue(d, "reader", client_ca_key, client_ca, cn="reader"),
        expired=_issue(d, "expired", client_ca_key, client_ca, cn="ci-prod", dns=["ci-prod"], days=(-2, -1)),
        foreign=_issue(d, "foreign", other_key, other, cn="ci-prod", dns=["ci-prod"]),
        revoked=revoked,
        crl_file=crl_file,
        client_ca_key=client_ca_key,
        client_ca=client_ca,
    )


def _crl(ca_key, ca, revoked: list[Client]) -> bytes:
    """The CA's revocation list (PEM) naming `revoked`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateRevocationListBuilder()
         .issuer_name(ca.subject)
         .last_update(now - datetime.timedelta(minutes=5))
         .next_update(now + datetime.timedelta(days=1))
         .add_extension(x509.CRLNumber(1), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    for client in revoked:
        serial = x509.load_pem_x509_certificate(client.cert_file.read_bytes()).serial_number
        b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(serial)
                                      .revocation_date(now - datetime.timedelta(minutes=1)).build())
    return b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


class MtlsServer(Server):
    """`stategate serve` on TLS with client certificates; health checked over https
    with `health_client`'s certificate (needed when certificates are required)."""

    pki: Pki | None = None
    health_client: Client | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        return request(self, "GET", "/healthz", client=self.health_client)[0] == 200


def context(pki: Pki, client: Client | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=pki.server_ca_pem)
    if client is not None:
        ctx.load_cert_chain(client.cert_file, client.key_file)
    return ctx


def request(server: MtlsServer, method: str, path: str, body: bytes | dict | None = None, *,
            client: Client | None = None, password: str | None = None) -> tuple[int, bytes]:
    """One request on a fresh connection. A refused handshake raises (ssl.SSLError or a
    reset): with TLS 1.3 the client learns of it on its first read."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=context(server.pki, client))
    headers = {"Content-Length": str(len(body or b""))}
    if password is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"stategate:{password}".encode()).decode()
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


HANDSHAKE_REFUSED = (ssl.SSLError, ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)


def start(server_factory, pki: Pki, *, grants: str = GRANTS, required: bool = False,
          crl: bool = False) -> MtlsServer:
    cfg = pki.dir / f"stategate-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(
        "[tls]\n"
        f"cert_file = {json.dumps(str(pki.server_cert))}\n"
        f"key_file = {json.dumps(str(pki.server_key))}\n"
        f"client_ca = {json.dumps(str(pki.client_ca_file))}\n"
        f"client_cert_required = {'true' if required else 'false'}\n"
        + (f"client_crl = {json.dumps(str(pki.crl_file))}\n" if crl else "")
        + grants)

    class _S(MtlsServer):
        pass

    _S.pki = pki
    _S.health_client = pki.reader if required else None
    return server_factory.new(None, cls=_S, STATEGATE_CONFIG=cfg)


def snapshot(server: Server, ws: str) -> dict:
    """Everything a refused request must leave as it was."""
    db = server.data_dir / "stategate.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {
            "versions": con.execute("SELECT * FROM versions WHERE scope = ? ORDER BY version", (f"tf/{ws}",)).fetchall(),
            "locks": con.execute("SELECT * FROM tf_locks WHERE workspace = ?", (ws,)).fetchall(),
            "audit": con.execute("SELECT id, actor, event FROM audit ORDER BY id").fetchall(),
        }
    finally:
        con.close()


def heredoc(key: str, pem: str, indent: str = "    ") -> str:
    body = "\n".join(indent + "  " + line for line in pem.strip().splitlines())
    return f"{indent}{key} = <<-EOT\n{body}\n{indent}  EOT\n"


def cert_backend(server: MtlsServer, ws: str, client: Client) -> str:
    """A `backend "http"` block that authenticates with `client` and sends no password."""
    address = f"{server.url}/api/v1/tf/state/{ws}"
    return ('terraform {\n  backend "http" {\n'
            f'    address = "{address}"\n    lock_address = "{address}"\n    unlock_address = "{address}"\n'
            + heredoc("client_ca_certificate_pem", server.pki.server_ca_pem)
            + heredoc("client_certificate_pem", client.cert_pem)
            + heredoc("client_private_key_pem", client.key_pem)
            + "  }\n}\n")


def no_password_tf(make_tf, name: str):
    """A Terraform working dir whose environment holds no backend credential at all."""
    tf = make_tf(name)
    tf.env = {k: v for k, v in tf.env.items() if not k.startswith("TF_HTTP_") or k.startswith("TF_HTTP_RETRY")}
    return tf


def test_terraform_applies_with_a_client_certificate_and_no_password(server_factory, pki, make_tf):
    server = start(server_factory, pki)
    ws = f"mtls-prod-{uuid.uuid4().hex[:8]}"
    tf = no_password_tf(make_tf, "ci")
    tf.write(cert_backend(server, ws, pki.ci_prod) + data_resource("a", "by-cert"))
    tf.init()
    assert "1 added" in tf.apply().stdout
    tf.write(cert_backend(server, ws, pki.ci_prod) + data_resource("a", "by-cert") + data_resource("b", "again"))
    assert "1 added" in tf.apply().stdout
    tf.plan_no_changes()
    assert tf.state_list() == ["terraform_data.a", "terraform_data.b"]

    # The state is stategate's, readable with the same certificate and no password.
    status, body = request(server, "GET", f"/api/v1/tf/state/{ws}", client=pki.ci_prod)
    assert status == 200, body[:300]
    assert resources_of(json.loads(body)) == ["terraform_data.a", "terraform_data.b"]

    # The locks were taken and released under the certificate's subject (the SAN: the
    # CN beside it is ignored).
    rows = snapshot(server, ws)
    assert len(rows["versions"]) == 2 and rows["locks"] == []
    lock_actors = {actor for _, actor, event in rows["audit"] if event in ("tf.lock_acquired", "tf.lock_released")}
    assert lock_actors == {"cert:ci-prod"}, rows["audit"]


def test_refused_certificates_change_nothing(server_factory, pki, make_tf):
    server = start(server_factory, pki)
    ws = f"mtls-prod-{uuid.uuid4().hex[:8]}"
    elsewhere = f"mtls-staging-{uuid.uuid4().hex[:8]}"
    seed = no_password_tf(make_tf, "seed")
    seed.write(cert_backend(server, ws, pki.ci_prod) + data_resource("a", "seed"))
    seed.init()
    seed.apply()
    before = {w: snapshot(server, w) for w in (ws, elsewhere)}
    path = f"/api/v1/tf/state/{ws}"

    # Terraform: another CA's certificate (Go does not even send it, as its issuer is not
    # one the server asks for: then it is a request without credential), an expired one
    # (refused at the handshake), the write grant's certificate on a workspace its grant
    # does not cover, a read-scope certificate trying to apply.
    for name, target, client in (("foreign", ws, pki.foreign), ("expired", ws, pki.expired),
                                 ("elsewhere", elsewhere, pki.ci_prod), ("reader", ws, pki.reader)):
        tf = no_password_tf(make_tf, f"refused-{name}")
        tf.write(cert_backend(server, target, client) + data_resource("a", "seed") + data_resource("x", name))
        r = tf.run("init", "-input=false", "-no-color", check=False)
        if r.returncode == 0:
            r = tf.apply(check=False)
        assert r.returncode != 0, f"{name}: terraform succeeded:\n{r}"
        assert "panic" not in r.output.lower(), r
        tls_refusal = "certificate" in r.output.lower()
        # Terraform words a 401 as "HTTP remote state endpoint requires auth".
        unauthorized = "requires auth" in r.output or "401" in r.output
        if name == "expired":
            assert tls_refusal, f"{name}: expected a TLS refusal:\n{r}"
        elif name == "foreign":
            assert tls_refusal or unauthorized, f"{name}: expected a refusal:\n{r}"
        else:
            assert unauthorized, f"{name}: expected a 401:\n{r}"

    # A raw client: the same refusals, located. A certificate that does not verify ends
    # the handshake; a verified one without a grant (or without the scope) is a 401
    # exactly like a wrong password.
    for client in (pki.foreign, pki.expired):
        with pytest.raises(HANDSHAKE_REFUSED):
            request(server, "GET", path, client=client)
    refusals = [
        ("GET", f"/api/v1/tf/state/{elsewhere}", pki.ci_prod, None, None),
        ("LOCK", f"/api/v1/tf/state/{elsewhere}", pki.ci_prod, lock_info(), None),
        ("LOCK", path, pki.reader, lock_info(), None),
        ("POST", path, pki.reader, b"{}", None),
        ("UNLOCK", path, pki.reader, b"", None),
        ("DELETE", path, pki.reader, None, None),
        ("DELETE", path, pki.ci_prod, None, None),  # only the workspace's own credential deletes
        # A secret, when sent, alone decides: a wrong one beside a valid certificate is refused.
        ("GET", path, pki.ci_prod, None, "wrong-password"),
        ("LOCK", path, pki.ci_prod, lock_info(), "wrong-password"),
        ("GET", path, None, None, "wrong-password"),
        ("GET", path, None, None, None),
    ]
    wrong = request(server, "GET", path, password="wrong-password")
    assert wrong[0] == 401
    for method, target, client, body, password in refusals:
        got = request(server, method, target, body, client=client, password=password)
        assert got == wrong, (method, target, client and client.cert_file.name, password, got)
    assert server.alive(), server.log_tail()
    assert {w: snapshot(server, w) for w in (ws, elsewhere)} == before

    # Still served: the read grant reads, the write grant reads; a valid password with
    # any certificate is the password's.
    assert request(server, "GET", path, client=pki.reader)[0] == 200
    assert request(server, "GET", path, client=pki.ci_prod)[0] == 200
    bearer = server.workspace(elsewhere).password
    assert request(server, "GET", f"/api/v1/tf/state/{elsewhere}", client=pki.ci_prod, password=bearer)[0] == 404


def test_a_read_scope_certificate_serves_remote_state(server_factory, pki, make_tf):
    server = start(server_factory, pki)
    ws = f"mtls-prod-{uuid.uuid4().hex[:8]}"
    producer = no_password_tf(make_tf, "producer")
    producer.write(cert_backend(server, ws, pki.ci_prod) + data_resource("a", "shared")
                   + 'output "greeting" {\n  value = "hello from prod"\n}\n')
    producer.init()
    producer.apply()

    address = f"{server.url}/api/v1/tf/state/{ws}"
    consumer = no_password_tf(make_tf, "consumer")
    consumer.write('data "terraform_remote_state" "prod" {\n  backend = "http"\n  config = {\n'
                   f'    address = "{address}"\n'
                   + heredoc("client_ca_certificate_pem", server.pki.server_ca_pem)
                   + heredoc("client_certificate_pem", pki.reader.cert_pem)
                   + heredoc("client_private_key_pem", pki.reader.key_pem)
                   + '  }\n}\noutput "got" {\n  value = data.terraform_remote_state.prod.outputs.greeting\n}\n')
    consumer.init()
    consumer.apply()
    got = json.loads(consumer.run("output", "-json", "got").stdout)
    assert got == "hello from prod"


def test_required_client_certificates(server_factory, pki, make_tf):
    server = start(server_factory, pki, required=True)
    ws = f"mtls-prod-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/tf/state/{ws}"
    bearer = server.workspace(ws).password
    # No certificate: refused at the handshake, even with the workspace's own password.
    with pytest.raises(HANDSHAKE_REFUSED):
        request(server, "GET", path, password=bearer)
    with pytest.raises(HANDSHAKE_REFUSED):
        request(server, "GET", path, client=pki.foreign, password=bearer)
    # A verified certificate with the password: the password's credential.
    assert request(server, "GET", path, client=pki.reader, password=bearer)[0] == 404
    assert request(server, "GET", path, client=pki.ci_prod)[0] == 404
    tf = no_password_tf(make_tf, "required")
    tf.write(cert_backend(server, ws, pki.ci_prod) + data_resource("a", "required"))
    tf.init()
    assert "1 added" in tf.apply().stdout


def test_revoked_certificates_are_refused(server_factory, pki, make_tf):
    server = start(server_factory, pki, crl=True)
    ws = f"mtls-prod-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/tf/state/{ws}"
    tf = no_password_tf(make_tf, "valid")
    tf.write(cert_backend(server, ws, pki.ci_prod) + data_resource("a", "before"))
    tf.init()
    tf.apply()
    before = snapshot(server, ws)

    # The revoked certificate (same CA, same subject, same grant) ends the handshake,
    # with Terraform and with a raw client, and changes nothing.
    revoked = no_password_tf(make_tf, "revoked")
    revoked.write(cert_backend(server, ws, pki.revoked) + data_resource("a", "before") + data_resource("x", "no"))
    r = revoked.run("init", "-input=false", "-no-color", check=False)
    if r.returncode == 0:
        r = revoked.apply(check=False)
    assert r.returncode != 0 and "certificate" in r.output.lower(), f"a revoked certificate was served:\n{r}"
    for method, body in (("GET", None), ("LOCK", lock_info())):
        with pytest.raises(HANDSHAKE_REFUSED):
            request(server, method, path, body, client=pki.revoked)
    with pytest.raises(HANDSHAKE_REFUSED):
        request(server, "GET", path, client=pki.foreign)
    assert snapshot(server, ws) == before
    # Certificates the list does not name, and clients without one, are served as before.
    assert request(server, "GET", path, client=pki.ci_prod)[0] == 200
    assert request(server, "GET", path, client=pki.reader)[0] == 200
    assert request(server, "GET", path, password=server.workspace(ws).password)[0] == 200


def _serve_refused(tmp_path: Path, config: str, extra_env: dict | None = None) -> str:
    """`stategate serve` with `config`: must exit non-zero before serving; its output."""
    cfg = tmp_path / f"bad-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEGATE_", "TF_"))}
    env.update(STATEGATE_CONFIG=str(cfg), STATEGATE_DATA_DIR=str(tmp_path / "data"), STATEGATE_LISTEN="127.0.0.1:0",
               **(extra_env or {}))
    p = subprocess.run([str(stategate_bin()), "serve"], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, f"serve accepted:\n{config}\n{p.stdout}{p.stderr}"
    out = p.stdout + p.stderr
    assert "panic" not in out.lower(), out
    return out


def test_malformed_client_certificate_config_refuses_startup(tmp_path, pki, check_binary):
    listener = (f"[tls]\ncert_file = {json.dumps(str(pki.server_cert))}\n"
                f"key_file = {json.dumps(str(pki.server_key))}\n")
    ca = f"client_ca = {json.dumps(str(pki.client_ca_file))}\n"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    (tmp_path / "garbage-crl.pem").write_text("-----BEGIN X509 CRL-----\nbm90IGEgY3Js\n-----END X509 CRL-----\n")
    empty = tmp_path / "empty.pem"
    empty.write_text("")

    def grant(subject="ci", workspaces="prod-*", scope="write") -> str:
        return (f"[[tls.client_grants]]\nsubject = {json.dumps(subject)}\n"
                f"workspaces = {json.dumps(workspaces)}\nscope = {json.dumps(scope)}\n")

    # (config, what the refusal must name)
    table = [
        (listener + f"client_ca = {json.dumps(str(tmp_path / 'missing.pem'))}\n", "tls.client_ca"),
        (listener + f"client_ca = {json.dumps(str(garbage))}\n", "tls.client_ca"),
        (listener + f"client_ca = {json.dumps(str(empty))}\n", "tls.client_ca"),
        (listener + ca + grant(workspaces="prod/*"), "tls.client_grants[1].workspaces"),
        (listener + ca + grant() + grant(scope="admin"), "tls.client_grants[2].scope"),
        (listener + ca + grant(subject=" ci"), "tls.client_grants[1].subject"),
        (listener + grant(), "tls.client_grants needs tls.client_ca"),
        (listener + "client_cert_required = true\n", "tls.client_cert_required needs tls.client_ca"),
        (f"[tls]\n{ca}", "tls.client_ca needs tls.cert_file"),
        (listener + ca + f"client_crl = {json.dumps(str(tmp_path / 'missing.crl'))}\n", "tls.client_crl"),
        (listener + ca + f"client_crl = {json.dumps(str(pki.client_ca_file))}\n", "tls.client_crl"),
        (listener + ca + f"client_crl = {json.dumps(str(empty))}\n", "tls.client_crl"),
        (listener + ca + "client_crl = " + json.dumps(str(garbage).replace("garbage", "garbage-crl")) + "\n",
         "tls.client_crl"),
        (listener + f"client_crl = {json.dumps(str(pki.crl_file))}\n", "tls.client_crl needs tls.client_ca"),
        (listener + ca + grant().replace("scope", "role"), "role"),
        (listener + ca + grant() * 257, "at most 256"),
    ]
    for config, named in table:
        out = _serve_refused(tmp_path, config)
        assert named in out, f"refusal does not name {named!r}:\n{config}\n{out}"
    # Nothing was opened for any of them.
    assert not (tmp_path / "data" / "stategate.db").exists()


def raw_get(server: MtlsServer, ctx: ssl.SSLContext, path: str, session=None):
    """One GET on a fresh connection, resuming `session` if given: (status, resumed,
    the session to resume next)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    tls = ctx.wrap_socket(sock, server_hostname="127.0.0.1", session=session)
    try:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            try:
                chunk = tls.recv(65536)
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            data += chunk
        if not data:
            raise ConnectionResetError("the server closed the connection without an answer")
        return int(data.split(b" ", 2)[1]), tls.session_reused, tls.session
    finally:
        tls.close()


def test_a_resumed_tls_session_keeps_its_certificate_identity_until_expiry(server_factory, pki):
    """rustls restores a resumed session's client certificate from its full handshake
    without checking it again; the listener re-checks its validity period at every
    handshake. A certificate valid for a few seconds: a resumed session (proved
    resumed) has its identity while it is valid, none once it has expired (401, as
    without a certificate), and a full handshake with it is refused."""
    server = start(server_factory, pki)
    ws = f"mtls-resume-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/tf/state/{ws}"
    # Without a certificate: 401. With the read certificate: no state yet, not 401.
    assert request(server, "GET", path)[0] == 401
    authed = request(server, "GET", path, client=pki.reader)[0]
    assert authed != 401, authed
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        short = _issue(pki.dir, f"short-{version.name}", pki.client_ca_key, pki.client_ca,
                       cn="reader", days=(-1 / 288, 6 / 86400))
        expires = time.time() + 6
        ctx = context(pki, short)
        ctx.minimum_version = ctx.maximum_version = version
        status, resumed, session = raw_get(server, ctx, path)
        assert (status, resumed) == (authed, False), version
        status, resumed, session = raw_get(server, ctx, path, session)
        assert (status, resumed) == (authed, True), f"{version}: resumption is on and keeps the identity"
        before = snapshot(server, ws)
        time.sleep(max(0, expires - time.time()) + 1.5)
        status, resumed, _ = raw_get(server, ctx, path, session)
        assert (status, resumed) == (401, True), f"{version}: an expired certificate on a resumed session"
        with pytest.raises(HANDSHAKE_REFUSED):
            raw_get(server, ctx, path)
        assert snapshot(server, ws) == before

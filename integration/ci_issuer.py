"""A real OIDC issuer of CI job tokens for the `[[ci_identity]]` tests, on loopback over
HTTPS: its own CA (the stategate config trusts it through `ca_file`), a server
certificate for 127.0.0.1, and per issuer path a discovery document and a JWKS. Keys and
certificates are made by the `cryptography` package; tokens are signed exactly as an
issuer signs them (RS256 for `/gh`, GitHub Actions' claims; ES256 for `/gl`, GitLab CI's).
Counts each JWKS read, and can be told to answer 503 (an outage).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int(n: int) -> str:
    return b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


class Key:
    def __init__(self, kind: str, kid: str):
        self.kind, self.kid = kind, kid
        self.private = (rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "RSA"
                        else ec.generate_private_key(ec.SECP256R1()))
        self.alg = "RS256" if kind == "RSA" else "ES256"

    def jwk(self) -> dict:
        pub = self.private.public_key().public_numbers()
        if self.kind == "RSA":
            return {"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": _int(pub.n), "e": _int(pub.e)}
        return {"kty": "EC", "kid": self.kid, "use": "sig", "alg": "ES256", "crv": "P-256",
                "x": b64(pub.x.to_bytes(32, "big")), "y": b64(pub.y.to_bytes(32, "big"))}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)

    def sign(self, data: bytes) -> bytes:
        if self.kind == "RSA":
            return self.private.sign(data, padding.PKCS1v15(), hashes.SHA256())
        r, s = decode_dss_signature(self.private.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")


class Issuer:
    """Issuers at https://127.0.0.1:PORT/gh (RSA) and /gl (EC), started at once."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("ci-issuer test CA", ca_key, None, ca_key, ca=True)
        server_key = ec.generate_private_key(ec.SECP256R1())
        server = _cert("127.0.0.1", server_key, ca.subject, ca_key, ca=False)
        self.ca_file = directory / "ci-ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        chain, keyfile = directory / "ci-server.pem", directory / "ci-server.key"
        chain.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        keyfile.write_bytes(server_key.private_bytes(serialization.Encoding.PEM,
                                                     serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
        self.keys = {"gh": Key("RSA", "gh-1"), "gl": Key("EC", "gl-1")}
        self.jwks_reads = {"gh": 0, "gl": 0}
        self.down = False
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                parts = self.path.strip("/").split("/", 1)
                name = parts[0]
                if issuer.down or name not in issuer.keys or len(parts) != 2:
                    return self._answer(503 if issuer.down else 404, {})
                if parts[1] == ".well-known/openid-configuration":
                    return self._answer(200, {"issuer": issuer.url(name), "jwks_uri": f"{issuer.url(name)}/jwks",
                                              "id_token_signing_alg_values_supported": [issuer.keys[name].alg]})
                if parts[1] == "jwks":
                    issuer.jwks_reads[name] += 1
                    return self._answer(200, {"keys": [issuer.keys[name].jwk()]})
                return self._answer(404, {})

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(chain, keyfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- tokens ---------------------------------------------------------------

    def mint(self, name: str, claims: dict, *, alg: str | None = None, kid: str | None = None,
             key: Key | None = None, hmac_secret: bytes | None = None, header: dict | None = None) -> str:
        key = key or self.keys[name]
        head = {"typ": "JWT", "alg": alg or key.alg, "kid": kid or key.kid, **(header or {})}
        signing = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(claims).encode())}".encode()
        if head["alg"] == "none":
            sig = b""
        elif hmac_secret is not None:
            sig = hmac.new(hmac_secret, signing, hashlib.sha256).digest()
        else:
            sig = key.sign(signing)
        return f"{signing.decode()}.{b64(sig)}"

    def github(self, audience: str, *, repository="acme/infra", ref="refs/heads/main", run_id="812",
               lifetime=300, issued=None, **extra) -> dict:
        """The claims GitHub Actions puts in a job's token (`id-token: write`)."""
        now = int(time.time()) if issued is None else issued
        owner = repository.split("/")[0]
        claims = {
            "jti": str(uuid.uuid4()), "sub": f"repo:{repository}:ref:{ref}", "aud": audience,
            "ref": ref, "sha": "d6f1c1b2f0e4a9f7c3a5b8e2d4c6a8b0e2f4a6c8", "repository": repository,
            "repository_owner": owner, "repository_owner_id": "65432", "run_id": run_id,
            "run_number": "17", "run_attempt": "1", "repository_visibility": "private",
            "repository_id": "123456", "actor_id": "1234", "actor": "octocat", "workflow": "terraform",
            "head_ref": "", "base_ref": "", "event_name": "push", "ref_type": "branch",
            "workflow_ref": f"{repository}/.github/workflows/terraform.yml@{ref}",
            "workflow_sha": "d6f1c1b2f0e4a9f7c3a5b8e2d4c6a8b0e2f4a6c8",
            "job_workflow_ref": f"{repository}/.github/workflows/terraform.yml@{ref}",
            "job_workflow_sha": "d6f1c1b2f0e4a9f7c3a5b8e2d4c6a8b0e2f4a6c8",
            "runner_environment": "github-hosted", "iss": self.url("gh"),
            "nbf": now - 5, "exp": now + lifetime, "iat": now - 5,
        }
        claims.update(extra)
        return claims

    def gitlab(self, audience, *, project_path="acme/infra", ref="main", protected=True,
               environment=None, pipeline_id="574", lifetime=300, issued=None, **extra) -> dict:
        """The claims GitLab CI puts in a job's `id_tokens:` token."""
        now = int(time.time()) if issued is None else issued
        namespace = project_path.split("/")[0]
        claims = {
            "namespace_id": "72", "namespace_path": namespace, "project_id": "20",
            "project_path": project_path, "user_id": "1", "user_login": "alice",
            "user_email": "alice@example.com", "user_access_level": "maintainer",
            "pipeline_id": pipeline_id, "pipeline_source": "push", "job_id": "302", "ref": ref,
            "ref_type": "branch", "ref_path": f"refs/heads/{ref}",
            "ref_protected": "true" if protected else "false", "runner_id": 1,
            "runner_environment": "gitlab-hosted", "sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
            "project_visibility": "private",
            "ci_config_ref_uri": f"gitlab.example.com/{project_path}//.gitlab-ci.yml@refs/heads/{ref}",
            "ci_config_sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
            "jti": str(uuid.uuid4()), "iss": self.url("gl"), "iat": now - 5, "nbf": now - 5,
            "exp": now + lifetime, "sub": f"project_path:{project_path}:ref_type:branch:ref:{ref}",
            "aud": audience,
        }
        if environment is not None:
            claims.update(environment=environment, environment_protected="true", deployment_tier="production")
        claims.update(extra)
        return claims

"""The cluster tfstate & lock API end to end with the real binary: `stategate admin`
commands (run while the server is up, against the same SQLite file) and raw HTTP
calls as the provisioning CLI makes them. Runs once per store (local, garage).

Lease staleness is configured down to 2 s (STATEGATE_CLUSTER_LEASE_STALE_SECONDS), so
the steal path costs one ~3 s wait instead of five minutes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import time
import uuid

from harness import http, stategate_bin

STALE = 2
ENC_KEY = base64.b64encode(bytes(range(100, 132))).decode()
NOT_CONFIGURED = b'{"error": "state sync not configured"}'


def admin(server, *args, ok=True):
    p = subprocess.run([str(stategate_bin()), "admin", *args], env=server.env(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if ok:
        assert p.returncode == 0, f"stategate admin {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def tfstate(serial: int, lineage: str, marker: str) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.15.5", "serial": serial, "lineage": lineage,
                       "outputs": {"marker": {"value": marker, "type": "string"}}, "resources": []},
                      separators=(",", ":")).encode()


class Cli:
    """What the provisioning CLI does, as one admin."""

    def __init__(self, server, cluster: str, token: str):
        self.base = f"{server.url}/v1/clusters/{cluster}"
        self.token = token

    def lock(self, operation="provision", host="laptop"):
        return http("POST", f"{self.base}/lock", {"operation": operation, "host": host}, bearer=self.token)

    def heartbeat(self):
        return http("POST", f"{self.base}/lock/heartbeat", b"", bearer=self.token)

    def release(self, force=False):
        return http("DELETE", f"{self.base}/lock" + ("?force=1" if force else ""), bearer=self.token)

    def pull(self):
        return http("GET", f"{self.base}/tfstate", bearer=self.token)

    def push(self, body: bytes):
        return http("PUT", f"{self.base}/tfstate", body, bearer=self.token)


def setup_identities(s):
    admin(s, "org", "create", "acme")
    admin(s, "org", "create", "initech")
    dup = admin(s, "org", "create", "acme", ok=False)
    assert dup.returncode != 0 and "already exists" in dup.stderr
    tokens = {}
    for name, org, role in [("alice", "acme", "admin"), ("bob", "acme", "admin"), ("erin", "acme", "admin"),
                            ("mallory", "acme", "member"), ("dave", "initech", "admin")]:
        p = admin(s, "user", "create", "--org", org, "--email", f"{name}@{org}.example", "--role", role)
        token = p.stdout.strip()
        assert token.startswith("sgp_") and "\n" not in token, p.stdout
        assert "shown once" in p.stderr
        tokens[name] = token
    bad = admin(s, "user", "create", "--org", "acme", "--email", "x@acme.example", "--role", "owner", ok=False)
    assert bad.returncode != 0
    cluster = admin(s, "cluster", "create", "--org", "acme", "--name", "prod").stdout.strip()
    assert str(uuid.UUID(cluster)) == cluster
    listed = [json.loads(line) for line in admin(s, "cluster", "list", "--org", "acme", "--json").stdout.splitlines()]
    assert [(c["id"], c["org"], c["name"]) for c in listed] == [(cluster, "acme", "prod")]
    return tokens, cluster


def test_cluster_cli_two_admins(server_factory):
    s = server_factory.new(ADJ_STATE_ENC_KEY=ENC_KEY, STATEGATE_CLUSTER_LEASE_STALE_SECONDS=STALE)
    tokens, cluster = setup_identities(s)  # while the server runs: same db, WAL
    a, b = Cli(s, cluster, tokens["alice"]), Cli(s, cluster, tokens["bob"])

    # A: acquire, pull (nothing yet), push, heartbeat.
    r = a.lock("provision", "laptop-a")
    assert r.status == 200 and r.json()["acquired_at"].endswith("Z"), r
    assert a.pull().status == 404
    s1 = tfstate(1, "lin-1", "a1")
    r = a.push(s1)
    assert (r.status, r.json()) == (200, {"serial": 1}), r
    assert a.push(s1).status == 200  # idempotent retry
    assert a.heartbeat().status == 200
    # B refused with A's details.
    r = b.lock("deprovision", "laptop-b")
    assert r.status == 409, r
    holder = r.json()
    assert holder["holder_email"] == "alice@acme.example"
    assert (holder["operation"], holder["host"]) == ("provision", "laptop-a")
    assert isinstance(holder["heartbeat_age_seconds"], int) and "acquired_at" in holder
    # GET: exact bytes and version headers.
    r = b.pull()
    assert r.status == 200 and r.body == s1
    h = {k.lower(): v for k, v in r.headers.items()}
    assert h["x-stategate-serial"] == "1" and h["x-stategate-lineage"] == "lin-1"
    assert h["etag"] == '"%s"' % hashlib.sha256(s1).hexdigest()
    assert h["last-modified"].endswith("GMT") and h["content-type"] == "application/json"
    # A goes silent past the stale threshold: B steals.
    time.sleep(STALE + 1.1)
    r = b.lock("deprovision", "laptop-b")
    assert r.status == 200, r
    # A's late push and heartbeat are rejected.
    r = a.push(tfstate(2, "lin-1", "a2-late"))
    assert r.status == 409 and r.json()["holder_email"] == "bob@acme.example", r
    assert a.heartbeat().status == 409
    # B pushes the next serial and releases.
    assert b.push(tfstate(2, "lin-1", "b2")).status == 200
    assert b.push(tfstate(2, "lin-1", "b2-other")).status == 409
    assert b.release().status == 200 and b.release().status == 200
    # An org admin force-breaks a lock.
    assert a.lock("state-push", "laptop-a").status == 200
    e = Cli(s, cluster, tokens["erin"])
    assert e.release().status == 409
    assert e.release(force=True).status == 200
    # A member is 403; another org's admin only ever sees 404, like a missing cluster.
    assert Cli(s, cluster, tokens["mallory"]).pull().status == 403
    for c in (Cli(s, cluster, tokens["dave"]), Cli(s, str(uuid.uuid4()), tokens["dave"]),
              Cli(s, "not-a-uuid", tokens["alice"])):
        for r in (c.pull(), c.push(s1), c.lock(), c.heartbeat(), c.release(), c.release(force=True)):
            assert (r.status, r.body) == (404, b'{"error":"cluster not found"}'), r
    assert http("GET", f"{s.url}/v1/clusters/{cluster}/tfstate").status == 401
    assert http("GET", f"{s.url}/v1/clusters/{cluster}/tfstate", bearer="sgp_nope").status == 401

    # The audit log, through the CLI.
    rows = [json.loads(line) for line in admin(s, "audit", "list", "--cluster", cluster, "--json").stdout.splitlines()]
    events = [(r["event"], r["actor"]) for r in rows if not r["event"].startswith("admin.")]
    assert events == [
        ("cluster.state_lock_acquired", "alice@acme.example"),
        ("cluster.state_pushed", "alice@acme.example"),
        ("cluster.state_lock_stolen", "bob@acme.example"),
        ("cluster.state_pushed", "bob@acme.example"),
        ("cluster.state_lock_released", "bob@acme.example"),
        ("cluster.state_lock_acquired", "alice@acme.example"),
        ("cluster.state_lock_broken", "erin@acme.example"),
    ], events
    by = {r["event"]: r for r in rows}
    assert by["cluster.state_pushed"]["payload"] == {"serial": 2, "size": len(tfstate(2, "lin-1", "b2"))}
    assert by["cluster.state_lock_stolen"]["payload"]["previous_holder"]["holder_email"] == "alice@acme.example"
    assert by["cluster.state_lock_broken"]["payload"]["previous_holder"]["holder_email"] == "alice@acme.example"
    assert all(r["org"] == "acme" and r["scope"] == f"cluster/{cluster}" and r["at"] for r in rows)
    only_broken = admin(s, "audit", "list", "--event", "cluster.state_lock_broken", "--json").stdout.splitlines()
    assert len(only_broken) == 1

    # Tokens exist only as hashes in the database.
    hashes = {row[0] for row in s.query("SELECT sha256 FROM tokens WHERE kind = 'principal'")}
    for token in tokens.values():
        assert hashlib.sha256(token.encode()).hexdigest() in hashes
        assert token not in hashes
    raw = b"".join(p.read_bytes() for p in s.data_dir.glob("stategate.db*"))
    assert not any(t.encode() in raw for t in tokens.values())
    # A second token for an existing user works at once.
    extra = admin(s, "token", "create", "--email", "alice@acme.example").stdout.strip()
    assert Cli(s, cluster, extra).pull().status == 200


def test_cluster_api_off_without_state_key(server_factory):
    s = server_factory.new(ADJ_STATE_ENC_KEY="")
    tokens, cluster = setup_identities(s)
    c = Cli(s, cluster, tokens["alice"])
    for r in (c.pull(), c.push(tfstate(1, "l", "m")), c.lock(), c.heartbeat(), c.release(), c.release(force=True)):
        assert (r.status, r.body) == (503, NOT_CONFIGURED), r
    # ... but only after the auth and org checks.
    assert http("GET", f"{s.url}/v1/clusters/{cluster}/tfstate").status == 401
    assert Cli(s, cluster, tokens["mallory"]).pull().status == 403
    assert Cli(s, cluster, tokens["dave"]).pull().status == 404

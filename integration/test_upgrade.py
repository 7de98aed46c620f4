"""Upgrades: an installation written by an earlier release opens in this one with
nothing lost, and Terraform goes on.

Each fixture in tests/fixtures/upgrade/ is a small data dir (and, for a PostgreSQL
index, a pg_dump of it) written by an earlier release's binary through the real
Terraform CLI (integration/upgrade_fixture.py says how and what). The current binary
serves it, and every version, the held lock, the operator and its token, the workspace
token, consumers, the freeze, the cluster API's principal, state and lease, and the
backups must be there as the old release left them (each where the fixture's manifest
records it); then a real `terraform apply` writes the next version.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

import postgres_harness
from harness import REPO, Server, Tf, cli, data_resource, http, json_lines, lock_info, tf_base_env

# Short, so the lease the old release left held is stale and another admin takes it over.
CLUSTER_LEASE_STALE = 2
FIXTURES = sorted(p for p in (REPO / "tests" / "fixtures" / "upgrade").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A PostgreSQL for the PostgreSQL fixtures: the run's own (STATEGATE_E2E_POSTGRES_DIR,
    left running), or one started here and stopped after this module."""
    shared = os.environ.get("STATEGATE_E2E_POSTGRES_DIR")
    pg = postgres_harness.Postgres(Path(shared) if shared else tmp_path_factory.mktemp("pg"))
    try:
        pg.start()
    except postgres_harness.PostgresError as e:
        if os.environ.get("STATEGATE_TEST_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"no PostgreSQL for the upgrade fixture: {e}")
        pytest.skip(f"no PostgreSQL: {e}")
    yield pg
    if not shared:
        pg.stop()


def _open(fixture: Path, tmp: Path, request) -> tuple[Server, dict]:
    manifest = json.loads((fixture / "manifest.json").read_text())
    with tarfile.open(fixture / "data.tar.gz") as tar:
        tar.extractall(tmp, filter="data")
    extra = {}
    if manifest["index"] == "postgres":
        url = request.getfixturevalue("postgres").new_database()
        subprocess.run([postgres_harness.find_bin("psql"), "--quiet", "-v", "ON_ERROR_STOP=1",
                        "-f", str(fixture / "index.sql"), url],
                       check=True, capture_output=True, text=True)
        extra = {"STATEGATE_INDEX": "postgres", "STATEGATE_INDEX_URL": url}
    if "cluster" in manifest["features"]:
        extra.update(ADJ_STATE_ENC_KEY=manifest["cluster"]["state_enc_key"],
                     STATEGATE_CLUSTER_LEASE_STALE_SECONDS=str(CLUSTER_LEASE_STALE))
    return Server(tmp / "data", "local", extra_env=extra), manifest


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_an_earlier_release_opens_with_nothing_lost_and_terraform_goes_on(fixture, tmp_path, request):
    server, m = _open(fixture, tmp_path, request)
    server.start()
    try:
        # Every version, byte for byte, under the credential derived from the same key.
        for ws, want in m["states"].items():
            got = server.workspace(ws).get()
            assert got.status == 200, (ws, got)
            assert hashlib.sha256(got.body).hexdigest() == want["sha256"], ws
            assert len(server.db_rows(ws)) == want["versions"], ws
        history = cli(server, "workspace", "history", "prod", "--json").stdout
        assert len([line for line in history.splitlines() if line.strip()]) == m["states"]["prod"]["versions"]

        # The lock the old release held is still held, by the same ID.
        lock = m["lock"]
        staging = server.workspace(lock["workspace"])
        other = staging.lock(lock_info("another-holder"))
        assert other.status == 423 and other.json()["ID"] == lock["id"], other

        # The operator's token and the workspace token still authenticate.
        who = http("GET", f"{server.url}/api/v1/admin/whoami",
                   bearer=m["operator"]["token"])
        assert who.status == 200 and m["operator"]["email"] in who.text(), who
        if "workspace_token" in m["features"]:
            t = m["workspace_token"]
            r = http("GET", f"{server.url}/api/v1/tf/state/{t['workspace']}", user="ci", password=t["secret"])
            assert r.status == 200, r
            assert hashlib.sha256(r.body).hexdigest() == m["states"][t["workspace"]]["sha256"]
        if "consumers" in m["features"]:
            for ws, consumers in m["consumers"].items():
                listed = cli(server, "workspace", "consumers", "list", ws).stdout.split()
                assert listed == consumers
        if "freeze" in m["features"]:
            freezes = json_lines(cli(server, "workspace", "freezes", "--json").stdout)
            assert [(f["workspace"], f["reason"]) for f in freezes] == [("frozen", "fixture freeze")], freezes

        if "cluster" in m["features"]:
            _cluster_goes_on(server, m["cluster"])

        # Every backup the old release left in the store is still listed, whatever the
        # index (this server may have added its own), and the old release's newest
        # restores under this one into a new index of the fixture's kind, holding the
        # versions it held when it was taken.
        left = {p.name.removesuffix(".sgdb") for p in (tmp_path / "data").rglob("*.sgdb")}
        assert left, "the fixture holds no backup"
        listed = {b["id"] for b in json_lines(cli(server, "backup", "list", "--json").stdout)}
        assert left <= listed, (sorted(left - listed), sorted(listed))
        _restore_goes_on(server, m, max(left), tmp_path, request)

        # Terraform goes on: the held lock released by its holder, then the next apply.
        assert staging.unlock(lock_info(lock["id"], who="ci@fixture")).status == 200
        ws = server.workspace("prod")
        tf = Tf(tmp_path / "tf", {**tf_base_env(), **ws.env})
        tf.write('terraform {\n  backend "http" {}\n}\n' + data_resource("v", "after-upgrade"))
        tf.init()
        tf.apply()
        tf.plan_no_changes()
        assert len(server.db_rows("prod")) == m["states"]["prod"]["versions"] + 1
        assert json.loads(ws.get().body)["serial"] == m["states"]["prod"]["serial"] + 1
    finally:
        server.stop()


def _restore_goes_on(server: Server, m: dict, backup: str, tmp: Path, request):
    """`restore --from` the old release's backup into a new index of the fixture's kind
    (a file, or an empty PostgreSQL database): it holds versions of the fixture's
    workspaces and its own `index.restored` audit row."""
    if m["index"] == "postgres":
        into = request.getfixturevalue("postgres").new_database()

        def count(sql: str) -> int:
            out = subprocess.run([postgres_harness.find_bin("psql"), into.split("?", 1)[0], "-qAtc", sql],
                                 check=True, capture_output=True, text=True).stdout
            return int(out.strip())
    else:
        into = str(tmp / "restored.db")

        def count(sql: str) -> int:
            import sqlite3
            with sqlite3.connect(into) as db:
                return db.execute(sql).fetchone()[0]
    cli(server, "restore", "--from", backup, "--into", into)
    versions = count("SELECT count(*) FROM versions WHERE scope = 'tf/prod'")
    assert 0 < versions <= m["states"]["prod"]["versions"], versions
    assert count("SELECT count(*) FROM audit WHERE event = 'index.restored'") == 1


def _cluster_goes_on(server: Server, c: dict):
    """The old release's org, principal token, cluster state and held lease are there;
    another admin of the org takes the stale lease over from the old holder and pushes
    the next state."""
    base = f"{server.url}/v1/clusters/{c['id']}"
    got = http("GET", f"{base}/tfstate", bearer=c["token"])
    assert got.status == 200 and hashlib.sha256(got.body).hexdigest() == c["sha256"], got
    headers = {k.lower(): v for k, v in got.headers.items()}
    assert headers.get("x-stategate-serial") == str(c["serial"]), headers
    listed = json_lines(cli(server, "admin", "cluster", "list", "--org", c["org"], "--json").stdout)
    assert [x["id"] for x in listed] == [c["id"]], listed
    other = cli(server, "admin", "user", "create", "--org", c["org"], "--email", "next@fixture",
                "--role", "admin").stdout.strip()
    r = http("POST", f"{base}/lock", {"operation": "provision", "host": "after-upgrade"}, bearer=other)
    if r.status == 409:  # the fixture was written moments ago: its lease is not stale yet
        assert r.json()["holder_email"] == c["email"], r
        time.sleep(CLUSTER_LEASE_STALE + 1.1)
        r = http("POST", f"{base}/lock", {"operation": "provision", "host": "after-upgrade"}, bearer=other)
    assert r.status == 200, r
    audit = json_lines(cli(server, "admin", "audit", "list", "--cluster", c["id"], "--json").stdout)
    stolen = [a for a in audit if a["event"] == "cluster.state_lock_stolen"]
    assert [a["payload"]["previous_holder"]["holder_email"] for a in stolen] == [c["email"]], audit
    body = json.loads(got.body)
    body["serial"] += 1
    nxt = json.dumps(body, separators=(",", ":")).encode()
    assert http("PUT", f"{base}/tfstate", nxt, bearer=other).status == 200
    again = http("GET", f"{base}/tfstate", bearer=c["token"])
    assert again.status == 200 and again.body == nxt, again

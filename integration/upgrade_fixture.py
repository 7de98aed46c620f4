"""Makes an upgrade fixture: a small installation written by an EARLIER release's binary,
kept in tests/fixtures/upgrade/<name>/ and opened by the current binary in
integration/test_upgrade.py (docs/operating.md, "Upgrading").

    STATEGATE_BIN=<old binary> python integration/upgrade_fixture.py <name> [--postgres URL]

What it writes, through the old binary and the real Terraform CLI only:
- `prod`: three applies (versions 1-3); `staging`: one apply, then a lock held;
- an admin operator (its token), a workspace token (`sgw_`, read on `prod`), a
  consumer list and a freeze, where the old release has them;
- where the old release has the cluster API: an org, an admin principal (its `sgp_`
  token), a cluster with two pushed states and its lease left held;
- a backup in the store;
then a clean stop, and:
- `data.tar.gz`: the data dir (its `dek`, the local store, and the SQLite index unless
  --postgres), `index.sql` with --postgres (pg_dump of the index database);
- `manifest.json`: the release, what the fixture holds (state hashes, the lock ID, the
  secrets) for the test to check. Every secret in it belongs to this fixture alone.

Each release that changes what is on disk (a table, a column, a file) adds a fixture of
the release before it, so every earlier layout keeps being opened by CI.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, Server, Tf, cli, data_resource, http, lock_info, stategate_bin, tf_base_env  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "upgrade"


def has_command(server: Server, *words: str) -> bool:
    return cli(server, *words, "--help", ok=False).returncode == 0


def apply(server: Server, workdir: Path, workspace: str, value: str):
    ws = server.workspace(workspace)
    tf = Tf(workdir, {**tf_base_env(), **ws.env})
    tf.write('terraform {\n  backend "http" {}\n}\n' + data_resource("v", value))
    tf.init()
    tf.apply()


def cluster_state(serial: int, marker: str) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.15.5", "serial": serial, "lineage": "fixture-cluster",
                       "outputs": {"marker": {"value": marker, "type": "string"}}, "resources": []},
                      separators=(",", ":")).encode()


def add_cluster(server: Server, manifest: dict):
    """An org, its admin principal, a cluster with two pushed states, the lease left
    held (it reads as stale by the time the fixture is opened)."""
    cli(server, "admin", "org", "create", "fixture-org")
    created = cli(server, "admin", "user", "create", "--org", "fixture-org", "--email", "lead@fixture",
                  "--role", "admin")
    token = next(t for t in created.stdout.split() if t.startswith("sgp_"))
    cluster = cli(server, "admin", "cluster", "create", "--org", "fixture-org", "--name", "fixture")
    cluster_id = cluster.stdout.split()[-1]
    base = f"{server.url}/v1/clusters/{cluster_id}"
    r = http("POST", f"{base}/lock", {"operation": "provision", "host": "fixture-host"}, bearer=token)
    assert r.status == 200, r
    for serial in (1, 2):
        body = cluster_state(serial, f"cluster-{serial}")
        r = http("PUT", f"{base}/tfstate", body, bearer=token)
        assert r.status == 200, r
    manifest["cluster"] = {"state_enc_key": server.extra_env["ADJ_STATE_ENC_KEY"], "org": "fixture-org",
                           "id": cluster_id, "email": "lead@fixture", "token": token,
                           "sha256": hashlib.sha256(body).hexdigest(), "serial": 2}
    manifest["features"].append("cluster")


def make(name: str, postgres: str | None) -> Path:
    out = FIXTURES / name
    if out.exists():
        raise SystemExit(f"{out} exists: a fixture is written once, by the release it names")
    version = subprocess.run([str(stategate_bin()), "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        extra = {"STATEGATE_INDEX": "postgres", "STATEGATE_INDEX_URL": postgres} if postgres else {}
        # The cluster API's state key (unset, every cluster route answers 503): this
        # fixture's own, recorded in the manifest for the test to serve it with.
        extra["ADJ_STATE_ENC_KEY"] = base64.b64encode(os.urandom(32)).decode()
        server = Server(tmp / "data", "local", extra_env=extra).start()
        manifest: dict = {"release": version, "index": "postgres" if postgres else "sqlite",
                          "features": []}
        try:
            for i in range(3):
                apply(server, tmp / "prod", "prod", f"prod-{i}")
            apply(server, tmp / "staging", "staging", "staging-0")
            held = lock_info("fixture-lock-0001", who="ci@fixture")
            r = server.workspace("staging").lock(held)
            assert r.status == 200, r
            manifest["lock"] = {"workspace": "staging", "id": held["ID"]}
            created = cli(server, "admin", "operator", "create", "--email", "admin@fixture")
            token = next(t for t in created.stdout.split() if t.startswith("sgo_") or len(t) > 30)
            manifest["operator"] = {"email": "admin@fixture", "token": token}
            if has_command(server, "workspace", "token", "create"):
                t = cli(server, "workspace", "token", "create", "--name", "fixture-read",
                        "--workspaces", "prod", "--scope", "read", "--json")
                manifest["workspace_token"] = {"workspace": "prod",
                                               "secret": json.loads(t.stdout.splitlines()[-1])["secret"]}
                manifest["features"].append("workspace_token")
            if has_command(server, "workspace", "consumers", "set"):
                cli(server, "workspace", "consumers", "set", "prod", "staging")
                manifest["consumers"] = {"prod": ["staging"]}
                manifest["features"].append("consumers")
            if has_command(server, "workspace", "freeze"):
                cli(server, "workspace", "freeze", "frozen", "--reason", "fixture freeze")
                manifest["features"].append("freeze")
            if has_command(server, "admin", "cluster", "create"):
                add_cluster(server, manifest)
            cli(server, "backup")
            manifest["states"] = {}
            for ws in ("prod", "staging"):
                w = server.workspace(ws)
                body = w.get().body
                manifest["states"][ws] = {
                    "sha256": hashlib.sha256(body).hexdigest(),
                    "serial": json.loads(body)["serial"],
                    "versions": len(server.db_rows(ws)),
                }
        finally:
            server.stop()
        out.mkdir(parents=True)
        with tarfile.open(out / "data.tar.gz", "w:gz") as tar:
            tar.add(tmp / "data", arcname="data",
                    filter=lambda m: None if m.name.endswith((".log", "serve.lock")) else m)
        if postgres:
            dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", postgres],
                                  capture_output=True, text=True, check=True).stdout
            (out / "index.sql").write_text(dump)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="e.g. 2026-12-05-115bfbb-sqlite")
    p.add_argument("--postgres", help="an EMPTY PostgreSQL database for the old release's index")
    a = p.parse_args()
    print(make(a.name, a.postgres))

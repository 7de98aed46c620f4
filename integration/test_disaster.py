"""Disaster recovery on a real Garage: the node loses its whole data dir (all but the
DEK) and comes back from the backups stategate keeps in the store.

Workload (Terraform workspaces, cluster API identities, a lease and pushes, audit),
then a SCHEDULED backup (backup.interval_seconds = 2), then more versions; the data dir
is deleted; `stategate restore --into NEW.db` + the documented swap gives back every
org, user, token (the old ones still work), cluster and audit row of the snapshot and
every version acknowledged after it, and Terraform continues from the latest state.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time

from harness import BACKEND_HTTP, Server, data_resource, stategate_bin, cli
from test_cluster_cli import ENC_KEY, Cli, admin, tfstate

TABLES = ["orgs", "principals", "tokens", "clusters"]



def dump(db, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def backup_ids(server) -> list[str]:
    return [json.loads(line)["id"] for line in cli(server, "backup", "list", "--json").stdout.splitlines()]


def wait_for_new_backup(server, known: list[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [i for i in backup_ids(server) if i not in known]
        if new:
            return new[-1]
        time.sleep(0.5)
    raise AssertionError(f"no scheduled backup within {timeout}s:\n{server.log_tail()}")


def test_restore_after_losing_the_data_dir(garage_env, check_binary, tmp_path, make_tf):
    s = Server(data_dir=tmp_path / "data", store="s3", s3_env=garage_env,
               extra_env={"ADJ_STATE_ENC_KEY": ENC_KEY, "STATEGATE_BACKUP_INTERVAL_SECONDS": "2",
                          "STATEGATE_BACKUP_KEEP": "50"})
    s.start()
    try:
        db = s.data_dir / "stategate.db"
        # -- the workload -----------------------------------------------------
        admin(s, "org", "create", "acme")
        token = admin(s, "user", "create", "--org", "acme", "--email", "alice@acme.example",
                      "--role", "admin").stdout.strip()
        cluster = admin(s, "cluster", "create", "--org", "acme", "--name", "prod").stdout.strip()
        alice = Cli(s, cluster, token)
        assert alice.lock().status == 200
        assert alice.push(tfstate(1, "lin-c", "before")).status == 200
        assert alice.release().status == 200
        ws = s.workspace("disaster")
        tf = make_tf("w", ws.env)
        tf.write(BACKEND_HTTP + data_resource("a", "one"))
        tf.init()
        assert "1 added" in tf.apply().stdout
        known = backup_ids(s)
        # -- a scheduled backup taken after all of that ------------------------
        snapshot_id = wait_for_new_backup(s, known)
        at_snapshot = {t: dump(db, f"SELECT * FROM {t} ORDER BY 1") for t in TABLES}
        audit_at_snapshot = dump(db, "SELECT * FROM audit ORDER BY id")
        assert all(at_snapshot[t] for t in TABLES) and audit_at_snapshot
        # -- acknowledged after the snapshot -----------------------------------
        tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "two"))
        assert "1 added" in tf.apply().stdout
        assert alice.lock().status == 200
        assert alice.push(tfstate(2, "lin-c", "after")).status == 200
        assert alice.release().status == 200
        versions = dump(db, "SELECT scope, version, serial, sha256, blob_key FROM versions ORDER BY 1, 2")
        latest_tf = ws.get().json()
        # -- the disaster: everything but the DEK is gone ----------------------
        s.stop()
        dek = (s.data_dir / "dek").read_bytes()
        shutil.rmtree(s.data_dir)
        s.data_dir.mkdir()
        (s.data_dir / "dek").write_bytes(dek)
        (s.data_dir / "dek").chmod(0o600)
        new_db = tmp_path / "restored.db"
        out = cli(s, "restore", "--from", "latest", "--into", str(new_db))
        assert "To use it: stop stategate" in out.stdout, out.stdout
        assert out.stderr == "", out.stderr  # no log lines, and nothing to warn about
        latest = backup_ids(s)[-1]
        assert latest >= snapshot_id
        # the swap, as docs/operating.md says
        shutil.move(str(new_db), str(db))
        s.start()
        # -- everything is back ------------------------------------------------
        for t in TABLES:
            assert dump(db, f"SELECT * FROM {t} ORDER BY 1") == at_snapshot[t], t
        restored_audit = dump(db, "SELECT * FROM audit ORDER BY id")
        assert restored_audit[:len(audit_at_snapshot)] == audit_at_snapshot
        assert dump(db, "SELECT scope, version, serial, sha256, blob_key FROM versions ORDER BY 1, 2") == versions
        # the old token still works and sees the version pushed after the snapshot
        pulled = alice.pull()
        assert pulled.status == 200 and json.loads(pulled.body)["outputs"]["marker"]["value"] == "after"
        assert ws.get().json() == latest_tf
        # Terraform continues from the latest state
        tf.plan_no_changes()
        tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "two") + data_resource("c", "3"))
        assert "1 added" in tf.apply().stdout
        assert alice.lock().status == 200
        assert alice.push(tfstate(3, "lin-c", "later")).status == 200
        assert alice.release().status == 200
        # a wrong DEK is refused and writes nothing
        env = dict(s.env(), STATEGATE_DEK="HxwdHhkaGxwdHh8ICQoLDA0ODxAREhMUFRYXGBkaGxw=")
        p = subprocess.run([str(stategate_bin()), "restore", "--into", str(tmp_path / "wrong.db")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        # (refused before the backup is read: the index records the installation's key)
        assert p.returncode == 1 and "another root key" in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
        assert not (tmp_path / "wrong.db").exists()
    finally:
        s.stop()

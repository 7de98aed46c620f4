"""Operator commands with the real binary and the real Terraform CLI, run while
`stategate serve` is up on the same data dir: `workspace history`, `workspace rollback`
(roll-forward, refused while locked, audited), then a normal `terraform apply` on top of
the rolled-back state; `prune --dry-run` and `index rebuild --into`; a rollback to a
plaintext version over an OpenTofu-encrypted state refused by the downgrade policy
unless allowed once. Once per store.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess

from harness import BACKEND_HTTP, data_resource, http, lock_info, resources_of, stategate_bin, cli, json_lines
from store_support import tfstate




def history(server, ws: str, *extra) -> list[dict]:
    return json_lines(cli(server, "workspace", "history", ws, "--json", *extra).stdout)


def test_history_rollback_then_terraform_apply(server, ws_name, make_tf, tmp_path):
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    assert "1 added" in tf.apply().stdout
    v1_state = ws.get().json()
    tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "two"))
    tf.plan("-out=at-v1.tfplan")  # saved against version 1's serial: the one a rollback restores
    assert "1 added" in tf.apply().stdout
    v2_state = ws.get().json()
    tf.plan("-out=before.tfplan")  # saved against version 2's serial

    # history: one JSON line per version, newest first
    rows = history(server, ws_name)
    assert [r["version"] for r in rows] == [2, 1], rows
    for r in rows:
        assert {"version", "serial", "lineage", "size", "sha256", "created_at", "tombstone"} <= r.keys(), r
        assert r["tombstone"] is False and r["lineage"] == v1_state["lineage"] and r["size"] > 0
    assert [r["serial"] for r in rows] == [v2_state["serial"], v1_state["serial"]]
    assert [r["version"] for r in history(server, ws_name, "--limit", "1")] == [2]
    empty = cli(server, "workspace", "history", ws_name + "-none")
    assert empty.stdout == "" and "no versions" in empty.stderr

    # rollback is refused while anyone holds the lock; nothing is written
    info = lock_info(who="someone-applying@host")
    assert ws.lock(info).status == 200
    refused = cli(server, "workspace", "rollback", ws_name, "--to", "1", ok=False)
    assert refused.returncode != 0, refused
    assert "locked" in refused.stderr and info["ID"] in refused.stderr, refused.stderr
    assert ws.unlock(info).status == 200
    assert len(history(server, ws_name)) == 2
    bad = cli(server, "workspace", "rollback", ws_name, "--to", "9", ok=False)
    assert bad.returncode != 0 and "no version 9" in bad.stderr, bad.stderr

    # roll forward: version 3 holds version 1's content under a serial above every stored
    # one, so plans saved before the rollback are stale
    done = cli(server, "workspace", "rollback", ws_name, "--to", "1")
    new = json.loads(done.stdout)
    fresh = v2_state["serial"] + 1
    assert (new["version"], new["serial"]) == (3, fresh), done
    assert "serial" in done.stderr and "stale" in done.stderr  # the operator is told about serials
    got = ws.get()
    assert got.status == 200 and got.json() == {**v1_state, "serial": fresh}, got
    assert resources_of(got.json()) == ["terraform_data.a"]
    assert [r["version"] for r in history(server, ws_name)] == [3, 2, 1]

    # a plan saved before the rollback no longer matches the state's serial — also one
    # saved against the very version restored (it was made before later applies changed
    # the infrastructure)
    for saved in ("before.tfplan", "at-v1.tfplan"):
        stale = tf.run("apply", "-input=false", "-no-color", saved, check=False)
        assert stale.returncode != 0 and "Saved plan is stale" in stale.output, (saved, stale)

    # audited, metadata only
    audit = json_lines(cli(server, "admin", "audit", "list", "--scope", f"tf/{ws_name}", "--json").stdout)
    events = [a["event"] for a in audit]
    # every state change is there: Terraform's two applies (lock, write, unlock) and the rollback
    assert events.count("tf.state_written") == 2 and events.count("tf.rollback") == 1, events
    assert {"tf.lock_acquired", "tf.lock_released"} <= set(events), events
    rollback = audit[events.index("tf.rollback")]
    assert rollback["payload"] == {"from_version": 2, "to_version": 1, "new_version": 3,
                                   "serial": fresh, "restored_serial": v1_state["serial"]}
    assert all("resources" not in json.dumps(a["payload"]) for a in audit), audit

    # Terraform carries on from the restored state: it reads the fresh serial, plans to
    # re-create b, and writes the serial after it (never one an earlier version had).
    plan = tf.plan("-detailed-exitcode", check=False)
    assert plan.returncode == 2 and "1 to add, 0 to change, 0 to destroy" in plan.stdout, plan
    r = tf.apply()
    assert "1 added, 0 changed, 0 destroyed" in r.stdout, r
    after = ws.get().json()
    assert resources_of(after) == ["terraform_data.a", "terraform_data.b"]
    assert after["lineage"] == v1_state["lineage"]
    assert after["serial"] == fresh + 1, (after["serial"], fresh)
    tf.plan_no_changes()
    assert [r["version"] for r in history(server, ws_name)] == [4, 3, 2, 1]

    # prune with the default policy (100 versions / 30 days) would delete none of these
    dry = cli(server, "prune", "--dry-run")
    assert all(line.get("scope") != f"tf/{ws_name}" for line in json_lines(dry.stdout)), dry.stdout
    assert "dry run" in dry.stderr

    # the index rebuilt from the store alone has exactly this workspace's live rows
    into = tmp_path / "rebuilt.db"
    rebuilt = cli(server, "index", "rebuild", "--into", str(into))
    assert "NOT in the new index" in rebuilt.stdout and "To use it" in rebuilt.stdout, rebuilt.stdout
    con = sqlite3.connect(f"file:{into}?mode=ro", uri=True)
    try:
        got_rows = con.execute(
            "SELECT version, serial, lineage, sha256, size, blob_key, created_at FROM versions "
            "WHERE scope = ? ORDER BY version", (f"tf/{ws_name}",)).fetchall()
    finally:
        con.close()
    live = [(r["version"], r["serial"], r["lineage"], r["sha256"], r["size"], r["blob_key"], r["created_at"])
            for r in server.db_rows(ws_name)]
    assert got_rows == live
    again = cli(server, "index", "rebuild", "--into", str(into), ok=False)
    assert again.returncode != 0 and "already exists" in again.stderr


# OpenTofu's encrypted envelope (serial and lineage in clear), as the backend receives it.
ENVELOPE = ('{"serial":%d,"lineage":"L","meta":{"key_provider.pbkdf2.main":'
            '"eyJzYWx0IjoiYWJjIiwiaXRlcmF0aW9ucyI6NjAwMDAwfQ=="},'
            '"encrypted_data":"q83vEjRWeJCrze8SNFZ4kA==","encryption_version":"v0"}')


def test_rollback_to_plaintext_over_encrypted_is_refused_by_the_downgrade_policy(server_factory, ws_name):
    server = server_factory.new(STATEGATE_TOFU_REFUSE_PLAINTEXT_AFTER_ENCRYPTED=ws_name)
    ws = server.workspace(ws_name)

    def post(body) -> int:
        return http("POST", ws.address, body, user=ws.user, password=ws.password).status

    assert post(tfstate(1, "L", "clear-marker")) == 200
    assert post(ENVELOPE % 2) == 200

    refused = cli(server, "workspace", "rollback", ws_name, "--to", "1", ok=False)
    assert refused.returncode != 0, refused
    assert "plaintext" in refused.stderr and "nothing was rolled back" in refused.stderr, refused.stderr
    assert f"stategate workspace allow-write {ws_name}" in refused.stderr, refused.stderr
    assert "clear-marker" not in refused.stderr + refused.stdout
    assert [r["version"] for r in history(server, ws_name)] == [2, 1]
    assert ws.get().text() == ENVELOPE % 2

    # Allowed once: the rollback goes through, uses the override up and is audited.
    cli(server, "workspace", "allow-write", ws_name, "--reason", "decrypt deliberately")
    cli(server, "workspace", "rollback", ws_name, "--to", "1")
    assert "clear-marker" in ws.get().text()
    rows = server.query("SELECT event FROM audit WHERE scope = ? ORDER BY id", (f"tf/{ws_name}",))
    events = [r[0] for r in rows]
    assert events.count("tf.write_override_used") == 1 and events[-1] == "tf.rollback", events
    assert post(ENVELOPE % 9) == 200
    again = cli(server, "workspace", "rollback", ws_name, "--to", "1", ok=False)
    assert again.returncode != 0 and "plaintext" in again.stderr, again.stderr

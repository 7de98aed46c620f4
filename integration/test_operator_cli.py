"""The operator's workspace commands with the real binary and the real Terraform CLI,
while `stategate serve` runs on the same data dir: `workspace list/show/diff` show what
Terraform wrote; a `terraform apply` killed with SIGKILL leaves a lock that `workspace
list` flags stale and `workspace unlock` frees (audited with the operator), after which
the next apply works; a DELETE is undone by `workspace restore`. Once per store.
"""

from __future__ import annotations

import json
import signal
import time

from harness import BACKEND_HTTP, data_resource, http, resources_of, stategate_bin, cli, json_lines

import subprocess




def listed(server, ws: str) -> dict:
    rows = [r for r in json_lines(cli(server, "workspace", "list", "--json").stdout) if r["name"] == ws]
    assert len(rows) == 1, rows
    return rows[0]


SLOW = 'resource "terraform_data" "slow" {\n  provisioner "local-exec" {\n    command = "sleep 120"\n  }\n}\n'


def test_list_show_diff_unlock_restore(server_factory, ws_name, make_tf):
    server = server_factory.new(STATEGATE_LOCKS_STALE_AFTER_SECONDS=1)
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    tf.apply()
    tf.write(BACKEND_HTTP + data_resource("a", "two") + data_resource("b", "three")
             + 'output "greeting" {\n  value = "hello"\n}\n'
             + 'output "secret" {\n  value = "s3cr3t-value"\n  sensitive = true\n}\n')
    tf.apply()
    current = ws.get().json()

    # list: the table and JSON lines agree with what Terraform wrote
    row = listed(server, ws_name)
    assert (row["version"], row["serial"], row["deleted"], row["lock"]) == (2, current["serial"], False, None), row
    table = cli(server, "workspace", "list").stdout
    assert table.splitlines()[0].split()[:3] == ["WORKSPACE", "VERSION", "SERIAL"], table
    assert any(line.startswith(ws_name + " ") for line in table.splitlines()), table

    # show: the current state and an old version, verbatim; masked hides the secret
    shown = cli(server, "workspace", "show", ws_name)
    assert json.loads(shown.stdout) == current
    old = json.loads(cli(server, "workspace", "show", ws_name, "--version", "1").stdout)
    assert resources_of(old) == ["terraform_data.a"]
    masked = cli(server, "workspace", "show", ws_name, "--masked").stdout
    assert "s3cr3t-value" not in masked and "s3cr3t-value" in shown.stdout
    missing = cli(server, "workspace", "show", ws_name, "--version", "9", ok=False)
    assert missing.returncode != 0 and missing.stdout == "" and "no version 9" in missing.stderr, missing
    # the two unmasked shows were reveals: audited, without the value; masked and refused ones not
    revealed = server.query("SELECT actor, payload FROM audit WHERE scope = ? AND event = 'state.revealed'"
                            " ORDER BY id", (f"tf/{ws_name}",))
    assert [json.loads(p) for _, p in revealed] == [{"version": 2, "via": "cli"}, {"version": 1, "via": "cli"}], revealed
    assert all(a.startswith("cli:") and "s3cr3t" not in p for a, p in revealed), revealed

    # diff: by address, the changed attribute, outputs (the sensitive one masked)
    d = cli(server, "workspace", "diff", ws_name, "1", "2").stdout
    assert "~ terraform_data.a" in d and "+ terraform_data.b" in d, d
    assert "input" in d and '"one"' in d and '"two"' in d, d
    assert "+ output.greeting" in d and "+ output.secret" in d and "s3cr3t-value" not in d, d
    changes = json_lines(cli(server, "workspace", "diff", ws_name, "1", "2", "--json").stdout)
    assert {(c["kind"], c.get("address") or c.get("name"), c["change"]) for c in changes} == {
        ("resource", "terraform_data.a", "changed"), ("resource", "terraform_data.b", "added"),
        ("output", "greeting", "added"), ("output", "secret", "added")}, changes

    # an unlocked workspace: says so, exit 0, no audit row
    nothing = cli(server, "workspace", "unlock", ws_name, "--yes")
    assert "not locked" in nothing.stderr

    # a terraform apply killed with SIGKILL leaves its lock behind
    tf.write(BACKEND_HTTP + data_resource("a", "two") + data_resource("b", "three") + SLOW)
    p = tf.start("apply", "-auto-approve", "-input=false", "-no-color")
    deadline = time.time() + 60
    while listed(server, ws_name)["lock"] is None:
        if p.poll() is not None:
            out, err = p.communicate()
            raise AssertionError(f"terraform ended before its lock was seen:\n{out}\n{err}")
        assert time.time() < deadline, "terraform never took the lock"
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    time.sleep(2.5)  # older than STATEGATE_LOCKS_STALE_AFTER_SECONDS=1 (ages are whole seconds)
    lock = listed(server, ws_name)["lock"]
    assert lock["stale"] is True and lock["operation"] == "OperationTypeApply", lock
    assert "STALE" in cli(server, "workspace", "list").stdout
    blocked = tf.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=0s", check=False)
    assert blocked.returncode != 0 and "lock" in blocked.output.lower(), blocked

    # unlock asks for the name back; a wrong answer changes nothing
    wrong = cli(server, "workspace", "unlock", ws_name, stdin="not-it\n", ok=False)
    assert wrong.returncode != 0 and lock["id"] in wrong.stderr and "aborted" in wrong.stderr, wrong
    assert listed(server, ws_name)["lock"] is not None
    typed = cli(server, "workspace", "unlock", ws_name, stdin=ws_name + "\n")
    assert "unlocked" in typed.stderr, typed
    assert listed(server, ws_name)["lock"] is None
    forced = server.query("SELECT actor, payload FROM audit WHERE scope = ? AND event = 'tf.lock_forced'",
                          (f"tf/{ws_name}",))
    assert len(forced) == 1 and forced[0][0].startswith("cli:"), forced
    assert json.loads(forced[0][1])["lock_id"] == lock["id"]

    # the next apply works (a short provisioner this time)
    tf.write(BACKEND_HTTP + data_resource("a", "two") + data_resource("b", "three"))
    tf.apply()
    before_delete = ws.get().json()

    # DELETE, then restore brings the state back for Terraform
    assert http("DELETE", ws.address, user=ws.user, password=ws.password).status == 200
    assert ws.get().status == 404
    assert listed(server, ws_name)["deleted"] is True
    tomb = cli(server, "workspace", "show", ws_name, ok=False)
    assert tomb.returncode != 0 and tomb.stdout == "" and "tombstone" in tomb.stderr, tomb
    restored = cli(server, "workspace", "restore", ws_name, "--json")
    assert json_lines(restored.stdout)[0]["written"] is True
    # the content before the delete, under the next serial (plans saved before are stale)
    assert ws.get().json() == {**before_delete, "serial": before_delete["serial"] + 1}
    assert listed(server, ws_name)["deleted"] is False
    tf.plan_no_changes()
    again = cli(server, "workspace", "restore", ws_name, ok=False)
    assert again.returncode != 0 and "not deleted" in again.stderr

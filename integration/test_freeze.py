"""Freezes with the real Terraform CLI against a real `stategate serve`.

`stategate workspace freeze` makes `terraform apply` fail at its LOCK with the reason
and who froze the workspace in Terraform's own "Lock Info" output; `-lock=false` is
refused at its first state write (Terraform reports `HTTP error: 423`); the state is
unchanged by both; a lock held when the freeze is made is left alone (the command says
so); after `unfreeze` apply works again. Freeze, unfreeze and the listing are audited
and shown.

Each test runs for store=local and store=garage and uses its own workspace.
"""

from __future__ import annotations


from harness import BACKEND_HTTP, cli, data_resource, json_lines, lock_info

REASON = "incident 42: database failover"


def _serial(ws) -> int:
    r = ws.get()
    assert r.status == 200, r
    return r.json()["serial"]


def _frozen(server, ws_name: str) -> list[dict]:
    """This workspace's rows of `workspace freezes --json` (the server is shared)."""
    rows = json_lines(cli(server, "workspace", "freezes", "--json").stdout)
    return [f for f in rows if f["workspace"] == ws_name]


def _audit_events(server, ws_name: str) -> list[str]:
    rows = server.query("SELECT event FROM audit WHERE scope = ? ORDER BY id", (f"tf/{ws_name}",))
    return [r[0] for r in rows]


def test_apply_while_frozen_fails_with_the_reason_and_works_after_unfreeze(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = make_tf("f", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    tf.apply()
    serial = _serial(ws)

    out = cli(server, "workspace", "freeze", ws_name, "--reason", REASON, "--for", "2h", "--json")
    done = json_lines(out.stdout)[0]
    assert done["freeze"]["reason"] == REASON and done["lock_held"] is None, done
    listed = _frozen(server, ws_name)
    assert [f["reason"] for f in listed] == [REASON], listed
    table = cli(server, "workspace", "freezes").stdout
    assert ws_name in table and REASON in table, table

    tf.write(BACKEND_HTTP + data_resource("a", "two"))
    r = tf.apply(check=False)
    assert r.returncode != 0, r
    assert "Error acquiring the state lock" in r.output, r
    assert REASON in r.output and "frozen by cli:" in r.output, r
    assert _serial(ws) == serial

    # -lock=false never asks for the lock: its first state write is refused.
    r = tf.apply("-lock=false", check=False)
    assert r.returncode != 0, r
    assert "423" in r.output, r
    assert _serial(ws) == serial
    # Plans (reads) still work; the drift of the change is visible.
    assert "1 to change" in tf.plan("-lock=false").stdout

    out = cli(server, "workspace", "unfreeze", ws_name)
    assert "unfrozen" in out.stderr, out.stderr
    tf.apply()
    assert _serial(ws) > serial
    assert _frozen(server, ws_name) == []
    events = _audit_events(server, ws_name)
    assert "tf.frozen" in events and "tf.unfrozen" in events, events
    assert events.index("tf.frozen") < events.index("tf.unfrozen")


def test_a_freeze_waits_for_the_lock_held_and_the_cli_says_so(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = make_tf("h", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    tf.apply()
    tf.write(BACKEND_HTTP + data_resource("a", "two"))
    tf.apply()
    assert ws.lock(lock_info("held-by-a-run")).status == 200
    out = cli(server, "workspace", "freeze", ws_name, "--reason", "window", "--until", "2099-01-01T00:00Z",
              ok=False)
    # The end is more than a year ahead: refused, nothing frozen.
    assert out.returncode != 0 and "at most a year" in out.stderr, out.stderr
    assert _frozen(server, ws_name) == []
    out = cli(server, "workspace", "freeze", ws_name, "--reason", "window")
    assert "lock held by" in out.stderr and "held-by-a-run" in out.stderr, out.stderr
    assert "the freeze applies when it is released" in out.stderr, out.stderr
    # The holder's lock is untouched; released, nobody takes it again.
    assert ws.unlock(lock_info("held-by-a-run")).status == 200
    r = tf.apply(check=False)
    assert r.returncode != 0 and "window" in r.output, r
    # The CLI's own writes are refused the same way, naming the freeze.
    out = cli(server, "workspace", "rollback", ws_name, "--to", "1", ok=False)
    assert out.returncode != 0 and "frozen" in out.stderr, out.stderr
    cli(server, "workspace", "unfreeze", ws_name)
    tf.apply()

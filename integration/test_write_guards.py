"""Write guards with the real Terraform CLI against a real `stategate serve`.

Every correct path that writes state passes (apply, destroy, import, state mv/rm/push,
-refresh-only, force-unlock then apply, -migrate-state onto an empty workspace and back
onto one holding an older copy of the same lineage, stategate's rollback); every misuse
is refused with 409 and changes nothing: a second configuration migrated onto an address
that already holds another state (other lineage), `-lock=false` runs racing (same serial,
other content), `state push -force` of an old file (lower serial). An operator's
`workspace allow-write` lets exactly one such write through.

Each test runs for store=local and store=garage and uses its own workspace.
"""

from __future__ import annotations

import json
import time

from harness import BACKEND_HTTP, cli, data_resource, lock_info, resources_of


def _tf(ws, make_tf, name: str, body: str, backend: bool = True):
    tf = make_tf(name, ws.env)
    tf.write((BACKEND_HTTP if backend else "") + body)
    return tf


def _current(ws) -> dict:
    r = ws.get()
    assert r.status == 200, r
    return r.json()


def _serial(ws) -> int:
    return _current(ws)["serial"]


def _audit_events(server, ws_name: str) -> list[str]:
    rows = server.query("SELECT event FROM audit WHERE scope = ? ORDER BY id", (f"tf/{ws_name}",))
    return [r[0] for r in rows]


def _refused(result) -> bool:
    """Terraform reports the backend's 409 on the failed POST as `HTTP error: 409`."""
    return result.returncode != 0 and "409" in result.output


def test_every_correct_write_path_passes(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    body = data_resource("a", "one") + data_resource("b", "two")
    tf = _tf(ws, make_tf, "w", body)
    tf.init()
    assert "2 added" in tf.apply().stdout
    first = _current(ws)
    lineage = first["lineage"]

    def moved_forward(before: int) -> int:
        now = _current(ws)
        assert now["lineage"] == lineage, now
        assert now["serial"] > before, (before, now["serial"])
        return now["serial"]

    s = first["serial"]
    # a change
    tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "changed"))
    tf.apply()
    s = moved_forward(s)
    # refresh-only (nothing drifted: Terraform may skip the write; it must not fail)
    tf.apply("-refresh-only")
    assert _current(ws)["lineage"] == lineage
    # import: the command and an import block
    tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "changed")
             + 'resource "terraform_data" "i" {\n}\n')
    tf.run("import", "-input=false", "-no-color", "terraform_data.i", "imported-id")
    s = moved_forward(s)
    tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "changed")
             + 'resource "terraform_data" "i" {\n}\n'
             + 'resource "terraform_data" "j" {\n}\nimport {\n  to = terraform_data.j\n  id = "j-id"\n}\n')
    tf.apply()
    s = moved_forward(s)
    # state mv and state rm
    tf.run("state", "mv", "-no-color", "terraform_data.b", "terraform_data.c")
    s = moved_forward(s)
    tf.run("state", "rm", "-no-color", "terraform_data.j")
    s = moved_forward(s)
    assert resources_of(_current(ws)) == ["terraform_data.a", "terraform_data.c", "terraform_data.i"]
    # state push: the pulled file again (nothing to write), then a newer copy of it
    pulled = tf.run("state", "pull").stdout
    (tf.dir / "pulled.tfstate").write_text(pulled)
    tf.run("state", "push", "-no-color", "pulled.tfstate")
    assert _serial(ws) == s
    newer = json.loads(pulled)
    newer["serial"] += 5
    newer["resources"] = [r for r in newer["resources"] if r["name"] != "i"]
    (tf.dir / "newer.tfstate").write_text(json.dumps(newer))
    tf.run("state", "push", "-no-color", "newer.tfstate")
    s = moved_forward(s)
    assert s == newer["serial"] + 1  # Terraform increments the pushed file's serial
    # force-unlock a stale lock, then apply
    stale = lock_info(who="crashed-ci@runner")
    assert ws.lock(stale).status == 200
    tf.run("force-unlock", "-force", stale["ID"])
    tf.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("c", "after-unlock"))
    tf.apply()
    s = moved_forward(s)
    # stategate's own rollback (fresh serial newest + 1), then Terraform carries on
    versions = [r["version"] for r in server.db_rows(ws_name)]
    cli(server, "workspace", "rollback", ws_name, "--to", str(versions[0]))
    rolled = _current(ws)
    assert rolled["lineage"] == lineage and rolled["serial"] == s + 1, rolled
    assert resources_of(rolled) == ["terraform_data.a", "terraform_data.b"]
    s = rolled["serial"]
    tf.apply()
    s = moved_forward(s)
    tf.plan_no_changes()
    # destroy
    assert "destroyed" in tf.run("destroy", "-auto-approve", "-input=false", "-no-color").stdout
    s = moved_forward(s)
    assert resources_of(_current(ws)) == []
    events = _audit_events(server, ws_name)
    assert "tf.write_override_used" not in events and "tf.write_allowed" not in events


def test_migrate_onto_empty_then_back_onto_an_older_copy(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    res = data_resource("a", "migrate")
    tf = _tf(ws, make_tf, "w", res, backend=False)
    tf.init()
    tf.apply()
    # local -> http, onto an empty workspace
    tf.write(BACKEND_HTTP + res)
    tf.init("-migrate-state", "-force-copy")
    on_http = _current(ws)
    tf.plan_no_changes()
    # http -> local, work locally for a while ...
    (tf.dir / "terraform.tfstate").unlink(missing_ok=True)
    tf.write(res + data_resource("b", "local-only"))
    tf.init("-migrate-state", "-force-copy")
    tf.apply()
    local = json.loads((tf.dir / "terraform.tfstate").read_text())
    assert local["lineage"] == on_http["lineage"] and local["serial"] > on_http["serial"]
    # ... then back onto the workspace, which still holds the older copy of that state
    tf.write(BACKEND_HTTP + res + data_resource("b", "local-only"))
    tf.init("-migrate-state", "-force-copy")
    back = _current(ws)
    assert back["lineage"] == on_http["lineage"] and back["serial"] > local["serial"]
    assert resources_of(back) == ["terraform_data.a", "terraform_data.b"]
    tf.plan_no_changes()


def test_a_second_configuration_on_the_same_address_is_refused(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    a = _tf(ws, make_tf, "A", data_resource("a", "mine"))
    a.init()
    a.apply()
    before = _current(ws)
    rows = len(server.db_rows(ws_name))
    # Another configuration with its own (local) state copies the backend block and
    # migrates: its state has another lineage.
    b = _tf(ws, make_tf, "B", data_resource("z", "theirs"), backend=False)
    b.init()
    b.apply()
    b.write(BACKEND_HTTP + data_resource("z", "theirs"))
    r = b.init("-migrate-state", "-force-copy", check=False)
    assert _refused(r), r
    assert _current(ws) == before, "the refused migration changed the state"
    assert len(server.db_rows(ws_name)) == rows
    # `state push -force` of that state: refused the same way.
    r = b.run("state", "push", "-force", "-no-color", "terraform.tfstate", check=False)
    assert r.returncode != 0, r
    assert _current(ws) == before
    a.plan_no_changes()
    # A deliberate re-initialisation: an operator allows one write.
    cli(server, "workspace", "allow-write", ws_name, "--reason", "adopt config B")
    b.init("-migrate-state", "-force-copy")
    assert resources_of(_current(ws)) == ["terraform_data.z"]
    assert _current(ws)["lineage"] != before["lineage"]
    b.plan_no_changes()
    events = _audit_events(server, ws_name)
    assert events.count("tf.write_allowed") == 1 and events.count("tf.write_override_used") == 1


def test_racing_lock_false_applies_the_second_writer_is_refused(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    base = data_resource("base", "shared")
    first = _tf(ws, make_tf, "first", base)
    first.init()
    first.apply()
    # A blocks mid-apply (after reading the state) until told to go on.
    slow = ('resource "terraform_data" "slow" {\n  input = "a"\n'
            '  provisioner "local-exec" {\n'
            '    command = "touch started; while [ ! -f go ]; do sleep 0.1; done"\n  }\n}\n')
    ta = _tf(ws, make_tf, "A", base + slow)
    tb = _tf(ws, make_tf, "B", base + data_resource("b", "b"))
    ta.init()
    tb.init()
    args = ("apply", "-auto-approve", "-input=false", "-no-color", "-lock=false")
    pa = ta.start(*args)
    deadline = time.monotonic() + 120
    while not (ta.dir / "started").exists():
        assert pa.poll() is None, ta.finish(pa, args)
        assert time.monotonic() < deadline, "A never reached its provisioner"
        time.sleep(0.1)
    tb.run(*args)  # B read the same state, and writes its serial + 1 first
    after_b = _current(ws)
    assert resources_of(after_b) == ["terraform_data.b", "terraform_data.base"]
    (ta.dir / "go").write_text("")
    ra = ta.finish(pa, args)
    assert _refused(ra), ra
    # B's write stands; A kept what it could not save locally.
    assert _current(ws) == after_b
    assert (ta.dir / "errored.tfstate").exists(), ra


def test_state_push_force_of_an_old_file_needs_a_single_use_override(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = _tf(ws, make_tf, "w", data_resource("a", "v1"))
    tf.init()
    for v in ("v1", "v2", "v3", "v4"):
        tf.write(BACKEND_HTTP + data_resource("a", v))
        tf.apply()
        (tf.dir / f"{v}.tfstate").write_text(tf.run("state", "pull").stdout)
    current = _current(ws)
    rows = len(server.db_rows(ws_name))
    # Terraform itself refuses an older file without -force ...
    r = tf.run("state", "push", "-no-color", "v1.tfstate", check=False)
    assert r.returncode != 0 and "serial" in r.output, r
    # ... and stategate refuses it with -force (it arrives as serial v1 + 1 < current).
    for old in ("v1", "v2"):
        r = tf.run("state", "push", "-force", "-no-color", f"{old}.tfstate", check=False)
        assert _refused(r), r
    assert _current(ws) == current and len(server.db_rows(ws_name)) == rows
    # With a fresh override it goes through, once.
    cli(server, "workspace", "allow-write", ws_name, "--minutes", "5", "--reason", "back to v2")
    tf.run("state", "push", "-force", "-no-color", "v2.tfstate")
    restored = _current(ws)
    assert restored["resources"] == json.loads((tf.dir / "v2.tfstate").read_text())["resources"]
    assert restored["serial"] < current["serial"]
    # The override is used up: the next forced old file is refused again.
    r = tf.run("state", "push", "-force", "-no-color", "v1.tfstate", check=False)
    assert _refused(r), r
    assert _current(ws) == restored
    events = _audit_events(server, ws_name)
    assert events.count("tf.write_allowed") == 1 and events.count("tf.write_override_used") == 1
    # Terraform carries on from the restored state.
    tf.write(BACKEND_HTTP + data_resource("a", "v2"))
    tf.plan_no_changes()
    tf.write(BACKEND_HTTP + data_resource("a", "v5"))
    tf.apply()
    assert _current(ws)["serial"] > restored["serial"]

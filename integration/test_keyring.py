"""The keyring with the real binary and the real Terraform CLI (docs/keys.md).

- racing `terraform apply`s in several workspaces while `stategate key rotate` and
  `stategate key reseal` run: every apply succeeds, no update is lost, every version
  is readable afterwards and `terraform state pull` equals the last apply;
- `kill -9` of `key reseal` at random points, many times, then a reseal to the end:
  every acknowledged version stays readable throughout;
- a backup from before the rotation restores after it (with a refused retire in
  between), and `key retire` exits non-zero naming what still needs the generation.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time

from harness import BACKEND_HTTP, cli, data_resource, http, json_lines, stategate_bin

WORKSPACES = 3
APPLIES = 4


def status(srv) -> dict:
    return json.loads(cli(srv, "key", "status", "--json").stdout)


def versions_by_generation(st: dict) -> dict[int, int]:
    return {g["generation"]: g["versions"] for g in st["generations"] if g["versions"]}


def every_version_readable(srv, ws: str) -> int:
    rows = srv.db_rows(ws)
    for row in rows:
        if row["blob_key"] is None:
            continue
        p = cli(srv, "workspace", "show", ws, "--version", str(row["version"]), "--masked")
        assert json.loads(p.stdout)["serial"] == row["serial"]
    return len(rows)


def test_racing_applies_during_rotate_and_reseal_lose_nothing(server_factory, ws_name, make_tf):
    srv = server_factory.new()
    names = [f"{ws_name[:40]}-{i}" for i in range(WORKSPACES)]
    tfs = {}
    for name in names:
        ws = srv.workspace(name)
        tf = make_tf(name, ws.env)
        tf.write(BACKEND_HTTP + data_resource("r", "v0"))
        tf.init()
        tf.apply()
        tfs[name] = tf
    failures: list[str] = []

    def applier(name):
        tf = tfs[name]
        for i in range(1, APPLIES + 1):
            tf.write(BACKEND_HTTP + data_resource("r", f"v{i}") + data_resource(f"x{i}", "y"))
            res = tf.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=60s",
                         check=False)
            if res.returncode != 0:
                failures.append(f"{name} apply {i}: {res}")

    threads = [threading.Thread(target=applier, args=(n,)) for n in names]
    for t in threads:
        t.start()
    rotated = json_lines(cli(srv, "key", "rotate").stdout)
    assert rotated[0]["generation"] == 1 and rotated[0]["purpose"] == "data"
    resealed = [json_lines(cli(srv, "key", "reseal").stdout)[-1]]
    for t in threads:
        t.join(600)
    assert not failures, "\n".join(failures)
    # What was written before the server noticed the rotation is resealed now.
    resealed.append(json_lines(cli(srv, "key", "reseal").stdout)[-1])
    assert sum(r["versions"] for r in resealed) >= WORKSPACES, resealed
    st = status(srv)
    assert st["data_generation"] == 1
    assert versions_by_generation(st) == {1: WORKSPACES * (APPLIES + 1)}, st

    for name in names:
        tf = tfs[name]
        pulled = json.loads(tf.run("state", "pull").stdout)
        ws = srv.workspace(name)
        current = ws.get()
        assert current.status == 200
        assert pulled == current.json()
        assert sorted(r["name"] for r in pulled["resources"]) == ["r", f"x{APPLIES}"]
        # 0 lost updates: serials 1..n, one version per apply
        serials = [row["serial"] for row in srv.db_rows(name)]
        assert serials == list(range(1, APPLIES + 2)), serials
        assert every_version_readable(srv, name) == APPLIES + 1
        tf.plan_no_changes()
    # The credential a pipeline holds did not change.
    assert srv.workspace(names[0]).password == tfs[names[0]].env["TF_HTTP_PASSWORD"]


def big_state(serial: int, lineage: str) -> bytes:
    # ~300 KiB: several chunks, so a reseal spends time inside each version.
    return json.dumps({
        "version": 4, "terraform_version": "1.15.5", "serial": serial, "lineage": lineage,
        "outputs": {"pad": {"value": "x" * 300_000, "type": "string"}}, "resources": [],
    }).encode()


def test_reseal_survives_kill_9_anywhere(server_factory, ws_name):
    srv = server_factory.new()
    ws = srv.workspace(ws_name)
    # Enough versions that a whole reseal outlasts several of the kills below (each
    # 0.05–0.6 s in): 30 resealed in 0.66 s once the blob cipher moved to ring.
    count = 150
    for serial in range(1, count + 1):
        r = http("POST", ws.address, big_state(serial, "kill"), user=ws.user, password=ws.password)
        assert r.status == 200, r
    cli(srv, "key", "rotate")
    rng = random.Random(24)
    kills = 0
    for _ in range(8):
        p = subprocess.Popen([str(stategate_bin()), "key", "reseal"], env=srv.env(),
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.05, 0.6))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait(30)
        # Every acknowledged version is readable at every point.
        current = ws.get()
        assert current.status == 200, current
        assert current.body == big_state(count, "kill")
    assert kills >= 3, f"the reseal finished too fast to be killed ({kills} kills)"
    before = versions_by_generation(status(srv))
    final = json_lines(cli(srv, "key", "reseal").stdout)[-1]
    assert final["raced"] == 0
    st = status(srv)
    assert versions_by_generation(st) == {1: count}, (before, st)
    assert every_version_readable(srv, ws_name) == count
    again = json_lines(cli(srv, "key", "reseal").stdout)[-1]
    assert again["versions"] == 0 and again["current"] == count
    # Nothing needs generation 0 any more: it retires (after the rotation grace).
    time.sleep(5)
    cli(srv, "key", "retire", "0")
    assert ws.get().body == big_state(count, "kill")
    assert [g["generation"] for g in status(srv)["generations"]] == [1]


def test_restore_a_pre_rotation_backup_after_rotation_and_a_refused_retire(server_factory, ws_name,
                                                                           make_tf):
    srv = server_factory.new()
    ws = srv.workspace(ws_name)
    tf = make_tf(ws_name, ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "before"))
    tf.init()
    tf.apply()
    backup = json_lines(cli(srv, "backup").stdout)[-1]
    cli(srv, "key", "rotate")
    time.sleep(1.5)  # the server re-reads the ring every second
    tf.write(BACKEND_HTTP + data_resource("a", "after") + data_resource("b", "after"))
    tf.apply()
    last = json.loads(tf.run("state", "pull").stdout)

    time.sleep(5)  # past the retire grace, so only what still needs 0 refuses it
    refused = cli(srv, "key", "retire", "0", ok=False)
    assert refused.returncode != 0
    assert "still seals" in refused.stderr and "state version" in refused.stderr, refused.stderr
    assert "backup" in refused.stderr, refused.stderr
    assert [g["generation"] for g in status(srv)["generations"] if g["in_ring"]] == [0, 1]

    srv.stop()
    live = srv.data_dir / "stategate.db"
    for suffix in ("", "-wal", "-shm"):
        p = srv.data_dir / f"stategate.db{suffix}"
        if p.exists():
            p.rename(srv.data_dir / f"lost.db{suffix}")
    out = cli(srv, "restore", "--from", backup["id"], "--into", str(live)).stdout
    assert "sealed under data key generation 0" in out, out
    assert "Added 1 version(s)" in out, out
    srv.start()
    assert ws.get().json() == last
    assert json.loads(tf.run("state", "pull").stdout) == last
    tf.plan_no_changes()
    # The restored ring still has generation 1 (from the store's copy): new writes use it.
    assert status(srv)["data_generation"] == 1


def test_rotate_credentials_is_deliberate_and_changes_every_credential(server_factory, ws_name):
    srv = server_factory.new()
    ws = srv.workspace(ws_name)
    body = json.dumps({"version": 4, "serial": 1, "lineage": "cred", "outputs": {}, "resources": []})
    assert http("POST", ws.address, body, user=ws.user, password=ws.password).status == 200
    hook = cli(srv, "drift", "webhook-secret").stdout

    # Refused without the typed phrase, and for generations not in the ring: nothing changes.
    for args, stdin in ((("key", "rotate-credentials"), "yes\n"), (("key", "retire", "7"), None),
                        (("key", "retire", "0"), None)):
        p = cli(srv, *args, ok=False, stdin=stdin)
        assert p.returncode != 0, (args, p)
        assert "nothing was changed" in p.stderr, p.stderr
    st = status(srv)
    assert st["credentials_generation"] == 0 and st["data_generation"] == 0
    assert srv.workspace(ws_name).password == ws.password
    assert ws.get().status == 200

    # A data rotation changes no credential; the deliberate one changes all of them.
    cli(srv, "key", "rotate")
    assert srv.workspace(ws_name).password == ws.password
    out = json_lines(cli(srv, "key", "rotate-credentials", "--yes").stdout)
    assert out[0]["purpose"] == "credentials" and out[0]["generation"] == 1
    new = srv.workspace(ws_name)
    assert new.password != ws.password
    assert cli(srv, "drift", "webhook-secret").stdout != hook
    deadline = time.monotonic() + 10
    while ws.get().status != 401:  # the server re-reads the ring within a second
        assert time.monotonic() < deadline, "the old credential still works"
        time.sleep(0.1)
    assert new.get().status == 200
    assert new.get().json()["serial"] == 1

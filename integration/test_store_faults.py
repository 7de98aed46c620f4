"""The S3 store failing under stategate (issue 3, "store failure semantics"), with a real
Garage that the tests stop and restart (same ports, same data) and the real Terraform CLI.

- Garage down → POST and GET answer 503 (retryable), no version row is committed,
  the lock stays with its holder; Garage back → the same POST succeeds.
- The same `terraform apply` survives the outage through its own retries.
- `serve` with a bad endpoint/bucket/credentials exits at startup and says why.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid

import pytest

import garage_harness
from harness import BACKEND_HTTP, data_resource, free_port, http, lock_info, resources_of, stategate_bin
from store_support import log_text, own_garage, tfstate, wait_for, server_factory  # noqa: F401 (fixtures)

# A 503 must come back quickly: the S3 client's connect timeout is 5 s, 2 attempts.
STORE_DOWN_ANSWER_WITHIN = 20.0


def _versions_total(srv) -> int:
    return srv.query("SELECT COUNT(*) FROM versions")[0][0]


def _post(ws, body: bytes, lock_id: str | None):
    url = ws.address + (f"?ID={lock_id}" if lock_id else "")
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    t0 = time.monotonic()
    r = http("POST", url, body, user=ws.user, password=ws.password, headers={"Content-MD5": md5},
             timeout=STORE_DOWN_ANSWER_WITHIN + 10)
    return r, time.monotonic() - t0


def _timed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


def test_store_down_post_get_503_lock_kept_then_recovers(own_garage, server_factory):
    srv = server_factory.new(own_garage.env())
    ws = srv.workspace(f"faults-{uuid.uuid4().hex[:8]}")
    lineage = str(uuid.uuid4())

    holder = lock_info(who="holder@faults")
    r = ws.lock(holder)
    assert r.status == 200, r
    v1 = tfstate(1, lineage, "v1")
    r, _ = _post(ws, v1, holder["ID"])
    assert r.status == 200, r
    assert len(srv.db_rows(ws.name)) == 1
    rows_before = _versions_total(srv)

    own_garage.stop()
    assert own_garage.pid() is None, "Garage is still running after stop()"

    # POST ?ID= while the store is down: 503 (the client retries), nothing committed.
    v2 = tfstate(2, lineage, "v2")
    r, took = _post(ws, v2, holder["ID"])
    assert r.status == 503, f"POST with the store down: expected 503, got {r}"
    assert took < STORE_DOWN_ANSWER_WITHIN, f"POST took {took:.1f}s with the store down"
    assert "error" in r.json(), r
    assert len(srv.db_rows(ws.name)) == 1, "a version row was committed for a blob that was never written"
    assert _versions_total(srv) == rows_before

    # The lock is still the first holder's: another ID gets 423 + the holder's LockInfo.
    other = lock_info(who="intruder@faults")
    r = ws.lock(other)
    assert r.status == 423, f"LOCK by another ID while the store is down: {r}"
    assert r.json().get("ID") == holder["ID"], r
    # ... and the holder's own retry of LOCK is still a 200.
    assert ws.lock(holder).status == 200

    # GET while a version exists but its blob can't be fetched: 503, never 404/empty.
    r, took = _timed(ws.get)
    assert r.status == 503, f"GET with the store down: expected 503 (never 404), got {r}"
    assert took < STORE_DOWN_ANSWER_WITHIN, f"GET took {took:.1f}s with the store down"
    assert srv.alive(), srv.log_tail()

    # The log line says 503 and never contains the state body.
    log = log_text(srv)
    assert re.search(r"\bstatus=503\b", log), log[-3000:]
    assert lineage not in log, "state content leaked into the log"

    # Garage back (same ports, same data): the SAME request now succeeds.
    garage_harness.restart(own_garage)
    r, _ = _post(ws, v2, holder["ID"])
    assert r.status == 200, f"retry of the same POST after the store came back: {r}"
    rows = srv.db_rows(ws.name)
    assert len(rows) == 2, [dict(x) for x in rows]
    g = ws.get()
    assert g.status == 200, g
    assert g.json() == json.loads(v2), g

    r = ws.unlock(holder)
    assert r.status == 200, r
    r = ws.lock(other)
    assert r.status == 200, r
    assert ws.unlock(other).status == 200


def test_terraform_apply_survives_store_outage(own_garage, server_factory, make_tf):
    srv = server_factory.new(own_garage.env())
    ws = srv.workspace(f"outage-{uuid.uuid4().hex[:8]}")
    tf = make_tf("w", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "before-outage"))
    tf.init()
    tf.apply()
    before = ws.get().json()
    assert resources_of(before) == ["terraform_data.a"]
    n503_before = len(re.findall(r"\bstatus=503\b", log_text(srv)))

    garage_harness.kill(own_garage)  # a crash this time (test above: a clean stop)
    tf.write(BACKEND_HTTP + data_resource("a", "before-outage") + data_resource("b", "during-outage"))
    retry_env = {"TF_HTTP_RETRY_MAX": "15", "TF_HTTP_RETRY_WAIT_MIN": "1", "TF_HTTP_RETRY_WAIT_MAX": "2"}
    args = ("apply", "-auto-approve", "-input=false", "-no-color")
    p = tf.start(*args, extra_env=retry_env)
    try:
        # Terraform has hit the outage (stategate answered 503) and is retrying.
        wait_for(lambda: p.poll() is not None
                 or len(re.findall(r"\bstatus=503\b", log_text(srv))) > n503_before,
                 30, "a 503 in stategate's log while Garage is down")
        assert p.poll() is None, "terraform apply ended during the outage:\n" + str(tf.finish(p, args))
    finally:
        garage_harness.restart(own_garage)
    res = tf.finish(p, args)
    assert res.returncode == 0, f"the apply did not survive the store outage:\n{res}\n{srv.log_tail()}"
    assert "1 added" in res.stdout, res

    after = ws.get()
    assert after.status == 200, after
    state = after.json()
    assert resources_of(state) == ["terraform_data.a", "terraform_data.b"], state
    assert state["lineage"] == before["lineage"] and state["serial"] > before["serial"]
    # the lock was released at the end of the run
    probe = lock_info(who="probe@faults")
    assert ws.lock(probe).status == 200
    assert ws.unlock(probe).status == 200
    tf.plan_no_changes()


HUNG_STORE_ANSWER_WITHIN = 25.0


def test_hung_store_answers_503_promptly(own_garage, server_factory):
    """Garage frozen (SIGSTOP): TCP connects, nothing answers. A state read must still
    come back as a retryable 503 within a bounded, short time."""
    srv = server_factory.new(own_garage.env())
    ws = srv.workspace(f"hung-{uuid.uuid4().hex[:8]}")
    holder = lock_info()
    assert ws.lock(holder).status == 200
    r, _ = _post(ws, tfstate(1, str(uuid.uuid4()), "v1"), holder["ID"])
    assert r.status == 200, r
    pid = own_garage.pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        try:
            r = http("GET", ws.address, user=ws.user, password=ws.password, timeout=HUNG_STORE_ANSWER_WITHIN)
        except OSError as e:  # socket timeout: no answer in time
            pytest.fail(f"no answer to a state GET within {HUNG_STORE_ANSWER_WITHIN}s of a hung store ({e})")
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.status == 503, r
    assert took < HUNG_STORE_ANSWER_WITHIN


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


BAD_CONFIGS = {
    # name: (env overrides or a callable(env) -> overrides, what the message must name)
    "wrong-secret": (lambda e: {"STATEGATE_S3_SECRET_ACCESS_KEY": "0" * 64},
                     r"403|AccessDenied|SignatureDoesNotMatch|InvalidAccessKeyId"),
    "unknown-key": (lambda e: {"STATEGATE_S3_ACCESS_KEY_ID": "GK" + "0" * 24},
                    r"403|AccessDenied|InvalidAccessKeyId"),
    "no-such-bucket": (lambda e: {"STATEGATE_S3_BUCKET": "no-such-bucket-" + uuid.uuid4().hex[:6]},
                       r"NoSuchBucket|404"),
    "unreachable-endpoint": (lambda e: {"STATEGATE_S3_ENDPOINT": f"http://127.0.0.1:{free_port()}"},
                             r"cannot reach|connect|refused"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_serve_with_bad_s3_config_fails_at_startup(case, own_garage, tmp_path, check_binary):
    from harness import Server

    overrides, problem = BAD_CONFIGS[case]
    s3 = own_garage.env()
    s3.update(overrides(s3))
    srv = Server(data_dir=tmp_path / "data", store="s3", s3_env=s3)
    env = srv.env()
    port = srv.port
    p = subprocess.Popen([str(stategate_bin()), "serve"], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listened = False
    deadline = time.monotonic() + 60
    try:
        while p.poll() is None and time.monotonic() < deadline:
            listened = listened or _port_open(port)
            time.sleep(0.02)
    finally:
        if p.poll() is None:
            p.kill()
            out = p.communicate()[0]
            pytest.fail(f"`serve` with a bad S3 config ({case}) was still running after 60s:\n{out}")
    out = p.communicate()[0]
    assert p.returncode != 0, f"`serve` exited 0 with a bad S3 config ({case}):\n{out}"
    assert not listened and not _port_open(port), f"`serve` listened on :{port} before failing ({case})"
    assert "stategate serving" not in out, out
    # It names what it tried and what went wrong.
    assert s3["STATEGATE_S3_ENDPOINT"] in out, f"message does not name the endpoint ({case}):\n{out}"
    assert s3["STATEGATE_S3_BUCKET"] in out, f"message does not name the bucket ({case}):\n{out}"
    assert re.search(r"credential", out, re.I), out
    assert re.search(problem, out), f"message does not say what is wrong ({case}, want /{problem}/):\n{out}"
    assert s3["STATEGATE_S3_SECRET_ACCESS_KEY"] not in out, "the secret key was printed"
    # A failed start leaves no fresh DEK (and no "back it up" banner) behind.
    assert not (tmp_path / "data" / "dek").exists(), "a DEK was created by a failed start"
    assert "BACK IT UP" not in out.upper(), out

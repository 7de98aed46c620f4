"""Two stategate nodes on one PostgreSQL index and one Garage behave as one server.

Real parts only: Debian's PostgreSQL 15 (postgres_harness.py), a real single-node
Garage, two `stategate serve` processes sharing the index and the bucket (and the
root key), the real Terraform CLI. A lock taken through one node is seen by the
other; racing writers through both nodes lose no update; Terraform applies through
one and plans through the other; a node killed with SIGKILL in the middle of writes
loses no acknowledged version and its client's lock stays held; housekeeping runs on
one node; operator tokens work on both; with a real OpenID provider, a single sign-on
and a reveal each go through both nodes (no sticky sessions); a drift check asked for
through both nodes at once runs once, its plan is kept in the shared store, approved
and applied through the other node, and never applied twice.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import postgres_harness
from harness import BACKEND_HTTP, Server, cli, data_resource, free_port, http, lock_info
from oidc_support import CALLBACK, CLIENT_SECRET, REFUSED, Provider, request, sign_in_at_provider

@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    reuse = os.environ.get("STATEGATE_E2E_POSTGRES_DIR")
    pg = postgres_harness.Postgres(Path(reuse) if reuse else tmp_path_factory.mktemp("pg"))
    try:
        pg.start()
    except postgres_harness.PostgresError as e:
        pytest.fail(f"PostgreSQL is needed for several nodes: {e}")
    yield pg
    if not reuse:
        pg.stop()


def two_nodes(postgres, garage_env, tmp_path, env: dict | None = None, ports=(0, 0)) -> list[Server]:
    """Two nodes: one index database, one bucket prefix, one root key (and `env`)."""
    shared = {
        "STATEGATE_INDEX": "postgres",
        "STATEGATE_INDEX_URL": postgres.new_database(),
        "STATEGATE_DEK": base64.b64encode(secrets.token_bytes(32)).decode(),
        "STATEGATE_S3_PREFIX": f"nodes-{uuid.uuid4().hex[:8]}/",
        **(env or {}),
    }
    return [Server(data_dir=tmp_path / f"node-{n}", store="s3", s3_env=garage_env, extra_env=dict(shared),
                   port=port) for n, port in zip("ab", ports)]


@pytest.fixture
def nodes(postgres, garage_env, check_binary, tmp_path):
    servers = two_nodes(postgres, garage_env, tmp_path)
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.stop()


def _state(serial: int, lineage: str, marker: str) -> dict:
    return {"version": 4, "terraform_version": "1.15.5", "serial": serial, "lineage": lineage,
            "outputs": {"marker": {"value": marker, "type": "string"}}, "resources": [], "check_results": None}


def _post(ws, info: dict, state: dict):
    return http("POST", f"{ws.address}?ID={info['ID']}", state, user=ws.user, password=ws.password)


def test_a_lock_taken_through_one_node_is_seen_by_the_other(nodes):
    a, b = nodes
    name = f"shared-{uuid.uuid4().hex[:8]}"
    wa, wb = a.workspace(name), b.workspace(name)
    assert wa.password == wb.password, "one root key: the same workspace credential on both nodes"
    held = lock_info(who="ci-job-1@runner")
    assert wa.lock(held).status == 200
    refused = wb.lock(lock_info(who="ci-job-2@runner"))
    assert refused.status == 423, refused
    assert refused.json()["ID"] == held["ID"], "the other node names the holder"
    # A write through B with A's lock ID is the holder's write: it commits.
    lineage = str(uuid.uuid4())
    assert _post(wb, held, _state(1, lineage, "through-b")).status == 200
    assert json.loads(wa.get().body)["outputs"]["marker"]["value"] == "through-b"
    # A write with another lock ID is refused whichever node it reaches.
    other = lock_info()
    assert _post(wa, other, _state(2, lineage, "intruder")).status in (409, 423)
    assert wb.unlock(held).status == 200
    assert wa.lock(other).status == 200, "unlocked through B, free through A"
    assert wa.unlock(other).status == 200


def test_racing_writers_through_both_nodes_lose_no_update(nodes):
    a, b = nodes
    name = f"race-{uuid.uuid4().hex[:8]}"
    wss = [a.workspace(name), b.workspace(name)]
    lineage = str(uuid.uuid4())
    writers, rounds = 6, 5
    acknowledged: list[str] = []
    errors: list[str] = []
    mutex = threading.Lock()

    def writer(n: int):
        for r in range(rounds):
            ws = wss[(n + r) % 2]  # alternate nodes
            info = lock_info(who=f"writer-{n}")
            deadline = time.monotonic() + 120
            while ws.lock(info).status != 200:
                if time.monotonic() > deadline:
                    errors.append(f"writer {n} never got the lock")
                    return
                time.sleep(0.01)
            current = ws.get()
            serial = json.loads(current.body)["serial"] if current.status == 200 else 0
            marker = f"w{n}-r{r}"
            resp = _post(ws, info, _state(serial + 1, lineage, marker))
            if resp.status == 200:
                with mutex:
                    acknowledged.append(marker)
            else:
                errors.append(f"writer {n} round {r}: {resp}")
            assert ws.unlock(info).status == 200

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(acknowledged) == writers * rounds
    final = json.loads(wss[0].get().body)
    assert final["serial"] == writers * rounds, "every write read the one before it: none was lost"
    rows = a.query("SELECT version, serial FROM versions WHERE scope = ? ORDER BY version", (f"tf/{name}",))
    assert [r[1] for r in rows] == list(range(1, writers * rounds + 1)), rows


def test_terraform_applies_through_one_node_and_plans_through_the_other(nodes, make_tf):
    a, b = nodes
    name = f"tf-{uuid.uuid4().hex[:8]}"
    tf_a = make_tf("a", a.workspace(name).env)
    tf_a.write(BACKEND_HTTP + data_resource("x", "from-node-a"))
    tf_a.init()
    tf_a.apply()
    tf_b = make_tf("b", b.workspace(name).env)
    tf_b.write(BACKEND_HTTP + data_resource("x", "from-node-a"))
    tf_b.init()
    tf_b.plan_no_changes()  # node B serves the state node A wrote
    tf_b.write(BACKEND_HTTP + data_resource("x", "from-node-b"))
    tf_b.apply()
    assert "from-node-b" in a.workspace(name).get().text()


def test_a_killed_node_loses_no_acknowledged_version_and_its_lock_stays_held(nodes):
    a, b = nodes
    name = f"failover-{uuid.uuid4().hex[:8]}"
    wa, wb = a.workspace(name), b.workspace(name)
    lineage = str(uuid.uuid4())
    acknowledged: list[int] = []
    stop = threading.Event()

    def client():
        """Writes through A while A lives, then goes on through B (as a client retrying
        against the other address behind a load balancer). A lock of its own that a
        dead node's request took (the answer never came back) it frees with that lock's
        ID through the live node, as `terraform force-unlock ID` does."""
        serial = 0
        deadline = time.monotonic() + 180
        while not stop.is_set() and serial < 400 and time.monotonic() < deadline:
            for ws in (wa, wb):
                try:
                    info = lock_info(who="failover-client")
                    got = ws.lock(info)
                    if got.status == 423 and got.json().get("Who") == "failover-client":
                        ws.unlock(got.json())
                        continue
                    if got.status != 200:
                        continue
                    resp = _post(ws, info, _state(serial + 1, lineage, f"s{serial + 1}"))
                    if resp.status == 200:
                        serial += 1
                        acknowledged.append(serial)
                    ws.unlock(info)
                    break
                except OSError:
                    continue  # the node died under us: retry on the other

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 120
    while len(acknowledged) < 15:
        assert time.monotonic() < deadline, "no writes through node A"
        time.sleep(0.02)
    os.killpg(a.proc.pid, signal.SIGKILL)
    a.proc.wait(10)
    a.proc = None
    while len(acknowledged) < 40:
        assert t.is_alive(), f"the client gave up after {len(acknowledged)} writes"
        time.sleep(0.05)
    stop.set()
    t.join(60)
    # Every acknowledged version is in the index and readable through B.
    serials = [r[0] for r in b.query("SELECT serial FROM versions WHERE scope = ? ORDER BY version",
                                     (f"tf/{name}",))]
    assert set(acknowledged) <= set(serials), set(acknowledged) - set(serials)
    assert json.loads(wb.get().body)["serial"] == max(acknowledged)

    # A lock is a row, not process memory: taken through A, A killed, B still refuses.
    a.start()
    held = lock_info(who="dies-with-node-a")
    assert wa.lock(held).status == 200
    os.killpg(a.proc.pid, signal.SIGKILL)
    a.proc.wait(10)
    a.proc = None
    refused = wb.lock(lock_info())
    assert refused.status == 423 and refused.json()["ID"] == held["ID"], refused


def test_housekeeping_runs_on_one_node_and_tokens_work_on_both(nodes):
    a, b = nodes
    deadline = time.monotonic() + 30
    while True:
        claims = a.query("SELECT job, holder FROM job_claims ORDER BY job")
        jobs = {job: holder for job, holder in claims}
        if "retention" in jobs and "stale-locks" in jobs:
            break
        assert time.monotonic() < deadline, claims
        time.sleep(0.2)
    assert len(claims) == len(jobs), "one holder per job"
    # Both nodes started a retention pass at startup; exactly one ran it.
    ran = [s for s in (a, b) if "retention pass done" in s.log_text()]
    assert len(ran) == 1, [s.data_dir.name for s in ran]

    # An operator token made through one node's CLI works on the other's admin API.
    token = cli(a, "admin", "operator", "create", "--email", "ops@example.org").stdout.strip().split()[-1]
    for s in (a, b):
        r = http("GET", f"{s.url}/api/v1/admin/workspaces", bearer=token)
        assert r.status == 200, (s.data_dir.name, r)
    listed = [json.loads(line) for line in
              cli(b, "admin", "operator", "token", "list", "--json").stdout.splitlines() if line.strip()]
    mine = [t["id"] for t in listed if t.get("email") == "ops@example.org"]
    assert len(mine) == 1, listed
    cli(b, "admin", "operator", "token", "revoke", mine[0])
    for s in (a, b):
        assert http("GET", f"{s.url}/api/v1/admin/workspaces", bearer=token).status == 401, "revoked on every node"


def test_single_sign_on_and_reveals_work_through_either_node(postgres, garage_env, check_binary, tmp_path):
    """Behind one address a browser's requests reach either node: a sign-in started
    through A finishes through B, the session works on both, is re-checked at the
    provider by whichever node a request reaches (a promotion made there is seen on
    both), a reveal POSTed to A is shown once by B, and logging out through B ends the
    session on A. The real OpenID provider (oidc-provider), PostgreSQL and Garage."""
    pa = free_port()
    public = f"http://127.0.0.1:{pa}"  # the address both nodes are behind
    provider = Provider(public + CALLBACK, tmp_path / "provider.log")
    conf = tmp_path / "sso.toml"
    conf.write_text(f"""
[oidc]
issuer_url = "{provider.url}"
client_id = "stategate"
client_secret = "{CLIENT_SECRET}"
scopes = ["email", "groups"]
revalidate_seconds = 1

[oidc.roles]
"platform-admins" = "admin"
"team-a" = {{ role = "operator", workspaces = "team-a-*" }}
""")
    a, b = two_nodes(postgres, garage_env, tmp_path, ports=(pa, 0),
                     env={"STATEGATE_CONFIG": str(conf), "STATEGATE_PUBLIC_URL": public})
    jar: dict = {}

    def same_address(frm: Server, to: Server):
        """One address: what the browser holds for it goes to either node."""
        jar[to.port] = dict(jar.get(frm.port, {}))

    def path_of(url: str) -> str:
        return urllib.parse.urlsplit(url)._replace(scheme="", netloc="", fragment="").geturl()

    def sign_in(start: Server, finish: Server) -> str:
        """Started through `start`, the provider's callback reaching `finish`."""
        status, authorize, body = request("GET", start.url + "/ui/login/oidc", jar,
                                          headers={"Sec-Fetch-Site": "same-origin"})
        assert status == 303 and authorize.startswith(provider.url), (status, body[:300])
        callback = sign_in_at_provider(authorize, jar, "tess", public + CALLBACK)
        same_address(start, finish)
        status, _, body = request("GET", finish.url + path_of(callback), jar)
        assert status == 200, (status, body[:300])
        same_address(finish, start)
        return callback

    def racing_gets() -> list[tuple]:
        """Six requests of the session at once, through both nodes."""
        answers = []
        threads = [threading.Thread(target=lambda s=s: answers.append(request("GET", s.url + "/ui/", dict(jar))[:2]))
                   for s in (a, b, a, b, a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers

    try:
        a.start()
        b.start()
        callback = sign_in(a, b)
        # The same callback replayed through A finds the sign-in used up.
        status, _, body = request("GET", a.url + path_of(callback), dict(jar))
        assert status == 401 and REFUSED in body, (status, body[:300])
        for s in (a, b):
            status, _, body = request("GET", s.url + "/ui/", jar)
            assert status == 200 and "tess@example.com" in body, (s.data_dir.name, status, body[:300])
        assert a.query("SELECT COUNT(*) FROM sso_logins")[0][0] == 0, "the sign-in was used up"

        # Promoted at the provider: re-checked by whichever node the next request
        # reaches; requests racing through both nodes all go on, and one asks.
        provider.set_groups("tess", ["platform-admins"])
        time.sleep(1.2)
        answers = racing_gets()
        assert [status for status, _ in answers] == [200] * 6, answers
        role = ("SELECT g.role FROM operator_grants g JOIN operators o ON o.id = g.operator_id"
                " WHERE o.email = 'tess@example.com'")
        assert [r[0] for r in b.query(role)] == ["admin"]
        assert len(a.query("SELECT id FROM audit WHERE event = 'ui.sso_regrant'")) == 1, "one check, one regrant"

        # A reveal: POSTed to A, its one-time page shown by B, a reload through A masked.
        ws = a.workspace("sso-reveal")
        lineage = str(uuid.uuid4())
        state = _state(1, lineage, "visible")
        state["outputs"]["db_password"] = {"value": "pw-two-nodes", "type": "string", "sensitive": True}
        assert http("POST", ws.address, state, user=ws.user, password=ws.password).status == 200
        status, _, page = request("GET", a.url + "/ui/workspaces/sso-reveal/versions/1", jar)
        assert status == 200 and "pw-two-nodes" not in page, status
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        status, location, _ = request("POST", a.url + "/ui/workspaces/sso-reveal/versions/1/reveal", jar,
                                      form={"csrf": csrf}, headers={"Origin": public})
        assert status == 303 and "reveal=" in location, (status, location)
        path = path_of(location)
        same_address(a, b)
        status, _, shown = request("GET", b.url + path, jar)
        assert status == 200 and "pw-two-nodes" in shown, status
        status, _, again = request("GET", a.url + path, jar)
        assert status == 200 and "pw-two-nodes" not in again, "a reload through the other node is masked"
        assert len(a.query("SELECT id FROM audit WHERE event = 'state.revealed'")) == 1

        # Logged out through B: the same cookie is refused by A too (sent to the login
        # page), and the session is no longer followed.
        cookie = jar[b.port]["sg_session"]
        status, _, _ = request("POST", b.url + "/ui/logout", jar, form={"csrf": csrf},
                               headers={"Origin": public})
        assert status == 303
        replayed = {a.port: {"sg_session": cookie}}
        assert request("GET", a.url + "/ui/", replayed)[:2] == (303, a.url + "/ui/login")
        assert a.query("SELECT COUNT(*) FROM sso_sessions")[0][0] == 0

        # Signed in again (through B, finished through A); then taken out of every
        # mapped group at the provider: requests racing through both nodes after the
        # interval are all sent to the login page, and the end is audited once.
        sign_in(b, a)
        provider.set_groups("tess", ["marketing"])
        time.sleep(1.2)
        answers = racing_gets()
        assert sorted(answers) == sorted([(303, a.url + "/ui/login"), (303, b.url + "/ui/login")] * 3), answers
        ended = a.query("SELECT payload FROM audit WHERE event = 'ui.session_ended'")
        assert [json.loads(p) for p, in ended] == [{"method": "oidc", "reason": "no_role"}], ended
        for s in (a, b):
            log = s.log_text()
            assert "sgs_" not in log and "sgv_" not in log and CLIENT_SECRET not in log
    finally:
        a.stop()
        b.stop()
        provider.stop()


def test_the_index_migrates_to_postgres_and_back(postgres, check_binary, tmp_path, make_tf):
    """SQLite → PostgreSQL → SQLite with the real CLI: every table verified, the state,
    its history, the audit log and an operator token the same after each move; refused
    while a server uses the source."""
    s = Server(data_dir=tmp_path / "data", store="local")
    s.start()
    name = f"moved-{uuid.uuid4().hex[:8]}"
    tf = make_tf("w", s.workspace(name).env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    tf.apply()
    tf.write(BACKEND_HTTP + data_resource("a", "two"))
    tf.apply()
    token = cli(s, "admin", "operator", "create", "--email", "ops@example.org").stdout.strip().split()[-1]

    def snapshot():
        history = cli(s, "workspace", "history", name, "--json").stdout
        audit = cli(s, "admin", "audit", "list", "--scope", f"tf/{name}", "--json").stdout
        return s.workspace(name).get().body, history, audit

    before = snapshot()
    url = postgres.new_database()
    refused = cli(s, "index", "migrate", "--to", "postgres", url, ok=False)
    assert refused.returncode != 0 and "server is running" in refused.stderr, refused
    assert postgres_harness_tables(url) == 0, "nothing was written while the server ran"

    s.stop()
    out = cli(s, "index", "migrate", "--to", "postgres", url, "--json")
    report = {json.loads(line)["table"]: json.loads(line) for line in out.stdout.splitlines() if line.strip()}
    assert report["versions"]["rows"] == 2 and report["audit"]["rows"] > 0, report
    assert "copied and verified" in out.stderr, out.stderr
    again = cli(s, "index", "migrate", "--to", "postgres", url, ok=False)
    assert "not empty" in again.stderr, again

    s.extra_env.update(STATEGATE_INDEX="postgres", STATEGATE_INDEX_URL=url)
    s.start()
    assert snapshot() == before
    assert http("GET", f"{s.url}/api/v1/admin/workspaces", bearer=token).status == 200
    tf.write(BACKEND_HTTP + data_resource("a", "three"))
    tf.apply()  # the server on PostgreSQL takes writes: identity numbers continue

    back = tmp_path / "back.db"
    busy = cli(s, "index", "migrate", "--to", "sqlite", str(back), ok=False)
    assert busy.returncode != 0 and "other stategate sessions" in busy.stderr and not back.exists(), busy
    s.stop()
    during = snapshot_cli_only(s, name)
    cli(s, "index", "migrate", "--to", "sqlite", str(back))
    for old in s.data_dir.glob("stategate.db*"):  # the old index and its WAL: never mixed
        old.unlink()
    back.rename(s.data_dir / "stategate.db")
    del s.extra_env["STATEGATE_INDEX"], s.extra_env["STATEGATE_INDEX_URL"]
    s.start()
    assert snapshot_cli_only(s, name) == during
    assert "three" in s.workspace(name).get().text()
    s.stop()


def snapshot_cli_only(s, name):
    history = json.loads(cli(s, "workspace", "history", name, "--json").stdout.splitlines()[0])
    return history["version"], history["sha256"]


def postgres_harness_tables(url: str) -> int:
    from harness import query_postgres
    return query_postgres(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")[0][0]


def test_a_restarted_postgresql_is_reconnected_to(check_binary, tmp_path):
    """The database goes away and comes back at its address (a restart, as a failover
    does): the server's connections are made again on their next use — no restart of
    stategate, and no request after the database is back fails for a connection that
    broke while it was idle; requests while it is down fail with a retryable answer
    and change nothing."""
    pg = postgres_harness.Postgres(tmp_path / "own-pg")
    pg.start()
    try:
        s = Server(data_dir=tmp_path / "data", store="local",
                   extra_env={"STATEGATE_INDEX": "postgres", "STATEGATE_INDEX_URL": pg.new_database()})
        s.start()
        ws = s.workspace(f"reconnect-{uuid.uuid4().hex[:8]}")
        lineage = str(uuid.uuid4())

        def write(serial: int):
            info = lock_info()
            got = ws.lock(info)
            if got.status != 200:
                return got.status
            status = _post(ws, info, _state(serial, lineage, f"s{serial}")).status
            ws.unlock(info)
            return status

        assert write(1) == 200
        # Every reader connection used, so that each has a session to lose.
        with ThreadPoolExecutor(8) as pool:
            assert {g.status for g in pool.map(lambda _: ws.get(), range(16))} == {200}
        pg.restart()  # returns once the server accepts connections again
        assert write(2) == 200
        with ThreadPoolExecutor(8) as pool:
            gets = list(pool.map(lambda _: ws.get(), range(16)))
        assert {g.status for g in gets} == {200}
        assert json.loads(gets[0].body)["serial"] == 2
        # Down for longer: every write is refused as retryable and changes nothing.
        pg.pause()
        assert [write(3) for _ in range(3)] == [503] * 3
        assert ws.get().status == 503, "a read answered without its index"
        pg.resume()
        assert write(3) == 200
        assert json.loads(ws.get().body)["serial"] == 3
        assert s.alive(), "stategate was not restarted"
        s.stop()
    finally:
        pg.stop()


def _drift_run(server, token: str, run: int, timeout: float = 120) -> dict:
    """Run `run` through `server`'s admin API once it finished."""
    deadline = time.monotonic() + timeout
    while True:
        got = http("GET", f"{server.url}/api/v1/admin/drift/{run}", bearer=token)
        assert got.status == 200, got
        if got.json()["run"]["finished_at"]:
            return got.json()
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def _at_once(*calls):
    """The results of `calls`, each started on its own thread at the same moment."""
    results: list = [None] * len(calls)
    go = threading.Barrier(len(calls))

    def run(i, call):
        go.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _one_admitted(responses) -> tuple:
    """(the 202, the refusal) of two racing requests; fails unless exactly one was admitted."""
    statuses = sorted(r.status for r in responses)
    assert statuses == [202, 409], responses
    admitted = next(r for r in responses if r.status == 202)
    return admitted, next(r for r in responses if r.status == 409)


def test_a_drift_plan_kept_through_one_node_is_applied_through_the_other_once(
        postgres, garage_env, check_binary, tmp_path, make_tf, tf_env):
    from store_support import stored_object
    from test_drift import MAIN, TERRAFORM, config_file, tf_env_for_check

    name = f"drift-{uuid.uuid4().hex[:8]}"
    tfdir = tmp_path / "w"
    cfg = config_file(tmp_path / "drift.toml", [{
        "workspace": name, "dir": str(tfdir), "binary": TERRAFORM, "var_files": ["drift.tfvars"],
        "interval_seconds": 0, "timeout_seconds": 120, "approve_apply": True, "env": tf_env_for_check(tf_env),
    }])
    a, b = two_nodes(postgres, garage_env, tmp_path, env={"STATEGATE_CONFIG": str(cfg)})
    try:
        a.start()
        b.start()
        tf = make_tf("w", a.workspace(name).env)
        tf.write(MAIN)
        (tfdir / "drift.tfvars").write_text('v = "one"\n')
        tf.init()
        tf.apply("-var-file=drift.tfvars")
        token = cli(a, "admin", "operator", "create", "--email", "ops@example.org").stdout.strip().split()[-1]

        def check_through(node):
            return lambda: http("POST", f"{node.url}/api/v1/admin/drift/{name}/run", bearer=token)

        def approve_through(node, run):
            return lambda: http("POST", f"{node.url}/api/v1/admin/drift/{run}/apply", bearer=token)

        def input_value():
            state = a.workspace(name).get().json()
            return state["resources"][0]["instances"][0]["attributes"]["input"]["value"]

        # A check through node A keeps its plan in the shared store, on neither disk.
        (tfdir / "drift.tfvars").write_text('v = "two"\n')
        started = check_through(a)()
        assert started.status == 202, started
        drifted = _drift_run(a, token, started.json()["run"])["run"]
        assert drifted["outcome"] == "drifted" and drifted["approvable"], drifted
        plan_key = f"drift/plans/{drifted['id']}.plan"
        assert stored_object(a, plan_key) is not None, "the kept plan is in the shared store"
        for node in (a, b):
            assert not (node.data_dir / "drift" / "plans").exists(), node.data_dir

        # Approved through node B: the apply runs on B (A's disk never reaches it).
        approved = approve_through(b, drifted["id"])()
        assert approved.status == 202, approved
        apply_id = approved.json()["run"]
        applied = _drift_run(b, token, apply_id)["run"]
        assert applied["outcome"] == "applied" and applied["applies"] == drifted["id"], applied
        assert input_value() == "two"
        finished_on = [n for n in (a, b) if _finished_here(n, apply_id)]
        assert finished_on == [b], [n.data_dir.name for n in finished_on]
        assert stored_object(a, plan_key) is None, "a used plan is deleted from the store"
        # Approving again is refused, whichever node is asked.
        for node in (a, b):
            again = approve_through(node, drifted["id"])()
            assert again.status == 409 and "already approved" in again.text(), (node.data_dir.name, again)
        applies = a.query("SELECT count(*) FROM drift_runs WHERE applies = ?", (drifted["id"],))
        assert applies[0][0] == 1, applies

        # The same check asked for through both nodes at once: the index admits one run.
        (tfdir / "drift.tfvars").write_text('v = "three"\n')
        admitted, refused = _one_admitted(_at_once(check_through(a), check_through(b)))
        assert "still going" in refused.text(), refused
        second = _drift_run(a, token, admitted.json()["run"])["run"]
        assert second["outcome"] == "drifted", second
        checks = a.query("SELECT count(*) FROM drift_runs WHERE workspace = ? AND kind = 'check'", (name,))
        assert checks[0][0] == 2, checks

        # Its plan approved through both nodes at once: one apply, once.
        admitted, refused = _one_admitted(_at_once(approve_through(a, second["id"]),
                                                   approve_through(b, second["id"])))
        assert "still going" in refused.text() or "already approved" in refused.text(), refused
        applied = _drift_run(b, token, admitted.json()["run"])["run"]
        assert applied["outcome"] == "applied", applied
        assert input_value() == "three"
        assert a.query("SELECT count(*) FROM drift_runs WHERE applies = ?", (second["id"],))[0][0] == 1
        assert stored_object(b, f"drift/plans/{second['id']}.plan") is None
    finally:
        a.stop()
        b.stop()


def _finished_here(node, run: int) -> bool:
    """Whether `node`'s log says it finished drift run `run` (it ran it)."""
    return any("drift run finished" in line and f"run={run}" in line.split() for line in node.log_text().splitlines())


def test_a_postgresql_index_is_backed_up_by_one_node_and_restored_into_a_new_database(
        postgres, garage_env, check_binary, tmp_path):
    """`[backup]` on two nodes sharing a PostgreSQL index: the node holding the job's
    claim backs the index up into the store, the other never does; `stategate backup`
    takes one on demand. After the database is lost, a recovery configuration on SQLite
    (the same store and key) restores the newest backup and `index migrate` copies it
    into a new PostgreSQL database: a node on that serves the newest state and the
    lock held when the backup was taken. The nodes' own configuration, pointed at a new
    empty database, restores into it directly, with the same result."""
    a, b = two_nodes(postgres, garage_env, tmp_path, env={"STATEGATE_BACKUP_INTERVAL_SECONDS": "1"})
    lost_url = a.extra_env["STATEGATE_INDEX_URL"]
    # A database no node has opened holds no index: refused, nothing put in the store.
    unopened = cli(a, "backup", ok=False)
    assert unopened.returncode != 0 and "holds no index yet" in unopened.stderr, unopened.stderr
    assert cli(a, "backup", "list", "--json").stdout.strip() == ""
    for s in (a, b):
        s.start()
    try:
        name = f"backed-{uuid.uuid4().hex[:8]}"
        ws = a.workspace(name)
        lineage = str(uuid.uuid4())
        for serial in (1, 2):
            info = lock_info()
            assert ws.lock(info).status == 200
            assert _post(ws, info, _state(serial, lineage, f"s{serial}")).status == 200
            assert ws.unlock(info).status == 200
        held = lock_info(who="ci-job@runner")
        assert b.workspace(name + "-held").lock(held).status == 200
        on_demand = json.loads(cli(b, "backup").stdout.splitlines()[0])
        deadline = time.monotonic() + 30
        while True:
            listed = [json.loads(line) for line in cli(a, "backup", "list", "--json").stdout.splitlines()]
            newer = [x for x in listed if x["id"][:16] > on_demand["id"][:16]]  # taken in a later second
            if len(newer) >= 2:
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.2)
        backed_up = [s for s in (a, b) if "index backed up into the store" in s.log_tail(100_000)]
        assert len(backed_up) == 1, "both nodes took the scheduled backups"
    finally:
        for s in (a, b):
            s.stop()
    base = lost_url.split("?", 1)[0].rsplit("/", 1)[0]
    postgres._psql(f"{base}/postgres?sslmode=disable",
                   f"DROP DATABASE {lost_url.split('?', 1)[0].rsplit('/', 1)[1]} WITH (FORCE)")

    # Recovery: the same store and key, the index in a SQLite file of its own.
    recovery_env = {k: v for k, v in a.extra_env.items() if not k.startswith("STATEGATE_INDEX")}
    recovery = Server(data_dir=tmp_path / "recovery", store="s3", s3_env=garage_env, extra_env=recovery_env)
    recovery.data_dir.mkdir(parents=True)
    cli(recovery, "restore", "--into", str(recovery.data_dir / "stategate.db"))
    new_url = postgres.new_database()
    migrated = cli(recovery, "index", "migrate", "--to", "postgres", new_url)
    assert "copied and verified" in migrated.stderr, migrated.stderr

    c = Server(data_dir=tmp_path / "node-c", store="s3", s3_env=garage_env,
               extra_env={**a.extra_env, "STATEGATE_INDEX_URL": new_url,
                          "STATEGATE_BACKUP_INTERVAL_SECONDS": "0"})
    c.start()
    try:
        state = json.loads(c.workspace(name).get().body)
        assert (state["serial"], state["outputs"]["marker"]["value"]) == (2, "s2")
        refused = c.workspace(name + "-held").lock(lock_info())
        assert refused.status == 423 and refused.json()["ID"] == held["ID"], refused
    finally:
        c.stop()

    # The direct way: the nodes' own configuration, pointed at a new empty database,
    # restores into it in place (no SQLite, no migrate); a rebuild from the store alone
    # goes into another new database.
    direct_url = postgres.new_database()
    d = Server(data_dir=tmp_path / "node-d", store="s3", s3_env=garage_env,
               extra_env={**a.extra_env, "STATEGATE_INDEX_URL": direct_url,
                          "STATEGATE_BACKUP_INTERVAL_SECONDS": "0"})
    d.data_dir.mkdir(parents=True)
    restored = cli(d, "restore", "--into", direct_url)
    assert "this installation's index already" in restored.stdout, restored.stdout
    rebuilt = cli(d, "index", "rebuild", "--into", postgres.new_database())
    assert "2 version(s) of 1 scope(s)" in rebuilt.stdout and "set index.url to" in rebuilt.stdout, rebuilt.stdout
    assert not [f for f in d.data_dir.iterdir() if f.name.startswith(".new-index-")]
    d.start()
    try:
        state = json.loads(d.workspace(name).get().body)
        assert (state["serial"], state["outputs"]["marker"]["value"]) == (2, "s2")
        refused = d.workspace(name + "-held").lock(lock_info())
        assert refused.status == 423 and refused.json()["ID"] == held["ID"], refused
    finally:
        d.stop()

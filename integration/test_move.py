"""Moving resources between workspaces with the real Terraform CLI against a real
`stategate serve`.

Two configurations are applied to two workspaces; `stategate workspace move` moves a
plain resource, a counted one (both instances) and one inside a module, while their
blocks move between the .tf files; then `terraform plan -detailed-exitcode` shows no
changes in either directory. Every refusal (missing or present address, same
workspace, a held lock, a freeze, a malformed address, an encrypted state) exits
non-zero and leaves both workspaces' versions as they were.

A move killed with `kill -9` (the CLI or the server) at a named point
(`STATEGATE_TEST_MOVE_PAUSE`) leaves its locks only until the server's housekeeping
finds its process gone (at start, or on its next pass), which releases them, audited as
`tf.move_abandoned`; a move killed after its commit keeps both new versions.

Each test runs for store=local and store=garage and uses its own workspaces.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest

from harness import BACKEND_HTTP, cli, data_resource, http, json_lines, lock_info, stategate_bin

COUNTED = 'resource "terraform_data" "many" {\n  count = 2\n  input = "n-${count.index}"\n}\n'
MODULE_CALL = 'module "m" {\n  source = "./mod"\n}\n'
MODULE_BODY = data_resource("inner", "in-module")


def _versions(server, *names: str) -> list[int]:
    return [server.query("SELECT coalesce(max(version), 0) FROM versions WHERE scope = ?",
                         (f"tf/{n}",))[0][0] for n in names]


def _audit(server, ws_name: str, event: str) -> list[str]:
    rows = server.query("SELECT payload FROM audit WHERE scope = ? AND event = ? ORDER BY id",
                        (f"tf/{ws_name}", event))
    return [r[0] for r in rows]


def _newest_changes(server, ws: str) -> dict:
    return json_lines(cli(server, "workspace", "history", ws, "--json", "--limit", "1").stdout)[0]["changes"]


def _config(tf, *blocks: str, module: bool = False):
    tf.write(BACKEND_HTTP + "".join(blocks))
    if module:
        (tf.dir / "mod").mkdir(exist_ok=True)
        tf.write(MODULE_BODY, "mod/main.tf")


def _pair(server, ws_name, make_tf):
    src, dst = f"{ws_name}-src", f"{ws_name}-dst"
    a = make_tf("src", server.workspace(src).env)
    b = make_tf("dst", server.workspace(dst).env)
    _config(a, data_resource("keep", "k"), data_resource("moved", "m"), COUNTED, MODULE_CALL, module=True)
    _config(b, data_resource("own", "o"))
    for tf in (a, b):
        tf.init()
        tf.apply()
    return src, dst, a, b


def test_moving_resources_and_their_blocks_leaves_both_plans_empty(server, ws_name, make_tf):
    src, dst, a, b = _pair(server, ws_name, make_tf)
    before = _versions(server, src, dst)
    out = cli(server, "workspace", "move", src, dst,
              "terraform_data.moved", "terraform_data.many", "module.m.terraform_data.inner", "--json")
    done = json_lines(out.stdout)[0]
    assert done["instances"] == 4, done
    assert [done["from"]["version"], done["to"]["version"]] == [before[0] + 1, before[1] + 1], done
    assert _versions(server, src, dst) == [before[0] + 1, before[1] + 1]
    payloads = _audit(server, src, "tf.resources_moved")
    assert len(payloads) == 1 and dst in payloads[0], payloads
    # History tells the truth: the move's versions count only what moved (4 addresses),
    # untouched records are not "changed" (the move keeps Terraform's bytes).
    assert _newest_changes(server, src) == {"added": 0, "changed": 0, "removed": 0, "moved": 4}
    assert _newest_changes(server, dst) == {"added": 0, "changed": 0, "removed": 0, "moved": 4}
    history = cli(server, "workspace", "history", src, "--limit", "1").stdout
    assert f"4 moved to {dst}" in history, history

    # The blocks move too: src keeps `keep`, dst gets the rest (and the module).
    _config(a, data_resource("keep", "k"))
    _config(b, data_resource("own", "o"), data_resource("moved", "m"), COUNTED, MODULE_CALL, module=True)
    b.init()
    a.plan_no_changes()
    b.plan_no_changes()
    assert a.state_list() == ["terraform_data.keep"]
    assert sorted(b.state_list()) == sorted([
        "module.m.terraform_data.inner", "terraform_data.many[0]", "terraform_data.many[1]",
        "terraform_data.moved", "terraform_data.own"])
    # Both keep working as usual.
    _config(b, data_resource("own", "changed"), data_resource("moved", "m"), COUNTED, MODULE_CALL, module=True)
    assert "1 changed" in b.apply().stdout
    # Terraform's next write of the moved records reads as unchanged too.
    assert _newest_changes(server, dst) == {"added": 0, "changed": 1, "removed": 0, "moved": 0}


def test_every_refused_move_exits_non_zero_and_changes_nothing(server, ws_name, make_tf):
    src, dst, a, b = _pair(server, ws_name, make_tf)
    frozen, locked = f"{ws_name}-frz", f"{ws_name}-lck"
    for name in (frozen, locked):
        t = make_tf(name, server.workspace(name).env)
        _config(t, data_resource("x", "x"))
        t.init()
        t.apply()
    cli(server, "workspace", "freeze", frozen, "--reason", "change window", "--for", "1h")
    assert server.workspace(locked).lock(lock_info("run-7")).status == 200
    table = [
        ((src, dst, "terraform_data.nope"), "not in the state"),
        ((src, dst, "terraform_data.moved", "terraform_data.nope"), "terraform_data.nope"),
        ((src, src, "terraform_data.moved"), "same workspace"),
        ((src, f"{ws_name}-none", "terraform_data.moved"), "has no state"),
        ((src, frozen, "terraform_data.moved"), "change window"),
        ((frozen, src, "terraform_data.x"), "change window"),
        ((src, locked, "terraform_data.moved"), "run-7"),
        ((src, dst, "terraform_data.many[0]"), "one instance"),
        ((src, dst, "module.m"), "not a resource address"),
        ((src, dst, "../etc/passwd"), "not a resource address"),
    ]
    # Already in the destination: dst gets a `keep` of its own.
    _config(b, data_resource("own", "o"), data_resource("keep", "k2"))
    b.apply()
    table.append(((src, dst, "terraform_data.moved", "terraform_data.keep"), "already in the state"))
    names = (src, dst, frozen, locked)
    for args, says in table:
        before = _versions(server, *names)
        out = cli(server, "workspace", "move", *args, ok=False)
        assert out.returncode != 0, (args, out.stdout, out.stderr)
        assert says in out.stderr, (args, out.stderr)
        assert "moved" not in out.stdout, out.stdout
        assert _versions(server, *names) == before, args
    # The held lock and the freeze are untouched; both configurations still plan clean.
    assert server.workspace(locked).unlock(lock_info("run-7")).status == 200
    a.plan_no_changes()
    b.plan_no_changes()


def _tfstate(serial: int, lineage: str, *names: str) -> bytes:
    resources = [{"mode": "managed", "type": "terraform_data", "name": n,
                  "provider": 'provider["terraform.io/builtin/terraform"]',
                  "instances": [{"schema_version": 0, "attributes": {"id": n, "input": n}}]}
                 for n in names]
    return json.dumps({"version": 4, "terraform_version": "1.15.5", "serial": serial,
                       "lineage": lineage, "outputs": {}, "resources": resources}).encode()


def _seed(server, name: str, *resources: str):
    ws = server.workspace(name)
    r = http("POST", ws.address, _tfstate(1, name, *resources), user=ws.user, password=ws.password)
    assert r.status == 200, r


def _paused(log_of, point: str, proc, timeout: float = 60):
    """Waits until the move says it holds at `point` (in `log_of()`)."""
    deadline = time.monotonic() + timeout
    while f"move paused at {point}" not in log_of():
        assert proc.poll() is None, f"exited {proc.returncode} before {point}:\n{log_of()}"
        assert time.monotonic() < deadline, f"never paused at {point}:\n{log_of()}"
        time.sleep(0.05)


def _locked_by_the_move(server, *names: str) -> list[bool]:
    return [bool(server.query("SELECT 1 FROM tf_locks WHERE workspace = ? AND lock_id LIKE 'stategate-move-%'",
                              (n,))) for n in names]


def _free(server, *names: str):
    for n in names:
        ws = server.workspace(n)
        info = lock_info()
        assert ws.lock(info).status == 200, n
        assert ws.unlock(info).status == 200, n


@pytest.mark.parametrize("point", ["locked", "committed"])
def test_a_killed_cli_move_has_its_locks_released_by_the_next_housekeeping_pass(
        server_factory, ws_name, point):
    # A short housekeeping interval: the pass after the kill releases the locks.
    srv = server_factory.new(STATEGATE_RETENTION_INTERVAL_SECONDS="1")
    src, dst = f"{ws_name}-src", f"{ws_name}-dst"
    _seed(srv, src, "keep", "moved")
    _seed(srv, dst, "own")
    before = _versions(srv, src, dst)
    env = dict(srv.env(), STATEGATE_TEST_MOVE_PAUSE=point)
    err = srv.data_dir.parent / f"move-{point}.err"
    with open(err, "wb") as out:
        p = subprocess.Popen([str(stategate_bin()), "workspace", "move", src, dst, "terraform_data.moved"],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out)
    try:
        _paused(lambda: err.read_text(errors="replace"), point, p)
        assert _locked_by_the_move(srv, src, dst) == [True, True]
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    deadline = time.monotonic() + 30
    while any(_locked_by_the_move(srv, src, dst)):
        assert time.monotonic() < deadline, "the killed move's locks were never released"
        time.sleep(0.2)
    _free(srv, src, dst)
    for name in (src, dst):
        rows = _audit(srv, name, "tf.move_abandoned")
        assert len(rows) == 1 and "stategate-move-" in rows[0], (name, rows)
    assert srv.query("SELECT count(*) FROM tf_moves")[0][0] == 0
    moved = point == "committed"
    assert _versions(srv, src, dst) == [v + int(moved) for v in before], "a committed move is never undone"
    assert len(_audit(srv, src, "tf.resources_moved")) == int(moved)


@pytest.mark.parametrize("point", ["locked", "committed"])
def test_a_move_killed_with_its_server_has_its_locks_released_when_it_starts_again(
        server_factory, ws_name, point):
    srv = server_factory.new(STATEGATE_TEST_MOVE_PAUSE=point)
    src, dst = f"{ws_name}-src", f"{ws_name}-dst"
    _seed(srv, src, "keep", "moved")
    _seed(srv, dst, "own")
    before = _versions(srv, src, dst)
    token = cli(srv, "admin", "operator", "create", "--email", "mover@example.com").stdout.strip().split()[-1]
    url = f"{srv.url}/api/v1/admin/workspaces/{src}/move/{dst}"

    def move():
        try:
            http("POST", url, {"addresses": ["terraform_data.moved"]}, bearer=token, timeout=120)
        except OSError:
            pass  # the server is killed under it

    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    _paused(lambda: srv.log_path.read_text(errors="replace"), point, srv.proc)
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(30)
    mover.join(30)
    assert _locked_by_the_move(srv, src, dst) == [True, True], "the kill left both locks"
    srv.extra_env.pop("STATEGATE_TEST_MOVE_PAUSE")
    srv.start()
    deadline = time.monotonic() + 30
    while any(_locked_by_the_move(srv, src, dst)):
        assert time.monotonic() < deadline, "the killed move's locks were not released at start"
        time.sleep(0.2)
    _free(srv, src, dst)
    for name in (src, dst):
        assert len(_audit(srv, name, "tf.move_abandoned")) == 1, name
    moved = point == "committed"
    assert _versions(srv, src, dst) == [v + int(moved) for v in before], "a committed move is never undone"

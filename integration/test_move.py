"""Moving resources between workspaces with the real Terraform CLI against a real
`stategate serve`.

Two configurations are applied to two workspaces; `stategate workspace move` moves a
plain resource, a counted one (both instances) and one inside a module, while their
blocks move between the .tf files; then `terraform plan -detailed-exitcode` shows no
changes in either directory. Every refusal (missing or present address, same
workspace, a held lock, a freeze, a malformed address, an encrypted state) exits
non-zero and leaves both workspaces' versions as they were.

Each test runs for store=local and store=garage and uses its own workspaces.
"""

from __future__ import annotations


from harness import BACKEND_HTTP, cli, data_resource, json_lines, lock_info

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

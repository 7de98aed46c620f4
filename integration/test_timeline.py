"""Who wrote every version and which resources each one changed, with the real
Terraform CLI against the real binary: an apply with count, for_each and a module, a
change of one attribute, a destroy of one instance, then an operator rollback;
`workspace history` and `workspace timeline` (table and --json) name exactly those
addresses, versions and writers (the lock's Who and Operation as Terraform sent them).
"""

from __future__ import annotations

import json

from harness import BACKEND_HTTP, cli, json_lines


def config(many_second: str, each: list[str]) -> str:
    keys = ", ".join(f'"{k}"' for k in each)
    return BACKEND_HTTP + f"""
resource "terraform_data" "one" {{
  input = "one"
}}

resource "terraform_data" "many" {{
  count = 2
  input = count.index == 1 ? "{many_second}" : "first"
}}

resource "terraform_data" "each" {{
  for_each = toset([{keys}])
  input    = each.key
}}

module "m" {{
  source = "./m"
}}
"""


MODULE = 'resource "terraform_data" "inner" {\n  input = "inner"\n}\n'


def timeline(server, ws: str, *extra) -> list[tuple[int, str, str]]:
    rows = json_lines(cli(server, "workspace", "timeline", ws, *extra, "--json").stdout)
    return [(r["version"], r["change"], r["address"]) for r in rows]


def test_timeline_and_writers_with_real_terraform(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = make_tf("t", ws.env)
    (tf.dir / "m").mkdir()
    tf.write(MODULE, "m/main.tf")
    tf.write(config("second", ["a", "b"]))
    tf.init()
    assert "6 added" in tf.apply().stdout
    tf.write(config("second-changed", ["a", "b"]))
    assert "1 changed" in tf.apply().stdout
    tf.write(config("second-changed", ["a"]))
    assert "1 destroyed" in tf.apply().stdout

    # The timeline names exactly those instances, newest first (addresses in order).
    assert timeline(server, ws_name) == [
        (3, "removed", 'terraform_data.each["b"]'),
        (2, "changed", "terraform_data.many[1]"),
        (1, "added", "module.m.terraform_data.inner"),
        (1, "added", 'terraform_data.each["a"]'),
        (1, "added", 'terraform_data.each["b"]'),
        (1, "added", "terraform_data.many[0]"),
        (1, "added", "terraform_data.many[1]"),
        (1, "added", "terraform_data.one"),
    ]
    assert timeline(server, ws_name, "terraform_data.many") == [
        (2, "changed", "terraform_data.many[1]"),
        (1, "added", "terraform_data.many[0]"),
        (1, "added", "terraform_data.many[1]"),
    ]
    assert timeline(server, ws_name, "module.m") == [(1, "added", "module.m.terraform_data.inner")]
    assert timeline(server, ws_name, "terraform_data.nothing") == []

    # Who: the workspace credential, with the lock's Who and Operation Terraform sent.
    rows = json_lines(cli(server, "workspace", "history", ws_name, "--json").stdout)
    assert [r["version"] for r in rows] == [3, 2, 1]
    for r in rows:
        assert r["writer"] == f"tf:{ws_name}", r
        assert r["lock_operation"] == "OperationTypeApply", r
        assert "@" in (r["lock_who"] or ""), r
        assert r["written_by"] == f"{r['lock_who']} (apply) via tf:{ws_name}", r
    assert [r["changes"] for r in rows] == [
        {"added": 0, "changed": 0, "removed": 1, "moved": 0},
        {"added": 0, "changed": 1, "removed": 0, "moved": 0},
        {"added": 6, "changed": 0, "removed": 0, "moved": 0},
    ]
    lines = json_lines(cli(server, "workspace", "timeline", ws_name, "terraform_data.many[1]", "--json").stdout)
    assert [line["writer"] for line in lines] == [f"tf:{ws_name}"] * 2
    assert all(line["lock_who"] == rows[0]["lock_who"] for line in lines)

    # An operator's rollback to v2 says so, and brings each["b"] back in the timeline.
    done = json.loads(cli(server, "workspace", "rollback", ws_name, "--to", "2").stdout)
    assert done["version"] == 4 and done["restored_from"] == 2, done
    assert done["writer"].startswith("cli:") and "rollback of v2" in done["written_by"], done
    assert timeline(server, ws_name, "--limit", "1") == [(4, "added", 'terraform_data.each["b"]')]
    table = cli(server, "workspace", "history", ws_name).stdout
    header, *body = table.splitlines()
    assert header.split() == ["VERSION", "SERIAL", "WRITTEN", "WRITER", "CHANGES", "SIZE"], table
    assert "rollback of v2" in body[0] and "+1 ~0 -0" in body[0], table
    assert f"(apply) via tf:{ws_name}" in body[1] and "+0 ~0 -1" in body[1], table
    tl = cli(server, "workspace", "timeline", ws_name, "terraform_data.each").stdout
    assert tl.splitlines()[0].split() == ["VERSION", "WRITTEN", "CHANGE", "ADDRESS", "WRITER"], tl
    assert 'terraform_data.each["b"]' in tl and "rollback of v2" in tl, tl

    # Terraform agrees with what the rollback restored; the next plan is about v2's config.
    tf.write(config("second-changed", ["a", "b"]))
    tf.plan_no_changes()

    # Bad input: a clear refusal, nothing written.
    bad = cli(server, "workspace", "timeline", ws_name, "a\x01b", ok=False)
    assert bad.returncode != 0 and "address must be" in bad.stderr, bad
    assert len(json_lines(cli(server, "workspace", "history", ws_name, "--json").stdout)) == 4

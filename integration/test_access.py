"""Workspace credentials with the real Terraform CLI against a real `stategate serve`
(issue 21): rotating the derived credential from the CLI, issued scoped tokens, the
outputs-only state read by `terraform_remote_state`, consumers, and revocation.

Every test runs for store=local and store=garage and uses its own workspaces.
"""

from __future__ import annotations

import json
import uuid

from harness import BACKEND_HTTP, cli, data_resource, http, lock_info

AUTH_ERR = "requires auth"  # Terraform's http backend on a 401


def _token(server, scope: str, workspaces: str, *extra: str) -> dict:
    name = f"t-{scope}-{uuid.uuid4().hex[:10]}"
    p = cli(server, "workspace", "token", "create", "--name", name, "--workspaces", workspaces,
            "--scope", scope, "--json", *extra)
    created = json.loads(p.stdout)
    assert created["secret"].startswith("sgw_") and created["name"] == name, created
    return created


def _with_password(env: dict, password: str) -> dict:
    e = dict(env)
    e["TF_HTTP_USERNAME"] = "ci"
    e["TF_HTTP_PASSWORD"] = password
    return e


PRODUCER = BACKEND_HTTP + data_resource("db", "resource-secret-value") + """
output "url" {
  value = "https://app.example"
}
output "db_password" {
  value     = "hunter2-sensitive-output"
  sensitive = true
}
"""


def _consumer_config(address: str, password: str) -> str:
    return f"""
data "terraform_remote_state" "producer" {{
  backend = "http"
  config = {{
    address  = "{address}"
    username = "consumer"
    password = "{password}"
  }}
}}
output "url" {{
  value = data.terraform_remote_state.producer.outputs.url
}}
output "has_password" {{
  value = can(data.terraform_remote_state.producer.outputs.db_password)
}}
output "names" {{
  value = sort(keys(data.terraform_remote_state.producer.outputs))
}}
"""


def _outputs_json(tf) -> dict:
    out = json.loads(tf.run("output", "-json", "-no-color").stdout)
    return {k: v["value"] for k, v in out.items()}


def test_rotating_the_credential_from_the_cli_refuses_the_old_one(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    other = server.workspace(f"{ws_name}-other")
    tf = make_tf("w", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    tf.apply()
    assert http("GET", other.address, user="x", password=other.password).status in (404, 200)

    p = cli(server, "workspace", "credential", "rotate", ws_name, "--json")
    assert json.loads(p.stdout) == {"workspace": ws_name, "generation": 1}

    r = tf.plan(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r
    rotated = server.workspace(ws_name)
    assert rotated.password != ws.password
    assert server.workspace(f"{ws_name}-other").password == other.password, "another workspace changed"
    fresh = make_tf("w", rotated.env)  # the same directory, the new credential
    fresh.plan_no_changes()
    audit = cli(server, "admin", "audit", "--json", ok=False)
    if audit.returncode == 0:  # the audit listing names the rotation, never a secret
        assert rotated.password not in audit.stdout and ws.password not in audit.stdout


def test_a_rotation_from_the_cli_refuses_the_old_credential_during_a_lock_storm(server, ws_name):
    """The server remembers a derived credential's lookup (and the lock it found) until
    something commits: a rotation made by the CLI, another process, is seen by the very
    next LOCK, even while refusals are being answered from that memory."""
    ws = server.workspace(ws_name)
    holder = lock_info(who="holder@ci")
    assert ws.lock(holder).status == 200
    for _ in range(3):  # refused, the answer remembered between commits
        r = ws.lock(lock_info())
        assert r.status == 423 and json.loads(r.body)["Who"] == "holder@ci", r
    cli(server, "workspace", "credential", "rotate", ws_name, "--json")
    old = ws.lock(lock_info())
    assert old.status == 401, old
    assert http("GET", ws.address, user=ws.user, password=ws.password).status == 401
    rotated = server.workspace(ws_name)
    again = rotated.lock(lock_info())
    assert again.status == 423 and json.loads(again.body)["ID"] == holder["ID"], again
    assert rotated.unlock(holder).status == 200


def test_a_consumer_reads_outputs_only_with_an_outputs_token_until_revoked(server, ws_name, make_tf):
    producer = server.workspace(ws_name)
    write = _token(server, "write", f"{ws_name}*")
    tf = make_tf("producer", _with_password(producer.env, write["secret"]))
    tf.write(PRODUCER)
    tf.init()
    tf.apply()

    outputs_url = f"{server.url}/api/v1/tf/outputs/{ws_name}"
    reader = _token(server, "outputs", ws_name)
    consumer = make_tf("consumer", {})  # local state: only the remote-state read goes to stategate
    consumer.write(_consumer_config(outputs_url, reader["secret"]))
    consumer.init()
    consumer.apply()
    got = _outputs_json(consumer)
    assert got == {"url": "https://app.example", "has_password": False, "names": ["url"]}, got
    body = http("GET", outputs_url, user="x", password=reader["secret"]).text()
    assert "resource-secret-value" not in body and "hunter2-sensitive-output" not in body, body
    # The outputs token cannot read the state itself.
    assert http("GET", producer.address, user="x", password=reader["secret"]).status == 401

    listed = cli(server, "workspace", "token", "list", "--json").stdout
    assert reader["name"] in listed and reader["secret"] not in listed and write["secret"] not in listed

    cli(server, "workspace", "token", "revoke", reader["name"])
    r = consumer.plan(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r


def test_a_read_token_cannot_lock_or_apply(server, ws_name, make_tf):
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    tf.write(BACKEND_HTTP + data_resource("a", "one"))
    tf.init()
    tf.apply()
    read = _token(server, "read", ws_name)
    reader = make_tf("w", _with_password(ws.env, read["secret"]))
    reader.write(BACKEND_HTTP + data_resource("a", "two"))
    r = reader.apply(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r
    assert "Error acquiring the state lock" in r.output, r
    # A plan without a lock reads the state: allowed.
    reader.plan("-lock=false")
    versions = server.db_rows(ws_name)
    assert len(versions) == 1, "the read token wrote a version"


def test_consumer_workspaces_read_outputs_with_their_own_credential(server, ws_name, make_tf):
    producer = server.workspace(ws_name)
    tf = make_tf("producer", producer.env)
    tf.write(PRODUCER)
    tf.init()
    tf.apply()
    app_name = f"{ws_name}-app"
    app = server.workspace(app_name)
    outputs_url = f"{server.url}/api/v1/tf/outputs/{ws_name}"
    consumer = make_tf("app", app.env)
    consumer.write(BACKEND_HTTP + _consumer_config(outputs_url, app.password))
    consumer.init()
    r = consumer.plan(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, "not a consumer yet: refused"

    cli(server, "workspace", "consumers", "set", ws_name, app_name)
    assert cli(server, "workspace", "consumers", "list", ws_name).stdout.split() == [app_name]
    consumer.apply()
    got = _outputs_json(consumer)
    assert got["url"] == "https://app.example" and got["names"] == ["url"], got
    # The consumer's credential reads outputs only, never the producer's state.
    assert http("GET", producer.address, user="x", password=app.password).status == 401

    cli(server, "workspace", "consumers", "clear", ws_name)
    r = consumer.plan(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r

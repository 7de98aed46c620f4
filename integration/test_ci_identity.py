"""A CI job's own OIDC identity token as the Terraform backend credential (issue 40),
with a real issuer on loopback over HTTPS (ci_issuer.py: its own CA, given to stategate
as `ca_file`; discovery + JWKS) and the real Terraform CLI using the JWT as
TF_HTTP_PASSWORD: main applies, a branch only plans, another repository is refused, a run
longer than its token finishes; and a hostile table in which every refusal is the same
401, byte for byte, and changes nothing.

Runs on SQLite, and on PostgreSQL with STATEGATE_E2E_INDEX=postgres.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from ci_issuer import Issuer, Key
from conftest import ServerFactory
from harness import BACKEND_HTTP, cli, data_resource, free_port, http, json_lines, lock_info

AUD = "https://stategate.test"
AUTH_ERR = "requires auth"  # Terraform's http backend on a 401


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    i = Issuer(tmp_path_factory.mktemp("ci-issuer"))
    yield i
    i.stop()


@pytest.fixture(scope="module")
def dead_issuer_port():
    return free_port()  # nothing listens there: its keys cannot be fetched


@pytest.fixture(scope="module")
def server(issuer, dead_issuer_port, check_binary, tmp_path_factory):
    base = tmp_path_factory.mktemp("ci-servers")
    cfg = base / "stategate.toml"
    cfg.write_text(f"""
[[ci_identity]]
name = "github"
issuer = "{issuer.url('gh')}"
audience = "{AUD}"
ca_file = "{issuer.ca_file}"
identity = "{{repository}}@{{ref}}#run {{run_id}}"
max_run_seconds = 300

[[ci_identity.rules]]
claims = {{ repository = "acme/infra", ref = "refs/heads/main" }}
workspaces = "prod-*"
scope = "write"

[[ci_identity.rules]]
claims = {{ repository = "acme/infra" }}
workspaces = "*"
scope = "read"

[[ci_identity]]
name = "gitlab"
issuer = "{issuer.url('gl')}"
audience = ["https://other.test", "{AUD}"]
ca_file = "{issuer.ca_file}"
identity = "{{project_path}}@{{ref}}#pipeline {{pipeline_id}}"
max_run_seconds = 30

[[ci_identity.rules]]
claims = {{ project_path = "acme/infra", ref_protected = "true" }}
workspaces = "staging-*"
scope = "write"

[[ci_identity.rules]]
claims = {{ project_path = "acme/*", environment = "*" }}
workspaces = "env-{{environment}}"
scope = "write"

[[ci_identity]]
name = "dead"
issuer = "https://127.0.0.1:{dead_issuer_port}/x"
audience = "{AUD}"
ca_file = "{issuer.ca_file}"
[[ci_identity.rules]]
claims = {{ sub = "*" }}
workspaces = "*"
scope = "write"
""")
    f = ServerFactory(base, ("local", {}))
    s = f.new(STATEGATE_CONFIG=cfg)
    yield s
    f.stop_all()


def _url(server, ws: str, outputs: bool = False) -> str:
    return f"{server.url}/api/v1/tf/{'outputs' if outputs else 'state'}/{ws}"


def _tf_env(server, ws: str, token: str) -> dict:
    a = _url(server, ws)
    return {"TF_HTTP_ADDRESS": a, "TF_HTTP_LOCK_ADDRESS": a, "TF_HTTP_UNLOCK_ADDRESS": a,
            "TF_HTTP_USERNAME": "ci", "TF_HTTP_PASSWORD": token}


def _seed(server, ws: str):
    """A first state written with the workspace's own derived credential."""
    w = server.workspace(ws)
    state = {"version": 4, "terraform_version": "1.15.5", "serial": 1, "lineage": str(uuid.uuid4()),
             "outputs": {"a": {"value": "b", "type": "string"}}, "resources": []}
    r = http("POST", w.address, state, user="x", password=w.password)
    assert r.status == 200, r
    return w


def _snapshot(server, ws: str):
    """Everything a request on `ws` could change."""
    return (server.query("SELECT version, actor FROM versions WHERE scope = ? ORDER BY version", (f"tf/{ws}",)),
            server.query("SELECT lock_id, credential FROM tf_locks WHERE workspace = ?", (ws,)),
            server.query("SELECT COUNT(*) FROM audit"),
            server.query("SELECT COUNT(*) FROM tf_ci_tokens"))


def test_hostile_tokens_are_all_the_same_401_and_change_nothing(server, issuer, dead_issuer_port):
    ws = f"prod-hostile-{uuid.uuid4().hex[:8]}"
    w = _seed(server, ws)
    gh = issuer.keys["gh"]
    now = int(time.time())

    # The reference refusals: a wrong secret, per route.
    routes = {
        "GET": lambda auth: http("GET", _url(server, ws), **auth),
        "OUTPUTS": lambda auth: http("GET", _url(server, ws, outputs=True), **auth),
        "LOCK": lambda auth: http("LOCK", _url(server, ws), lock_info(), **auth),
        "POST": lambda auth: http("POST", _url(server, ws) + "?ID=x", {"version": 4}, **auth),
        "UNLOCK": lambda auth: http("UNLOCK", _url(server, ws), lock_info(), **auth),
    }
    reference = {name: route({"user": "ci", "password": "not-a-credential"}) for name, route in routes.items()}
    for name, r in reference.items():
        assert r.status == 401, (name, r)

    def refused(label: str, token: str):
        before = _snapshot(server, ws)
        for auth in ({"user": "ci", "password": token}, {"bearer": token}):
            for name, route in routes.items():
                r = route(auth)
                assert (r.status, r.body) == (reference[name].status, reference[name].body), (label, name, r)
        assert _snapshot(server, ws) == before, label

    # Unknown kid: exactly one JWKS read (the issuer's first), then refused without another.
    stranger = Key("EC", "gl-2")
    unknown = issuer.mint("gl", issuer.gitlab(AUD, environment="x"), key=stranger)
    before_reads = issuer.jwks_reads["gl"]
    assert http("GET", _url(server, "env-x"), bearer=unknown).body == reference["GET"].body
    assert issuer.jwks_reads["gl"] == before_reads + 1
    refused("unknown kid", unknown)
    assert issuer.jwks_reads["gl"] == before_reads + 1, "a refresh per request: not rate-limited"

    # A valid main token works on this workspace (so each refusal below is the hostile part's).
    ok = issuer.mint("gh", issuer.github(AUD))
    assert http("GET", _url(server, ws), bearer=ok).status == 200

    public_pem = gh.public_pem()
    table = {
        "wrong issuer": issuer.mint("gh", issuer.github(AUD, iss="https://token.actions.githubusercontent.com")),
        "issuer of another entry": issuer.mint("gh", issuer.github(AUD, iss=issuer.url("gl"))),
        "wrong audience": issuer.mint("gh", issuer.github("https://elsewhere.test")),
        "audience list without ours": issuer.mint("gh", issuer.github(["a", "b"])),
        "expired": issuer.mint("gh", issuer.github(AUD, issued=now - 900, lifetime=300)),
        "not yet valid": issuer.mint("gh", issuer.github(AUD, nbf=now + 600)),
        "issued in the future": issuer.mint("gh", issuer.github(AUD, iat=now + 600)),
        "no exp": issuer.mint("gh", {k: v for k, v in issuer.github(AUD).items() if k != "exp"}),
        "alg none": issuer.mint("gh", issuer.github(AUD), alg="none"),
        "HS256 keyed with the public key": issuer.mint("gh", issuer.github(AUD), alg="HS256", hmac_secret=public_pem),
        "RS256 header over an EC key's signature": issuer.mint("gh", issuer.github(AUD), alg="RS256", key=Key("EC", "gh-1")),
        "ES256 header, RSA key": issuer.mint("gh", issuer.github(AUD), alg="ES256", kid="gh-1", key=Key("EC", "x")),
        "embedded jwk": issuer.mint("gh", issuer.github(AUD), key=Key("RSA", "gh-1"),
                                    header={"jwk": {"kty": "RSA", "kid": "gh-1"}}),
        "crit header": issuer.mint("gh", issuer.github(AUD), header={"crit": ["exp"]}),
        "signature of another token": ok.rsplit(".", 1)[0][:-4] + "AAAA." + ok.rsplit(".", 1)[1],
        "another repository": issuer.mint("gh", issuer.github(AUD, repository="evil/infra")),
        "repository *": issuer.mint("gh", issuer.github(AUD, repository="*")),
        "repository acme/*": issuer.mint("gh", issuer.github(AUD, repository="acme/*")),
        "control character in the identity": issuer.mint("gh", issuer.github(AUD, run_id="812\n")),
        "escape in the repository": issuer.mint("gh", issuer.github(AUD, repository="acme/infra\u001b[2J")),
        # Over the 8 KiB bound (but within the edge's 16 KiB header line, Basic-encoded too).
        "oversized": issuer.mint("gh", issuer.github(AUD, pad="x" * 5200)),
        "unfetchable JWKS": issuer.mint("gh", issuer.github(AUD, iss=f"https://127.0.0.1:{dead_issuer_port}/x")),
    }
    assert 8192 < len(table["oversized"]) < 9000
    for label, token in table.items():
        refused(label, token)
    # A branch may read but neither lock nor write: the same 401 on those routes.
    branch = issuer.mint("gh", issuer.github(AUD, ref="refs/heads/feature"))
    assert http("GET", _url(server, ws), bearer=branch).status == 200
    before = _snapshot(server, ws)
    for name in ("LOCK", "POST", "UNLOCK"):
        r = routes[name]({"bearer": branch})
        assert (r.status, r.body) == (reference[name].status, reference[name].body), name
    assert _snapshot(server, ws) == before
    # Claims put into a workspace pattern: no wildcard, no `..`, no control character.
    legit = issuer.mint("gl", issuer.gitlab(AUD, environment="a"))
    assert http("GET", _url(server, "env-a"), bearer=legit).status == 404  # permitted; no state yet
    for env in ["*", "a*", "..", "a\u0007", "env-a"]:
        t = issuer.mint("gl", issuer.gitlab(AUD, environment=env))
        r = http("GET", _url(server, "env-a"), bearer=t)
        assert (r.status, r.body) == (401, reference["GET"].body), env
    # A token padded below the bound is judged (Basic-encoded it exceeds the 4 KiB of other secrets).
    padded = issuer.mint("gh", issuer.github(AUD, pad="x" * 3800))
    assert 6000 < len(padded) < 8192
    assert http("GET", _url(server, ws), user="ci", password=padded).status == 200
    # The issuer's outage stops neither its known keys nor any other credential.
    issuer.down = True
    try:
        assert http("GET", _url(server, ws), bearer=issuer.mint("gh", issuer.github(AUD))).status == 200
        assert http("GET", w.address, user="x", password=w.password).status == 200
        refused("unfetchable JWKS, again", table["unfetchable JWKS"])
    finally:
        issuer.down = False
    assert server.alive()


def test_main_applies_a_branch_only_plans_another_repository_is_refused(server, issuer, make_tf):
    ws = f"prod-web-{uuid.uuid4().hex[:8]}"
    main = issuer.mint("gh", issuer.github(AUD, run_id="812"))
    tf = make_tf("main", _tf_env(server, ws, main))
    tf.write(BACKEND_HTTP + data_resource("web", "v1"))
    tf.init()
    tf.apply()
    rows = server.db_rows(ws)
    assert [r["actor"] for r in rows] == ["ci:github:acme/infra@refs/heads/main#run 812"]
    audit = server.query("SELECT actor, event FROM audit WHERE scope = ? ORDER BY id", (f"tf/{ws}",))
    assert {a["actor"] for a in audit} == {"ci:github:acme/infra@refs/heads/main#run 812"}, audit
    assert any(a["event"] == "tf.locked" for a in audit) or audit, audit
    history = json_lines(cli(server, "workspace", "history", ws, "--json").stdout)
    assert "ci:github:acme/infra@refs/heads/main#run 812" in json.dumps(history), history

    # A branch of the same repository: plans (without a lock), its apply refused, nothing written.
    branch = issuer.mint("gh", issuer.github(AUD, ref="refs/heads/feature", run_id="813"))
    tfb = make_tf("branch", _tf_env(server, ws, branch))
    tfb.write(BACKEND_HTTP + data_resource("web", "v2"))
    tfb.init()
    assert "1 to change" in tfb.plan("-lock=false").stdout
    r = tfb.apply(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r
    assert len(server.db_rows(ws)) == 1
    assert server.query("SELECT * FROM tf_locks WHERE workspace = ?", (ws,)) == []
    r = tfb.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock=false", check=False)
    assert r.returncode != 0 and len(server.db_rows(ws)) == 1, r

    # Another repository: not even a plan.
    other = issuer.mint("gh", issuer.github(AUD, repository="evil/infra", run_id="9"))
    tfo = make_tf("other", _tf_env(server, ws, other))
    tfo.write(BACKEND_HTTP + data_resource("web", "v3"))
    r = tfo.init(check=False)
    if r.returncode == 0:
        r = tfo.plan("-lock=false", check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r

    # An expired token: refused from its first request.
    expired = issuer.mint("gh", issuer.github(AUD, issued=int(time.time()) - 400, lifetime=300))
    tfe = make_tf("expired", _tf_env(server, ws, expired))
    tfe.write(BACKEND_HTTP + data_resource("web", "v4"))
    r = tfe.init(check=False)
    if r.returncode == 0:
        r = tfe.apply(check=False)
    assert r.returncode != 0 and AUTH_ERR in r.output, r
    assert len(server.db_rows(ws)) == 1


def test_a_run_longer_than_its_token_finishes(server, issuer, make_tf):
    ws = f"prod-long-{uuid.uuid4().hex[:8]}"
    token = issuer.mint("gh", issuer.github(AUD, run_id="900", lifetime=3))
    tf = make_tf("long", _tf_env(server, ws, token))
    tf.write(BACKEND_HTTP + """
resource "terraform_data" "slow" {
  input = "v1"
  provisioner "local-exec" {
    command = "sleep 22"
  }
}
""")
    start = time.time()
    tf.init()
    tf.apply()
    assert time.time() - start > 3 + 15, "the write came after the token's expiry and leeway"
    assert [r["actor"] for r in server.db_rows(ws)] == ["ci:github:acme/infra@refs/heads/main#run 900"]
    assert server.query("SELECT * FROM tf_locks WHERE workspace = ?", (ws,)) == []
    # The same token on a new run after its expiry still works inside its window...
    assert http("GET", _url(server, ws), bearer=token).status == 200


def test_a_token_replayed_after_its_window_is_refused(server, issuer):
    # gitlab: max_run_seconds = 30; the token lives 1 s (+15 s of leeway).
    ws = f"staging-{uuid.uuid4().hex[:8]}"
    _seed(server, ws)
    token = issuer.mint("gl", issuer.gitlab(AUD, lifetime=1))
    t0 = time.time()
    assert http("GET", _url(server, ws), bearer=token).status == 200
    seen = server.query("SELECT identity, until_unix - first_seen_unix FROM tf_ci_tokens WHERE identity LIKE ?",
                        ("gitlab:acme/infra@main#pipeline 574",))
    # max_run_seconds after first seen, or the token's own exp (+ leeway) when later: an
    # earlier test's 5-minute token of the same identity is accepted until its exp.
    assert seen and any(r[1] == 30 for r in seen) and all(r[1] >= 30 for r in seen), seen
    time.sleep(max(0, t0 + 19 - time.time()))
    assert http("GET", _url(server, ws), bearer=token).status == 200, "inside its window"
    # First seen after its expiry: never.
    late = issuer.mint("gl", issuer.gitlab(AUD, issued=int(time.time()) - 20, lifetime=1))
    reference = http("GET", _url(server, ws), bearer="nope")
    r = http("GET", _url(server, ws), bearer=late)
    assert (r.status, r.body) == (401, reference.body)
    time.sleep(max(0, t0 + 33 - time.time()))
    before = _snapshot(server, ws)
    for _ in range(2):
        r = http("GET", _url(server, ws), bearer=token)
        assert (r.status, r.body) == (401, reference.body), "replayed after its window"
        r = http("LOCK", _url(server, ws), lock_info(), bearer=token)
        assert r.status == 401
    assert _snapshot(server, ws) == before

"""Single sign-on for the web UI against a real OpenID provider: the certified npm
package `oidc-provider` (integration/oidc/provider.js, installed by
scripts/setup-test-deps.sh), started by the test on a loopback port, with a
confidential client that must use PKCE, test users and their groups.

- In headless Chromium: an operator asks for a workspace page, is sent to the login
  page, signs in through the provider's own login form and lands on the page asked
  for with the role its groups map to: an admin (`platform-admins`) sees and uses the
  reveal form; a viewer (`dev`) is offered none and a reveal it posts anyway is a 403.
  A user whose groups map to no role is told to ask an admin to map one of their
  groups (naming the groups claim), not about tokens, and no operator, session or
  login row is made for it. The `ui.login` audit row names the
  subject, issuer and email, never a code or token.
- Over plain HTTP (the same provider, its login form posted by the test): a forged
  `state`, a replayed callback (the same code again), a code of another sign-in
  presented with this one's state (its PKCE verifier does not match), this sign-in's
  own request sent to the provider with another nonce (the ID token's nonce does not
  match), a callback from another browser (no binding cookie), cross-site starts and POSTs,
  a name an operator from the CLI already has, and an expired ID token (a provider
  whose clock runs 30 minutes behind issues tokens that expired 20 minutes ago), a
  callback naming another issuer or none (RFC 9207; the provider advertises `iss`):
  each is the one refusal, and nothing changes in the database.
- A session follows the provider: re-checked through userinfo (and the refresh token
  once the access token has expired) after `revalidate_seconds`, a user promoted or
  taken out of its groups at the provider (a test hook of provider.js) gets the new
  role or loses the session at the next request (revoked, audited); the session's
  provider tokens are sealed rows of the index, so a restart keeps it, and a session
  whose row is gone ends. Groups can come from userinfo alone.
- `admin operator set-role` on a single sign-on operator is a cap: re-checks at the
  provider never give more, in the UI or through the operator's API token.

Nothing is skipped: without node, the package, chromium or chromedriver the test fails.
"""

from __future__ import annotations

import json
import re
import time
import sqlite3
import urllib.parse
from pathlib import Path

import pytest

from browser_support import Page, browser  # noqa: F401 (a fixture)
from harness import BACKEND_HTTP, Server, cli, data_resource, free_port, json_lines
from oidc_support import CALLBACK, CLIENT_SECRET, REFUSED, Provider, request, sign_in_at_provider

class Setup:
    def __init__(self, server: Server, provider: Provider):
        self.server, self.provider = server, provider

    def db(self, sql: str, *args):
        con = sqlite3.connect(self.server.data_dir / "stategate.db")
        try:
            rows = con.execute(sql, args).fetchall()
            con.commit()
            return rows
        finally:
            con.close()

    def snapshot(self) -> dict:
        """What a refused sign-in must leave as it was."""
        return {
            "operators": self.db("SELECT id, email FROM operators ORDER BY id"),
            "grants": self.db("SELECT * FROM operator_grants ORDER BY operator_id"),
            "sso": self.db("SELECT operator_id, issuer, subject FROM operator_sso ORDER BY operator_id"),
            "sessions": self.db("SELECT sha256, revoked_at FROM tokens WHERE kind = 'session' ORDER BY sha256"),
            "logins": self.db("SELECT id FROM audit WHERE event = 'ui.login'"),
            "created": self.db("SELECT id FROM audit WHERE event = 'admin.operator_created'"),
        }


def start(tmp_path: Path, skew_seconds: int = 0, oidc: str = "", provider_env: dict | None = None) -> Setup:
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    provider = Provider(public + CALLBACK, tmp_path / f"provider{skew_seconds}.log", skew_seconds,
                        provider_env)
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    conf = tmp_path / f"stategate{skew_seconds}.toml"
    conf.write_text(f"""
[oidc]
issuer_url = "{provider.url}"
client_id = "stategate"
client_secret_file = "{secret}"
scopes = ["email", "groups"]
display_name = "Test IdP"
{oidc}

[oidc.roles]
"platform-admins" = "admin"
"dev" = "viewer"
"team-a" = {{ role = "operator", workspaces = "team-a-*" }}
""")
    server = Server(data_dir=tmp_path / f"data{skew_seconds}", store="local", port=port,
                    extra_env={"STATEGATE_CONFIG": str(conf)})
    try:
        server.start()
    except Exception:
        provider.stop()
        raise
    return Setup(server, provider)


@pytest.fixture
def sso(tmp_path, check_binary):
    s = start(tmp_path)
    yield s
    s.server.stop()
    s.provider.stop()


def begin(s: Setup, jar: dict) -> str:
    """Starts a sign-in as our own login page's link would: the provider's URL."""
    status, location, body = request("GET", s.server.url + "/ui/login/oidc", jar,
                                     headers={"Sec-Fetch-Site": "same-origin"})
    assert status == 303 and location and location.startswith(s.provider.url), (status, body)
    return location


def at_provider(s: Setup, authorize_url: str, jar: dict, login: str) -> str:
    """Signs in at the provider (its own form); the callback URL it sends back."""
    return sign_in_at_provider(authorize_url, jar, login, s.server.url + CALLBACK)


def callback_url(s: Setup, login: str) -> tuple[str, dict]:
    jar: dict = {}
    return at_provider(s, begin(s, jar), jar, login), jar


def with_query(url: str, **changes) -> str:
    u = urllib.parse.urlsplit(url)
    q = dict(urllib.parse.parse_qsl(u.query))
    q.update(changes)
    return urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(q)))


def without(url: str, name: str) -> str:
    u = urllib.parse.urlsplit(url)
    q = [(k, v) for k, v in urllib.parse.parse_qsl(u.query) if k != name]
    return urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(q)))


def assert_no_role(result):
    """The provider signed the user in, but no group maps to a role: the page says to ask
    for a group mapping (403) and opens nothing, hands out nothing."""
    status, _, body = result
    assert status == 403 and 'id="sso-no-role"' in body, (status, body[:400])
    assert "code=" not in body and "sgs_" not in body


def assert_refused(result):
    status, _, body = result
    assert status == 401 and REFUSED in body, (status, body[:400])
    assert "code=" not in body and "sgs_" not in body


# -- in the browser -------------------------------------------------------------------

CONFIG = (BACKEND_HTTP + data_resource("web", "one")
          + 'output "db_password" {\n  value = "pw-sso-secret"\n  sensitive = true\n}\n')


def sign_in(page: Page, login: str):
    page.css("a[href='/ui/login/oidc']").click()
    page.wait_text("Sign-in")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any")
    page.css("button[type=submit]").click()


def test_sign_in_through_the_provider_gives_the_mapped_role(sso, browser, make_tf, tmp_path):
    ws = sso.server.workspace("prod")
    tf = make_tf("w", ws.env)
    tf.write(CONFIG)
    tf.init()
    tf.apply()
    shots = tmp_path / "shots"
    shots.mkdir()
    page = Page(browser, sso.server.url, shots)

    # The page asked for is where the sign-in lands, with the admin's reveal form.
    page.open("/ui/workspaces/prod/versions/1")
    page.wait_text("Operator login", "Sign in with Test IdP")
    sign_in(page, "alice")
    text = page.wait_text("alice@example.com", "prod")
    assert browser.current_url == sso.server.url + "/ui/workspaces/prod/versions/1", browser.current_url
    assert "pw-sso-secret" not in text
    page.submit("form[action$='/versions/1/reveal']")
    page.wait_text("pw-sso-secret")
    page.shot("admin-revealed")

    rows = sso.db("SELECT actor, payload FROM audit WHERE event = 'ui.login'")
    assert len(rows) == 1, rows
    actor, payload = rows[0]
    assert actor == "operator:alice@example.com"
    assert '"method":"oidc"' in payload and '"subject":"alice"' in payload, payload
    assert sso.provider.url in payload and '"role":"admin"' in payload, payload
    assert "code" not in payload and "token" not in payload, payload
    assert sso.db("SELECT o.email, g.role, s.subject FROM operators o JOIN operator_grants g ON g.operator_id = o.id"
                  " JOIN operator_sso s ON s.operator_id = o.id") == [("alice@example.com", "admin", "alice")]
    log = sso.server.log_text()
    assert "code=" not in log and "sgs_" not in log

    # A viewer (group `dev`): masked values, no reveal offered, a posted one refused.
    browser.delete_all_cookies()  # the provider's session too (cookies ignore ports)
    page.open("/ui/workspaces/prod/versions/1")
    page.wait_text("Operator login")
    sign_in(page, "vic")
    text = page.wait_text("vic@example.com", "viewer")
    assert "pw-sso-secret" not in text
    assert not browser.find_elements(page.By.CSS_SELECTOR, "form[action$='/reveal']")
    session = browser.get_cookie("sg_session")["value"]
    status, _, body = request("POST", sso.server.url + "/ui/workspaces/prod/versions/1/reveal",
                              {}, form={"csrf": "x"}, headers={"Cookie": f"sg_session={session}"})
    assert status == 403 and "pw-sso-secret" not in body, (status, body[:300])
    assert not sso.db("SELECT id FROM audit WHERE event = 'state.revealed' AND actor = 'operator:vic@example.com'")

    # A user whose groups map to no role: told what to ask for, nothing created.
    browser.delete_all_cookies()
    before = sso.snapshot()
    page.open("/ui/login")
    sign_in(page, "nora")
    page.wait_text("Ask a stategate admin to map one of your groups to a role")
    assert "groups" in browser.find_element(page.By.ID, "sso-no-role").text
    assert REFUSED not in browser.page_source
    page.shot("no-role-refused")
    assert browser.get_cookie("sg_session") is None
    assert sso.snapshot() == before


# -- hostile callbacks, over HTTP -------------------------------------------------------

def test_forged_replayed_and_foreign_callbacks_are_refused_and_change_nothing(sso):
    s = sso
    # A working sign-in first: the callback opens a session (200, then our own page).
    url, jar = callback_url(s, "tess")
    status, _, body = request("GET", url, jar)
    assert status == 200 and 'http-equiv="refresh"' in body, (status, body[:300])
    assert jar[s.server.port].get("sg_session", "").startswith("sgs_")
    assert "sg_sso" not in jar[s.server.port], "the binding cookie is cleared"
    assert s.db("SELECT g.role, g.workspaces FROM operator_grants g JOIN operators o ON o.id = g.operator_id"
                " WHERE o.email = 'tess@example.com'") == [("operator", "team-a-*")]
    before = s.snapshot()

    # The same callback again (a replayed code): the sign-in was used up.
    binding = {s.server.port: {"sg_sso": "whatever"}}
    assert_refused(request("GET", url, jar))
    assert s.snapshot() == before

    # A forged state, with a fresh real code and its browser's binding cookie.
    url, jar = callback_url(s, "tess")
    assert_refused(request("GET", with_query(url, state="forged-state"), jar))
    # ... and no state at all, an empty one, an absurd one.
    for forged in (with_query(url, state=""), with_query(url, state="x" * 5000),
                   s.server.url + CALLBACK + "?code=abc"):
        assert_refused(request("GET", forged, jar))
    assert s.snapshot() == before

    # Another browser (no binding cookie, or another one) with the real state and code.
    url, jar = callback_url(s, "tess")
    assert_refused(request("GET", url, binding))
    # That burned the sign-in: the right browser cannot finish it either.
    assert_refused(request("GET", url, jar))
    assert s.snapshot() == before

    # The code of sign-in B presented with sign-in A's state (A's nonce and PKCE
    # verifier): refused; and B's own state, now with A's code spent, too.
    jar_a: dict = {}
    auth_a = begin(s, jar_a)
    jar_b: dict = {}
    auth_b = begin(s, jar_b)
    url_a = at_provider(s, auth_a, jar_a, "tess")
    url_b = at_provider(s, auth_b, jar_b, "tess")
    code_b = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url_b).query))["code"]
    assert_refused(request("GET", with_query(url_a, code=code_b), jar_a))
    assert s.snapshot() == before

    # A mismatched nonce: the authorization request of this very sign-in (its state and
    # PKCE challenge, both visible in the URL) sent to the provider with another nonce.
    # The code exchange succeeds; the ID token's nonce is not this sign-in's.
    jar = {}
    url = at_provider(s, with_query(begin(s, jar), nonce="another-nonce"), jar, "tess")
    assert_refused(request("GET", url, jar))
    assert s.snapshot() == before

    # The provider's error answer (the user cancelled) ends the sign-in.
    url, jar = callback_url(s, "tess")
    state = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["state"]
    assert_refused(request("GET", s.server.url + CALLBACK + "?" + urllib.parse.urlencode(
        {"state": state, "error": "access_denied", "iss": s.provider.url}), jar))
    assert_refused(request("GET", url, jar))
    assert s.snapshot() == before

    # Cross-site: a start from another site's page is the login's cross-site 403; a
    # POST to either path is no route (to the login page); none starts or makes anything.
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
        status, location, body = request("GET", s.server.url + "/ui/login/oidc", {}, headers=headers)
        assert status == 403 and "own login page" in body and location is None, (status, body[:300])
    for path in ("/ui/login/oidc", CALLBACK):
        status, location, _ = request("POST", s.server.url + path, {}, form={"state": "x", "code": "y"},
                                      headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})
        assert (status, location) == (303, s.server.url + "/ui/login"), (path, status)
    assert s.snapshot() == before

    # A user whose email an operator from the CLI already has never becomes that
    # operator (nor changes its role): refused, nothing changed.
    cli(s.server, "admin", "operator", "create", "--email", "root@example.com", "--role", "viewer")
    before = s.snapshot()
    url, jar = callback_url(s, "mallory")
    assert_refused(request("GET", url, jar))
    assert s.snapshot() == before

    # No code, token or session id in the server's log.
    log = s.server.log_text()
    assert "single sign-on refused" in log and "nonce" in log.lower()
    assert "code=" not in log and "sgs_" not in log and CLIENT_SECRET not in log


def test_an_expired_id_token_is_refused(tmp_path, check_binary):
    """A provider whose clock runs 30 minutes behind issues ID tokens (10-minute
    lifetime) that expired 20 minutes ago by the server's clock."""
    s = start(tmp_path, skew_seconds=-1800)
    try:
        before = s.snapshot()
        url, jar = callback_url(s, "alice")
        assert_refused(request("GET", url, jar))
        assert s.snapshot() == before
        log = s.server.log_text()
        assert "expired" in log.lower(), log[-2000:]
    finally:
        s.server.stop()
        s.provider.stop()


def session_rows(s: Setup):
    return s.db("SELECT revoked_at IS NOT NULL FROM tokens WHERE kind = 'session' ORDER BY created_at")


def ended(s: Setup):
    return s.db("SELECT actor, payload FROM audit WHERE event = 'ui.session_ended' ORDER BY id")


def test_a_session_follows_the_users_groups_at_the_provider(tmp_path, check_binary):
    """A single sign-on session is re-checked at the provider (userinfo) once its last
    check is older than `revalidate_seconds`: renewed through the refresh token when
    the access token has expired, given the role the user's groups map to today, and
    ended (revoked, audited) when they map to none. A session survives a restart
    (followed in the index); one the server does not follow any more ends too. The provider's access
    tokens live 2 seconds; sessions are re-checked after 1."""
    s = start(tmp_path, oidc="revalidate_seconds = 1\nsession_max_age_seconds = 3600\n",
              provider_env={"OIDC_ACCESS_TTL": "2"})
    try:
        home = s.server.url + "/ui/"
        url, jar = callback_url(s, "tess")
        assert request("GET", url, jar)[0] == 200
        # Bounded by session_max_age_seconds, not the token login's 12 hours.
        (expires,), = s.db("SELECT expires_at FROM tokens WHERE kind = 'session'")
        assert abs(expires - (time.time() + 3600)) < 120, expires
        status, _, body = request("GET", home, jar)
        assert status == 200 and "tess@example.com" in body, (status, body[:300])

        # The access token has expired: the re-check renews it and the session goes on.
        time.sleep(2.5)
        status, _, body = request("GET", home, jar)
        assert status == 200 and "tess@example.com" in body, (status, body[:300])
        assert ended(s) == [] and session_rows(s) == [(0,)]

        # Promoted at the provider: the next request after the interval has the new
        # role, and the change is audited.
        s.provider.set_groups("tess", ["platform-admins"])
        time.sleep(1.2)
        assert request("GET", home, jar)[0] == 200
        grants = ("SELECT g.role, g.workspaces FROM operator_grants g JOIN operators o"
                  " ON o.id = g.operator_id WHERE o.email = 'tess@example.com'")
        assert s.db(grants) == [("admin", "")]  # (unlimited)
        (actor, payload), = s.db("SELECT actor, payload FROM audit WHERE event = 'ui.sso_regrant'")
        assert actor == "operator:tess@example.com"
        assert json.loads(payload) == {"method": "oidc", "from": {"role": "operator", "workspaces": "team-a-*"},
                                       "role": "admin", "workspaces": ""}, payload

        # Taken out of every mapped group: the next request after the interval is sent
        # to the login page, the session is revoked and the end audited; nothing else
        # changes (the operator keeps its row, no login, no other audit row).
        s.provider.set_groups("tess", ["marketing"])
        time.sleep(1.2)
        before = s.snapshot()
        status, location, _ = request("GET", s.server.url + "/ui/workspaces", jar)
        assert (status, location) == (303, s.server.url + "/ui/login"), (status, location)
        assert session_rows(s) == [(1,)]
        assert [(a, json.loads(p)) for a, p in ended(s)] == [
            ("operator:tess@example.com", {"method": "oidc", "reason": "no_role"})]
        after = s.snapshot()
        assert {k: v for k, v in after.items() if k != "sessions"} == \
            {k: v for k, v in before.items() if k != "sessions"}
        # The same cookie again, a form POST with it: the login page, nothing more.
        assert request("GET", home, jar)[:2] == (303, s.server.url + "/ui/login")
        status, _, _ = request("POST", s.server.url + "/ui/logout", jar, form={"csrf": "x"},
                               headers={"Origin": s.server.url})
        assert status == 303
        assert len(ended(s)) == 1 and s.snapshot() == after
        # Signing in again is refused as for anyone without a mapped group: the page
        # says to ask for a group mapping (403), opens nothing and hands out nothing.
        url, jar = callback_url(s, "tess")
        assert_no_role(request("GET", url, jar))
        assert s.snapshot() == after

        # Back in a group; signed in. The session's provider tokens are a row of the
        # index, sealed (no token, nor the JSON around them, in clear): a restart keeps
        # the session, and it is still re-checked at the provider afterwards.
        s.provider.set_groups("tess", ["team-a"])
        url, jar = callback_url(s, "tess")
        assert request("GET", url, jar)[0] == 200
        assert request("GET", home, jar)[0] == 200
        (sealed,), = s.db("SELECT sealed FROM sso_sessions")
        assert b"access" not in sealed and b"refresh" not in sealed and len(sealed) > 64
        assert s.db("SELECT COUNT(*) FROM sso_logins") == [(0,)], "the sign-in was used up"
        s.server.restart()
        assert request("GET", home, jar)[0] == 200
        s.provider.set_groups("tess", ["dev"])
        time.sleep(1.2)
        assert request("GET", home, jar)[0] == 200
        assert s.db(grants) == [("viewer", "")]
        # A session no longer followed (its row dropped: more than 65536 followed at
        # once) ends at its next request, audited.
        s.server.stop()
        s.db("DELETE FROM sso_sessions")
        s.server.start()
        assert request("GET", home, jar)[:2] == (303, s.server.url + "/ui/login")
        assert json.loads(ended(s)[-1][1]) == {"method": "oidc", "reason": "untracked"}
        log = s.server.log_text()
        assert "single sign-on session ended" in log
        assert "sgs_" not in log and CLIENT_SECRET not in log
    finally:
        s.server.stop()
        s.provider.stop()


def test_groups_can_come_from_userinfo(tmp_path, check_binary):
    """A provider that puts no groups in the ID token (only userinfo has them), with
    `groups_from_userinfo = true`: the user gets the role its groups map to."""
    s = start(tmp_path, oidc="groups_from_userinfo = true\n",
              provider_env={"OIDC_GROUPS_IN_USERINFO_ONLY": "1"})
    try:
        url, jar = callback_url(s, "tess")
        assert request("GET", url, jar)[0] == 200
        # (The ID token has no email either, so the operator is named by its subject.)
        assert s.db("SELECT g.role, g.workspaces FROM operator_grants g JOIN operator_sso s"
                    " ON s.operator_id = g.operator_id WHERE s.subject = 'tess'") == [("operator", "team-a-*")]
        before = s.snapshot()
        url, jar = callback_url(s, "nora")
        assert_no_role(request("GET", url, jar))
        assert s.snapshot() == before
    finally:
        s.server.stop()
        s.provider.stop()


def test_a_callback_naming_another_issuer_is_refused(sso):
    """RFC 9207 (mix-up defence): the provider advertises `iss` on its authorization
    responses, so a callback naming another issuer (the answer of another provider
    the browser also uses) or none at all is refused; that too burns the sign-in.
    (Its own test: the hostile-callback test above uses up the login throttle.)"""
    s = sso
    before = s.snapshot()
    for forged in ("http://127.0.0.1:1/evil", s.provider.url + "/", None):
        url, jar = callback_url(s, "tess")
        assert dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["iss"] == s.provider.url
        bad = with_query(url, iss=forged) if forged else without(url, "iss")
        assert_refused(request("GET", bad, jar))
        assert_refused(request("GET", url, jar))
    assert s.snapshot() == before
    assert "RFC 9207" in s.server.log_text()
    # The genuine callback, iss and all, signs in.
    url, jar = callback_url(s, "tess")
    assert request("GET", url, jar)[0] == 200


def test_set_role_caps_a_single_sign_on_operator_whatever_its_groups_give(tmp_path, check_binary):
    """Issue 37, finding 3: `admin operator set-role` on a single sign-on operator sets a
    cap its groups at the provider never exceed. An admin (`platform-admins`) demoted to
    viewer stays a viewer after forced re-checks at the provider (sessions re-checked
    after 1 s), in the UI and through its API token (never re-checked at the provider);
    a re-grant from changed groups is audited and held under the cap; a cap with
    workspace patterns narrows them too."""
    s = start(tmp_path, oidc="revalidate_seconds = 1\n")
    try:
        url, jar = callback_url(s, "alice")
        assert request("GET", url, jar)[0] == 200
        token = cli(s.server, "admin", "operator", "token", "create", "--email",
                    "alice@example.com").stdout.strip()
        assert token.startswith("sgo_"), token
        bearer = {"Authorization": f"Bearer {token}"}

        def api(path: str) -> int:
            return request("GET", s.server.url + "/api/v1/admin/" + path, {}, headers=bearer)[0]

        def checked() -> int:
            (ms,), = s.db("SELECT checked_ms FROM sso_sessions")
            return ms

        def rechecked_ui() -> str:
            """The UI after a re-check at the provider (forced: older than 1 s)."""
            was = checked()
            time.sleep(1.2)
            status, _, body = request("GET", s.server.url + "/ui/", jar)
            assert status == 200, (status, body[:300])
            assert checked() > was, "the session was re-checked at the provider"
            return body

        assert api("keys") == 200
        role = 'title="your operator role">{}<'.format
        assert role("admin") in rechecked_ui()

        p = cli(s.server, "admin", "operator", "set-role", "--email", "alice@example.com",
                "--role", "viewer")
        assert "set its cap" in p.stderr and "viewer" in p.stderr, p.stderr
        assert api("keys") == 403 and api("workspaces") == 200
        body = rechecked_ui()
        assert role("viewer") in body, body[:2000]
        assert api("keys") == 403, "the API token follows the cap after a re-grant"
        listed = json_lines(cli(s.server, "admin", "operator", "list", "--json").stdout)
        assert [(r["email"], r["role"], r["sso"], r["cap"]) for r in listed] == [
            ("alice@example.com", "viewer", True, {"role": "viewer", "workspaces": ""})], listed
        # A posted reveal of the UI session, with the session's own CSRF token, is the
        # viewer's 403, and nothing is revealed.
        session = jar[s.server.port]["sg_session"]
        csrf = re.search(r'name="csrf" value="([^"]+)"', body).group(1)
        status, _, _ = request("POST", s.server.url + "/ui/workspaces/prod/versions/1/reveal", {},
                               form={"csrf": csrf}, headers={"Cookie": f"sg_session={session}",
                                                             "Origin": s.server.url})
        assert status == 403, status
        assert s.db("SELECT count(*) FROM audit WHERE event = 'state.revealed'") == [(0,)]

        # Groups change at the provider: the re-grant is audited, and held under the cap.
        s.provider.set_groups("alice", ["team-a"])
        rechecked_ui()
        s.provider.set_groups("alice", ["platform-admins"])
        rechecked_ui()
        assert api("keys") == 403
        regrants = [json.loads(p) for (p,) in s.db(
            "SELECT payload FROM audit WHERE event = 'ui.sso_regrant' ORDER BY id")]
        assert regrants[-1] == {"method": "oidc", "from": {"role": "viewer", "workspaces": "team-a-*"},
                                "role": "viewer", "workspaces": "",
                                "groups": {"role": "admin", "workspaces": ""}}, regrants

        # A cap with patterns: an operator of team-a-* only, whatever the groups say.
        cli(s.server, "admin", "operator", "set-role", "--email", "alice@example.com",
            "--role", "operator", "--workspaces", "team-a-*")
        rechecked_ui()
        assert (api("keys"), api("workspaces/prod"), api("workspaces/team-a-1")) == (403, 403, 404)
        status, _, body = request("GET", s.server.url + "/ui/workspaces/prod", jar)
        assert status == 403, (status, body[:300])

        # Lifting the cap (admin of everything) gives back what the groups give.
        cli(s.server, "admin", "operator", "set-role", "--email", "alice@example.com", "--role", "admin")
        assert api("keys") == 200
        caps = [json.loads(p) for (p,) in s.db(
            "SELECT payload FROM audit WHERE event = 'admin.operator_role_set' ORDER BY id")]
        assert [c["cap"]["to"]["role"] for c in caps] == ["viewer", "operator", "admin"], caps
        assert caps[0]["from"] == {"role": "admin", "workspaces": ""} and caps[0]["cap"]["from"] is None
        assert caps[0]["to"] == {"role": "viewer", "workspaces": ""}
    finally:
        s.server.stop()
        s.provider.stop()

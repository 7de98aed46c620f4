"""The operator web UI in a real headless browser (Debian's chromium + chromedriver,
driven by selenium), against the real binary and the real Terraform CLI.

Terraform applies a workspace three times; an operator made with the CLI logs in
through the form, opens the workspace, diffs two versions and sees the changed
resource, sees a sensitive output masked and reveals it (a POST form, audited),
previews a rollback (the diff it would make) and confirms it (typing the name) and
sees the new version, finds the resource by searching, force-unlocks the lock a
SIGKILLed `terraform apply` left behind, and reads the audit rows of all three. Every step checks the text the page shows.

Every page (login, workspaces, workspace with its versions, timeline and tokens, a
version masked and revealed, a diff, a rollback preview, search, the audit log and an
audit filter that matches nothing, clusters, drift, error pages, a stale lock, an
unlocked notice) gets `Page.check`: at desktop and at 390 px nothing scrolls sideways
and axe-core finds nothing serious or critical; its screenshots go to
`$STATEGATE_ARTIFACTS` (default a temp dir). With STATEGATE_UPDATE_SCREENSHOT=1 the
workspace page's also replaces docs/ui-workspace.png (the README's).

`test_every_ui_page_route_in_a_real_browser` walks every UI `GET` page of the route
table (`stategate routes`), so a page nobody added to a list is checked all the same.

A keyboard-only operator logs in, opens a diff, rolls back and force-unlocks with TAB,
typing and ENTER alone, the focus visible at every stop.
A viewer limited to `dev-*` (made with `--role viewer --workspaces 'dev-*'`) sees its
role in the header and masked values only, is offered no reveal, download or
rollback, never sees the other workspace, and a reveal it posts anyway is refused.

Not skipped anywhere: without chromium, chromedriver or selenium the test fails
(scripts/setup-test-deps.sh installs them). Run once, on the local store: the UI is
a client of the same operations the store-parametrized suites already cover.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from browser_support import Page, artifacts_dir, browser, fill_route, ui_page_routes  # noqa: F401 (a fixture)
from harness import BACKEND_HTTP, Server, data_resource, lock_info, stategate_bin, cli

OPERATOR = "ui-e2e@example.com"
ACTOR = f"operator:{OPERATOR}"
REPO = Path(__file__).resolve().parent.parent
def config(value: str) -> str:
    return (BACKEND_HTTP + data_resource("web", value)
            + f'output "greeting" {{\n  value = "hello-{value}"\n}}\n'
            + f'output "db_password" {{\n  value = "pw-{value}"\n  sensitive = true\n}}\n')


def applied(make_tf, name: str, env: dict, *values: str):
    """A Terraform directory `name` that applied `config(v)` for each value in turn."""
    tf = make_tf(name, env)
    tf.write(config(values[0]))
    tf.init()
    tf.apply()
    for value in values[1:]:
        tf.write(config(value))
        tf.apply()
    return tf


SLOW = 'resource "terraform_data" "slow" {\n  provisioner "local-exec" {\n    command = "sleep 120"\n  }\n}\n'


@pytest.fixture
def ui_server(tmp_path, check_binary):
    s = Server(data_dir=tmp_path / "data", store="local",
               extra_env={"STATEGATE_LOCKS_STALE_AFTER_SECONDS": "1"})
    s.start()
    yield s
    s.stop()



def test_operator_ui_in_a_real_browser(ui_server, browser, make_tf, tmp_path):
    server = ui_server
    ws_name = "ui-e2e-prod"
    ws = server.workspace(ws_name)
    tf = applied(make_tf, "w", ws.env, "v-one", "v-two", "v-three")
    token = cli(server, "admin", "operator", "create", "--email", OPERATOR).stdout.strip().splitlines()[-1]
    assert token.startswith("sgo_"), token
    # An issued workspace token, so the workspace page lists one.
    cli(server, "workspace", "token", "create", "--name", "ci-read", "--workspaces", ws_name, "--scope", "read")

    page = Page(browser, server.url, artifacts_dir("operator-ui"))

    # No session: the UI sends the browser to the login form; a wrong token is refused.
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Operator login")
    assert browser.current_url.endswith("/ui/login")
    assert ws_name not in page.text()
    page.check("00-login")
    # The check sees what it is for: an image without a text alternative is critical.
    browser.execute_script("document.querySelector('main').insertAdjacentHTML('beforeend', '<img src=\"/favicon.ico\">')")
    assert [v["id"] for v in page.axe()] == ["image-alt"]
    page.login("sgo_not-a-real-token")
    page.wait_text("not a valid operator token")
    page.check("00b-login-refused")
    page.login(token)
    # The login returns to the page asked for before it.
    page.wait_text(OPERATOR, ws_name, "Versions")
    assert browser.current_url.endswith(f"/ui/workspaces/{ws_name}"), browser.current_url
    page.open("/ui/workspaces")
    text = page.wait_text("Workspaces", OPERATOR, ws_name)
    assert "unlocked" in text
    page.check("01-workspaces")

    # The workspace: three versions written by Terraform, newest first.
    browser.find_element(page.By.LINK_TEXT, ws_name).click()
    text = page.wait_text("Versions", "Compare two versions", "Roll back")
    rows = [r.text for r in browser.find_elements(page.By.CSS_SELECTOR, "#versions tbody tr")]
    assert [r.split()[0] for r in rows] == ["3", "2", "1"], rows
    assert "ci-read" in text, "the issued token is listed"
    page.check("02-workspace")

    # Diff version 1 against 3: the changed resource and its attribute, and the output.
    page.fill("#diff input[name=from]", "1")
    page.fill("#diff input[name=to]", "3")
    page.submit("#diff")
    text = page.wait_text("version 1 → 3", "terraform_data.web")
    assert "changed" in text and '"v-one"' in text and '"v-three"' in text, text
    assert "greeting" in text and '"hello-v-three"' in text, text
    assert "pw-v-" not in text, "sensitive output masked in the diff"
    page.check("03-diff")

    # Version 3 masks the sensitive output; revealing it is a form, and it is audited.
    page.open(f"/ui/workspaces/{ws_name}/versions/3")
    text = page.wait_text("Sensitive values are shown as", "(sensitive)")
    assert "pw-v-three" not in text
    page.check("03a-version")
    page.submit("form[action$='/versions/3/reveal']")
    text = page.wait_text("pw-v-three", "recorded in the audit log as state.revealed")
    page.shot("03b-revealed")  # once: a reload masks the values again

    # Roll back to version 1: the preview shows what changes, then the typed name confirms it;
    # version 4 appears, written by the operator.
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Roll back")
    page.fill("#rollback input[name=to]", "1")
    page.submit("#rollback")
    text = page.wait_text("roll back to version 1", "The workspace is at version 3", "terraform_data.web")
    assert '"v-three"' in text and '"v-one"' in text and '"hello-v-one"' in text, text
    assert "pw-v-" not in text, "masked in the preview"
    page.check("04a-rollback-preview")
    page.fill("#confirm-rollback input[name=confirm]", ws_name)
    page.submit("#confirm-rollback")
    text = page.wait_text("Rolled back: the workspace is now at version 4.")
    rows = [r.text for r in browser.find_elements(page.By.CSS_SELECTOR, "#versions tbody tr")]
    assert rows[0].split()[0] == "4" and ACTOR in rows[0], rows
    page.check("04-rolled-back")
    assert '"v-one"' in ws.get().text(), "Terraform's backend serves the rolled-back content"

    # Search across workspaces by type: the resource, linked to the newest version.
    browser.find_element(page.By.LINK_TEXT, "Search").click()
    page.wait_text("Search resources")
    page.fill("input[name=q]", "terraform_data")
    page.submit("form[action='/ui/search']")
    text = page.wait_text("terraform_data.web", "1 match in 1 workspace searched")
    page.check("04b-search")
    browser.find_element(page.By.LINK_TEXT, "terraform_data.web").click()
    page.wait_text(f"{ws_name} · version 4", "(sensitive)")

    # A terraform apply killed with SIGKILL leaves its lock; the UI shows it, stale.
    tf.write(config("v-one") + SLOW)
    p = tf.start("apply", "-auto-approve", "-input=false", "-no-color")
    try:
        deadline = time.monotonic() + 60
        while True:
            page.open(f"/ui/workspaces/{ws_name}")
            if "Force unlock" in page.text():
                break
            if p.poll() is not None:
                out, err = p.communicate()
                raise AssertionError(f"terraform ended before its lock was seen:\n{out}\n{err}")
            assert time.monotonic() < deadline, "terraform never took the lock"
            time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    time.sleep(2.2)  # past STATEGATE_LOCKS_STALE_AFTER_SECONDS=1 (ages are whole seconds)
    page.open(f"/ui/workspaces/{ws_name}")
    # The killed apply's lock, stale, with Terraform's operation in words.
    text = page.wait_text("Force unlock", "’s apply", "STALE")
    assert "OperationTypeApply" not in text
    assert "Rollback is refused while the workspace is locked" in text
    page.check("05-locked")
    # The preview still shows the diff, and why the confirmation is disabled.
    page.open(f"/ui/workspaces/{ws_name}/rollback?to=2")
    page.wait_text("Rollback is refused while the workspace is locked", "terraform_data.web")
    assert page.css("#confirm-rollback button[type=submit]").get_attribute("disabled") is not None
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Force unlock")
    page.css("#lock input[name=confirm]").click()
    page.submit("#lock form")
    text = page.wait_text("The lock was released.", "Not locked.")
    page.check("06-unlocked")
    # Terraform can apply again.
    tf.write(config("v-four"))
    tf.apply()

    # The audit log names the operator for all three actions; the reveal row holds no value.
    browser.find_element(page.By.LINK_TEXT, "Audit").click()
    page.wait_text("Audit log")
    # A bare workspace name is its scope; logins are hidden until asked for.
    page.fill("input[name=scope]", ws_name)
    page.submit("form[action='/ui/audit']")
    text = page.wait_text("tf.rollback", "tf.lock_forced", "state.revealed", "Logins (ui.login) are hidden.")
    audit_rows = [r.text for r in browser.find_elements(page.By.CSS_SELECTOR, "#audit tbody tr")]
    for event in ("tf.rollback", "tf.lock_forced", "state.revealed"):
        assert any(event in r and ACTOR in r for r in audit_rows), (event, audit_rows)
    assert "pw-v-" not in text, "no value in the audit log"
    assert "{" not in page.css("#audit tbody").text, "details in words, not JSON"
    # The rollback row links the version it restored and the one it wrote.
    rollback_row = next(r for r in browser.find_elements(page.By.CSS_SELECTOR, "#audit tbody tr")
                        if "tf.rollback" in r.text)
    links = {a.get_attribute("href").split(server.url)[1]
             for a in rollback_row.find_elements(page.By.CSS_SELECTOR, "td a")}
    assert f"/ui/workspaces/{ws_name}" in links, links
    assert any(h.startswith(f"/ui/workspaces/{ws_name}/versions/") for h in links), links
    page.check("07-audit")
    # Prefix and part matches: `rollback` finds tf.rollback, `tf.lock` every tf.lock*.
    for typed, want, not_want in (("rollback", {"tf.rollback"}, "tf.lock"),
                                  ("tf.lock", {"tf.lock_forced", "tf.lock_acquired"}, "tf.rollback")):
        page.open(f"/ui/audit?scope={ws_name}&event={typed}")
        page.wait_text("Audit log")
        events = {r.find_element(page.By.CSS_SELECTOR, "td:nth-child(2)").text
                  for r in browser.find_elements(page.By.CSS_SELECTOR, "#audit tbody tr")}
        assert want <= events and not any(e.startswith(not_want) for e in events), (typed, events)
    # The event list offers the kinds in the log.
    kinds = [o.get_attribute("value") for o in browser.find_elements(page.By.CSS_SELECTOR, "#event-kinds option")]
    assert "tf.rollback" in kinds and "ui.login" in kinds, kinds
    # Logins: hidden by default, shown when asked; a CLI-made operator's row names the CLI user.
    page.open("/ui/audit?scope=operators")
    text = page.wait_text("Audit log", "admin.operator_created")
    assert "ui.login" not in page.css("#audit tbody").text, text
    assert "operator:unknown" not in text and "cli:" in text, text
    page.open("/ui/audit?scope=operators&logins=1")
    text = page.wait_text("ui.login", OPERATOR)
    # Nothing matches: say why.
    page.open(f"/ui/audit?scope={ws_name}&event=no-such-event")
    text = page.wait_text("No audit rows match.", "No event in the log begins with “no-such-event”")
    page.check("07b-audit-no-match")

    # The other pages: clusters, drift (none configured), errors in words, and the
    # admin's tokens and keys pages.
    for name, path, needle in (("08a-clusters", "/ui/clusters", "No clusters"),
                               ("08b-drift", "/ui/drift", "Drift"),
                               ("08c-error-no-version", f"/ui/workspaces/{ws_name}/versions/99", "Error 404"),
                               ("08d-error-no-page", "/ui/no-such-page", "Error 404"),
                               ("08e-error-post-only", f"/ui/workspaces/{ws_name}/versions/1/nope", "Error"),
                               ("08f-empty-workspace", "/ui/workspaces/never-written", "never-written"),
                               ("08g-tokens", "/ui/workspace-tokens", "Workspace tokens"),
                               ("08h-keys", "/ui/keys", "data key generation")):
        page.open(path)
        page.wait_text(OPERATOR, needle)
        page.check(name)

    # The workspace page as an operator sees it: the README's screenshot when asked.
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Versions")
    shots = page.check("09-workspace-final")
    if os.environ.get("STATEGATE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shots["desktop"], REPO / "docs" / "ui-workspace.png")

    # On a phone the versions are cards: every row's view/diff actions are on screen.
    browser.set_window_size(390, 844)
    try:
        for link in browser.find_elements(page.By.CSS_SELECTOR, "#versions td.actions-cell a"):
            box = browser.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.left, r.right]", link)
            assert 0 <= box[0] and box[1] <= 390, f"{link.text} is off-screen at {box}"
    finally:
        browser.set_window_size(1280, 1000)

    # Logging out ends the session: the pages are gone again.
    page.submit("header form[action='/ui/logout']")
    page.wait_text("Operator login")
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Operator login")
    assert ws_name not in page.text()


def test_a_limited_viewer_in_a_real_browser(ui_server, browser, make_tf, tmp_path):
    """A viewer limited to `dev-*` sees its role in the header, masked values, no
    reveal/download/rollback/unlock, and never the other workspace; a posted reveal is
    refused server-side with nothing audited."""
    server = ui_server
    for name in ("dev-web", "prod-web"):
        applied(make_tf, name, server.workspace(name).env, "v-one")
    token = cli(server, "admin", "operator", "create", "--email", "viewer@example.com",
                "--role", "viewer", "--workspaces", "dev-*").stdout.strip().splitlines()[-1]
    assert token.startswith("sgo_"), token
    page = Page(browser, server.url, artifacts_dir("limited-viewer"))
    page.open("/ui/login")
    page.login(token)
    text = page.wait_text("viewer@example.com", "viewer (dev-*)", "dev-web")
    assert "prod-web" not in text, text
    assert not browser.find_elements(page.By.LINK_TEXT, "Clusters")
    page.check("10-viewer-workspaces")

    page.open("/ui/workspaces/dev-web")
    text = page.wait_text("Versions", "Compare two versions")
    assert "Roll back" not in text and "download" not in text, text
    page.open("/ui/workspaces/dev-web/versions/1")
    text = page.wait_text("Sensitive values are shown as", "(sensitive)")
    assert "pw-v-one" not in text
    assert not browser.find_elements(page.By.CSS_SELECTOR, "form[action$='/reveal']")
    assert not browser.find_elements(page.By.CSS_SELECTOR, "form[action$='/download']")
    page.check("11-viewer-version")

    # The other workspace is refused like a forbidden action, whether it exists or not.
    page.open("/ui/workspaces/prod-web")
    refused = page.wait_text("not permitted")
    page.check("12-viewer-refused")
    page.open("/ui/workspaces/prod-nope")
    assert page.wait_text("not permitted") == refused
    assert "prod-web" not in refused, refused

    # A reveal posted anyway (the form the viewer was not offered) is refused, unaudited.
    import urllib.error
    import urllib.parse
    import urllib.request
    cookie = {"Cookie": f"sg_session={browser.get_cookie('sg_session')['value']}"}
    with urllib.request.urlopen(urllib.request.Request(f"{server.url}/ui/workspaces", headers=cookie)) as r:
        csrf = r.read().decode().split('name="csrf" value="')[1].split('"')[0]
    form = urllib.parse.urlencode({"csrf": csrf}).encode()
    post = urllib.request.Request(f"{server.url}/ui/workspaces/dev-web/versions/1/reveal",
                                  data=form, headers=cookie, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused_post:
        urllib.request.urlopen(post)
    body = refused_post.value.read().decode()
    assert refused_post.value.code == 403 and "not permitted" in body and "pw-v-one" not in body, body
    audit = cli(server, "admin", "audit", "list", "--scope", "tf/dev-web", "--json").stdout
    assert "state.revealed" not in audit, audit


def test_keyboard_only_operator(ui_server, browser, make_tf):
    """Log in, open a diff, roll back and force-unlock with TAB, typing and ENTER
    alone (SPACE ticks the confirmation box); the focus is visible at every stop."""
    from selenium.webdriver.common.keys import Keys
    server = ui_server
    ws_name = "kb-prod"
    ws = server.workspace(ws_name)
    applied(make_tf, "kb", ws.env, "v-one", "v-two")
    token = cli(server, "admin", "operator", "create", "--email", "keys@example.com").stdout.strip().splitlines()[-1]
    page = Page(browser, server.url, artifacts_dir("keyboard-only"))

    page.open("/ui/login")
    page.wait_text("Operator login")
    page.tab_to("input[name=token]")
    page.press(token, Keys.ENTER)
    page.wait_text("keys@example.com", ws_name)

    page.tab_to(f"a[href='/ui/workspaces/{ws_name}']")
    page.press(Keys.ENTER)
    page.wait_text("Versions", "Roll back")
    # The newest row's "diff" link: version 1 → 2.
    page.tab_to("#versions a[href*='/diff?']")
    page.press(Keys.ENTER)
    text = page.wait_text("version 1 → 2", "terraform_data.web")
    assert '"v-one"' in text and '"v-two"' in text, text
    page.shot("diff")

    page.tab_to(f"main a[href='/ui/workspaces/{ws_name}']")
    page.press(Keys.ENTER)
    page.wait_text("Versions", "Roll back")
    page.tab_to("#rollback input[name=to]")
    page.press(Keys.CONTROL, "a")
    page.press("1", Keys.ENTER)
    page.wait_text("roll back to version 1")
    page.tab_to("#confirm-rollback input[name=confirm]")
    page.press(ws_name, Keys.ENTER)
    page.wait_text("Rolled back: the workspace is now at version 3.")
    assert '"v-one"' in ws.get().text()

    # A lock left behind; the guarded force-unlock, by keyboard.
    held = lock_info(who="ci@runner-7")
    assert ws.lock(held).status == 200
    browser.refresh()
    page.wait_text("Force unlock", "ci@runner-7")
    page.tab_to("#lock input[name=confirm]")
    page.press(Keys.SPACE)
    assert page.active().is_selected()
    page.tab_to("#lock button[type=submit]")
    page.press(Keys.ENTER)
    page.wait_text("The lock was released.", "Not locked.")
    page.shot("unlocked")
    assert ws.lock(lock_info(who="next")).status == 200, "the workspace can be locked again"


def test_every_ui_page_route_in_a_real_browser(browser, check_binary, make_tf, tf_env, tmp_path):
    """Every GET page of the UI in the route table (`stategate routes`, not a list kept
    here) gets `Page.check` — axe-core clean and no word broken mid-word, at desktop and
    phone width — with its path values filled from real fixtures: a workspace Terraform
    wrote twice, a drift run (skipped: the workspace was locked). Walked signed out
    (the login and sign-on pages) and signed in (the rest); every route must have been
    checked at its own address in one of the two walks, so a new page cannot hide behind
    a redirect."""
    from harness import venv_dir
    ws_name = "walk-prod-network"
    operator = "walker@example.com"
    cfg = tmp_path / "drift.toml"
    cfg.write_text("[[drift]]\n" + f"workspace = {json.dumps(ws_name)}\n"
                   + f"dir = {json.dumps(str(tmp_path / 'w'))}\n"
                   + f"binary = {json.dumps(str(venv_dir() / 'bin' / 'terraform'))}\n"
                   + "interval_seconds = 0\n")
    server = Server(data_dir=tmp_path / "data", store="local", extra_env={"STATEGATE_CONFIG": str(cfg)}).start()
    try:
        ws = server.workspace(ws_name)
        applied(make_tf, "w", ws.env, "v-one", "v-two")
        held = lock_info(who="someone-applying@elsewhere")
        assert ws.lock(held).status == 200
        skipped = json.loads(cli(server, "drift", "run", ws_name, "--json").stdout)
        assert skipped["outcome"] == "skipped_locked", skipped
        assert skipped["locked_by"] == "someone-applying@elsewhere", skipped
        assert ws.unlock(held).status == 200
        token = cli(server, "admin", "operator", "create", "--email", operator).stdout.strip().splitlines()[-1]
        values = {"ws": ws_name, "version": 2, "from": 1, "run": skipped["id"]}

        routes = ui_page_routes()
        page = Page(browser, server.url, artifacts_dir("every-page"))
        checked: set[str] = set()  # the addresses checked, path and query
        at_own: set[str] = set()  # the route templates checked at their own address
        faults: list[str] = []

        def walk(signed_in: bool):
            for n, route in enumerate(routes):
                target = fill_route(route, values)
                page.open(target)
                page.Wait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
                landed = browser.current_url.removeprefix(server.url)
                if landed == target:
                    at_own.add(route["path"])
                if landed in checked:
                    continue  # already checked, reached by a redirect or another route
                if signed_in:
                    page.wait_text(operator)
                name = re.sub(r"[^a-z0-9]+", "-", landed.lower()).strip("-") or "root"
                checked.add(landed)
                try:
                    page.check(f"{'in' if signed_in else 'out'}-{n:02d}-{name}")
                except AssertionError as e:  # every page's faults in one run
                    faults.append(f"{landed}: {e}")

        walk(signed_in=False)
        page.open("/ui/login")
        page.login(token)
        page.wait_text(operator)
        walk(signed_in=True)
        assert not faults, "\n".join(faults)
        missed = [r["path"] for r in routes if r["path"] not in at_own]
        assert not missed, f"pages never checked at their own address: {missed}"
        # The skipped run's page names the holder from the run's recorded field.
        page.open(f"/ui/drift/{skipped['id']}")
        page.wait_text("Skipped because the workspace was locked by someone-applying@elsewhere;")
        assert page.css("#skipped strong").text == "someone-applying@elsewhere"
    finally:
        server.stop()

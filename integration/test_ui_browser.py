"""The operator web UI in a real headless browser (Debian's chromium + chromedriver,
driven by selenium), against the real binary and the real Terraform CLI.

Terraform applies a workspace three times; an operator made with the CLI logs in
through the form, opens the workspace, diffs two versions and sees the changed
resource, sees a sensitive output masked and reveals it (a POST form, audited),
previews a rollback (the diff it would make) and confirms it (typing the name) and
sees the new version, finds the resource by searching, force-unlocks the lock a
SIGKILLed `terraform apply` left behind, and reads the audit rows of all three. Every step checks the text the page shows; screenshots go to the test's
temp dir (and the workspace page to docs/ui-workspace.png when
STATEGATE_UI_SCREENSHOT_OUT is set, for docs/web-ui.md: `1` for that path, or a path).
A viewer limited to `dev-*` (made with `--role viewer --workspaces 'dev-*'`) sees its
role in the header and masked values only, is offered no reveal, download or
rollback, never sees the other workspace, and a reveal it posts anyway is refused.

Not skipped anywhere: without chromium, chromedriver or selenium the test fails
(scripts/setup-test-deps.sh installs them). Run once, on the local store: the UI is
a client of the same operations the store-parametrized suites already cover.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from browser_support import Page, browser  # noqa: F401 (a fixture)
from harness import BACKEND_HTTP, Server, data_resource, stategate_bin, cli

OPERATOR = "ui-e2e@example.com"
ACTOR = f"operator:{OPERATOR}"
REPO = Path(__file__).resolve().parent.parent
def config(value: str) -> str:
    return (BACKEND_HTTP + data_resource("web", value)
            + f'output "greeting" {{\n  value = "hello-{value}"\n}}\n'
            + f'output "db_password" {{\n  value = "pw-{value}"\n  sensitive = true\n}}\n')


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
    tf = make_tf("w", ws.env)
    tf.write(config("v-one"))
    tf.init()
    tf.apply()
    for value in ("v-two", "v-three"):
        tf.write(config(value))
        tf.apply()
    token = cli(server, "admin", "operator", "create", "--email", OPERATOR).stdout.strip().splitlines()[-1]
    assert token.startswith("sgo_"), token

    shots = tmp_path / "screenshots"
    shots.mkdir()
    page = Page(browser, server.url, shots)

    # No session: the UI sends the browser to the login form; a wrong token is refused.
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Operator login")
    assert browser.current_url.endswith("/ui/login")
    assert ws_name not in page.text()
    page.login("sgo_not-a-real-token")
    page.wait_text("not a valid operator token")
    page.login(token)
    # The login returns to the page asked for before it.
    page.wait_text(OPERATOR, ws_name, "Versions")
    assert browser.current_url.endswith(f"/ui/workspaces/{ws_name}"), browser.current_url
    page.open("/ui/workspaces")
    text = page.wait_text("Workspaces", OPERATOR, ws_name)
    assert "unlocked" in text
    page.shot("01-workspaces")

    # The workspace: three versions written by Terraform, newest first.
    browser.find_element(page.By.LINK_TEXT, ws_name).click()
    text = page.wait_text("Versions", "Compare two versions", "Roll back")
    rows = [r.text for r in browser.find_elements(page.By.CSS_SELECTOR, "#versions tbody tr")]
    assert [r.split()[0] for r in rows] == ["3", "2", "1"], rows
    page.shot("02-workspace")

    # Diff version 1 against 3: the changed resource and its attribute, and the output.
    page.fill("#diff input[name=from]", "1")
    page.fill("#diff input[name=to]", "3")
    page.submit("#diff")
    text = page.wait_text("version 1 → 3", "terraform_data.web")
    assert "changed" in text and '"v-one"' in text and '"v-three"' in text, text
    assert "greeting" in text and '"hello-v-three"' in text, text
    assert "pw-v-" not in text, "sensitive output masked in the diff"
    page.shot("03-diff")

    # Version 3 masks the sensitive output; revealing it is a form, and it is audited.
    page.open(f"/ui/workspaces/{ws_name}/versions/3")
    text = page.wait_text("Sensitive values are shown as", "(sensitive)")
    assert "pw-v-three" not in text
    page.submit("form[action$='/versions/3/reveal']")
    text = page.wait_text("pw-v-three", "recorded in the audit log as state.revealed")
    page.shot("03b-revealed")

    # Roll back to version 1: the preview shows what changes, then the typed name confirms it;
    # version 4 appears, written by the operator.
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Roll back")
    page.fill("#rollback input[name=to]", "1")
    page.submit("#rollback")
    text = page.wait_text("roll back to version 1", "The workspace is at version 3", "terraform_data.web")
    assert '"v-three"' in text and '"v-one"' in text and '"hello-v-one"' in text, text
    assert "pw-v-" not in text, "masked in the preview"
    page.shot("04a-rollback-preview")
    page.fill("#confirm-rollback input[name=confirm]", ws_name)
    page.submit("#confirm-rollback")
    text = page.wait_text("Rolled back: the workspace is now at version 4.")
    rows = [r.text for r in browser.find_elements(page.By.CSS_SELECTOR, "#versions tbody tr")]
    assert rows[0].split()[0] == "4" and ACTOR in rows[0], rows
    page.shot("04-rolled-back")
    assert '"v-one"' in ws.get().text(), "Terraform's backend serves the rolled-back content"

    # Search across workspaces by type: the resource, linked to the newest version.
    browser.find_element(page.By.LINK_TEXT, "Search").click()
    page.wait_text("Search resources")
    page.fill("input[name=q]", "terraform_data")
    page.submit("form[action='/ui/search']")
    text = page.wait_text("terraform_data.web", "1 match in 1 workspace searched")
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
    page.shot("05-locked")
    # The preview still shows the diff, and why the confirmation is disabled.
    page.open(f"/ui/workspaces/{ws_name}/rollback?to=2")
    page.wait_text("Rollback is refused while the workspace is locked", "terraform_data.web")
    assert page.css("#confirm-rollback button[type=submit]").get_attribute("disabled") is not None
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Force unlock")
    page.css("#lock input[name=confirm]").click()
    page.submit("#lock form")
    text = page.wait_text("The lock was released.", "Not locked.")
    page.shot("06-unlocked")
    # Terraform can apply again.
    tf.write(config("v-four"))
    tf.apply()

    # The audit log names the operator for all three actions; the reveal row holds no value.
    browser.find_element(page.By.LINK_TEXT, "Audit").click()
    page.wait_text("Audit log")
    page.fill("input[name=scope]", f"tf/{ws_name}")
    page.submit("form[action='/ui/audit']")
    text = page.wait_text("tf.rollback", "tf.lock_forced", "state.revealed")
    audit_rows = [r.text for r in browser.find_elements(page.By.CSS_SELECTOR, "#audit tbody tr")]
    for event in ("tf.rollback", "tf.lock_forced", "state.revealed"):
        assert any(event in r and ACTOR in r for r in audit_rows), (event, audit_rows)
    assert "pw-v-" not in text, "no value in the audit log"
    page.shot("07-audit")

    # docs/web-ui.md's screenshot: the workspace page as an operator sees it.
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Versions")
    shot = page.shot("08-workspace-final")
    out = os.environ.get("STATEGATE_UI_SCREENSHOT_OUT")
    if out:
        target = REPO / "docs" / "ui-workspace.png" if out == "1" else Path(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)

    # On a phone-sized screen the page still fits: wide tables scroll inside their box.
    browser.set_window_size(390, 844)
    for path in (f"/ui/workspaces/{ws_name}", "/ui/workspaces", "/ui/audit",
                 f"/ui/workspaces/{ws_name}/diff?from=1&to=3", f"/ui/workspaces/{ws_name}/rollback?to=1",
                 "/ui/search?q=terraform_data"):
        page.open(path)
        page.wait_text(OPERATOR)
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"{path} is {overflow}px wider than a phone screen"
    page.open(f"/ui/workspaces/{ws_name}")
    page.wait_text("Versions")
    page.shot("09-phone-workspace")

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
        tf = make_tf(name, server.workspace(name).env)
        tf.write(config("v-one"))
        tf.init()
        tf.apply()
    token = cli(server, "admin", "operator", "create", "--email", "viewer@example.com",
                "--role", "viewer", "--workspaces", "dev-*").stdout.strip().splitlines()[-1]
    assert token.startswith("sgo_"), token
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page = Page(browser, server.url, shots)
    page.open("/ui/login")
    page.login(token)
    text = page.wait_text("viewer@example.com", "viewer (dev-*)", "dev-web")
    assert "prod-web" not in text, text
    assert not browser.find_elements(page.By.LINK_TEXT, "Clusters")
    page.shot("10-viewer-workspaces")

    page.open("/ui/workspaces/dev-web")
    text = page.wait_text("Versions", "Compare two versions")
    assert "Roll back" not in text and "download" not in text, text
    page.open("/ui/workspaces/dev-web/versions/1")
    text = page.wait_text("Sensitive values are shown as", "(sensitive)")
    assert "pw-v-one" not in text
    assert not browser.find_elements(page.By.CSS_SELECTOR, "form[action$='/reveal']")
    assert not browser.find_elements(page.By.CSS_SELECTOR, "form[action$='/download']")
    page.shot("11-viewer-version")

    # The other workspace is refused like a forbidden action, whether it exists or not.
    page.open("/ui/workspaces/prod-web")
    refused = page.wait_text("not permitted")
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

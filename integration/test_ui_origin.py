"""Untrusted S3 bytes never run with the web UI's authority (issue 20, item 1), in a
real headless Chromium against the real binary with a real Garage as the upstream.

An operator is logged in to the UI. Anyone who can write to a user bucket (or hand out
a presigned URL) puts an HTML object there whose script fetches `/ui/workspaces` with
the operator's cookie, reads the session's CSRF token, POSTs a reveal of a sensitive
output and a rollback, and writes what it got into `document.title`. Opened through
stategate — the same origin as `/ui/` — the object is served with
`Content-Security-Policy: sandbox`: the script never runs, nothing is revealed, the
state is not rolled back, no `state.revealed` row is written.

The control proves the header is what stops it: the very same object, URL and
session, through a loopback proxy that only removes that one header from pass-through
answers (UI pages and everything else unchanged, one origin for both), and the same
script gets the secret and the CSRF token and rolls the workspace back.
"""

from __future__ import annotations

import http.client
import http.server
import json
import sqlite3
import threading
import time
import uuid

import pytest

from browser_support import Page, browser  # noqa: F401 (a fixture)
from harness import cli, http as http_call
from store_support import boto3_s3, own_garage, server_factory  # noqa: F401 (fixtures)

OPERATOR = "origin-e2e@example.com"
SECRET = "hunter2-sensitive-output"
WS = "victim"

# The attacker's object: its script reports into the title the CSRF token it read and
# what the reveal returned next to the sensitive output's name.
HOSTILE = """<!doctype html><html><head><title>hostile</title></head><body>
<p>hostile object</p>
<script>
(async () => {
  const report = (s) => { document.title = "report:" + s; };
  try {
    const page = await (await fetch("/ui/workspaces", {credentials: "include"})).text();
    const m = page.match(/name="csrf" value="([^"]+)"/);
    if (!m) { report("no-csrf"); return; }
    const csrf = m[1];
    const reveal = await fetch("/ui/workspaces/victim/versions/2/reveal", {
      method: "POST", credentials: "include", body: new URLSearchParams({csrf})});
    const text = await reveal.text();
    await fetch("/ui/workspaces/victim/rollback", {
      method: "POST", credentials: "include",
      body: new URLSearchParams({csrf, to: "1", confirm: "victim"})});
    const at = text.indexOf("db_password");
    report(csrf + " " + (at < 0 ? "nothing" : text.slice(at, at + 300)));
  } catch (e) { report("error " + e); }
})();
</script></body></html>"""


def tfstate(serial: int, lineage: str, marker: str) -> bytes:
    return json.dumps({
        "version": 4, "terraform_version": "1.15.5", "serial": serial, "lineage": lineage,
        "outputs": {
            "marker": {"value": marker, "type": "string"},
            "db_password": {"value": SECRET, "type": "string", "sensitive": True},
        },
        "resources": [], "check_results": None,
    }).encode()


class StripPolicyProxy:
    """The control: forwards every request to stategate unchanged (Host rewritten to
    stategate's, so presigned signatures still hold, and Origin with it: to the browser
    the page and the UI are one origin, which is what the control stands for, so the
    UI's same-origin check must see one origin too) and removes
    Content-Security-Policy from pass-through answers only (not from /ui/)."""

    def __init__(self, target_host: str, target_port: int):
        target = (target_host, target_port)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(*target, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                headers["Host"] = f"{target[0]}:{target[1]}"
                if "Origin" in headers:
                    headers["Origin"] = f"http://{target[0]}:{target[1]}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    lk = k.lower()
                    if lk in ("connection", "transfer-encoding", "content-length"):
                        continue
                    if lk == "content-security-policy" and not self.path.startswith("/ui"):
                        continue
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_HEAD = _forward

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def audit_events(server, event: str) -> int:
    con = sqlite3.connect(f"file:{server.data_dir / 'stategate.db'}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute("SELECT count(*) FROM audit WHERE event = ?", (event,)).fetchone()[0]
    finally:
        con.close()


def test_a_hostile_object_through_the_pass_through_cannot_use_the_ui(own_garage, server_factory, browser):
    env = own_garage.env()
    srv = server_factory.new(env, STATEGATE_UPSTREAM_SHARE_STATE_BUCKET="true")
    ws = srv.workspace(WS)
    for serial, marker in ((1, "one"), (2, "two")):
        r = http_call("POST", ws.address, tfstate(serial, "lineage-origin", marker), user=ws.user, password=ws.password)
        assert r.status == 200, r
    token = cli(srv, "admin", "operator", "create", "--email", OPERATOR).stdout.strip().splitlines()[-1]

    # The attacker's object, in a user bucket, reached by a presigned URL through stategate.
    bucket = env["STATEGATE_S3_BUCKET"]
    key = f"user-objects/{uuid.uuid4().hex[:8]}/x.html"
    sg = boto3_s3(srv.url, env)
    sg.put_object(Bucket=bucket, Key=key, Body=HOSTILE.encode(), ContentType="text/html")
    url = sg.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=900)
    assert url.startswith(srv.url), url
    path = url[len(srv.url):]

    # The operator logs in.
    shots = srv.data_dir.parent / "screenshots"
    shots.mkdir(exist_ok=True)
    page = Page(browser, srv.url, shots)
    page.open("/ui/login")
    page.login(token)
    page.wait_text("Workspaces", OPERATOR)

    # Through stategate: the object loads (its text shows), its script never runs.
    page.open(path)
    page.wait_text("hostile object")
    time.sleep(3)  # the control below finishes well within this
    assert browser.title == "hostile", browser.title
    assert SECRET not in page.text()
    page.shot("hostile-sandboxed")
    assert audit_events(srv, "state.revealed") == 0
    assert audit_events(srv, "tf.rollback") == 0
    assert [r["version"] for r in srv.db_rows(WS)] == [1, 2]
    # The session itself still works: the UI was not harmed, only not reached.
    page.open("/ui/workspaces")
    page.wait_text(WS)

    # Control: the same object and session on one origin without the sandbox header.
    proxy = StripPolicyProxy("127.0.0.1", int(srv.url.rsplit(":", 1)[1]))
    try:
        browser.get(f"http://127.0.0.1:{proxy.port}{path}")
        page.Wait(browser, 30).until(lambda d: d.title.startswith("report:"))
        report = browser.title
    finally:
        proxy.close()
    assert report.startswith("report:csrf_") and SECRET in report, f"the attack works without the header: {report}"
    assert audit_events(srv, "state.revealed") == 1
    assert audit_events(srv, "tf.rollback") == 1
    assert [r["version"] for r in srv.db_rows(WS)] == [1, 2, 3]

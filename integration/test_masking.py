"""Masking by value, with states the real Terraform CLI wrote through a real stategate.

A sensitive variable flows into `terraform_data.db.input` (Terraform marks that path),
its unmarked `output` copy, a second resource that reads that output (unmarked), a
connection string built from that output (unmarked, the secret inside a longer string),
one field of an object (only that field is marked), a sensitive output, and an instance
key (`for_each` over `nonsensitive(...)`). Every operator view must hide every copy: the
masked UI version page, the UI diff, the UI rollback preview, the UI search, and the
admin API's `?masked=1`, diff, rollback preview and search, none of which writes a
`state.revealed` row. The audited reveal still shows the secret (and writes one row).
"""

from __future__ import annotations

from http.cookiejar import CookieJar
import json
import re
import urllib.parse
import urllib.request

from harness import BACKEND_HTTP, cli, http

SECRET_1 = "Xq7-first-S3CRET-value"
SECRET_2 = "Zk9-second-S3CRET-value"
NESTED = "nested-field-S3CRET-4f1"

CONFIG = BACKEND_HTTP + """
variable "secret" {
  type      = string
  sensitive = true
}
variable "nested" {
  type      = string
  sensitive = true
}
resource "terraform_data" "db" {
  input = var.secret
}
resource "terraform_data" "reader" {
  input = terraform_data.db.output
}
resource "terraform_data" "conn" {
  input = "postgres://app:${terraform_data.db.output}@db:5432/app"
}
resource "terraform_data" "obj" {
  input = { user = "admin-user", pass = var.nested, port = 5432 }
}
resource "terraform_data" "keyed" {
  for_each = toset([nonsensitive(var.secret)])
  input    = "keyed-by-the-secret"
}
output "password" {
  value     = var.secret
  sensitive = true
}
output "plain" {
  value = "plain-visible-output"
}
"""


class Ui:
    """A logged-in operator's browser session, over plain HTTP (no redirects followed)."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.jar = CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **kw):
                return None

        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), NoRedirect)
        status, _ = self.request("POST", "/ui/login", {"token": token})
        assert status == 303, status
        assert any(c.name == "sg_session" for c in self.jar), "no session cookie"

    def request(self, method: str, path: str, form: dict | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self.opener.open(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, (e.read() or b"").decode()

    def redirected(self, path: str, form: dict) -> str:
        """POSTs `form` and returns where the 303 answer sends the browser."""
        data = urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST")
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self.opener.open(req, timeout=30) as r:
                raise AssertionError(f"{path}: {r.status}, not a redirect")
        except urllib.error.HTTPError as e:
            assert e.code == 303, (path, e.code)
            return e.headers["Location"]

    def page(self, path: str) -> str:
        status, text = self.request("GET", path)
        assert status == 200, (path, status, text[:500])
        return text


def revealed_rows(server, ws: str) -> list[dict]:
    rows = server.query("SELECT payload FROM audit WHERE scope = ? AND event = 'state.revealed' ORDER BY id",
                        (f"tf/{ws}",))
    return [json.loads(p) for (p,) in rows]


def test_masked_views_hide_every_copy_of_a_sensitive_value(server_factory, ws_name, make_tf):
    server = server_factory.new()
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    tf.write(CONFIG)
    tf.init()
    tf.apply(extra_env={"TF_VAR_secret": SECRET_1, "TF_VAR_nested": NESTED})
    tf.apply(extra_env={"TF_VAR_secret": SECRET_2, "TF_VAR_nested": NESTED})

    # What Terraform wrote: the secret is marked on db.input only, copied unmarked
    # into db.output, reader.input/output, an instance key and the sensitive output.
    raw = ws.get().json()
    by_name = {r["name"]: r for r in raw["resources"]}
    db = by_name["db"]["instances"][0]
    assert db["sensitive_attributes"] == [[{"type": "get_attr", "value": "input"}]], db
    assert db["attributes"]["output"]["value"] == SECRET_2
    assert by_name["reader"]["instances"][0]["sensitive_attributes"] == []
    assert by_name["reader"]["instances"][0]["attributes"]["output"]["value"] == SECRET_2
    assert by_name["keyed"]["instances"][0]["index_key"] == SECRET_2
    conn = by_name["conn"]["instances"][0]
    assert conn["sensitive_attributes"] == [], conn
    assert conn["attributes"]["input"]["value"] == f"postgres://app:{SECRET_2}@db:5432/app"
    versions = [r["version"] for r in server.db_rows(ws_name)]
    first, last = min(versions), max(versions)
    assert last > first, versions
    secrets = (SECRET_1, SECRET_2, NESTED)

    def hidden(where: str, text: str):
        for s in secrets:
            assert s not in text, f"{s} shown in {where}:\n{text[:3000]}"

    token = cli(server, "admin", "operator", "create", "--email", "masker@example.com").stdout.strip().split()[-1]
    assert token.startswith("sgo_"), token
    ui = Ui(server.url, token)
    path = f"/ui/workspaces/{ws_name}"

    # The masked version page: every copy hidden, only the marked field of the object
    # masked (its neighbours stay readable), and the page says what masking can know.
    page = ui.page(f"{path}/versions/{last}")
    hidden("the masked version page", page)
    assert "admin-user" in page and "5432" in page and "plain-visible-output" in page, page[:3000]
    assert "(sensitive)" in page
    assert "never marked" in page and "every copy" in page, "the page does not say what masking can know"
    # The diff between the two applies, both ways, and the rollback preview.
    hidden("the UI diff", ui.page(f"{path}/diff?from={first}&to={last}"))
    hidden("the UI diff (reversed)", ui.page(f"{path}/diff?from={last}&to={first}"))
    preview = ui.page(f"{path}/rollback?to={first}")
    hidden("the UI rollback preview", preview)
    assert "terraform_data.db" in preview, preview[:3000]
    # Search: the instance key is the secret; it is shown masked and cannot be searched for.
    found = ui.page("/ui/search?" + urllib.parse.urlencode({"q": "terraform_data.keyed"}))
    hidden("the UI search", found)
    assert "terraform_data.keyed[" in found and "(sensitive)" in found, found[:3000]
    for s in secrets:
        guess = ui.page("/ui/search?" + urllib.parse.urlencode({"q": s}))
        assert "terraform_data.keyed" not in guess, f"search confirmed a guess of {s}"

    # The admin API: masked reads, diff, preview and search, all without the secret.
    admin = f"{server.url}/api/v1/admin"
    for what, url in [
        ("?masked=1", f"{admin}/workspaces/{ws_name}/versions/latest?masked=1"),
        ("?masked=1 (old)", f"{admin}/workspaces/{ws_name}/versions/{first}?masked=1"),
        ("the admin diff", f"{admin}/workspaces/{ws_name}/diff?from={first}&to={last}"),
        ("the admin rollback preview", f"{admin}/workspaces/{ws_name}/rollback?to={first}"),
        ("the admin search", f"{admin}/search?q=terraform_data"),
    ]:
        r = http("GET", url, bearer=token)
        assert r.status == 200, (what, r)
        hidden(what, r.text())
    masked = http("GET", f"{admin}/workspaces/{ws_name}/versions/latest?masked=1", bearer=token).json()
    obj = {r["name"]: r for r in masked["resources"]}["obj"]["instances"][0]["attributes"]
    assert obj["input"]["value"] == {"user": "admin-user", "pass": "(sensitive)", "port": 5432}, obj
    assert obj["input"]["type"][0] == "object", obj
    assert masked["outputs"]["plain"]["value"] == "plain-visible-output"
    conn = {r["name"]: r for r in masked["resources"]}["conn"]["instances"][0]["attributes"]
    assert conn["input"]["value"] == "postgres://app:(sensitive)@db:5432/app", conn
    assert masked["serial"] == raw["serial"] and masked["lineage"] == raw["lineage"]

    # None of that was a reveal.
    assert revealed_rows(server, ws_name) == []

    # The reveal still shows the real values, audited (the row holds no value).
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    # The reveal is POST-redirect-GET: the values are shown (once) at the address it sends to.
    location = ui.redirected(f"{path}/versions/{last}/reveal", {"csrf": csrf})
    shown = ui.page(location.split("#")[0])
    assert SECRET_2 in shown and NESTED in shown
    assert not any(s in ui.page(location.split("#")[0]) for s in secrets), "a reload is masked"
    rows = revealed_rows(server, ws_name)
    assert rows == [{"version": last, "via": "ui.view"}], rows
    assert not any(s in json.dumps(rows) for s in secrets)

"""The real OpenID provider of the single sign-on tests, and a browser-less client.

The provider is the certified npm package `oidc-provider` (integration/oidc/provider.js,
installed by scripts/setup-test-deps.sh), started on a loopback port with a
confidential client that must use PKCE, test users and their groups. Without node or
the package the test fails, never skips.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROVIDER_JS = HERE / "oidc" / "provider.js"
MODULES = Path(os.environ.get("STATEGATE_TEST_OIDC_DIR",
                              Path.home() / ".cache/stategate/oidc")) / "node_modules"
CALLBACK = "/ui/login/oidc/callback"
REFUSED = "not a valid operator token or single sign-on"
CLIENT_SECRET = "test-client-secret-7f3a9c"
# How long a provider may take to listen (it takes well under a second).
START_SECONDS = 30


class Provider:
    """node provider.js on a loopback port, stopped at the end."""

    def __init__(self, redirect_uri: str, log: Path, skew_seconds: int = 0, env: dict | None = None):
        node = shutil.which("node")
        if node is None:
            pytest.fail("node is missing; run scripts/setup-test-deps.sh")
        if not (MODULES / "oidc-provider" / "package.json").exists():
            pytest.fail(f"oidc-provider is not installed in {MODULES}; run scripts/setup-test-deps.sh")
        self.log = open(log, "wb")
        # A node that hangs before it listens (seen once in ~20 starts: every thread in
        # a futex wait, nothing printed) would hang the whole suite on the read: each
        # start is given START_SECONDS, and a hung one is killed and started once more.
        line = ""
        for _attempt in range(2):
            self.proc = subprocess.Popen(
                [node, str(PROVIDER_JS), str(MODULES), redirect_uri, CLIENT_SECRET, str(skew_seconds)],
                stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **(env or {})})
            ready, _, _ = select.select([self.proc.stdout], [], [], START_SECONDS)
            line = self.proc.stdout.readline().decode().strip() if ready else ""
            if line.startswith("PORT="):
                break
            self.proc.kill()
            self.proc.wait(10)
        else:
            self.log.close()
            pytest.fail(f"the provider did not start within {START_SECONDS}s (twice): {line!r}\n"
                        f"{log.read_text(errors='replace')}")
        self.url = f"http://127.0.0.1:{int(line[5:])}"

    def set_groups(self, subject: str, groups: list[str]):
        """What an administrator of the identity provider does: effective at once."""
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request("POST", f"/test/users/{subject}/groups", body=json.dumps(groups))
        assert conn.getresponse().status == 204
        conn.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


# -- a browser-less client: cookies per port, no redirects followed ------------------

def request(method: str, url: str, jar: dict, *, form: dict | None = None, headers: dict | None = None):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    h = dict(headers or {})
    cookies = jar.setdefault(u.port, {})
    if cookies:
        h["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    body = None
    if form is not None:
        body = urllib.parse.urlencode(form)
        h["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=body, headers=h)
    r = conn.getresponse()
    data = r.read().decode(errors="replace")
    for k, v in r.getheaders():
        if k.lower() == "set-cookie":
            name, _, rest = v.partition("=")
            value = rest.split(";")[0]
            low = v.lower()
            if not value or "max-age=0" in low or "expires=thu, 01 jan 1970" in low:
                cookies.pop(name, None)
            else:
                cookies[name] = value
    location = r.getheader("Location")
    conn.close()
    return r.status, (urllib.parse.urljoin(url, location) if location else None), data


def sign_in_at_provider(authorize_url: str, jar: dict, login: str, callback: str) -> str:
    """Signs in at the provider (its own form) as `login`; the callback URL (starting
    with `callback`) it sends the browser back to."""
    url = authorize_url
    for _ in range(12):
        status, location, body = request("GET", url, jar)
        if status in (302, 303) and location:
            if location.startswith(callback):
                return location
            url = location
            continue
        assert status == 200, (status, body)
        action = urllib.parse.urljoin(url, re.search(r'<form[^>]*action="([^"]+)"', body).group(1))
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', body))
        fields.update(login=login, password="any")
        status, location, body = request("POST", action, jar, form=fields)
        assert status in (302, 303) and location, (status, body)
        if location.startswith(callback):
            return location
        url = location
    raise AssertionError("the provider never sent the browser back")

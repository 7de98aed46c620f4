"""Hostile input on the Terraform HTTP backend (/api/v1/tf/state/<ws>), per store.

One table of raw requests (sent byte for byte, see hostile_support.raw), each with the
statuses it may get. Three workspaces exist: `victim` (unlocked, so a bad write that
slipped through would land), `other` (whose credential and state must never mix with
the victim's) and `held` (locked). After every case all three still read back the same
bytes, have the same version rows and the same lock row, and the answer leaks no
state content. Then the slow clients: trickled headers must not delay anyone else,
a trickled body is cut off after the body-read deadline, and bodies that merely
declare a large Content-Length do not starve other writers.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass

import pytest

from harness import Server, Workspace, http, lock_info
from hostile_support import (Answer, Trickle, basic, chunked, content_md5, raw, request_bytes,
                             tf_lock_row, version_rows)
from store_support import tfstate

MAX_STATE = 256 * 1024
BODY_READ_TIMEOUT = 3
SERVER_ENV = {
    "STATEGATE_MAX_STATE_BYTES": MAX_STATE,
    "STATEGATE_BODY_READ_TIMEOUT_SECONDS": BODY_READ_TIMEOUT,
    "STATEGATE_BODY_MIN_BYTES_PER_SECOND": 1024,
    "STATEGATE_RETENTION_INTERVAL_SECONDS": 0,
}
LINEAGE = "7d1c2a8e-0000-4000-8000-hostile00001"
HELD_ID = "a3c1f0de-4d1e-4b7e-9c55-held00000001"
MARKERS = {"victim": "victim-marker-3f9a", "other": "other-marker-8c21", "held": "held-marker-5d07"}
NEXT = tfstate(99, LINEAGE, "hijacked-marker")  # a valid next state: landing it would be a bypass
BASE = "/api/v1/tf/state/"


def state_with(**fields) -> bytes:
    doc = {"version": 4, "terraform_version": "1.15.5", "serial": 2, "lineage": LINEAGE,
           "outputs": {}, "resources": []}
    doc.update(fields)
    return json.dumps(doc).encode()


def lock_with(lock_id) -> bytes:
    info = lock_info()
    info["ID"] = lock_id
    return json.dumps(info).encode()


HEAD = b'{"version":4,"serial":2,"lineage":"' + LINEAGE.encode() + b'","resources":'
DEEP_UNCLOSED = HEAD + b"[" * 100_000
DEEP_BALANCED = HEAD + b"[" * 100_000 + b"]" * 100_000 + b"}"
DEEP_OBJECTS = HEAD + b'{"a":' * 30_000 + b"1" + b"}" * 30_000 + b"}"


@dataclass(frozen=True)
class Case:
    """One hostile request. `path` and header values may name {victim}/{other}/{held}
    and credentials ({victim_pw}, {victim_basic}, {other_basic}); `auth` is a role
    whose Basic credential is sent (`<role>-bearer` for Bearer), None for none.
    `half_close`: stop sending after the body (a client that dies mid-upload).
    Whatever the answer, nothing stored may change (`unchanged`)."""

    name: str
    method: str | bytes
    path: str | bytes
    expect: tuple
    auth: str | None = "victim"
    body: bytes = b""
    headers: tuple = ()
    half_close: bool = False
    unchanged: tuple = ("victim", "other", "held")


V = BASE + "{victim}"
CASES = [
    # ---- garbled, truncated and oversized bodies -----------------------------------
    Case("json-cut-mid-string", "POST", V, (400,), body=b'{"version":4,"serial":2,"lineage":"'),
    Case("json-cut-mid-array", "POST", V, (400,), body=HEAD + b"[{"),
    Case("empty-body", "POST", V, (400,)),
    Case("whitespace-body", "POST", V, (400,), body=b" \r\n\t "),
    Case("trailing-garbage", "POST", V, (400,), body=state_with() + b"}{"),
    Case("bad-utf8-in-lineage", "POST", V, (400,), body=b'{"version":4,"serial":2,"lineage":"\xff\xfe"}'),
    Case("bad-utf8-in-outputs", "POST", V, (400,),
         body=HEAD + b'[],"outputs":{"x":{"value":"\xc3\x28","type":"string"}}}'),
    Case("utf16-body", "POST", V, (400,), body=state_with().decode().encode("utf-16")),
    Case("deep-nesting-unclosed", "POST", V, (400,), body=DEEP_UNCLOSED),
    Case("deep-nesting-balanced", "POST", V, (400,), body=DEEP_BALANCED),
    Case("deep-nesting-objects", "POST", V, (400,), body=DEEP_OBJECTS),
    Case("json-array", "POST", V, (400,), body=b"[]"),
    Case("json-string", "POST", V, (400,), body=b'"terraform"'),
    Case("json-null", "POST", V, (400,), body=b"null"),
    Case("json-number", "POST", V, (400,), body=b"4"),
    Case("no-version-field", "POST", V, (400,), body=b'{"serial":2,"lineage":"' + LINEAGE.encode() + b'"}'),
    Case("serial-negative", "POST", V, (400,), body=state_with(serial=-1)),
    Case("serial-float", "POST", V, (400,), body=state_with(serial=2.5)),
    Case("serial-huge", "POST", V, (400,), body=state_with(serial=2**64)),
    Case("serial-exponent", "POST", V, (400,), body=HEAD.replace(b'"serial":2', b'"serial":1e3') + b"[]}"),
    Case("serial-string", "POST", V, (400,), body=state_with(serial="2")),
    Case("serial-nan", "POST", V, (400,), body=HEAD.replace(b'"serial":2', b'"serial":NaN') + b"[]}"),
    Case("serial-duplicated", "POST", V, (400,), body=HEAD.replace(b'"serial":2', b'"serial":2,"serial":-5') + b"[]}"),
    Case("lineage-newline", "POST", V, (400,), body=state_with(lineage="abc\ndef")),
    Case("lineage-nul", "POST", V, (400,), body=state_with(lineage="abc\x00def")),
    Case("lineage-escape-seq", "POST", V, (400,), body=state_with(lineage="abc\x1b[31mdef")),
    Case("lineage-header-injection", "POST", V, (400,), body=state_with(lineage="abc\r\nX-Injected: 1")),
    Case("lineage-257-chars", "POST", V, (400,), body=state_with(lineage="l" * 257)),
    Case("lineage-not-string", "POST", V, (400,), body=state_with(lineage=7)),
    Case("content-md5-mismatch", "POST", V, (400,), body=NEXT, headers=(("Content-MD5", content_md5(b"other")),)),
    Case("content-md5-not-base64", "POST", V, (400,), body=NEXT, headers=(("Content-MD5", "%%%not-base64%%%"),)),
    Case("oversized-declared", "POST", V, (413,), headers=(("Content-Length", str(MAX_STATE + 1)),)),
    Case("oversized-chunked", "POST", V, (413, None),
         body=chunked(state_with(pad="x" * MAX_STATE)), headers=(("Transfer-Encoding", "chunked"),)),
    Case("truncated-body", "POST", V, (400, None), body=NEXT,
         headers=(("Content-Length", str(len(NEXT) + 500)),), half_close=True),
    Case("content-length-not-a-number", "POST", V, (400,), body=NEXT, headers=(("Content-Length", "abc"),)),
    Case("content-length-negative", "POST", V, (400,), body=NEXT, headers=(("Content-Length", "-1"),)),
    Case("content-length-twice", "POST", V, (400,), body=NEXT,
         headers=(("Content-Length", str(len(NEXT))), ("Content-Length", str(len(NEXT) - 10)))),
    # ---- lock bodies ------------------------------------------------------------------
    Case("lock-id-newline", "LOCK", V, (400,), body=lock_with("abc\ndef")),
    Case("lock-id-nul", "LOCK", V, (400,), body=lock_with("abc\x00def")),
    Case("lock-id-escape-seq", "LOCK", V, (400,), body=lock_with("\x1b]0;pwned\x07")),
    Case("lock-id-257-chars", "LOCK", V, (400,), body=lock_with("i" * 257)),
    Case("lockinfo-garbled", "LOCK", V, (400,), body=b'{"ID":"x","Operation":'),
    Case("lockinfo-bad-utf8", "LOCK", V, (400,), body=b'{"ID":"\xff\xfe"}'),
    Case("lockinfo-deep-nesting", "LOCK", V, (400,), body=b'{"ID":"x","Info":' + b"[" * 60_000),
    Case("lockinfo-not-object", "LOCK", V, (400,), body=b'["ID","x"]'),
    Case("lockinfo-oversized", "LOCK", V, (413,), body=lock_with("x")[:-1] + b',"Pad":"' + b"p" * 70_000 + b'"}'),
    Case("unlock-held-garbled", "UNLOCK", BASE + "{held}", (400,), auth="held", body=b'{"ID":'),
    Case("unlock-held-wrong-id", "UNLOCK", BASE + "{held}", (409, 423), auth="held", body=lock_with("not-the-holder")),
    Case("write-held-without-id", "POST", BASE + "{held}", (409, 423), auth="held", body=NEXT),
    Case("write-held-wrong-id", "POST", BASE + "{held}?ID=not-the-holder", (409, 423), auth="held", body=NEXT),
    # ---- path tricks: never another workspace's state ----------------------------------
    Case("dotdot-raw", "GET", BASE + "../{other}", (400, 404)),
    Case("dotdot-after-name", "GET", BASE + "{victim}/../{other}", (400, 404)),
    Case("dotdot-encoded", "GET", BASE + "%2e%2e/{other}", (400, 404)),
    Case("slash-encoded", "GET", BASE + "{victim}%2F..%2F{other}", (400, 404)),
    Case("backslash", "GET", BASE + "..\\{other}", (400, 404)),
    Case("trailing-slash", "GET", BASE + "{victim}/", (400, 404)),
    Case("nul-encoded", "GET", BASE + "{victim}%00", (400, 404)),
    Case("nul-raw", "GET", BASE.encode() + b"{victim}\x00", (400,)),
    Case("name-129-chars", "GET", BASE + "w" * 129, (400,)),
    Case("unicode-encoded", "GET", BASE + "%C3%BC{victim}", (400,)),
    Case("unicode-raw", "GET", BASE.encode() + "ü{victim}".encode(), (400,)),
    Case("double-slash-prefix", "GET", "/" + V, (400, 403, 404)),
    Case("uppercase-prefix", "GET", "/API/v1/tf/state/{victim}", (400, 403, 404)),
    Case("absolute-form-other", "GET", "http://127.0.0.1/api/v1/tf/state/{other}", (400, 401, 404)),
    # ---- method tricks ------------------------------------------------------------------
    Case("method-put", "PUT", V, (405,), body=NEXT),
    Case("method-patch", "PATCH", V, (405,), body=NEXT),
    Case("method-trace", "TRACE", V, (405,)),
    Case("method-lowercase-get", "get", V, (400, 405)),
    Case("method-lowercase-post", "post", V, (400, 405), body=NEXT),
    Case("method-propfind", "PROPFIND", V, (405,)),
    Case("method-options", "OPTIONS", V, (405,)),
    Case("method-get-on-lock-path", "GET", V + "/lock", (405,)),
    Case("method-put-on-lock-path", "PUT", V + "/lock", (405,), body=lock_with("x")),
    Case("method-control-char", b"G\x01T", V, (400,)),
    # ---- auth confusion (on every route) -------------------------------------------------
    Case("get-no-auth", "GET", V, (401,), auth=None),
    Case("get-other-basic", "GET", V, (401,), auth="other"),
    Case("get-other-bearer", "GET", V, (401,), auth="other-bearer"),
    Case("get-empty-basic", "GET", V, (401,), auth=None, headers=(("Authorization", "Basic "),)),
    Case("get-basic-only-colon", "GET", V, (401,), auth=None, headers=(("Authorization", basic("", "")),)),
    Case("get-basic-garbled-base64", "GET", V, (401,), auth=None, headers=(("Authorization", "Basic !!!*"),)),
    Case("get-basic-no-colon", "GET", V, (401,), auth=None, headers=(("Authorization", "Basic {victim_b64}"),)),
    Case("get-bearer-empty", "GET", V, (401,), auth=None, headers=(("Authorization", "Bearer"),)),
    Case("get-digest-scheme", "GET", V, (401,), auth=None, headers=(("Authorization", "Digest {victim_pw}"),)),
    Case("get-bearer-with-suffix", "GET", V, (401,), auth=None, headers=(("Authorization", "Bearer {victim_pw}x"),)),
    # A header line over 16 KiB is refused at the edge (431) before anything reads it.
    Case("get-auth-16k", "GET", V, (431,), auth=None, headers=(("Authorization", "Bearer " + "t" * 16384),)),
    Case("get-auth-15k", "GET", V, (401,), auth=None, headers=(("Authorization", "Bearer " + "t" * 15000),)),
    Case("get-auth-twice-wrong-first", "GET", V, (400, 401), auth=None,
         headers=(("Authorization", "{other_basic}"), ("Authorization", "{victim_basic}"))),
    Case("post-no-auth", "POST", V, (401,), auth=None, body=NEXT),
    Case("post-other-basic", "POST", V, (401,), auth="other", body=NEXT),
    Case("lock-other-bearer", "LOCK", V, (401,), auth="other-bearer", body=lock_with(str(uuid.uuid4()))),
    Case("force-unlock-held-victim-bearer", "UNLOCK", BASE + "{held}", (401,), auth="victim-bearer"),
    Case("unlock-held-no-auth", "UNLOCK", BASE + "{held}", (401,), auth=None, body=lock_with(HELD_ID)),
    Case("delete-other-bearer", "DELETE", V, (401,), auth="other-bearer"),
    Case("delete-no-auth", "DELETE", V, (401,), auth=None),
    Case("lock-path-post-other-basic", "POST", V + "/lock", (401,), auth="other", body=lock_with(str(uuid.uuid4()))),
]


@dataclass
class TfGateway:
    srv: Server
    ws: dict  # role -> Workspace

    def fill(self, text):
        values = {role: w.name for role, w in self.ws.items()}
        values.update(victim_pw=self.ws["victim"].password,
                      victim_basic=basic(self.ws["victim"].user, self.ws["victim"].password),
                      other_basic=basic(self.ws["other"].user, self.ws["other"].password),
                      victim_b64=base64.b64encode(self.ws["victim"].password.encode()).decode())
        if isinstance(text, bytes):
            for k, v in values.items():
                text = text.replace(b"{" + k.encode() + b"}", v.encode())
            return text
        return text.format_map(values)

    def auth_header(self, auth: str | None) -> list:
        if auth is None:
            return []
        role, _, kind = auth.partition("-")
        w = self.ws[role]
        return [("Authorization", f"Bearer {w.password}" if kind == "bearer" else basic(w.user, w.password))]

    def snapshot(self, roles) -> dict:
        out = {}
        for role in roles:
            w = self.ws[role]
            r = w.get()
            out[role] = (r.status, r.body, version_rows(self.srv, f"tf/{w.name}"), tf_lock_row(self.srv, w.name))
        return out

    def secrets(self) -> list[bytes]:
        return [m.encode() for m in MARKERS.values()] + [w.password.encode() for w in self.ws.values()]


def _workspace_with_state(srv: Server, role: str) -> Workspace:
    w = srv.workspace(f"hostile-{role}-{uuid.uuid4().hex[:6]}")
    r = http("POST", w.address, tfstate(1, LINEAGE, MARKERS[role]), user=w.user, password=w.password)
    assert r.status == 200, r
    return w


@pytest.fixture(scope="module")
def tfgw(store, check_binary, tmp_path_factory):
    kind, s3 = store
    base = tmp_path_factory.mktemp(f"hostile-tf-{kind}")
    srv = Server(data_dir=base / "data", store=kind, s3_env=s3,
                 extra_env={k: str(v) for k, v in SERVER_ENV.items()}).start()
    try:
        ws = {role: _workspace_with_state(srv, role) for role in MARKERS}
        assert ws["held"].lock(json.loads(lock_with(HELD_ID))).status == 200
        yield TfGateway(srv, ws)
    finally:
        srv.stop()


@pytest.fixture
def server(tfgw):
    """Named like conftest's fixture, so its report hook attaches this server's log to failures."""
    return tfgw.srv


@pytest.fixture
def gw(tfgw, server):
    assert tfgw.srv.alive(), tfgw.srv.log_tail()
    yield tfgw
    assert tfgw.srv.alive(), f"stategate died:\n{tfgw.srv.log_tail()}"


def send(gw: TfGateway, case: Case) -> Answer:
    headers = gw.auth_header(case.auth) + [(k, gw.fill(v)) for k, v in case.headers]
    return raw(gw.srv.port, case.method, gw.fill(case.path), headers, case.body, half_close=case.half_close)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_tf_request(gw, case):
    before = gw.snapshot(case.unchanged)
    answer = send(gw, case)
    assert answer.status in case.expect, f"{case.name}: expected {case.expect}, got {answer!r}"
    for secret in gw.secrets():
        assert secret not in answer.body, f"{case.name}: the answer leaks {secret[:12]!r}…: {answer!r}"
    after = gw.snapshot(case.unchanged)
    for role in case.unchanged:
        assert after[role] == before[role], (
            f"{case.name} changed the {role} workspace:\nbefore {before[role]!r}\nafter  {after[role]!r}")


def test_hostile_tf_table_size():
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)


def test_lock_path_is_the_documented_route(gw):
    """LOCK/UNLOCK on `<ws>/lock` (the GitLab/Gitea convention) is a route, not a trick."""
    w = gw.srv.workspace(f"lockpath-{uuid.uuid4().hex[:6]}")
    info = lock_with(str(uuid.uuid4()))
    auth = [("Authorization", basic(w.user, w.password))]
    path = BASE + w.name + "/lock"
    assert raw(gw.srv.port, "LOCK", path, auth, info).status == 200
    assert len(tf_lock_row(gw.srv, w.name)) == 1
    assert raw(gw.srv.port, "UNLOCK", path, auth, info).status == 200
    assert tf_lock_row(gw.srv, w.name) == []


# --------------------------------------------------------------------------
# slow clients
# --------------------------------------------------------------------------


def test_slow_headers_do_not_delay_other_clients(gw):
    """Eight clients send their request headers one byte every half second; another
    client's GET is still answered in under a second, every time."""
    victim = gw.ws["victim"]
    wire = request_bytes("GET", BASE + victim.name, [("Authorization", basic(victim.user, victim.password))], b"",
                         host=f"127.0.0.1:{gw.srv.port}")
    before = gw.snapshot(MARKERS)
    slow = [Trickle(gw.srv.port, wire, step=1, interval=0.5, max_seconds=6) for _ in range(8)]
    for t in slow:
        t.start()
    try:
        time.sleep(0.5)
        for _ in range(5):
            t0 = time.monotonic()
            r = gw.ws["other"].get(timeout=5)
            took = time.monotonic() - t0
            assert r.status == 200 and MARKERS["other"].encode() in r.body, r
            assert took < 1.0, f"GET took {took:.2f}s while 8 clients trickle headers"
            time.sleep(0.3)
    finally:
        for t in slow:
            t.close()
    assert gw.snapshot(MARKERS) == before


def test_slow_body_is_cut_off(gw):
    """A state body trickled at 2 bytes/s is abandoned by the server (connection
    closed, or 408) within the body-read deadline (3 s here) plus slack; nothing is
    written."""
    victim = gw.ws["victim"]
    body = NEXT + b" " * 2000
    wire = request_bytes("POST", BASE + victim.name, [("Authorization", basic(victim.user, victim.password))],
                         body, host=f"127.0.0.1:{gw.srv.port}")
    head_len = len(wire) - len(body)
    before = gw.snapshot(MARKERS)
    with Trickle(gw.srv.port, wire, burst=head_len + 10, step=1, interval=0.5, max_seconds=9) as t:
        t.join(timeout=10)
        ended, answer = t.ended_after, t.answer
    assert ended is not None, "the server kept a 2 byte/s body open for 9 s (no body-read deadline)"
    assert ended <= BODY_READ_TIMEOUT + 3, f"cut off only after {ended:.1f}s"
    assert answer == b"" or answer.split(b" ", 2)[1] in (b"408", b"400"), answer[:200]
    assert gw.snapshot(MARKERS) == before


def test_declared_bodies_do_not_starve_other_writers(store, check_binary, tmp_path):
    """Two clients declare bodies as large as the whole in-flight body budget and then
    send almost nothing. A third client's small state write still succeeds: memory is
    reserved as bytes arrive, not as Content-Length claims. Nothing of the two is written."""
    kind, s3 = store
    srv = Server(data_dir=tmp_path / "data", store=kind, s3_env=s3, extra_env={
        "STATEGATE_MAX_STATE_BYTES": str(512 * 1024),
        "STATEGATE_MAX_INFLIGHT_BODY_BYTES": str(1024 * 1024),
        # the two hogs send 2 bytes/s: slow but within these limits, so only the budget is tested
        "STATEGATE_BODY_READ_TIMEOUT_SECONDS": "20",
        "STATEGATE_BODY_MIN_BYTES_PER_SECOND": "1",
        "STATEGATE_RETENTION_INTERVAL_SECONDS": "0",
    }).start()
    try:
        hogs = [srv.workspace(f"hog-{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
        writer = srv.workspace(f"writer-{uuid.uuid4().hex[:6]}")
        slow = []
        for w in hogs:
            wire = request_bytes("POST", BASE + w.name, [("Authorization", basic(w.user, w.password)),
                                                        ("Content-Length", str(512 * 1024))],
                                 b"{" + b" " * 100, host=f"127.0.0.1:{srv.port}")
            slow.append(Trickle(srv.port, wire, burst=len(wire) - 90, step=1, interval=0.5, max_seconds=8))
        for t in slow:
            t.start()
        try:
            time.sleep(0.5)
            r = http("POST", writer.address, tfstate(1, LINEAGE, "writer"), user=writer.user,
                     password=writer.password, timeout=5)
            assert r.status == 200, f"a 300-byte write was refused while two clients only declared big bodies: {r}"
        finally:
            for t in slow:
                t.close()
        for w in hogs:
            assert version_rows(srv, f"tf/{w.name}") == []
        assert srv.alive()
    finally:
        srv.stop()

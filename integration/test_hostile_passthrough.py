"""Hostile input on the S3 pass-through, against a real Garage that is both
stategate's store and its upstream.

stategate's state bucket is reserved: no request whose target is that bucket (by any
addressing form: path-style with slash and percent tricks, virtual-host via the
configured root domain, bucket-level listings and writes, multi-object delete, copy
sources and copy targets) gets through (403 AccessDenied, S3 XML). A Host that is
neither stategate's own address nor `<bucket>.<root domain>` is refused (400).

Every attack is SIGNED with the store's real credentials (as a tenant holding the
same key could), sent raw so no client normalizes it, and has a CONTROL: the same
trick sent straight to Garage, which shows Garage does reach the object (reads the
blob, lists the keys, deletes or overwrites a sacrificial object) — so the refusal is
stategate's doing. After every attempt through stategate the workspace state still
reads back byte for byte, and both buckets' keys/ETags and the state bucket's
lifecycle/website/CORS configuration are unchanged. Destructive controls only ever
touch sacrificial objects, restored afterwards.

Then the user-bucket positive controls (everything that must keep working), and the
conditional-write guard (Terraform `use_lockfile`): no existence oracle for unsigned
or wrongly signed requests, 412 for an existing lock file, exact keys (`&`), and a
bounded turn that a slow client cannot hold hostage.

STATEGATE_HOSTILE_CONTROLS_ONLY=1 runs only the Garage side of the table: use it to
check that every control still proves its point after a Garage upgrade.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest

import garage_harness
from harness import Server, http
from hostile_support import (Answer, S3Creds, Trickle, bucket_objects, content_md5, garage_create_bucket,
                             garage_root_domain, request_bytes, s3_error_code, sign, signed, version_rows)
from store_support import boto3_s3, require_garage_binary, tfstate

USER_BUCKET = "user-bucket"
PREFIX = "stategate/"
SAC = "stategate/states/sacrificial-0.blob"  # a blob-like object no state depends on
SAC_BODY = b"sacrificial: deleted and overwritten by the controls, then restored\n"
OUTSIDE = "user-area/outside.txt"  # in the state bucket, outside stategate's prefix
OUTSIDE_BODY = b"an object in the state bucket that stategate did not write\n"
README = "docs/readme.txt"
README_BODY = b"a user's own object\n"
PLANTED = "stategate/states/planted.blob"
MARKER = "protected-marker-6b0d"
TURN_WAIT = 2
CONFIGS = ("lifecycle", "website", "cors")  # state-bucket sub-resources that must not change

LIFECYCLE = (b"<LifecycleConfiguration><Rule><ID>hostile</ID><Status>Enabled</Status>"
             b"<Filter><Prefix>stategate/</Prefix></Filter><Expiration><Days>1</Days></Expiration>"
             b"</Rule></LifecycleConfiguration>")
WEBSITE = b"<WebsiteConfiguration><IndexDocument><Suffix>index.html</Suffix></IndexDocument></WebsiteConfiguration>"
CORS = (b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
        b"</CORSRule></CORSConfiguration>")
POLICY = b'{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject"}]}'
MULTI_DELETE = b"<Delete><Quiet>true</Quiet><Object><Key>{sac}</Key></Object></Delete>"


@dataclass(frozen=True)
class Case:
    """One signed request. Placeholders: {sb} state bucket, {ub} user bucket, {blob} a
    live state blob's key, {blob_enc} the same with every `/` as %2F, {blob_pct} with
    `stategate` percent-encoded, {sac}/{sac_enc} the sacrificial key, {upload} a fresh
    multipart upload id in the user bucket.
    `host`: "self" (127.0.0.1:<port>), "vhost:<bucket>", "vhost-upper:<bucket>",
    "vhost-noport:<bucket>" or "raw:<literal Host>".
    `control`: what the same request straight to Garage must show (see `check_control`);
    None only where Garage 2.5 itself does not resolve the trick (`why` says so)."""

    name: str
    method: str
    path: str
    query: str = ""
    headers: tuple = ()
    body: bytes = b""
    host: str = "self"
    expect: tuple = (403,)
    control: str | None = "read-blob"
    why: str = ""


SB_BLOB = "/{sb}/{blob}"
COPY_FROM_BLOB = (("x-amz-copy-source", "{sb}/{blob}"),)
CASES = [
    # ---- path-style object access -------------------------------------------------------
    Case("get-blob", "GET", SB_BLOB),
    Case("head-blob", "HEAD", SB_BLOB, control="head-blob"),
    Case("get-blob-double-slash", "GET", "/{sb}//{blob}"),
    Case("get-blob-triple-slash", "GET", "/{sb}///{blob}"),
    Case("get-blob-leading-double-slash", "GET", "//{sb}/{blob}"),
    Case("head-blob-double-slash", "HEAD", "/{sb}//{blob}", control="head-blob"),
    Case("get-blob-encoded-slashes", "GET", "/{sb}/{blob_enc}"),
    Case("get-blob-encoded-prefix", "GET", "/{sb}/{blob_pct}"),
    Case("get-blob-encoded-bucket", "GET", "/%73tategate-test/{blob}", control=None,
         why="Garage 2.5 takes the path's bucket name undecoded; AWS S3 and MinIO decode it"),
    Case("get-blob-range", "GET", SB_BLOB, headers=(("Range", "bytes=0-15"),), control="status:206"),
    Case("get-object-outside-prefix", "GET", "/{sb}/" + OUTSIDE, control="read:" + OUTSIDE),
    Case("delete-sacrificial", "DELETE", "/{sb}/{sac}", control="delete-sac"),
    Case("delete-sacrificial-double-slash", "DELETE", "/{sb}//{sac}", control="delete-sac"),
    Case("delete-sacrificial-leading-slashes", "DELETE", "//{sb}/{sac}", control="delete-sac"),
    Case("delete-sacrificial-encoded", "DELETE", "/{sb}/{sac_enc}", control="delete-sac"),
    Case("put-planted-blob", "PUT", "/{sb}/" + PLANTED, body=b"planted", control="write:" + PLANTED),
    Case("put-planted-double-slash", "PUT", "/{sb}//" + PLANTED, body=b"planted", control="write:" + PLANTED),
    Case("put-outside-prefix", "PUT", "/{sb}/user-area/planted.txt", body=b"planted",
         control="write:user-area/planted.txt"),
    Case("put-over-sacrificial", "PUT", "/{sb}/{sac}", body=b"overwritten", control="overwrite-sac"),
    Case("conditional-put-into-state-bucket", "PUT", "/{sb}/stategate/states/new.tflock", body=b"{}",
         headers=(("If-None-Match", "*"),), control="write:stategate/states/new.tflock"),
    Case("create-multipart-in-state-bucket", "POST", "/{sb}/" + PLANTED, query="uploads", control="status:200"),
    # ---- listings -----------------------------------------------------------------------
    Case("list-v2-no-prefix", "GET", "/{sb}", query="list-type=2", control="list-state"),
    Case("list-v1-no-query", "GET", "/{sb}", control="list-state"),
    Case("list-v1-trailing-slash", "GET", "/{sb}/", control="list-state"),
    Case("list-v2-empty-prefix", "GET", "/{sb}", query="list-type=2&prefix=", control="list-state"),
    Case("list-v2-state-prefix", "GET", "/{sb}", query="list-type=2&prefix=stategate%2F", control="list-state"),
    Case("list-v2-encoded-prefix", "GET", "/{sb}", query="list-type=2&prefix=%73tategate%2Fstates", control="list-state"),
    Case("list-v2-start-after", "GET", "/{sb}", query="list-type=2&start-after=stategate%2F", control="list-state"),
    Case("list-v1-marker", "GET", "/{sb}", query="marker=stategate%2F", control="list-state"),
    Case("list-v2-delimiter", "GET", "/{sb}", query="delimiter=%2F&list-type=2", control="list-mentions:stategate/"),
    Case("list-leading-double-slash", "GET", "//{sb}", query="list-type=2", control="list-state"),
    Case("list-versions", "GET", "/{sb}", query="versions", control=None,
         why="Garage 2.5 does not implement ListObjectVersions (501); AWS S3 and MinIO list every key"),
    Case("list-multipart-uploads", "GET", "/{sb}", query="uploads", control="status:200"),
    Case("head-bucket", "HEAD", "/{sb}", control="status:200"),
    Case("get-bucket-location", "GET", "/{sb}", query="location", control="status:200"),
    Case("get-bucket-acl", "GET", "/{sb}", query="acl", control="status:200"),
    # ---- multi-object delete ---------------------------------------------------------------
    Case("multi-delete", "POST", "/{sb}", query="delete", body=MULTI_DELETE, control="delete-sac"),
    Case("multi-delete-double-slash", "POST", "/{sb}//", query="delete", body=MULTI_DELETE, control="delete-sac"),
    Case("multi-delete-leading-slashes", "POST", "//{sb}", query="delete", body=MULTI_DELETE, control="delete-sac"),
    Case("multi-delete-empty-value", "POST", "/{sb}", query="delete=", body=MULTI_DELETE, control="delete-sac"),
    # ---- bucket-level writes -------------------------------------------------------------
    Case("put-lifecycle-expire-states", "PUT", "/{sb}", query="lifecycle", body=LIFECYCLE, control="config:lifecycle"),
    Case("put-website", "PUT", "/{sb}", query="website", body=WEBSITE, control="config:website"),
    Case("put-cors", "PUT", "/{sb}", query="cors", body=CORS, control="config:cors"),
    Case("put-policy", "PUT", "/{sb}", query="policy", body=POLICY, control=None,
         why="Garage 2.5 does not implement bucket policies; AWS S3 and MinIO apply them"),
    Case("delete-bucket", "DELETE", "/{sb}", control="status:409"),
    Case("delete-lifecycle", "DELETE", "/{sb}", query="lifecycle", control="status:204"),
    # ---- virtual-host addressing ------------------------------------------------------------
    Case("vhost-get-blob", "GET", "/{blob}", host="vhost:{sb}"),
    Case("vhost-head-blob", "HEAD", "/{blob}", host="vhost:{sb}", control="head-blob"),
    Case("vhost-get-blob-double-slash", "GET", "//{blob}", host="vhost:{sb}"),
    Case("vhost-get-blob-encoded", "GET", "/{blob_enc}", host="vhost:{sb}"),
    Case("vhost-uppercase-host", "GET", "/{blob}", host="vhost-upper:{sb}"),
    Case("vhost-host-without-port", "GET", "/{blob}", host="vhost-noport:{sb}"),
    Case("vhost-list", "GET", "/", query="list-type=2", host="vhost:{sb}", control="list-state"),
    Case("vhost-list-v1", "GET", "/", host="vhost:{sb}", control="list-state"),
    Case("vhost-delete-sacrificial", "DELETE", "/{sac}", host="vhost:{sb}", control="delete-sac"),
    Case("vhost-multi-delete", "POST", "/", query="delete", body=MULTI_DELETE, host="vhost:{sb}",
         control="delete-sac"),
    Case("vhost-put-planted", "PUT", "/" + PLANTED, body=b"planted", host="vhost:{sb}", control="write:" + PLANTED),
    Case("vhost-put-lifecycle", "PUT", "/", query="lifecycle", body=LIFECYCLE, host="vhost:{sb}",
         control="config:lifecycle"),
    # ---- Host names stategate does not know ------------------------------------------------
    Case("unknown-host-user-object", "GET", "/{ub}/" + README, host="raw:evil.example", expect=(400,),
         control="read:" + README),
    Case("unknown-host-state-blob", "GET", SB_BLOB, host="raw:evil.example", expect=(400, 403)),
    Case("unknown-host-bucket-lookalike", "GET", "/{ub}/" + README, host="raw:{sb}.evil.example", expect=(400,),
         control="read:" + README),
    Case("unknown-host-root-domain-suffix", "GET", "/{ub}/" + README, host="raw:{ub}.{root}.evil.example",
         expect=(400,), control="read:" + README),
    Case("unknown-host-other-ip", "GET", "/{ub}/" + README, host="raw:10.1.2.3:3900", expect=(400,),
         control="read:" + README),
    # ---- copy sources and copy targets --------------------------------------------------------
    Case("copy-out", "PUT", "/{ub}/stolen/1", headers=COPY_FROM_BLOB, control="copy-out:stolen/1"),
    Case("copy-out-leading-slash", "PUT", "/{ub}/stolen/2", headers=(("x-amz-copy-source", "/{sb}/{blob}"),),
         control="copy-out:stolen/2"),
    Case("copy-out-leading-double-slash", "PUT", "/{ub}/stolen/3", headers=(("x-amz-copy-source", "//{sb}/{blob}"),),
         control="copy-out:stolen/3"),
    Case("copy-out-encoded", "PUT", "/{ub}/stolen/4", headers=(("x-amz-copy-source", "{sb}%2F{blob_enc}"),),
         control="copy-out:stolen/4"),
    Case("copy-out-encoded-bucket", "PUT", "/{ub}/stolen/5",
         headers=(("x-amz-copy-source", "%73tategate-test/{blob}"),), control="copy-out:stolen/5"),
    Case("copy-out-version-id", "PUT", "/{ub}/stolen/6",
         headers=(("x-amz-copy-source", "{sb}/{blob}?versionId=null"),), control=None,
         why="Garage 2.5 reads `?versionId=` as part of the source key; AWS S3 and MinIO strip it"),
    Case("copy-out-vhost-target", "PUT", "/stolen/7", headers=COPY_FROM_BLOB, host="vhost:{ub}",
         control="copy-out:stolen/7"),
    Case("upload-part-copy", "PUT", "/{ub}/stolen/mp", query="partNumber=1&uploadId={upload}",
         headers=COPY_FROM_BLOB, control="status:200"),
    Case("upload-part-copy-encoded", "PUT", "/{ub}/stolen/mp", query="partNumber=1&uploadId={upload}",
         headers=(("x-amz-copy-source", "%2F{sb}%2F{blob_enc}"),), control="status:200"),
    Case("copy-into-state-bucket", "PUT", "/{sb}/{sac}", headers=(("x-amz-copy-source", "{ub}/" + README),),
         control="overwrite-sac"),
    Case("copy-into-state-bucket-double-slash", "PUT", "/{sb}//{sac}",
         headers=(("x-amz-copy-source", "{ub}/" + README),), control="overwrite-sac"),
    Case("copy-into-state-bucket-vhost", "PUT", "/{sac}", headers=(("x-amz-copy-source", "{ub}/" + README),),
         host="vhost:{sb}", control="overwrite-sac"),
]


@dataclass
class PassThrough:
    garage: garage_harness.Garage
    srv: Server
    env: dict
    creds: S3Creds
    direct: object  # boto3 client straight to Garage
    root: str
    ws: object
    blob: str
    blob_body: bytes
    state_body: bytes
    values: dict = field(default_factory=dict)

    @property
    def sb(self) -> str:
        return self.env["STATEGATE_S3_BUCKET"]

    @property
    def garage_port(self) -> int:
        return int(self.env["STATEGATE_S3_ENDPOINT"].rsplit(":", 1)[1])

    def fill(self, text):
        """Replaces the known {placeholders} only (bodies may hold other braces)."""
        if isinstance(text, bytes):
            return self.fill(text.decode()).encode()
        return re.sub(r"\{(\w+)\}", lambda m: str(self.values.get(m.group(1), m.group(0))), text)

    def host_for(self, spec: str, port: int) -> str:
        kind, _, arg = spec.partition(":")
        arg = self.fill(arg)
        return {
            "self": f"127.0.0.1:{port}",
            "vhost": f"{arg}.{self.root}:{port}",
            "vhost-upper": f"{arg}.{self.root}:{port}".upper(),
            "vhost-noport": f"{arg}.{self.root}",
            "raw": arg,
        }[kind]

    def send(self, case: Case, port: int, creds: S3Creds | None = None) -> Answer:
        body = self.fill(case.body)
        headers = [(k, self.fill(v)) for k, v in case.headers]
        if body:
            headers.append(("Content-MD5", content_md5(body)))
        return signed(port, creds or self.creds, case.method, self.fill(case.path), self.fill(case.query), headers,
                      body, host=self.host_for(case.host, port))

    def direct_get(self, query: str) -> tuple:
        a = signed(self.garage_port, self.creds, "GET", f"/{self.sb}", query)
        return a.status, a.body

    def snapshot(self) -> dict:
        r = self.ws.get()
        return {
            "state": (r.status, r.body),
            "versions": version_rows(self.srv, f"tf/{self.ws.name}"),
            "state bucket": bucket_objects(self.direct, self.sb),
            "user bucket": bucket_objects(self.direct, USER_BUCKET),
            "state bucket config": [self.direct_get(q) for q in CONFIGS],
        }

    def restore(self, baseline: dict):
        """Undo what a control did: only sacrificial and planted objects, never a state blob."""
        originals = {(self.sb, SAC): SAC_BODY, (self.sb, OUTSIDE): OUTSIDE_BODY, (USER_BUCKET, README): README_BODY}
        for bucket, want in ((self.sb, baseline["state bucket"]), (USER_BUCKET, baseline["user bucket"])):
            now = bucket_objects(self.direct, bucket)
            for key in set(now) - set(want):
                self.direct.delete_object(Bucket=bucket, Key=key)
            for key, etag in want.items():
                if now.get(key) != etag:
                    body = originals.get((bucket, key))
                    assert body is not None, f"live object {bucket}/{key} changed; cannot restore it"
                    self.direct.put_object(Bucket=bucket, Key=key, Body=body)
            for up in self.direct.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                self.direct.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
        configs = dict(zip(CONFIGS, baseline["state bucket config"]))
        for q, delete in (("lifecycle", self.direct.delete_bucket_lifecycle),
                          ("website", self.direct.delete_bucket_website),
                          ("cors", self.direct.delete_bucket_cors)):
            if self.direct_get(q) != configs[q]:
                delete(Bucket=self.sb)
        assert self.snapshot() == baseline, "could not restore the buckets after a control"


@pytest.fixture(scope="module")
def pt(check_binary, tmp_path_factory):
    require_garage_binary()
    base = tmp_path_factory.mktemp("hostile-pt")
    g = garage_harness.Garage(base / "garage")
    srv = None
    try:
        env = g.start()
        garage_create_bucket(g, USER_BUCKET)
        root = garage_root_domain(g)
        srv = Server(data_dir=base / "sg" / "data", store="s3", s3_env=env, extra_env={
            "STATEGATE_S3_PREFIX": PREFIX,
            "STATEGATE_UPSTREAM_ROOT_DOMAINS": root,
            "STATEGATE_UPSTREAM_CONDITIONAL_TURN_WAIT_SECONDS": str(TURN_WAIT),
            "STATEGATE_UPSTREAM_READ_TIMEOUT_SECONDS": "10",
            # the slow conditional writers trickle 2 bytes/s for a few seconds: legitimately slow
            "STATEGATE_BODY_READ_TIMEOUT_SECONDS": "30",
            "STATEGATE_BODY_MIN_BYTES_PER_SECOND": "1",
            "STATEGATE_RETENTION_INTERVAL_SECONDS": "0",
        }).start()
        direct = boto3_s3(env["STATEGATE_S3_ENDPOINT"], env)
        ws = srv.workspace(f"pt-victim-{uuid.uuid4().hex[:6]}")
        # > Garage's inline threshold (3 KiB): UploadPartCopy only copies block-stored objects
        state_body = tfstate(1, str(uuid.uuid4()), MARKER + "-" + "p" * 8192)
        assert http("POST", ws.address, state_body, user=ws.user, password=ws.password).status == 200
        rows = srv.db_rows(ws.name)
        blob = PREFIX + rows[-1]["blob_key"]
        blob_body = direct.get_object(Bucket=env["STATEGATE_S3_BUCKET"], Key=blob)["Body"].read()
        direct.put_object(Bucket=env["STATEGATE_S3_BUCKET"], Key=SAC, Body=SAC_BODY)
        direct.put_object(Bucket=env["STATEGATE_S3_BUCKET"], Key=OUTSIDE, Body=OUTSIDE_BODY)
        direct.put_object(Bucket=USER_BUCKET, Key=README, Body=README_BODY)
        p = PassThrough(g, srv, env, S3Creds.of(env), direct, root, ws, blob, blob_body, state_body)
        p.values = {
            "sb": p.sb, "ub": USER_BUCKET, "root": root, "blob": blob, "blob_enc": quote(blob, safe=""),
            "blob_pct": "%73%74%61%74%65gate" + blob[len("stategate"):], "sac": SAC, "sac_enc": quote(SAC, safe=""),
        }
        yield p
    finally:
        if srv is not None:
            srv.stop()
        garage_harness.kill(g)


@pytest.fixture
def server(pt):
    """Named like conftest's fixture, so its report hook attaches this server's log to failures."""
    return pt.srv


@pytest.fixture
def gw(pt, server):
    assert pt.srv.alive(), pt.srv.log_tail()
    yield pt
    assert pt.srv.alive(), f"stategate died:\n{pt.srv.log_tail()}"


def check_control(pt: PassThrough, case: Case, a: Answer):
    """The same request straight to Garage reached what stategate must keep out of reach."""
    kind, _, arg = (case.control or "").partition(":")
    sb, ub = pt.sb, USER_BUCKET
    if kind == "read-blob":
        assert a.status == 200 and a.body == pt.blob_body, a
    elif kind == "head-blob":
        assert a.status == 200 and int(a.headers["content-length"]) == len(pt.blob_body), a
    elif kind == "read":
        want = OUTSIDE_BODY if arg == OUTSIDE else README_BODY
        assert a.status == 200 and a.body == want, a
    elif kind == "list-state":
        assert a.status == 200 and pt.blob.encode() in a.body, a
    elif kind == "list-mentions":
        assert a.status == 200 and arg.encode() in a.body, a
    elif kind == "delete-sac":
        assert a.status in (200, 204), a
        assert SAC not in bucket_objects(pt.direct, sb), "Garage did not delete the sacrificial object"
    elif kind == "overwrite-sac":
        assert a.status == 200, a
        assert pt.direct.get_object(Bucket=sb, Key=SAC)["Body"].read() != SAC_BODY
    elif kind == "write":
        assert a.status == 200 and arg in bucket_objects(pt.direct, sb), a
    elif kind == "copy-out":
        assert a.status == 200, a
        assert pt.direct.get_object(Bucket=ub, Key=arg)["Body"].read() == pt.blob_body
    elif kind == "config":
        assert a.status in (200, 204), a
        got = pt.direct_get(arg)
        assert got[0] == 200 and b"Error" not in got[1], got
    elif kind == "status":
        assert a.status == int(arg), a
    else:
        raise AssertionError(f"unknown control {case.control!r}")


def _with_upload(pt: PassThrough, case: Case):
    if "{upload}" in case.query:
        pt.values["upload"] = pt.direct.create_multipart_upload(Bucket=USER_BUCKET, Key="stolen/mp")["UploadId"]


CONTROLS_ONLY = os.environ.get("STATEGATE_HOSTILE_CONTROLS_ONLY") == "1"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_passthrough_request(gw, case):
    _with_upload(gw, case)
    before = gw.snapshot()
    if not CONTROLS_ONLY:
        attempt_through_stategate(gw, case, before)
    if case.control is None:
        assert case.why, f"{case.name}: a case without a control must say why"
        return
    try:
        control = gw.send(case, gw.garage_port)
        check_control(gw, case, control)
    finally:
        gw.restore(before)


def attempt_through_stategate(gw: PassThrough, case: Case, before: dict):
    a = gw.send(case, gw.srv.port)
    assert a.status in case.expect, f"{case.name}: expected {case.expect} from stategate, got {a!r}"
    if case.method != "HEAD":
        code = s3_error_code(a)
        assert code is not None, f"{case.name}: not an S3 XML error: {a!r}"
        if a.status == 403:
            assert code == "AccessDenied", a
    assert gw.blob_body[:16] not in a.body and MARKER.encode() not in a.body, f"{case.name}: the answer leaks state"
    after = gw.snapshot()
    for what in before:
        assert after[what] == before[what], f"{case.name} through stategate changed the {what}"


def test_hostile_passthrough_table_size():
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)
    assert sum(c.control is None for c in CASES) <= 4


# --------------------------------------------------------------------------
# user buckets keep working (positive controls)
# --------------------------------------------------------------------------

POSITIVE = [
    # (name, method, path, query, headers, body, host, expected status)
    ("put-object", "PUT", "/{ub}/pos/a.txt", "", (), b"positive", "self", 200),
    ("get-object", "GET", "/{ub}/pos/a.txt", "", (), b"", "self", 200),
    ("head-object", "HEAD", "/{ub}/pos/a.txt", "", (), b"", "self", 200),
    ("list-objects", "GET", "/{ub}", "list-type=2&prefix=pos%2F", (), b"", "self", 200),
    ("copy-between-user-objects", "PUT", "/{ub}/pos/b.txt", "", (("x-amz-copy-source", "{ub}/pos/a.txt"),), b"",
     "self", 200),
    ("head-user-bucket", "HEAD", "/{ub}", "", (), b"", "self", 200),
    ("list-buckets", "GET", "/", "", (), b"", "self", 200),
    ("host-localhost", "GET", "/{ub}/pos/a.txt", "", (), b"", "raw:localhost:{port}", 200),
    ("host-ipv6-loopback", "GET", "/{ub}/pos/a.txt", "", (), b"", "raw:[::1]:{port}", 200),
    ("vhost-user-bucket", "GET", "/pos/a.txt", "", (), b"", "vhost:{ub}", 200),
    ("vhost-user-list", "GET", "/", "list-type=2&prefix=pos%2F", (), b"", "vhost:{ub}", 200),
    ("conditional-create-missing", "PUT", "/{ub}/pos/lock-{n}.tflock", "", (("If-None-Match", "*"),), b"{}",
     "self", 200),
    ("delete-object", "DELETE", "/{ub}/pos/b.txt", "", (), b"", "self", 204),
]


@pytest.mark.parametrize("row", POSITIVE, ids=[r[0] for r in POSITIVE])
def test_user_bucket_through_stategate(gw, row):
    name, method, path, query, headers, body, host, status = row
    gw.values.update(port=gw.srv.port, n=uuid.uuid4().hex[:8])
    if name not in ("put-object", "list-buckets", "head-user-bucket"):
        gw.direct.put_object(Bucket=USER_BUCKET, Key="pos/a.txt", Body=b"positive")
        gw.direct.put_object(Bucket=USER_BUCKET, Key="pos/b.txt", Body=b"positive")
    case = Case(name, method, path, query, headers, body, host)
    a = gw.send(case, gw.srv.port)
    assert a.status == status, f"{name}: {a!r}"
    if name == "get-object" or name.startswith("host-") or name == "vhost-user-bucket":
        assert a.body == b"positive", a
    if name in ("list-objects", "vhost-user-list"):
        assert b"pos/a.txt" in a.body, a
    if name == "copy-between-user-objects":
        assert gw.direct.get_object(Bucket=USER_BUCKET, Key="pos/b.txt")["Body"].read() == b"positive"
    if name == "list-buckets":
        assert USER_BUCKET.encode() in a.body, a
    r = gw.ws.get()
    assert (r.status, r.body) == (200, gw.state_body)


# --------------------------------------------------------------------------
# the conditional-write guard
# --------------------------------------------------------------------------


def _cond_put(gw, key: str, body: bytes, signer: str, condition=("If-None-Match", "*"), port=None,
              timeout: float = 15) -> Answer:
    port = port or gw.srv.port
    path = f"/{USER_BUCKET}/{key}"
    headers = [condition, ("Content-MD5", content_md5(body))]
    creds = {"store": gw.creds, "none": None,
             "wrong": S3Creds(gw.creds.key_id, "0" * len(gw.creds.secret), gw.creds.region)}[signer]
    return signed(port, creds, "PUT", path, "", headers, body, timeout=timeout)


COND = [
    # (name, object exists before, signer, condition, expected status)
    ("unsigned-existing", True, "none", ("If-None-Match", "*"), 403),
    ("unsigned-missing", False, "none", ("If-None-Match", "*"), 403),
    ("unsigned-if-match-existing", True, "none", ("If-Match", '"0123"'), 403),
    ("wrong-secret-existing", True, "wrong", ("If-None-Match", "*"), 403),
    ("wrong-secret-missing", False, "wrong", ("If-None-Match", "*"), 403),
    ("signed-existing", True, "store", ("If-None-Match", "*"), 412),
    ("signed-missing", False, "store", ("If-None-Match", "*"), 200),
    ("signed-if-match-stale-etag", True, "store", ("If-Match", '"0123456789abcdef0123456789abcdef"'), 412),
]


@pytest.mark.parametrize("row", COND, ids=[r[0] for r in COND])
def test_conditional_guard_is_no_existence_oracle(gw, row):
    """Unsigned or wrongly signed conditional PUTs learn nothing (403 whether or not
    the key exists); signed ones get S3's answer (412 for an existing lock file)."""
    name, exists, signer, condition, status = row
    key = f"locks/{name}-{uuid.uuid4().hex[:8]}.tflock"
    if exists:
        gw.direct.put_object(Bucket=USER_BUCKET, Key=key, Body=b"held")
    before = bucket_objects(gw.direct, USER_BUCKET)
    a = _cond_put(gw, key, b'{"ID":"contender"}', signer, condition)
    assert a.status == status, f"{name}: {a!r}"
    after = bucket_objects(gw.direct, USER_BUCKET)
    if status == 200:
        assert key in after and key not in before
    else:
        assert after == before, f"{name} changed the user bucket"
    gw.direct.delete_object(Bucket=USER_BUCKET, Key=key)


@pytest.mark.parametrize("key", ["locks/a&b.tflock", "locks/a+b.tflock", "locks/a%26c.tflock", "locks/a=b;c.tflock"])
def test_conditional_guard_checks_the_exact_key(gw, key):
    """`&`, `+`, `=`: the guard decides on the key Garage will write, so a second
    create-only PUT of the same lock file is refused."""
    key = key.replace("locks/", f"locks/{uuid.uuid4().hex[:6]}/")
    first = _cond_put(gw, key, b'{"ID":"first"}', "store")
    assert first.status == 200, first
    second = _cond_put(gw, key, b'{"ID":"second"}', "store")
    assert second.status == 412, f"second create-only PUT of {key!r}: {second!r}"
    stored_key = key.replace("%26", "&")
    assert gw.direct.get_object(Bucket=USER_BUCKET, Key=stored_key)["Body"].read() == b'{"ID":"first"}'


def _slot(bucket: str, key: str) -> int:
    """The turn slot today's guard would use (256 stripes of sha256(bucket/key))."""
    return hashlib.sha256(f"{bucket}/{key}".encode()).digest()[1]


def _trickled_cond_put(gw, key: str) -> Trickle:
    body = b'{"ID":"slow-writer","Info":"' + b"." * 40 + b'"}'
    headers = sign(gw.creds, "PUT", f"127.0.0.1:{gw.srv.port}", f"/{USER_BUCKET}/{key}", "",
                   [("If-None-Match", "*")], body)
    wire = request_bytes("PUT", f"/{USER_BUCKET}/{key}", headers, body, host=f"127.0.0.1:{gw.srv.port}")
    return Trickle(gw.srv.port, wire, burst=len(wire) - len(body) + 1, step=1, interval=0.5, max_seconds=8)


def test_slow_conditional_writer_does_not_block_other_keys(gw):
    """A client trickling its create-only PUT of K holds K's turn only: a create-only
    PUT of another key K2 (one that shares K's slot in today's striped table) is
    answered at once."""
    k = f"locks/{uuid.uuid4().hex[:8]}/k.tflock"
    k2 = next(c for c in (f"locks/{uuid.uuid4().hex[:8]}/k2.tflock" for _ in range(100_000))
              if _slot(USER_BUCKET, c) == _slot(USER_BUCKET, k))
    with _trickled_cond_put(gw, k):
        time.sleep(0.7)
        t0 = time.monotonic()
        a = _cond_put(gw, k2, b'{"ID":"k2"}', "store", timeout=5)
        took = time.monotonic() - t0
    assert a.status == 200, a
    assert took < 2.0, f"a conditional PUT of an unrelated key waited {took:.1f}s behind a slow client"


def test_second_writer_on_a_held_key_gets_an_answer(gw):
    """While a slow client holds K's turn, a second create-only PUT of K is answered
    (412 or 503) within the configured turn wait (2 s) instead of hanging."""
    k = f"locks/{uuid.uuid4().hex[:8]}/k.tflock"
    with _trickled_cond_put(gw, k):
        time.sleep(0.7)
        t0 = time.monotonic()
        a = _cond_put(gw, k, b'{"ID":"second"}', "store", timeout=TURN_WAIT + 3)
        took = time.monotonic() - t0
    assert a.status in (412, 503), a
    assert took < TURN_WAIT + 2, f"the second writer waited {took:.1f}s (turn wait is {TURN_WAIT}s)"


def test_upstream_named_differently_is_still_the_store(gw, tmp_path):
    """The same Garage named `localhost` instead of `127.0.0.1`: stategate either
    recognizes its own store (state bucket still reserved) or refuses to start with a
    message — it never silently drops the protection."""
    env = gw.env
    # The same store is the same installation: it opens only with the first server's key.
    key = (gw.srv.data_dir / "dek").read_text().strip()
    srv = Server(data_dir=tmp_path / "data", store="s3", s3_env=env, extra_env={
        "STATEGATE_DEK": key,
        "STATEGATE_S3_PREFIX": PREFIX,
        "STATEGATE_UPSTREAM_ENDPOINT": env["STATEGATE_S3_ENDPOINT"].replace("127.0.0.1", "localhost"),
        "STATEGATE_RETENTION_INTERVAL_SECONDS": "0",
    })
    try:
        try:
            srv.start(timeout=30)
        except RuntimeError as e:
            assert "upstream" in str(e).lower(), f"refused to start, but without saying why:\n{e}"
            return
        a = signed(srv.port, gw.creds, "GET", f"/{gw.sb}/{gw.blob}")
        assert a.status == 403 and s3_error_code(a) == "AccessDenied", a
    finally:
        srv.stop()

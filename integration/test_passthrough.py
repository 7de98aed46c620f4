"""S3 pass-through: a real S3 client (boto3) pointed at stategate's URL talks to the real
Garage behind it — SigV4 signatures made for stategate's address stay valid, bodies are
streamed both ways, multipart works — while stategate's own `bucket/prefix` is refused
(403) and an unreachable upstream is a quick 502 with an S3 XML error.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time
import uuid
import xml.etree.ElementTree as ET

import pytest

import garage_harness
from harness import http, lock_info
from store_support import boto3_s3, log_text, own_garage, tfstate, server_factory  # noqa: F401 (fixtures)

MiB = 1024 * 1024
BIG = 17 * MiB + 12345  # > 16 MiB, and not a whole number of parts
PART = 5 * MiB


@pytest.fixture
def gw(own_garage, server_factory):
    """(garage, stategate server, boto3 via stategate, boto3 direct to Garage, bucket)."""
    env = own_garage.env()
    # The test Garage has one bucket, shared by stategate's state and these user objects.
    srv = server_factory.new(env, STATEGATE_UPSTREAM_READ_TIMEOUT_SECONDS=10,
                             STATEGATE_UPSTREAM_SHARE_STATE_BUCKET="true")
    return own_garage, srv, boto3_s3(srv.url, env), boto3_s3(env["STATEGATE_S3_ENDPOINT"], env), env["STATEGATE_S3_BUCKET"]


def _client_error_status(excinfo) -> int:
    return excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"]


def _sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def test_boto3_objects_through_stategate(gw, tmp_path):
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    _, srv, sg, direct, bucket = gw
    base = f"passthrough/{uuid.uuid4().hex[:8]}/"

    # bucket-level calls
    names = [b["Name"] for b in sg.list_buckets()["Buckets"]]
    assert bucket in names, names
    assert sg.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200

    # small object: put through stategate, visible directly in Garage
    body = b"hello through stategate\n" * 100
    put = sg.put_object(Bucket=bucket, Key=base + "hello.txt", Body=body, ContentType="text/plain",
                        Metadata={"origin": "e2e"})
    head = direct.head_object(Bucket=bucket, Key=base + "hello.txt")
    assert head["ETag"] == put["ETag"] and head["ContentLength"] == len(body)
    assert head["Metadata"] == {"origin": "e2e"}
    assert direct.get_object(Bucket=bucket, Key=base + "hello.txt")["Body"].read() == body
    # ... and written directly, readable through stategate (also a ranged GET)
    direct.put_object(Bucket=bucket, Key=base + "direct.bin", Body=b"0123456789")
    assert sg.get_object(Bucket=bucket, Key=base + "direct.bin")["Body"].read() == b"0123456789"
    assert sg.get_object(Bucket=bucket, Key=base + "direct.bin", Range="bytes=2-5")["Body"].read() == b"2345"

    # multipart upload > 16 MiB (4 parts) through stategate
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        f.write(os.urandom(BIG))
    cfg = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=2)
    sg.upload_file(str(src), bucket, base + "big.bin", Config=cfg)
    head = direct.head_object(Bucket=bucket, Key=base + "big.bin")
    assert head["ContentLength"] == BIG
    parts = -(-BIG // PART)
    assert head["ETag"].strip('"').endswith(f"-{parts}"), f"not a {parts}-part multipart object: {head['ETag']}"

    # download through stategate (ranged, concurrent) and directly: same bytes
    want = _sha256_file(src)
    got_sg, got_direct = tmp_path / "via-sg.bin", tmp_path / "direct.bin"
    sg.download_file(bucket, base + "big.bin", str(got_sg), Config=cfg)
    direct.download_file(bucket, base + "big.bin", str(got_direct))
    assert _sha256_file(got_sg) == want
    assert _sha256_file(got_direct) == want

    # listing through stategate
    listed = sg.list_objects_v2(Bucket=bucket, Prefix=base)
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == sorted(
        base + k for k in ("big.bin", "direct.bin", "hello.txt"))
    listed = sg.list_objects_v2(Bucket=bucket, Prefix=base, Delimiter="/", MaxKeys=2)
    assert listed["IsTruncated"] and listed["KeyCount"] == 2

    # copy and delete through stategate
    sg.copy_object(Bucket=bucket, Key=base + "copy.txt", CopySource={"Bucket": bucket, "Key": base + "hello.txt"})
    assert direct.get_object(Bucket=bucket, Key=base + "copy.txt")["Body"].read() == body
    for k in ("hello.txt", "direct.bin", "big.bin", "copy.txt"):
        sg.delete_object(Bucket=bucket, Key=base + k)
    with pytest.raises(ClientError) as e:
        direct.head_object(Bucket=bucket, Key=base + "big.bin")
    assert _client_error_status(e) == 404
    assert direct.list_objects_v2(Bucket=bucket, Prefix=base).get("KeyCount", 0) == 0

    # a wrong signature made for stategate's address is Garage's 403, passed through as-is
    bad = boto3_s3(srv.url, {**gw[0].env(), "STATEGATE_S3_SECRET_ACCESS_KEY": "0" * 64})
    with pytest.raises(ClientError) as e:
        bad.list_objects_v2(Bucket=bucket, Prefix=base)
    assert _client_error_status(e) == 403

    # the proxied requests are in stategate's log (one summary line each)
    assert re.search(r'route="?upstream"?.*status=200', log_text(srv)), srv.log_tail()
    assert srv.alive()


def test_state_prefix_is_refused(gw):
    from botocore.exceptions import ClientError

    _, srv, sg, direct, bucket = gw
    prefix = srv.env()["STATEGATE_S3_PREFIX"]
    ws = srv.workspace(f"pt-{uuid.uuid4().hex[:8]}")
    info = lock_info()
    assert ws.lock(info).status == 200
    r = http("POST", f"{ws.address}?ID={info['ID']}", tfstate(1, str(uuid.uuid4()), "protected"),
             user=ws.user, password=ws.password)
    assert r.status == 200, r
    assert ws.unlock(info).status == 200
    rows = srv.db_rows(ws.name)
    assert len(rows) == 1 and rows[0]["blob_key"]
    blob = prefix + rows[0]["blob_key"]
    direct.head_object(Bucket=bucket, Key=blob)  # the blob really is there

    def refused(fn, **kw):
        with pytest.raises(ClientError) as e:
            fn(Bucket=bucket, **kw)
        assert _client_error_status(e) == 403, e.value.response
        if fn != sg.head_object:  # a HEAD answer has no body, so no error code
            assert e.value.response["Error"]["Code"] == "AccessDenied", e.value.response

    refused(sg.get_object, Key=blob)
    refused(sg.head_object, Key=blob)
    refused(sg.list_objects_v2, Prefix=prefix)
    refused(sg.list_objects_v2, Prefix=prefix + "states/")
    refused(sg.put_object, Key=prefix + "planted.blob", Body=b"not a state")
    refused(sg.delete_object, Key=blob)
    refused(sg.copy_object, Key=prefix + "copy.blob", CopySource={"Bucket": bucket, "Key": blob})
    # a raw request too (path percent-encoded), with an S3 XML error body
    enc = prefix.rstrip("/") + "%2F" + rows[0]["blob_key"]
    r = http("GET", f"{srv.url}/{bucket}/{enc}")
    assert r.status == 403 and b"<Error>" in r.body, r

    # nothing changed in Garage, and the state still reads back
    with pytest.raises(ClientError) as e:
        direct.head_object(Bucket=bucket, Key=prefix + "planted.blob")
    assert _client_error_status(e) == 404
    with pytest.raises(ClientError):
        direct.head_object(Bucket=bucket, Key=prefix + "copy.blob")
    direct.head_object(Bucket=bucket, Key=blob)
    got = ws.get()
    assert got.status == 200 and got.json()["outputs"]["marker"]["value"] == "protected", got

    # the rest of the bucket stays reachable
    sg.put_object(Bucket=bucket, Key="not-stategate/ok.txt", Body=b"ok")
    assert sg.get_object(Bucket=bucket, Key="not-stategate/ok.txt")["Body"].read() == b"ok"


def test_upstream_down_is_a_quick_502(gw):
    from botocore.exceptions import ClientError

    g, srv, sg, _, bucket = gw
    sg.put_object(Bucket=bucket, Key="down/before.txt", Body=b"before")

    garage_harness.kill(g)
    t0 = time.monotonic()
    r = http("GET", f"{srv.url}/{bucket}/down/before.txt", timeout=30)
    took = time.monotonic() - t0
    assert r.status == 502, r
    assert took < 10, f"502 took {took:.1f}s"
    assert "xml" in {k.lower(): v for k, v in r.headers.items()}.get("content-type", ""), r.headers
    err = ET.fromstring(r.body)
    assert err.tag == "Error" and err.findtext("Code"), r.body
    assert err.findtext("Resource", "").endswith("/down/before.txt"), r.body

    # a real client sees a 502 too, quickly (no retries configured in this client)
    t0 = time.monotonic()
    with pytest.raises(ClientError) as e:
        sg.list_objects_v2(Bucket=bucket, Prefix="down/")
    assert _client_error_status(e) == 502
    assert time.monotonic() - t0 < 10
    assert srv.alive(), srv.log_tail()
    assert re.search(r"status=502", log_text(srv)), srv.log_tail()

    garage_harness.restart(g)
    assert sg.get_object(Bucket=bucket, Key="down/before.txt")["Body"].read() == b"before"


def test_hung_upstream_is_a_502_after_the_read_timeout(own_garage, server_factory):
    """Garage frozen (SIGSTOP: connections are accepted, nothing is answered): the
    pass-through gives up after upstream.read_timeout_seconds with a 502, never hangs."""
    env = own_garage.env()
    srv = server_factory.new(env, STATEGATE_UPSTREAM_READ_TIMEOUT_SECONDS=2,
                             STATEGATE_UPSTREAM_SHARE_STATE_BUCKET="true")
    bucket = env["STATEGATE_S3_BUCKET"]
    pid = own_garage.pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = http("GET", f"{srv.url}/{bucket}/frozen/key", timeout=30)
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.status == 502 and b"<Error>" in r.body, r
    assert 1.5 < took < 8, f"502 after {took:.1f}s with a 2 s read timeout"
    # thawed: pass-through works again
    assert http("GET", f"{srv.url}/{bucket}/frozen/key").status in (403, 404)

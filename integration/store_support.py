"""Shared pieces of the "stategate in front of a real S3 store" tests
(test_store_faults.py, test_tls.py, test_migration.py, test_passthrough.py).

Reuses harness.py (Server, http, Terraform runner) and garage_harness.py (Garage,
restart). Tests that stop the store get a PRIVATE Garage (`own_garage`), so the
session Garage the rest of the suite shares is never disturbed.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

import garage_harness
from harness import Server


def require_garage_binary() -> str:
    """The garage binary, else skip (or fail under STATEGATE_E2E_REQUIRE_GARAGE=1)."""
    try:
        return garage_harness.find_garage()
    except garage_harness.GarageError as e:
        if os.environ.get("STATEGATE_E2E_REQUIRE_GARAGE") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))


def wait_for(pred, timeout: float, what: str, interval: float = 0.05):
    """Poll `pred()` until it returns something truthy; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


class SgServers:
    """Starts `stategate serve` processes for one test and stops them all afterwards.

    `.servers` has the same shape as conftest's ServerFactory, so a fixture of this
    type named `server_factory` gets its logs attached to failure reports by conftest.
    """

    def __init__(self, base: Path):
        self.base = base
        self.servers: list[Server] = []

    def new(self, s3_env: dict | None = None, cls=Server, **extra_env) -> Server:
        d = self.base / f"data-{len(self.servers)}-{uuid.uuid4().hex[:6]}"
        s = cls(data_dir=d, store="s3" if s3_env else "local", s3_env=dict(s3_env or {}),
                extra_env={k: str(v) for k, v in extra_env.items()})
        self.servers.append(s)
        return s.start()

    def stop_all(self):
        for s in self.servers:
            s.stop()


@pytest.fixture
def server_factory(tmp_path, check_binary):
    """Servers started with `SgServers` for one test (store chosen per call). Named like
    conftest's fixture, which it replaces where imported, so failure reports get the logs."""
    f = SgServers(tmp_path / "servers")
    yield f
    f.stop_all()


@pytest.fixture
def own_garage(tmp_path):
    """A private single-node Garage for this test (≈1 s to start); the test may stop
    and `garage_harness.restart()` it. Always stopped at the end."""
    require_garage_binary()
    g = garage_harness.Garage(tmp_path / "garage")
    try:
        g.start()
    except garage_harness.GarageError as e:
        g.stop()
        pytest.fail(f"could not start Garage: {e}")
    yield g
    garage_harness.kill(g)  # stop() would wait ~10 s for stategate's idle connections


def log_text(server: Server) -> str:
    return server.log_text()


def tfstate(serial: int, lineage: str, marker: str = "x") -> bytes:
    """A minimal valid Terraform state (version 4) whose content depends on `marker`."""
    return json.dumps({
        "version": 4,
        "terraform_version": "1.15.5",
        "serial": serial,
        "lineage": lineage,
        "outputs": {"marker": {"value": marker, "type": "string"}},
        "resources": [],
        "check_results": None,
    }, indent=2).encode()


def stored_object(server: Server, key: str) -> bytes | None:
    """The object `key` of `server`'s blob store (its local blob directory, or its
    prefix of the S3 bucket), read straight from the store; None when there is none."""
    if server.store == "local":
        path = server.data_dir / "blobs" / key
        return path.read_bytes() if path.is_file() else None
    env = server.env()
    client = boto3_s3(env["STATEGATE_S3_ENDPOINT"], env, request_checksum_calculation="when_required",
                      response_checksum_validation="when_required")
    try:
        return client.get_object(Bucket=env["STATEGATE_S3_BUCKET"],
                                 Key=env["STATEGATE_S3_PREFIX"] + key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def boto3_s3(endpoint: str, s3_env: dict, **config):
    """A boto3 S3 client the way a homelab user configures one for Garage/MinIO."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
                 connect_timeout=5, read_timeout=30, **config)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=s3_env["STATEGATE_S3_REGION"],
        aws_access_key_id=s3_env["STATEGATE_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_env["STATEGATE_S3_SECRET_ACCESS_KEY"],
        config=cfg,
    )

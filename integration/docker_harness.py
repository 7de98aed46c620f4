"""A Docker engine, offline-built images and a Compose project for test_docker.py.

No registry serves images here, so nothing is pulled:

- `Engine.start()` uses a Docker engine that already answers, else starts `dockerd`
  (root) with its data under the test's work dir, on a private socket, with host
  networking only (no bridge, no iptables changes): every container is started with
  `network_mode: host` and talks over loopback.
- `base_tarball()` makes a Debian bookworm root file system with
  `debootstrap --variant=minbase` from the mirror apt already uses, trimmed like
  debian:bookworm-slim, and caches it as a tarball under ~/.cache/stategate/docker/
  (delete it to refresh); `Engine.import_base()` turns it into an image.
- `Engine.build()` builds docker/Dockerfile's `prebuilt` target (stategate) and
  docker/garage/Dockerfile from binaries built on this machine, on that base.
- `Engine.build_postgres()` builds docker/postgres (Debian's PostgreSQL 15, apt from
  the same mirror) on that base, for docker/compose.nodes.yaml.
- `Compose` drives docker/compose.garage.yaml and compose.nodes.yaml with
  `docker-compose` (Compose v1, Debian's package) or `docker compose`.

Everything started is stopped and removed again by `close()`/`down()`.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("STATEGATE_DOCKER_CACHE", Path.home() / ".cache" / "stategate" / "docker"))
BASE_TARBALL = CACHE / "bookworm-minbase.tar"
ENGINE_START_TIMEOUT = 60
CMD_TIMEOUT = 180


class DockerError(RuntimeError):
    pass


def _run(args: list[str], *, env: dict | None = None, timeout: float = CMD_TIMEOUT, check: bool = True,
         input: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(args, env=env, input=input, cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise DockerError(f"`{' '.join(args)}` timed out after {timeout}s") from e
    except FileNotFoundError as e:
        raise DockerError(f"`{args[0]}` not found: run scripts/setup-test-deps.sh (as root)") from e
    if check and p.returncode != 0:
        raise DockerError(f"`{' '.join(args)}` failed ({p.returncode}):\n"
                          f"{p.stdout.decode(errors='replace')[-3000:]}\n{p.stderr.decode(errors='replace')[-3000:]}")
    return p


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------
# the base image
# --------------------------------------------------------------------------


def debian_mirror() -> str:
    """STATEGATE_DEBIAN_MIRROR, else the first Debian (not -security) URI apt uses."""
    if os.environ.get("STATEGATE_DEBIAN_MIRROR"):
        return os.environ["STATEGATE_DEBIAN_MIRROR"]
    texts = []
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(p.read_text())
        except OSError:
            pass
    for text in texts:
        # one-line (`deb URI suite ...`) and deb822 (`URIs: URI`) formats
        for uri in re.findall(r"^\s*(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text, re.M):
            if "debian" in uri and "security" not in uri:
                return uri
    raise DockerError("no Debian mirror in /etc/apt/sources.list*: set STATEGATE_DEBIAN_MIRROR")


def _trim(root: Path):
    """Drops what debian:bookworm-slim leaves out (docs but their copyright files, man
    pages, translations) and apt's caches."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
                    "usr/share/man", "usr/share/info", "usr/share/locale/*", "usr/share/doc/**/*"):
        for path in sorted(root.glob(pattern), reverse=True):  # children before parents
            if path.name == "copyright" or not path.exists():
                continue
            if path.is_dir() and not path.is_symlink():
                if pattern.startswith("usr/share/doc"):
                    continue  # a package's doc dir stays, holding its copyright file
                shutil.rmtree(path)
            else:
                path.unlink()


def base_tarball(timeout: float = 600) -> Path:
    """The cached minbase tarball; made with debootstrap (about 40 s) when missing."""
    if BASE_TARBALL.exists():
        return BASE_TARBALL
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not os.path.exists(debootstrap):
        raise DockerError("debootstrap not found: run scripts/setup-test-deps.sh (as root)")
    CACHE.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=CACHE))
    try:
        mirror = debian_mirror()
        p = _run([debootstrap, "--variant=minbase", "--include=ca-certificates", "bookworm", str(root), mirror],
                 timeout=timeout, check=False)
        if p.returncode != 0:
            raise DockerError(f"debootstrap from {mirror} failed ({p.returncode}):\n"
                              f"{p.stdout.decode(errors='replace')[-2000:]}\n{p.stderr.decode(errors='replace')[-2000:]}")
        _trim(root)
        tmp = BASE_TARBALL.with_suffix(".tmp")
        _run(["tar", "-C", str(root), "-cf", str(tmp), "."], timeout=timeout)
        tmp.rename(BASE_TARBALL)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BASE_TARBALL


def _stripped_copy(binary: Path, dest: Path) -> Path:
    """A copy without debug info (a debug build is ~300 MB of it); as-is without `strip`."""
    shutil.copy2(binary, dest)
    strip = shutil.which("strip")
    if strip:
        _run([strip, str(dest)], timeout=120)
    return dest


# --------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------


@dataclass
class Engine:
    work: Path
    env: dict = field(default_factory=lambda: dict(os.environ))
    dockerd: str | None = None  # default: the one on PATH
    proc: subprocess.Popen | None = None  # our dockerd, if we started one
    sock_dir: Path | None = None  # set while we run a dockerd of our own
    images: list[str] = field(default_factory=list)

    def docker(self, *args: str, timeout: float = CMD_TIMEOUT, check: bool = True,
               input: bytes | None = None) -> subprocess.CompletedProcess:
        return _run([shutil.which("docker") or "docker", *args], env=self.env, timeout=timeout,
                    check=check, input=input)

    def answers(self) -> bool:
        try:
            return self.docker("version", "--format", "{{.Server.Version}}", timeout=15, check=False).returncode == 0
        except DockerError:
            return False

    def start(self) -> "Engine":
        """Reuses an engine that answers, else starts dockerd. DockerError says why not."""
        if shutil.which("docker") is None:
            raise DockerError("no `docker` CLI: run scripts/setup-test-deps.sh (as root)")
        if self.answers():
            return self
        dockerd = self.dockerd or shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not os.path.exists(dockerd):
            raise DockerError("no Docker engine answers and `dockerd` is not installed: "
                              "run scripts/setup-test-deps.sh (as root)")
        if os.geteuid() != 0:
            raise DockerError("no Docker engine answers, and starting dockerd needs root")
        # Unix socket paths are limited to ~108 bytes: the sockets get a short dir of their own.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="sgd-", dir="/tmp"))
        data = self.work / "dockerd-data"
        data.mkdir(parents=True, exist_ok=True)
        log_path = self.work / "dockerd.log"
        sock = self.sock_dir / "docker.sock"
        self.env = dict(self.env, DOCKER_HOST=f"unix://{sock}")
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [dockerd, "--data-root", str(data), "--exec-root", str(self.sock_dir / "exec"),
                 "--pidfile", str(self.sock_dir / "dockerd.pid"), "--host", f"unix://{sock}",
                 # host networking only: leave the machine's bridges and firewall alone
                 "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + ENGINE_START_TIMEOUT
        while not self.answers():
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.close()
                raise DockerError(f"dockerd exited ({rc}) while starting:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                self.close()
                raise DockerError(f"dockerd did not answer within {ENGINE_START_TIMEOUT}s:\n{_tail(log_path)}")
            time.sleep(0.2)
        return self

    def import_base(self, tag: str) -> str:
        self.docker("import", str(base_tarball()), tag, timeout=300)
        self.images.append(tag)
        return tag

    def build(self, tag: str, context: Path, dockerfile: Path, base: str, target: str | None = None) -> str:
        args = ["build", "--network", "host", "-q", "-f", str(dockerfile), "--build-arg", f"RUNTIME_IMAGE={base}",
                "-t", tag]
        if target:
            args += ["--target", target]
        self.docker(*args, str(context), timeout=600)
        self.images.append(tag)
        return tag

    def build_stategate(self, tag: str, binary: Path, base: str) -> str:
        ctx = self.work / "ctx-stategate"
        ctx.mkdir(parents=True, exist_ok=True)
        _stripped_copy(binary, ctx / "stategate")
        return self.build(tag, ctx, REPO / "docker" / "Dockerfile", base, target="prebuilt")

    def build_garage(self, tag: str, binary: Path, base: str) -> str:
        ctx = self.work / "ctx-garage"
        shutil.copytree(REPO / "docker" / "garage", ctx, dirs_exist_ok=True)
        _stripped_copy(binary, ctx / "garage")
        return self.build(tag, ctx, ctx / "Dockerfile", base)

    def build_postgres(self, tag: str, base: str) -> str:
        """docker/postgres: PostgreSQL 15 from the base's Debian mirror."""
        ctx = REPO / "docker" / "postgres"
        return self.build(tag, ctx, ctx / "Dockerfile", base)

    def image_size(self, tag: str) -> int:
        return int(self.docker("image", "inspect", "-f", "{{.Size}}", tag).stdout.decode().strip())

    def inspect(self, container: str) -> dict:
        return json.loads(self.docker("inspect", container).stdout)[0]

    def close(self):
        """Stops our dockerd and removes its data; on a shared engine, removes our images."""
        if self.sock_dir is None:  # not ours
            for tag in reversed(self.images):
                self.docker("rmi", "-f", tag, check=False, timeout=60)
            return
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.proc = None
        dirs = [self.work / "dockerd-data", self.sock_dir]
        _unmount_under(dirs)  # dockerd leaves e.g. exec-root/netns/default mounted
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.sock_dir = None


def _unmount_under(dirs: list[Path]):
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    roots = [str(d.resolve()) + "/" for d in dirs]
    for m in sorted(mounts, key=len, reverse=True):
        if any(m.startswith(r) for r in roots):
            _run(["umount", m], check=False, timeout=30)


# --------------------------------------------------------------------------
# compose
# --------------------------------------------------------------------------


def compose_command() -> list[str]:
    """`docker-compose` (v1, Debian's package), else the `docker compose` plugin."""
    v1 = shutil.which("docker-compose")
    if v1:
        return [v1]
    docker = shutil.which("docker")
    if docker and _run([docker, "compose", "version"], check=False, timeout=30).returncode == 0:
        return [docker, "compose"]
    raise DockerError("neither `docker-compose` nor `docker compose` found: run scripts/setup-test-deps.sh")


@dataclass
class Compose:
    engine: Engine
    file: Path
    project: str
    env: dict  # the compose file's ${VARIABLES}

    def run(self, *args: str, timeout: float = CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(self.engine.env, **self.env)
        return _run([*compose_command(), "-p", self.project, "-f", str(self.file), *args], env=env,
                    timeout=timeout, check=check, cwd=self.file.parent)

    def container(self, service: str) -> str:
        """The id of the service's (one) container."""
        out = self.run("ps", "-a", "-q", service).stdout.decode().split()
        if not out:
            raise DockerError(f"no container for service {service}")
        return out[0]

    def up(self, *services: str):
        # --no-build: the images were built beforehand, from binaries built here
        self.run("up", "-d", "--no-build", *services, timeout=300)

    def logs(self, tail: int = 60) -> str:
        p = self.run("logs", "--no-color", "--tail", str(tail), timeout=60, check=False)
        return p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")

    def down(self, volumes: bool = False):
        self.run("down", "--remove-orphans", *(["-v"] if volumes else []), timeout=120, check=False)

"""The Docker drop-in, built and run for real (Garage flavour).

Images are built from docker/Dockerfile (its `prebuilt` target, with the stategate
binary under test) and docker/garage/Dockerfile (the `cargo install`ed garage), both
on a Debian minbase made offline with debootstrap; docker/compose.garage.yaml runs
them with Compose, host networking only. Covered: real Terraform applies through the
containerized stategate onto the containerized Garage (http backend, and the s3
backend through the pass-through), the process is not root, the DEK in the volume is
0600, a compose down/up keeps every state, and `docker stop` of an idle and of a busy
container ends with the process's own exit 0 (never SIGKILL's 137) within the grace
period. Without a working engine these tests fail with the reason; they never skip.
The MinIO flavour (docker/compose.yaml) is not run: no MinIO image exists here.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shlex
import socket
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

import garage_harness
from docker_harness import Compose, DockerError, Engine, REPO
from harness import BACKEND_HTTP, Tf, Workspace, data_resource, free_port, http, lock_info, resources_of, \
    s3_backend_block, stategate_bin
from store_support import boto3_s3, require_garage_binary, tfstate, wait_for

GRACE_SECONDS = 10  # STATEGATE_SHUTDOWN_GRACE_SECONDS in the stack; stop_grace_period is 15 s
STATE_BUCKET = "stategate"  # compose.garage.yaml: stategate's own (reserved) bucket
S3_BUCKET = "tf-s3"  # compose.garage.yaml: a bucket for S3 clients


# --------------------------------------------------------------------------
# fixtures: engine -> images -> compose stack (one of each for the module)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = Engine(tmp_path_factory.mktemp("docker"))
    try:
        e.start()
    except DockerError as err:
        pytest.fail(f"no Docker engine: {err}", pytrace=False)
    yield e
    e.close()


@dataclass
class Images:
    base: str
    stategate: str
    garage: str


@pytest.fixture(scope="module")
def images(engine, check_binary):
    garage = Path(require_garage_binary())
    run = uuid.uuid4().hex[:8]
    t0 = time.monotonic()
    try:
        base = engine.import_base(f"stategate-test-base:{run}")
        t1 = time.monotonic()
        imgs = Images(base, engine.build_stategate(f"stategate-test:{run}", stategate_bin(), base),
                      engine.build_garage(f"stategate-test-garage:{run}", garage, base))
    except DockerError as err:
        pytest.fail(f"building the images failed: {err}", pytrace=False)
    print(f"\n[docker] base import {t1 - t0:.1f}s, both builds {time.monotonic() - t1:.1f}s; sizes: "
          + ", ".join(f"{t} {engine.image_size(t) / 1e6:.0f} MB" for t in (imgs.base, imgs.stategate, imgs.garage)))
    return imgs


@dataclass
class Stack:
    engine: Engine
    compose: Compose
    url: str
    s3_env: dict  # STATEGATE_S3_* for a client talking to Garage directly

    def sg(self) -> str:
        return self.compose.container("stategate")

    def exec(self, *args: str) -> str:
        return self.engine.docker("exec", self.sg(), *args).stdout.decode()

    def workspace(self, name: str) -> Workspace:
        return _workspace(self.engine, self.sg(), name)

    def wait_healthy(self, timeout: float = 60):
        try:
            wait_for(lambda: _answers(self.url), timeout, f"stategate at {self.url}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.compose.logs()}") from None

    def state(self) -> dict:
        return self.engine.inspect(self.sg())["State"]


@pytest.fixture(scope="module")
def stack(engine, images, tmp_path_factory):
    port, s3, rpc, admin = (free_port() for _ in range(4))
    key_id, key_secret = "GK" + secrets.token_hex(12), secrets.token_hex(32)
    compose = Compose(engine, REPO / "docker" / "compose.garage.yaml", f"sgtest{uuid.uuid4().hex[:8]}", {
        "STATEGATE_IMAGE": images.stategate,
        "GARAGE_IMAGE": images.garage,
        "GARAGE_RPC_SECRET": secrets.token_hex(32),
        "GARAGE_KEY_ID": key_id,
        "GARAGE_KEY_SECRET": key_secret,
        "GARAGE_S3_PORT": str(s3),
        "GARAGE_RPC_PORT": str(rpc),
        "GARAGE_ADMIN_PORT": str(admin),
        "STATEGATE_LISTEN": f"127.0.0.1:{port}",
        "STATEGATE_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "STATEGATE_SHUTDOWN_GRACE_SECONDS": str(GRACE_SECONDS),
    })
    s = Stack(engine, compose, f"http://127.0.0.1:{port}", {
        "STATEGATE_S3_ENDPOINT": f"http://127.0.0.1:{s3}",
        "STATEGATE_S3_REGION": garage_harness.REGION,
        "STATEGATE_S3_ACCESS_KEY_ID": key_id,
        "STATEGATE_S3_SECRET_ACCESS_KEY": key_secret,
    })
    t0 = time.monotonic()
    try:
        try:
            compose.up()
        except DockerError as err:
            pytest.fail(f"compose up failed: {err}\n{compose.logs()}", pytrace=False)
        s.wait_healthy()
        print(f"\n[docker] compose up until healthy: {time.monotonic() - t0:.1f}s")
        yield s
    finally:
        log = tmp_path_factory.getbasetemp() / "docker-compose.log"
        log.write_text(compose.logs(tail=400))
        compose.down(volumes=True)


@pytest.fixture
def tf(tf_env, tmp_path):
    def make(name: str, extra_env: dict | None = None) -> Tf:
        return Tf(tmp_path / name, dict(tf_env, **(extra_env or {})))

    return make


def _docker_stop(stack: Stack, timeout: int = 15) -> float:
    t0 = time.monotonic()
    stack.engine.docker("stop", "-t", str(timeout), stack.sg(), timeout=timeout + 30)
    return time.monotonic() - t0


def _unix_time(stamp: str) -> float:
    """An RFC 3339 UTC time with any number of fractional digits, as a Unix time."""
    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?Z$", stamp)
    return datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc).timestamp() + float(m.group(2) or 0)


def _log_times(engine: Engine, container: str, *markers: str) -> list[float]:
    """The time of the last line of stategate's log containing each marker."""
    log = engine.docker("logs", "--tail", "200", container).stderr.decode(errors="replace")

    def last(marker: str) -> float:
        lines = [line for line in log.splitlines() if marker in line]
        assert lines, f"no {marker!r} in the log:\n{log[-3000:]}"
        return _unix_time(lines[-1].split()[0])

    return [last(m) for m in markers]


def _stop_latency_in_log(engine: Engine, container: str) -> float:
    """Seconds from the last SIGTERM stategate logged to its last "stopped" line."""
    sigterm, stopped = _log_times(engine, container, "SIGTERM received", "stopped: no request in flight")
    return stopped - sigterm


def _exit_code(stack: Stack) -> int:
    state = stack.state()
    assert not state["Running"], state
    return state["ExitCode"]


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------


def test_engine_failure_is_reported_with_its_reason(tmp_path):
    """A dockerd that cannot start fails the tests with its own words, never a skip."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dockerd").write_text("#!/bin/sh\necho 'failed to start daemon: no cgroups here' >&2\nexit 1\n")
    (fake / "dockerd").chmod(0o755)
    e = Engine(tmp_path / "work", env=dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/none.sock"),
               dockerd=str(fake / "dockerd"))
    with pytest.raises(DockerError) as err:
        e.start()
    e.close()
    msg = str(err.value)
    assert ("no cgroups here" in msg and "exited (1)" in msg) or "needs root" in msg, msg


def test_images_are_built_on_the_offline_base(engine, images):
    cfg = json.loads(engine.docker("image", "inspect", images.stategate, "-f", "{{json .Config}}").stdout)
    assert cfg["User"] == "10001:10001", cfg
    assert cfg["Healthcheck"]["Test"] == ["CMD", "stategate", "health"], cfg
    assert cfg["StopSignal"] == "SIGTERM", cfg
    assert "8080/tcp" in cfg["ExposedPorts"] and "/data" in cfg["Volumes"], cfg
    # the binaries load on the minbase (dynamic libraries present) and there is no curl
    out = engine.docker("run", "--rm", "--network", "none", images.stategate, "--version").stdout.decode()
    assert out.startswith("stategate "), out
    assert engine.docker("run", "--rm", "--network", "none", "--entrypoint", "sh", images.stategate,
                         "-c", "command -v curl", check=False).returncode != 0
    out = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "garage", images.garage,
                        "--version").stdout.decode()
    assert out.startswith("garage "), out


def test_terraform_through_the_containers(stack, tf):
    # http backend: states kept by the containerized stategate in the containerized Garage
    ws = stack.workspace("docker-http")
    assert ws.address.startswith(stack.url), ws.env
    w = tf("http", ws.env)
    w.write(BACKEND_HTTP + data_resource("a", "one"))
    w.init()
    assert "1 added" in w.apply().stdout
    w.write(BACKEND_HTTP + data_resource("a", "one") + data_resource("b", "two"))
    assert "1 added" in w.apply().stdout
    w.plan_no_changes()
    got = ws.get()
    assert got.status == 200 and resources_of(got.json()) == ["terraform_data.a", "terraform_data.b"], got
    garage = boto3_s3(stack.s3_env["STATEGATE_S3_ENDPOINT"], stack.s3_env)
    stored = [o["Key"] for o in garage.list_objects_v2(Bucket=STATE_BUCKET).get("Contents", [])]
    assert len(stored) >= 2, f"expected the state versions' blobs in Garage's {STATE_BUCKET} bucket: {stored}"

    # s3 backend through the pass-through: stategate as a drop-in in front of Garage
    aws = {"AWS_ACCESS_KEY_ID": stack.s3_env["STATEGATE_S3_ACCESS_KEY_ID"],
           "AWS_SECRET_ACCESS_KEY": stack.s3_env["STATEGATE_S3_SECRET_ACCESS_KEY"],
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true"}
    w3 = tf("s3", aws)
    w3.write(s3_backend_block(stack.url, S3_BUCKET, "docker/terraform.tfstate") + data_resource("c", "three"))
    w3.init()
    assert "1 added" in w3.apply().stdout
    w3.plan_no_changes()
    head = garage.head_object(Bucket=S3_BUCKET, Key="docker/terraform.tfstate")
    assert head["ContentLength"] > 0, head

    # ... which refuses stategate's own blobs
    from botocore.exceptions import ClientError
    through = boto3_s3(stack.url, stack.s3_env)
    with pytest.raises(ClientError) as err:
        through.get_object(Bucket=STATE_BUCKET, Key=stored[0])
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403, err.value.response
    # Garage waits up to 10 s for open client connections when it stops
    garage.close()
    through.close()


def test_non_root_process_and_private_dek(stack):
    status = dict(line.split(":", 1) for line in stack.exec("cat", "/proc/1/status").splitlines() if ":" in line)
    assert status["Name"].strip() == "stategate", status
    assert status["Uid"].split() == ["10001"] * 4, status["Uid"]
    modes = stack.exec("stat", "-c", "%n %a %u", "/data", "/data/dek", "/data/stategate.db").split("\n")
    assert modes[:3] == ["/data 700 10001", "/data/dek 600 10001", "/data/stategate.db 600 10001"], modes
    # the image's HEALTHCHECK (`stategate health`, no curl) reports healthy
    wait_for(lambda: stack.state().get("Health", {}).get("Status") == "healthy", 40,
             f"docker health status healthy (now {stack.state().get('Health')})", interval=1)


def test_compose_down_and_up_keeps_every_state(stack, tf):
    w = tf("restart", stack.workspace("docker-restart").env)
    w.write(BACKEND_HTTP + data_resource("a", "kept"))
    w.init()
    w.apply()
    raw = [stack.workspace(f"docker-restart-{i}") for i in range(3)]
    for i, ws in enumerate(raw):
        r = http("POST", ws.address, tfstate(1, str(uuid.uuid4()), f"m{i}"), user=ws.user, password=ws.password)
        assert r.status == 200, r
    before = {ws.name: ws.get().body for ws in raw}

    t0 = time.monotonic()
    stack.compose.run("stop")  # stop_grace_period of each service
    ids = {svc: stack.compose.container(svc) for svc in ("stategate", "garage")}
    codes = {svc: stack.engine.inspect(c)["State"]["ExitCode"] for svc, c in ids.items()}
    assert codes == {"stategate": 0, "garage": 0}, f"{codes} (137 = SIGKILL)"
    t1 = time.monotonic()
    stack.compose.down()  # containers go, volumes stay
    stack.compose.up()
    stack.wait_healthy()
    print(f"\n[docker] compose stop {t1 - t0:.1f}s (exit codes {codes}), down + up {time.monotonic() - t1:.1f}s")

    # same DEK (the workspace credentials still work), same states, nothing to change
    assert {ws.name: ws.get().body for ws in raw} == before
    w.plan_no_changes()


def test_docker_stop_of_an_idle_container(stack):
    took = _docker_stop(stack)
    code = _exit_code(stack)
    own = _stop_latency_in_log(stack.engine, stack.sg())
    print(f"\n[docker] idle stop: stategate done {own * 1000:.0f} ms after SIGTERM, "
          f"`docker stop` took {took:.2f}s, exit code {code}")
    assert code == 0, f"exit code {code} (137 = SIGKILL)\n{stack.compose.logs()}"
    assert own < 0.5, f"an idle stategate took {own:.2f}s from SIGTERM to exit"
    assert took < 5, f"`docker stop` of an idle stategate took {took:.1f}s"
    stack.compose.up("stategate")
    stack.wait_healthy()


def test_docker_stop_of_a_busy_container(stack):
    """A state upload in flight when the stop arrives completes; then the process exits
    by itself, well before the grace period and the stop timeout."""
    ws = stack.workspace("docker-busy")
    body = tfstate(1, str(uuid.uuid4()), "sent-during-stop")
    host = stack.url.removeprefix("http://")
    auth = base64.b64encode(f"{ws.user}:{ws.password}".encode()).decode()
    conn = socket.create_connection(tuple(host.rsplit(":", 1)), timeout=30)
    path = ws.address.removeprefix(stack.url)
    conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {auth}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:20])
    time.sleep(0.5)  # the request header has been read: the request is in flight

    result = {}
    stopper = threading.Thread(target=lambda: result.update(took=_docker_stop(stack)))
    stopper.start()
    hold = 2.0
    time.sleep(hold)
    assert stack.state()["Running"], "stategate exited with a request in flight"
    conn.sendall(body[20:])
    reply = conn.recv(4096).decode(errors="replace")
    conn.close()
    stopper.join(60)
    code = _exit_code(stack)
    own = _stop_latency_in_log(stack.engine, stack.sg())
    print(f"\n[docker] busy stop: stategate done {own:.2f}s after SIGTERM (request held {hold}s), "
          f"`docker stop` took {result.get('took', -1):.2f}s, exit code {code}")
    assert reply.startswith("HTTP/1.1 200"), reply
    assert code == 0, f"exit code {code} (137 = SIGKILL)\n{stack.compose.logs()}"
    assert hold * 0.9 <= result["took"] < GRACE_SECONDS, result
    # In stategate's own log: SIGTERM came while the upload was in flight, the upload
    # finished, and only then the process stopped, well inside the grace period.
    sigterm, wrote, stopped = _log_times(stack.engine, stack.sg(), "SIGTERM received",
                                         'route="tf.write"', "stopped: no request in flight")
    assert sigterm < wrote <= stopped, (sigterm, wrote, stopped)
    assert own < GRACE_SECONDS, own

    stack.compose.up("stategate")
    stack.wait_healthy()
    got = ws.get()
    assert got.status == 200 and got.json()["outputs"]["marker"]["value"] == "sent-during-stop", got


def test_docker_stop_of_a_stuck_request_ends_at_the_grace_period(engine, images):
    """A client that never finishes its upload cannot stretch a stop past the grace
    period: the process still exits by itself (0), not by SIGKILL. Also the image
    alone, with the local store, as `docker run` users start it."""
    grace = 2
    port = free_port()
    name = f"sgtest-stuck-{uuid.uuid4().hex[:8]}"
    engine.docker("run", "-d", "--name", name, "--network", "host", "-e", f"STATEGATE_LISTEN=127.0.0.1:{port}",
                  "-e", f"STATEGATE_PUBLIC_URL=http://127.0.0.1:{port}", "-e", "STATEGATE_STORE=local",
                  "-e", f"STATEGATE_SHUTDOWN_GRACE_SECONDS={grace}", images.stategate)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), 30, f"stategate at {url}")
        ws = _workspace(engine, name, "stuck")
        auth = base64.b64encode(f"{ws.user}:{ws.password}".encode()).decode()
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn.sendall(f"POST {ws.address.removeprefix(url)} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Authorization: Basic {auth}\r\nContent-Length: 1000\r\n\r\n{{".encode())
        time.sleep(0.5)  # the request is in flight, and never completes
        t0 = time.monotonic()
        engine.docker("stop", "-t", "15", name, timeout=60)
        took = time.monotonic() - t0
        state = engine.inspect(name)["State"]
        print(f"\n[docker] stuck-request stop: {took:.2f}s (grace {grace}s), exit code {state['ExitCode']}")
        assert state["ExitCode"] == 0, f"exit code {state['ExitCode']} (137 = SIGKILL)"
        assert grace <= took < grace + 3, took
        try:
            assert conn.recv(4096) == b""  # the stuck request was dropped, not answered
        except ConnectionResetError:
            pass
        conn.close()
    finally:
        engine.docker("rm", "-f", "-v", name, check=False)


def _answers(url: str) -> bool:
    try:
        return http("GET", f"{url}/healthz", timeout=2).status == 200
    except OSError:
        return False


def _through(ws: Workspace, url: str) -> Workspace:
    """`ws` with its addresses on the node at `url` instead of the public URL."""
    def moved(v: str) -> str:
        parts = urllib.parse.urlsplit(v)
        return urllib.parse.urlunsplit(parts._replace(scheme="http", netloc=url.removeprefix("http://")))
    return Workspace(ws.name, {k: moved(v) if k.endswith("ADDRESS") else v for k, v in ws.env.items()})


def _workspace(engine: Engine, container: str, name: str) -> Workspace:
    """`stategate workspace env` run inside the container."""
    out = engine.docker("exec", container, "stategate", "workspace", "env", name).stdout.decode()
    env = dict(t.split("=", 1) for t in shlex.split(out, comments=True) if t != "export" and "=" in t)
    return Workspace(name, env)


def test_the_two_node_example_serves_through_either_node(engine, images, tmp_path):
    """docker/compose.nodes.yaml as written: two stategate containers on one PostgreSQL
    container (docker/postgres, Debian's PostgreSQL 15) and one Garage. Both come up
    healthy on the one index; a lock taken through node a is refused through node b
    naming its holder; the holder's write through b is read through a; with node a
    killed, node b goes on and the lock stays held (a row, not a's memory)."""
    run = uuid.uuid4().hex[:8]
    try:
        postgres = engine.build_postgres(f"stategate-test-postgres:{run}", images.base)
    except DockerError as err:
        pytest.fail(f"building the PostgreSQL image failed: {err}", pytrace=False)
    port_a, port_b, pg, s3, rpc, admin = (free_port() for _ in range(6))
    compose = Compose(engine, REPO / "docker" / "compose.nodes.yaml", f"sgnodes{run}", {
        "STATEGATE_IMAGE": images.stategate,
        "GARAGE_IMAGE": images.garage,
        "POSTGRES_IMAGE": postgres,
        "POSTGRES_PASSWORD": secrets.token_hex(16),
        "POSTGRES_PORT": str(pg),
        "STATEGATE_DEK": base64.b64encode(secrets.token_bytes(32)).decode(),
        "GARAGE_RPC_SECRET": secrets.token_hex(32),
        "GARAGE_KEY_ID": "GK" + secrets.token_hex(12),
        "GARAGE_KEY_SECRET": secrets.token_hex(32),
        "GARAGE_S3_PORT": str(s3),
        "GARAGE_RPC_PORT": str(rpc),
        "GARAGE_ADMIN_PORT": str(admin),
        "NODE_A_LISTEN": f"127.0.0.1:{port_a}",
        "NODE_B_LISTEN": f"127.0.0.1:{port_b}",
    })
    urls = {"a": f"http://127.0.0.1:{port_a}", "b": f"http://127.0.0.1:{port_b}"}
    try:
        try:
            compose.up()
        except DockerError as err:
            pytest.fail(f"compose up failed: {err}\n{compose.logs()}", pytrace=False)
        for node, url in urls.items():
            try:
                # A node started before PostgreSQL accepted connections is restarted.
                wait_for(lambda url=url: _answers(url), 120, f"node {node} at {url}")
            except AssertionError as e:
                raise AssertionError(f"{e}\n{compose.logs(tail=200)}") from None
        a, b = (compose.container(f"stategate-{n}") for n in "ab")
        wa, wb = _workspace(engine, a, "nodes"), _workspace(engine, b, "nodes")
        assert wa.password == wb.password, "one DEK: one credential on both nodes"
        # The addresses name the public URL (the load balancer's); go to each node.
        wa, wb = _through(wa, urls["a"]), _through(wb, urls["b"])

        held = lock_info(who="ci@docker-a")
        assert wa.lock(held).status == 200
        refused = wb.lock(lock_info())
        assert refused.status == 423 and refused.json()["ID"] == held["ID"], refused
        lineage = str(uuid.uuid4())
        r = http("POST", f"{wb.address}?ID={held['ID']}", tfstate(1, lineage, "through-b"),
                 user=wb.user, password=wb.password)
        assert r.status == 200, r
        assert wa.get().json()["serial"] == 1

        engine.docker("kill", a)
        r = http("POST", f"{wb.address}?ID={held['ID']}", tfstate(2, lineage, "a-is-gone"),
                 user=wb.user, password=wb.password)
        assert r.status == 200, r
        assert wb.get().json()["serial"] == 2
        assert wb.lock(lock_info()).status == 423, "the lock is a row: it outlives node a"
        assert wb.unlock(held).status == 200
    finally:
        (tmp_path / "compose-nodes.log").write_text(compose.logs(tail=400))
        compose.down(volumes=True)


"""Peak memory of a real `stategate serve` (VmHWM from /proc/<pid>/status) while it
takes and serves large states: a 256 MiB POST then GET must stay below 96 MiB, and
8 concurrent 64 MiB uploads below 160 MiB; `stategate workspace rollback` to a 64 MiB
version (which reads, renumbers and writes it) stays below 96 MiB as well. Bodies are streamed from generators, so
the test process holds none of them whole either.

Part of the suite (about 5 minutes on a debug build: it hashes and seals ~1 GiB);
`-s` prints the figures. The release figures come from the load harness (benches/)."""
import base64
import http.client
import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from harness import Server, cli, json_lines, stategate_bin
from harness import http as request

MiB = 1 << 20
PIECE = 64 * 1024


def state_pieces(size: int, lineage: str):
    """A valid tfstate of exactly `size` bytes, yielded in 64 KiB pieces."""
    head = ('{"version":4,"serial":1,"lineage":"%s","outputs":{},"resources":[{"pad":"' % lineage).encode()
    tail = b'"}]}'
    pad = size - len(head) - len(tail)
    yield head
    filler = b"0123456789abcdef" * (PIECE // 16)
    while pad > 0:
        n = min(pad, PIECE)
        yield filler[:n]
        pad -= n
    yield tail


def post(ws, size: int):
    url = urlparse(ws.address)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    auth = base64.b64encode(f"{ws.user}:{ws.password}".encode()).decode()
    conn.putrequest("POST", url.path)
    conn.putheader("Authorization", f"Basic {auth}")
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    for piece in state_pieces(size, ws.name):
        conn.send(piece)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 200, (resp.status, body[:300])


def get_digest(ws) -> tuple[int, str]:
    url = urlparse(ws.address)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    auth = base64.b64encode(f"{ws.user}:{ws.password}".encode()).decode()
    conn.request("GET", url.path, headers={"Authorization": f"Basic {auth}"})
    resp = conn.getresponse()
    assert resp.status == 200
    h, n = hashlib.sha256(), 0
    while piece := resp.read(PIECE):
        h.update(piece)
        n += len(piece)
    conn.close()
    return n, h.hexdigest()


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def expected_digest(size: int, lineage: str) -> str:
    h = hashlib.sha256()
    for piece in state_pieces(size, lineage):
        h.update(piece)
    return h.hexdigest()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "data", "local",
               extra_env={"STATEGATE_MAX_STATE_BYTES": str(512 * MiB),
                          "STATEGATE_MAX_INFLIGHT_BODY_BYTES": str(512 * MiB)}).start()
    yield s
    s.stop()


def test_256_mib_state_round_trip_in_bounded_memory(server):
    ws = server.workspace("huge")
    base = vm_hwm_mib(server.proc.pid)
    post(ws, 256 * MiB)
    after_post = vm_hwm_mib(server.proc.pid)
    assert get_digest(ws) == (256 * MiB, expected_digest(256 * MiB, "huge"))
    after_get = vm_hwm_mib(server.proc.pid)
    print(f"\nVmHWM: idle {base:.1f} MiB, after 256 MiB POST {after_post:.1f} MiB, after GET {after_get:.1f} MiB")
    assert after_get < 96, after_get


def test_8_concurrent_64_mib_uploads_in_bounded_memory(server):
    spaces = [server.workspace(f"c{i}") for i in range(8)]
    errors = []

    def run(ws):
        try:
            post(ws, 64 * MiB)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(ws,)) for ws in spaces]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    peak = vm_hwm_mib(server.proc.pid)
    print(f"\nVmHWM after 8 concurrent 64 MiB uploads: {peak:.1f} MiB")
    assert peak < 160, peak


def test_rollback_to_a_64_mib_version_in_bounded_memory(server):
    """The rollback reads the old version as a stream (to find its serial, to compare
    it with the current one, and to write it with a fresh serial), never whole."""
    ws = server.workspace("back")
    post(ws, 64 * MiB)
    small = json.dumps({"version": 4, "serial": 9, "lineage": "back", "outputs": {},
                        "resources": []}).encode()
    assert request("POST", ws.address, small, user=ws.user, password=ws.password).status == 200
    # VmHWM of the running CLI, polled: wait4's ru_maxrss would also count this test
    # process's own peak, which the child inherits across fork and exec.
    cmd = subprocess.Popen([str(stategate_bin()), "workspace", "rollback", "back", "--to", "1"],
                           env=server.env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0.0
    while cmd.poll() is None:
        try:
            peak = max(peak, vm_hwm_mib(cmd.pid))
        except (OSError, AssertionError):  # exited between poll() and the read
            break
        time.sleep(0.02)
    out, err = cmd.communicate()
    assert cmd.returncode == 0, (out, err)
    assert peak > 0, "the CLI ended before its memory could be read"
    print(f"\npeak RSS of `stategate workspace rollback` to a 64 MiB version: {peak:.1f} MiB")
    assert peak < 96, peak
    rows = json_lines(cli(server, "workspace", "history", "back", "--json").stdout)
    assert [r["version"] for r in rows] == [3, 2, 1]
    # Version 1's content with a serial above every stored one (9), byte for byte otherwise.
    assert rows[0]["serial"] == 10 and rows[0]["size"] == rows[2]["size"] + 1

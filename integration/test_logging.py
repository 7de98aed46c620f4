"""The server's log never holds up a request: a reader of its stderr that stalls (a
container log driver that stopped reading, a full pipe) leaves requests answered,
and the lines logged before a graceful stop are all written out."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

from harness import Server, http, stategate_bin

# One access-log line per request, ~150 bytes: 3,000 requests are ~7 pipe buffers.
REQUESTS = 3000


def test_a_stalled_stderr_reader_does_not_stall_requests(check_binary, tmp_path: Path):
    srv = Server(data_dir=tmp_path / "data", store="local")
    env = srv.env()
    env["STATEGATE_LOG"] = "info"
    # stderr is a pipe nobody reads until the end: once its buffer is full, a write
    # to it blocks.
    proc = subprocess.Popen([str(stategate_bin()), "serve"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if srv.healthy():
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        answered, failed = [], []

        def ask():
            try:
                for _ in range(REQUESTS):
                    answered.append(http("GET", f"{srv.url}/healthz", timeout=10).status)
            except OSError as e:
                failed.append(repr(e))

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(120)
        assert not asker.is_alive() and not failed, \
            f"requests stalled after {len(answered)} answers: {failed}"
        assert answered == [200] * REQUESTS
        # A graceful stop writes out what was still queued: the last line is there.
        proc.send_signal(signal.SIGTERM)
        log = proc.stderr.read().decode(errors="replace")
        assert proc.wait(60) == 0
        assert "stopped: no request in flight" in log.splitlines()[-1], log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

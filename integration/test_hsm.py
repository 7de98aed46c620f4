"""The root key kept by a real PKCS#11 token (SoftHSM2 in a temp dir): a fresh
`stategate serve` with key.service = "pkcs11" makes its key and writes only the
wrapped form; the real Terraform CLI applies and reads back through it, across a
restart; a wrong PIN stops the restart with the reason and writes nothing; no key
material or PIN reaches the server's log.

Tokens are made with softhsm2-util and pkcs11-tool (scripts/setup-test-deps.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from harness import BACKEND_HTTP, Server, data_resource, stategate_bin

MODULE = "/usr/lib/softhsm/libsofthsm2.so"
PIN = "40392817"


def _token(base: Path) -> dict:
    """A SoftHSM2 token `stategate` with a non-extractable AES-256 key `root-wrap`."""
    tokens = base / "tokens"
    tokens.mkdir(parents=True)
    conf = base / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tokens}\nobjectstore.backend = file\n")
    env = dict(os.environ, SOFTHSM2_CONF=str(conf))
    for cmd in (
        ["softhsm2-util", "--init-token", "--free", "--label", "stategate",
         "--so-pin", "1029384756", "--pin", PIN],
        ["pkcs11-tool", "--module", MODULE, "--token-label", "stategate", "--login",
         "--pin", PIN, "--keygen", "--key-type", "AES:32", "--label", "root-wrap"],
    ):
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=60)
    pin_file = base / "pin"
    pin_file.write_text(PIN + "\n")
    return {
        "SOFTHSM2_CONF": str(conf),
        "STATEGATE_KEY_SERVICE": "pkcs11",
        "STATEGATE_KEY_PKCS11_MODULE": MODULE,
        "STATEGATE_KEY_PKCS11_TOKEN_LABEL": "stategate",
        "STATEGATE_KEY_PKCS11_KEY_LABEL": "root-wrap",
        "STATEGATE_KEY_PKCS11_PIN_FILE": str(pin_file),
    }


def _files(d: Path) -> dict:
    """Every file under the data dir with its bytes (the SQLite WAL aside)."""
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm", ".lock"))
    }


def test_serve_with_a_wrapped_key_and_a_real_terraform_round_trip(tmp_path, make_tf):
    hsm = _token(tmp_path / "hsm")
    data = tmp_path / "data"
    server = Server(data_dir=data, store="local", extra_env=hsm)
    server.start()
    try:
        wrapped = data / "stategate.key.wrapped"
        assert wrapped.exists(), server.log_tail()
        assert not (data / "dek").exists(), "a plain key file was written beside the wrapped one"
        body = json.loads(wrapped.read_text())
        assert body["format"] == "stategate-wrapped-key/1"
        assert body["service"] == "pkcs11 token 'stategate' key 'root-wrap'"

        ws_name = f"hsm-{uuid.uuid4().hex[:8]}"
        ws = server.workspace(ws_name)
        tf = make_tf("w", ws.env)
        tf.write(BACKEND_HTTP + data_resource("a", "kept-by-the-token"))
        tf.init()
        r = tf.apply()
        assert "1 added" in r.stdout, r
        pulled = json.loads(tf.run("state", "pull").stdout)
        assert pulled["resources"][0]["instances"][0]["attributes"]["input"]["value"] == "kept-by-the-token"
        got = ws.get()
        assert got.status == 200 and got.json()["serial"] == pulled["serial"], got

        # A restart unwraps the same key: the credentials and the state are unchanged.
        server.restart()
        assert server.workspace(ws_name).env["TF_HTTP_PASSWORD"] == ws.env["TF_HTTP_PASSWORD"]
        tf.plan_no_changes()
        assert json.loads(tf.run("state", "pull").stdout) == pulled

        # Neither the key, the PIN nor a derived credential reaches the log.
        log = server.log_text()
        for secret in (PIN, ws.env["TF_HTTP_PASSWORD"], body["keys"]["dek"]):
            assert secret not in log, f"{secret[:6]}… in the server log"
        # The token is asked once per start, its key handed to the app and the backup
        # service (on by default): the first start made the key (no unwrap), the
        # restart unwrapped it exactly once.
        assert log.count("root key unwrapped") == 1, log
    finally:
        server.stop()

    # A wrong PIN stops the restart with the reason; nothing in the data dir changes.
    before = _files(data)
    wrong = tmp_path / "hsm" / "wrong-pin"
    wrong.write_text("11111111\n")
    bad = Server(data_dir=data, store="local",
                 extra_env=dict(hsm, STATEGATE_KEY_PKCS11_PIN_FILE=str(wrong)))
    with pytest.raises(RuntimeError) as failed:
        bad.start(timeout=30)
    assert "PKCS#11 login to token 'stategate' refused: wrong PIN" in str(failed.value), failed.value
    assert _files(data) == before

    # The same for a command: one line naming what failed, exit 1.
    p = subprocess.run([str(stategate_bin()), "workspace", "env", "x"], env=bad.env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p
    assert "wrong PIN" in p.stderr and PIN not in p.stderr, p.stderr
    assert _files(data) == before

"""Drift checks with the real binary and the real Terraform CLI, while `stategate serve`
runs on the same data dir: a check of a `terraform_data` configuration whose input
comes from the check's own `-var-file` is in sync; changing that file makes the next
check drifted (a test HTTP server receives the webhook and verifies its HMAC
signature; /metrics flips; the plan is kept sealed in the blob store, not in the data
dir); `drift apply` applies exactly the kept plan (audited, then deleted from the
store), and the next check is in sync again; a plan kept across a newer apply is refused as stale;
approving twice or a run that was not drifted is refused; in a real browser, an
operator sees the drifted run in the web UI, approves it by typing the workspace's
name, sees the apply finish and starts an in-sync check. A workspace locked by
another client (a LOCK request, and a real `terraform apply` blocked in a provisioner)
is `skipped_locked` and the holder untouched (the apply finishes); a check that hangs is
killed with its process group at its timeout and leaves the workspace unlocked (the
lock it took force-cleared and audited); a missing directory or binary is an error
outcome with a clear message. Once per store.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from browser_support import Page, artifacts_dir, browser  # noqa: F401 (a fixture)
from harness import BACKEND_HTTP, Server, http as http_call, lock_info, stategate_bin, venv_dir, cli
from store_support import stored_object



def run_check(server, ws: str) -> dict:
    return json.loads(cli(server, "drift", "run", ws, "--json").stdout)


class Hooks:
    """A webhook receiver: records every POST (headers, body); answers 200."""

    def __init__(self):
        self.events: list[tuple[dict, bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def verified(secret: str, headers: dict, body: bytes) -> dict:
    """What a receiver does: recompute HMAC-SHA256(secret, "<t>.<body>"), compare in
    constant time, refuse old timestamps; the body's timestamp is the signed one."""
    fields = dict(part.split("=", 1) for part in headers["x-stategate-signature"].split(","))
    expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, fields["v1"]), "bad signature"
    assert abs(time.time() - int(fields["t"])) < 300, "old event"
    event = json.loads(body)
    assert event["timestamp"] == int(fields["t"])
    return event


def metric(server, name: str, ws: str) -> str | None:
    text = http_call("GET", f"{server.url}/metrics").text()
    prefix = f'{name}{{workspace="{ws}"}} '
    return next((line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)), None)


def lock_held(server, ws: str) -> bool:
    """Read-only look at the lock table (no LOCK probe that could race the apply)."""
    return server.query("SELECT count(*) FROM tf_locks WHERE workspace = ?", (ws,))[0][0] == 1


def config_file(path: Path, checks: list[dict], webhooks: list[str] = ()) -> Path:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(str(v))

    lines = ["[drift_settings]", f"webhooks = {value(list(webhooks))}", "lock_timeout_seconds = 1",
             "webhook_attempts = 2", ""]
    for c in checks:
        lines.append("[[drift]]")
        lines += [f"{k} = {value(v)}" for k, v in c.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


TERRAFORM = str(venv_dir() / "bin" / "terraform")
MAIN = BACKEND_HTTP + 'variable "v" {\n  type = string\n}\nresource "terraform_data" "a" {\n  input = var.v\n}\n'


def tf_env_for_check(tf_env: dict) -> dict:
    return {"TF_CLI_CONFIG_FILE": tf_env["TF_CLI_CONFIG_FILE"], "CHECKPOINT_DISABLE": "1"}


def test_in_sync_drifted_approved_apply_in_sync(server_factory, ws_name, make_tf, tf_env, tmp_path):
    hooks = Hooks()
    try:
        tfdir = tmp_path / "w"
        cfg = config_file(tmp_path / "drift.toml", [{
            "workspace": ws_name, "dir": str(tfdir), "binary": TERRAFORM,
            "var_files": ["drift.tfvars"], "interval_seconds": 0, "timeout_seconds": 60,
            "approve_apply": True, "env": tf_env_for_check(tf_env),
        }], [hooks.url])
        server = server_factory.new(STATEGATE_CONFIG=cfg)
        ws = server.workspace(ws_name)
        tf = make_tf("w", ws.env)
        tf.write(MAIN)
        (tfdir / "drift.tfvars").write_text('v = "one"\n')
        tf.init()
        tf.apply("-var-file=drift.tfvars")
        secret = cli(server, "drift", "webhook-secret").stdout.strip()

        # in sync: planned against the current serial; nothing to notify yet
        first = run_check(server, ws_name)
        assert first["outcome"] == "in_sync", first
        assert first["serial"] == ws.get().json()["serial"] and first["exit_code"] == 0, first
        assert hooks.events == []
        assert metric(server, "stategate_drift_status", ws_name) == "0"
        assert float(metric(server, "stategate_drift_last_check_timestamp_seconds", ws_name)) > 0

        # the input the check reads changes: drifted, with counts, a kept plan, an event
        (tfdir / "drift.tfvars").write_text('v = "two"\n')
        drifted = run_check(server, ws_name)
        assert drifted["outcome"] == "drifted" and drifted["exit_code"] == 2, drifted
        assert drifted["changes"] == {"add": 0, "change": 1, "destroy": 0}, drifted
        assert drifted["approvable"] is True, drifted
        assert len(hooks.events) == 1, hooks.events
        event = verified(secret, *hooks.events[0])
        assert (event["event"], event["workspace"], event["run"]) == ("drift.outcome_changed", ws_name, drifted["id"])
        assert (event["previous"], event["outcome"]) == ("in_sync", "drifted"), event
        assert metric(server, "stategate_drift_status", ws_name) == "1"
        shown = cli(server, "drift", "show", str(drifted["id"])).stdout
        assert '"one" -> "two"' in shown and "1 to change" in shown, shown
        # the plan is kept sealed in the blob store (any node sharing it can apply it),
        # never as a file in the data dir
        plan_key = f"drift/plans/{drifted['id']}.plan"
        sealed = stored_object(server, plan_key)
        assert sealed is not None, "the kept plan is in the store"
        assert not sealed.startswith(b"PK") and b"terraform_data" not in sealed, "sealed at rest"
        assert not (server.data_dir / "drift" / "plans").exists()
        assert oct((server.data_dir / "drift").stat().st_mode & 0o777) == "0o700"

        # refusals: a run that is not drifted
        refused = cli(server, "drift", "apply", str(first["id"]), "--yes", ok=False)
        assert refused.returncode != 0 and "not a drifted check" in refused.stderr, refused.stderr

        # the approved apply applies exactly the kept plan, once
        applied = json.loads(cli(server, "drift", "apply", str(drifted["id"]), "--yes", "--json").stdout)
        assert applied["outcome"] == "applied" and applied["applies"] == drifted["id"], applied
        assert ws.get().json()["resources"][0]["instances"][0]["attributes"]["input"]["value"] == "two"
        assert stored_object(server, plan_key) is None, "a used plan is deleted"
        twice = cli(server, "drift", "apply", str(drifted["id"]), "--yes", ok=False)
        assert twice.returncode != 0 and "already approved" in twice.stderr, twice.stderr
        audit = [json.loads(line) for line in cli(server, "admin", "audit", "list", "--scope", f"tf/{ws_name}", "--json").stdout.splitlines()]
        events = [a["event"] for a in audit]
        assert "drift.apply_approved" in events and "drift.applied" in events, events

        # in sync again: the change back is an event too
        again = run_check(server, ws_name)
        assert again["outcome"] == "in_sync", again
        assert len(hooks.events) == 2
        event = verified(secret, *hooks.events[1])
        assert (event["previous"], event["outcome"]) == ("drifted", "in_sync"), event
        assert metric(server, "stategate_drift_status", ws_name) == "0"

        # a plan kept across a newer apply: Terraform refuses it, and the CLI says so
        (tfdir / "drift.tfvars").write_text('v = "three"\n')
        stale_check = run_check(server, ws_name)
        assert stale_check["outcome"] == "drifted", stale_check
        assert stale_check["state_moved"] is False, stale_check
        tf.apply("-var-file=drift.tfvars")
        moved = json.loads(cli(server, "drift", "show", str(stale_check["id"]), "--json").stdout)["run"]
        assert moved["state_moved"] is True and moved["approvable"] is True, moved
        stale = cli(server, "drift", "apply", str(stale_check["id"]), "--yes", ok=False)
        assert stale.returncode != 0 and "Saved plan is stale" in stale.stderr, stale.stderr
        listed = [json.loads(line) for line in cli(server, "drift", "list", "--workspace", ws_name, "--json").stdout.splitlines()]
        assert listed[0]["outcome"] == "stale_plan" and listed[0]["applies"] == stale_check["id"], listed[0]
        table = cli(server, "drift", "list").stdout
        assert table.splitlines()[0].split()[:4] == ["RUN", "WORKSPACE", "KIND", "OUTCOME"], table

        # the admin API shows the same and starts a check (202, then poll)
        token = cli(server, "admin", "operator", "create", "--email", "ops@example.com").stdout.strip().split()[-1]
        overview = http_call("GET", f"{server.url}/api/v1/admin/drift", bearer=token)
        assert overview.status == 200, overview
        body = overview.json()
        assert body["checks"][0]["workspace"] == ws_name and body["checks"][0]["status"] == "drifted", body
        started = http_call("POST", f"{server.url}/api/v1/admin/drift/{ws_name}/run", bearer=token)
        assert started.status == 202, started
        run_id = started.json()["run"]
        deadline = time.monotonic() + 60
        while True:
            got = http_call("GET", f"{server.url}/api/v1/admin/drift/{run_id}", bearer=token).json()
            if got["run"]["finished_at"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert got["run"]["outcome"] == "in_sync" and "ops@example.com" in got["run"]["trigger"], got
        assert got["output"] is not None
    finally:
        hooks.close()


def test_locked_workspace_is_skipped_and_bad_checks_are_errors(server_factory, ws_name, make_tf, tf_env, tmp_path):
    tfdir = tmp_path / "w"
    cfg = config_file(tmp_path / "drift.toml", [
        {"workspace": ws_name, "dir": str(tfdir), "binary": TERRAFORM, "interval_seconds": 0,
         "env": tf_env_for_check(tf_env)},
        {"workspace": ws_name + "-nodir", "dir": str(tmp_path / "missing"), "binary": TERRAFORM},
        {"workspace": ws_name + "-noconf", "dir": str(tmp_path), "binary": TERRAFORM},
        {"workspace": ws_name + "-nobin", "dir": str(tfdir), "binary": "no-such-tofu"},
    ])
    server = server_factory.new(STATEGATE_CONFIG=cfg)
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    tf.write(BACKEND_HTTP + 'resource "terraform_data" "a" {\n  input = "x"\n}\n')
    tf.init()
    tf.apply()

    holder = lock_info(who="someone-applying@elsewhere")
    assert ws.lock(holder).status == 200
    skipped = run_check(server, ws_name)
    assert skipped["outcome"] == "skipped_locked", skipped
    assert "someone-applying@elsewhere" in skipped["message"], skipped
    assert skipped["locked_by"] == "someone-applying@elsewhere", skipped
    again = ws.lock(lock_info())
    assert again.status == 423 and again.json()["ID"] == holder["ID"], "the holder was not disturbed"
    assert metric(server, "stategate_drift_status", ws_name) is None, "a skipped check says nothing"
    assert ws.unlock(holder).status == 200
    assert run_check(server, ws_name)["outcome"] == "in_sync"

    # a real apply holding the lock (blocked in a provisioner): skipped, the apply unharmed
    tf.write(BACKEND_HTTP + 'resource "terraform_data" "a" {\n  input = "x"\n}\n'
             + 'resource "terraform_data" "slow" {\n  provisioner "local-exec" {\n    command = "sleep 4"\n  }\n}\n')
    applying = tf.start("apply", "-auto-approve", "-input=false", "-no-color")
    deadline = time.monotonic() + 30
    while not lock_held(server, ws_name):
        assert time.monotonic() < deadline and applying.poll() is None, "the apply never took the lock"
        time.sleep(0.1)
    during = run_check(server, ws_name)
    assert during["outcome"] == "skipped_locked" and "OperationTypeApply" in during["message"], during
    done = tf.finish(applying, ["apply"])
    assert done.returncode == 0, str(done)
    assert "terraform_data.slow" in [r["type"] + "." + r["name"] for r in ws.get().json()["resources"]]

    for suffix, why in (("-nodir", "does not exist"), ("-noconf", "has no configuration"),
                        ("-nobin", "was not found on PATH")):
        bad = run_check(server, ws_name + suffix)
        assert bad["outcome"] == "error" and why in bad["message"], bad
    assert server.alive()


HANG = """#!{python}
import json, os, subprocess, sys, time, urllib.request, base64
if sys.argv[1] == "init":
    os.makedirs(".terraform", exist_ok=True)
    sys.exit(0)
if sys.argv[1] == "plan":
    info = {{"ID": "hung-plan-lock", "Operation": "OperationTypePlan", "Who": "drift@test",
            "Created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "Info": "", "Version": "1", "Path": ""}}
    req = urllib.request.Request(os.environ["TF_HTTP_LOCK_ADDRESS"], data=json.dumps(info).encode(), method="LOCK")
    cred = base64.b64encode((os.environ["TF_HTTP_USERNAME"] + ":" + os.environ["TF_HTTP_PASSWORD"]).encode()).decode()
    req.add_header("Authorization", "Basic " + cred)
    urllib.request.urlopen(req).read()
    child = subprocess.Popen(["sleep", {marker!r}])
    open("grandchild-started", "w").write(str(child.pid))
    time.sleep(300)
"""


def pids_running(argv: list[str]) -> list[int]:
    """Host pids of live (not zombie) processes whose command line is exactly `argv`: the
    sandboxed child's own pids are those of its PID namespace, so it cannot tell us."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if [c.decode(errors="replace") for c in cmdline] == argv and state != "Z":
            found.append(int(proc.name))
    return found


def test_hung_check_is_killed_and_leaves_the_workspace_unlocked(server_factory, ws_name, tmp_path):
    tfdir = tmp_path / "w"
    tfdir.mkdir()
    (tfdir / "main.tf").write_text(BACKEND_HTTP)
    # A sleep no other process runs: found by its command line after the timeout.
    marker = f"300.{os.getpid()}{time.monotonic_ns() % 100000}"
    fake = tmp_path / "fake-tofu"
    fake.write_text(HANG.format(python=sys.executable, marker=marker))
    fake.chmod(0o755)
    cfg = config_file(tmp_path / "drift.toml", [{
        "workspace": ws_name, "dir": str(tfdir), "binary": str(fake), "interval_seconds": 0,
        "timeout_seconds": 3,
    }])
    server = server_factory.new(STATEGATE_CONFIG=cfg)
    ws = server.workspace(ws_name)

    started = time.monotonic()
    hung = run_check(server, ws_name)
    assert time.monotonic() - started < 30
    assert hung["outcome"] == "error" and "timeout" in hung["message"], hung
    assert "force-cleared" in hung["message"], hung
    probe = lock_info()
    assert ws.lock(probe).status == 200, "the workspace was left unlocked"
    assert ws.unlock(probe).status == 200
    assert (tfdir / "grandchild-started").exists(), "the child started its own child"
    deadline = time.monotonic() + 5
    while survivors := pids_running(["sleep", marker]):
        assert time.monotonic() < deadline, f"the child's own child {survivors} survived the timeout"
        time.sleep(0.05)
    audit = [json.loads(line) for line in cli(server, "admin", "audit", "list", "--scope", f"tf/{ws_name}", "--event", "tf.lock_forced", "--json").stdout.splitlines()]
    assert [a["actor"] for a in audit] == [f"drift:run-{hung['id']}"], audit
    assert audit[0]["payload"]["lock_id"] == "hung-plan-lock"
    assert os.path.exists(server.data_dir / "drift")


def test_drift_in_the_web_ui(browser, check_binary, make_tf, tf_env, tmp_path):
    """Once, on the local store (the UI calls the same DriftService the tests above cover)."""
    ws_name = "drift-ui-e2e"
    operator = "drift-ui@example.com"
    tfdir = tmp_path / "w"
    cfg = config_file(tmp_path / "drift.toml", [{
        "workspace": ws_name, "dir": str(tfdir), "binary": TERRAFORM, "var_files": ["drift.tfvars"],
        "interval_seconds": 0, "timeout_seconds": 60, "approve_apply": True, "env": tf_env_for_check(tf_env),
    }])
    server = Server(data_dir=tmp_path / "data", store="local", extra_env={"STATEGATE_CONFIG": str(cfg)}).start()
    try:
        ws = server.workspace(ws_name)
        tf = make_tf("w", ws.env)
        tf.write(MAIN)
        (tfdir / "drift.tfvars").write_text('v = "one"\n')
        tf.init()
        tf.apply("-var-file=drift.tfvars")
        (tfdir / "drift.tfvars").write_text('v = "two"\n')
        drifted = run_check(server, ws_name)
        assert drifted["outcome"] == "drifted", drifted
        token = cli(server, "admin", "operator", "create", "--email", operator).stdout.strip().split()[-1]

        # Every drift page gets the browser suite's checks (no sideways scrolling, no
        # serious axe-core violation, screenshots at both widths into $STATEGATE_ARTIFACTS).
        page = Page(browser, server.url, artifacts_dir("drift-ui"))
        page.open("/ui/login")
        page.login(token)
        page.wait_text("Workspaces", operator)

        # The drift page: the check is drifted, its plan awaiting approval.
        browser.find_element(page.By.LINK_TEXT, "Drift").click()
        page.wait_text("Recent runs", ws_name, "drifted", "awaiting approval", "0 to add, 1 to change, 0 to destroy")
        page.check("drift-01-checks")
        browser.find_element(page.By.LINK_TEXT, f"#{drifted['id']}").click()
        page.wait_text(f"Drift check #{drifted['id']}", '"one" -> "two"', "Approve and apply")
        page.check("drift-02-drifted-run")

        # Approve with the typed name: the apply run's page, reloading until it is done.
        page.fill("#approve input[name=confirm]", ws_name)
        page.submit("#approve")
        text = page.wait_text("Drift apply #", f"check #{drifted['id']}", "Apply complete!")
        assert f"operator:{operator}" in text, text
        assert "applied" in text, text
        page.check("drift-03-applied")
        assert ws.get().json()["resources"][0]["instances"][0]["attributes"]["input"]["value"] == "two"

        # Run check now: in sync again.
        browser.find_element(page.By.LINK_TEXT, "Drift").click()
        page.wait_text("Run check now")
        page.css(f"form[action='/ui/drift/{ws_name}/run'] button").click()
        text = page.wait_text("Drift check #", "in_sync", "0 to add, 0 to change, 0 to destroy")
        assert "still going" not in text, text
        page.check("drift-04-in-sync")

        # On a phone-sized screen the drift pages still fit (wide tables scroll in their box).
        browser.set_window_size(390, 844)
        for path in ("/ui/drift", f"/ui/drift/{drifted['id']}", f"/ui/workspaces/{ws_name}"):
            page.open(path)
            page.wait_text(operator, "in_sync" if "workspaces" in path else "Drift")
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{path} is {overflow}px wider than a phone screen"
    finally:
        server.stop()


PLAINTEXT = """#!/bin/sh
cmd="$1"; shift
case "$cmd" in
init) mkdir -p .terraform; exit 0 ;;
plan)
  for a in "$@"; do case "$a" in -out=*) out="${{a#-out=}}" ;; esac; done
  printf '%s' {plan!r} > "$out"
  echo '{{"type":"change_summary","@message":"Plan: 0 to add, 1 to change, 0 to destroy.","changes":{{"add":0,"change":1,"remove":0}}}}'
  exit 2 ;;
show) echo "human text of the saved plan"; exit 0 ;;
apply) touch applying; exec sleep {sleep!r} ;;
esac
exit 1
"""


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_no_plaintext_plan_outlives_a_sigkilled_server(server_factory, ws_name, tmp_path):
    """Issue 20 item 6: an approved apply writes the kept plan in clear for its child;
    the server is SIGKILLed mid-apply; the child dies with it (the sandbox's
    die-with-parent) and after the restart no plaintext plan is left anywhere in the
    data dir (the kept plan is sealed; the work file was swept at startup)."""
    tfdir = tmp_path / "w"
    tfdir.mkdir()
    (tfdir / "main.tf").write_text(BACKEND_HTTP)
    marker = f"PLAINTEXT-PLAN-{os.getpid()}-{time.monotonic_ns()}"
    sleep = f"300.{time.monotonic_ns() % 100000}"
    fake = tmp_path / "fake-tofu"
    fake.write_text(PLAINTEXT.format(plan=marker, sleep=sleep))
    fake.chmod(0o755)
    cfg = config_file(tmp_path / "drift.toml", [{
        "workspace": ws_name, "dir": str(tfdir), "binary": str(fake), "interval_seconds": 0,
        "timeout_seconds": 600, "approve_apply": True,
    }])
    server = server_factory.new(STATEGATE_CONFIG=cfg)
    drifted = run_check(server, ws_name)
    assert drifted["outcome"] == "drifted" and drifted["approvable"], drifted
    assert files_containing(server.data_dir, marker.encode()) == [], "the kept plan is sealed"
    token = cli(server, "admin", "operator", "create", "--email", "ops@example.com").stdout.strip().split()[-1]
    approved = http_call("POST", f"{server.url}/api/v1/admin/drift/{drifted['id']}/apply", bearer=token)
    assert approved.status == 202, approved
    deadline = time.monotonic() + 30
    while not (tfdir / "applying").exists():
        assert time.monotonic() < deadline, f"the apply never started:\n{server.log_tail()}"
        time.sleep(0.05)
    in_use = files_containing(server.data_dir, marker.encode())
    assert len(in_use) == 1 and "work" in in_use[0].parts, in_use

    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    deadline = time.monotonic() + 5
    while survivors := pids_running(["sleep", sleep]):
        assert time.monotonic() < deadline, f"the apply's child {survivors} outlived the server"
        time.sleep(0.05)
    assert in_use[0].exists(), "the crash left the plaintext (what the restart must clean)"

    server.start()
    assert files_containing(server.data_dir, marker.encode()) == [], "plaintext survived the restart"
    assert list((server.data_dir / "drift" / "work").iterdir()) == []


NOSY = """#!/bin/sh
case "$1" in
init) mkdir -p .terraform; exit 0 ;;
plan)
  {{
  echo "PPID $PPID"
  for f in /proc/$PPID/environ /proc/$PPID/cmdline /proc/{pid}/environ /proc/{pid}/cmdline \\
           /proc/{pid}/maps /proc/{pid}/mem {data}/dek {data}/stategate.db {config}; do
    if head -c 65536 "$f" 2>/dev/null | tr '\\0' '\\n' | grep -q .; then
      echo "READ $f"; head -c 65536 "$f" 2>/dev/null | tr '\\0' '\\n'; echo
    else
      echo "DENIED $f"
    fi
  done
  }} > report
  echo '{{"type":"change_summary","@message":"No changes.","changes":{{"add":0,"change":0,"remove":0}}}}'
  exit 0 ;;
esac
exit 1
"""


def test_a_drift_child_reads_nothing_of_the_server(server_factory, ws_name, tmp_path):
    """Issue 20 item 3, on the real binary with the DEK and the cluster key in its
    environment: a check started through the admin API (so the server itself is the
    child's parent) tries the server's /proc files, the data dir's DEK file and
    database and the config file, and gets none of them."""
    tfdir = tmp_path / "w"
    tfdir.mkdir()
    (tfdir / "main.tf").write_text(BACKEND_HTTP)
    dek = base64.b64encode(os.urandom(32)).decode()
    cluster_key = base64.b64encode(os.urandom(32)).decode()
    fake = tmp_path / "nosy-tofu"
    cfg = tmp_path / "drift.toml"
    config_file(cfg, [{"workspace": ws_name, "dir": str(tfdir), "binary": str(fake), "interval_seconds": 0}])
    server = server_factory.new(STATEGATE_CONFIG=cfg, STATEGATE_DEK=dek, ADJ_STATE_ENC_KEY=cluster_key)
    # As a default install keeps it (here the environment's DEK is the one in use).
    (server.data_dir / "dek").write_text(dek)
    fake.write_text(NOSY.format(pid=server.proc.pid, data=server.data_dir, config=cfg))
    fake.chmod(0o755)
    environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes()
    assert dek.encode() in environ, "the server really holds the DEK in its environment"

    token = cli(server, "admin", "operator", "create", "--email", "ops@example.com").stdout.strip().split()[-1]
    started = http_call("POST", f"{server.url}/api/v1/admin/drift/{ws_name}/run", bearer=token)
    assert started.status == 202, started
    deadline = time.monotonic() + 60
    while True:
        got = http_call("GET", f"{server.url}/api/v1/admin/drift/{started.json()['run']}", bearer=token).json()
        if got["run"]["finished_at"]:
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    assert got["run"]["outcome"] == "in_sync", got
    report = (tfdir / "report").read_bytes().decode(errors="replace")
    for secret in (dek, cluster_key, "STATEGATE_", "SQLite format", "[[drift]]"):
        assert secret not in report, f"{secret!r} leaked:\n{report}"
    assert f"PPID {server.proc.pid}\n" not in report, report
    for target in ("environ", "cmdline", "maps", "mem"):
        assert f"DENIED /proc/{server.proc.pid}/{target}" in report, report
    for path in (server.data_dir / "dek", server.data_dir / "stategate.db", cfg):
        assert f"DENIED {path}" in report, report


def test_a_drift_apply_is_written_and_locked_by_its_run(server_factory, ws_name, make_tf, tf_env, tmp_path):
    """The version a drift apply writes names its run (`drift:run-N`) as the writer, in
    `workspace history --json` and the admin API, and the lock it wrote under was taken
    and released by that run's own credential (not the workspace's)."""
    tfdir = tmp_path / "w"
    cfg = config_file(tmp_path / "drift.toml", [{
        "workspace": ws_name, "dir": str(tfdir), "binary": TERRAFORM,
        "var_files": ["drift.tfvars"], "interval_seconds": 0, "timeout_seconds": 60,
        "approve_apply": True, "env": tf_env_for_check(tf_env),
    }])
    server = server_factory.new(STATEGATE_CONFIG=cfg)
    ws = server.workspace(ws_name)
    tf = make_tf("w", ws.env)
    tf.write(MAIN)
    (tfdir / "drift.tfvars").write_text('v = "one"\n')
    tf.init()
    tf.apply("-var-file=drift.tfvars")
    (tfdir / "drift.tfvars").write_text('v = "two"\n')
    drifted = run_check(server, ws_name)
    assert drifted["outcome"] == "drifted", drifted
    applied = json.loads(cli(server, "drift", "apply", str(drifted["id"]), "--yes", "--json").stdout)
    assert applied["outcome"] == "applied", applied
    run = f"drift:run-{applied['id']}"

    history = [json.loads(line) for line in
               cli(server, "workspace", "history", ws_name, "--json").stdout.splitlines()]
    newest, before = history[0], history[1]
    assert newest["writer"] == run and newest["written_by"].endswith(run), newest
    assert newest["lock_operation"] == "OperationTypeApply", newest
    assert before["writer"] != run and not before["writer"].startswith("drift:"), before

    token = cli(server, "admin", "operator", "create", "--email", "ops@example.com").stdout.strip().split()[-1]
    listed = http_call("GET", f"{server.url}/api/v1/admin/workspaces/{ws_name}/versions", bearer=token)
    assert listed.status == 200, listed
    body = listed.json()
    rows = body["versions"] if isinstance(body, dict) else body
    assert rows[0]["version"] == newest["version"] and rows[0]["writer"] == run, rows[0]

    # The lock the apply wrote under: taken and released by the run's credential.
    audit = [json.loads(line) for line in
             cli(server, "admin", "audit", "list", "--scope", f"tf/{ws_name}", "--json").stdout.splitlines()]
    lock_actors = {(a["event"], a["actor"]) for a in audit if a["event"] in ("tf.lock_acquired", "tf.lock_released")
                   and a["actor"] == run}
    assert lock_actors == {("tf.lock_acquired", run), ("tf.lock_released", run)}, audit
    written = [a for a in audit if a["event"] == "tf.state_written" and a["actor"] == run]
    assert written, [(a["event"], a["actor"]) for a in audit]
    assert not lock_held(server, ws_name)

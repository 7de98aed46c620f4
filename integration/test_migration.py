"""docs/migration.md, executed: the runbook's own shell blocks are pasted into bash
(`set -euo pipefail`, one shell session per workspace whose exported variables carry
from block to block, as in a terminal) against the real Terraform CLI, a real Garage
holding the `s3` backend's state, and a real `stategate serve` (local store and Garage).

Only the example values of the document are replaced (workspace name, stategate URL,
Garage endpoint, bucket, key); if the document stops containing them, or a command in
it fails, these tests fail: the document and the tests cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from harness import REPO, TF_TIMEOUT, Tf, data_resource, resources_of, stategate_bin
from store_support import boto3_s3

DOC = REPO / "docs" / "migration.md"

# The document's example values (must all appear in it) -> replaced per test.
DOC_WS = "WS=prod"
DOC_SG = "http://127.0.0.1:8080"
DOC_S3_ENDPOINT = "http://127.0.0.1:3900"
DOC_BUCKET = 'bucket                      = "tfstate"'
DOC_KEY = "prod/terraform.tfstate"

RESOURCES = data_resource("a", "first") + data_resource("b", "second")
MORE = data_resource("c", "added-on-stategate")


def doc_blocks() -> dict[str, list[tuple[str, str]]]:
    """{"0": [(lang, code), ...], "1": [...], ...} by the number of each `## N.` heading."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = "intro"
    lang, buf = None, []
    for line in DOC.read_text().splitlines():
        if lang is None:
            m = re.match(r"^## (\d+)\.", line)
            if m:
                current = m.group(1)
                continue
            m = re.match(r"^```(\w*)\s*$", line)
            if m:
                lang, buf = m.group(1) or "text", []
        elif line.startswith("```"):
            sections.setdefault(current, []).append((lang, "\n".join(buf) + "\n"))
            lang = None
        else:
            buf.append(line)
    return sections


def block(sections, section: str, lang: str, index: int = 0) -> str:
    blocks = [code for (lg, code) in sections.get(section, []) if lg == lang]
    assert len(blocks) > index, f"docs/migration.md section {section} has no {lang} block #{index}"
    return blocks[index]


class DocShell:
    """Runs document blocks like a person pasting them into one terminal."""

    def __init__(self, cwd: Path, env: dict, subs: list[tuple[str, str]]):
        self.cwd = cwd
        self.env = env
        self.subs = subs
        self.state = cwd.parent / f".{cwd.name}.shell-env"
        self.state.unlink(missing_ok=True)

    def text(self, code: str) -> str:
        for old, new in self.subs:
            code = code.replace(old, new)
        return code

    def run(self, code: str, what: str) -> subprocess.CompletedProcess:
        code = self.text(code)
        script = (
            "set -euo pipefail\n"
            f"if [ -f '{self.state}' ]; then source '{self.state}'; fi\n"
            f"cd '{self.cwd}'\n"
            f"{code}\n"
            f"export -p > '{self.state}'\n"
        )
        p = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=TF_TIMEOUT)
        assert p.returncode == 0, (f"docs/migration.md {what} failed (exit {p.returncode}):\n{code}\n"
                                   f"--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr}")
        return p

    def exported(self) -> dict:
        out = {}
        for line in self.state.read_text().splitlines():
            m = re.match(r'^declare -x ([A-Za-z_][A-Za-z0-9_]*)="(.*)"$', line)
            if m:
                out[m.group(1)] = m.group(2)
        return out


@pytest.fixture
def doc():
    s = doc_blocks()
    text = DOC.read_text()
    for lit in (DOC_WS, DOC_SG, DOC_S3_ENDPOINT, DOC_BUCKET, DOC_KEY):
        assert lit in text, f"docs/migration.md no longer contains the example value {lit!r}: update the test"
    return s


def _shell_env(tf_env: dict, server, extra: dict | None = None) -> dict:
    e = dict(tf_env)
    e.update({k: v for k, v in server.env().items() if k.startswith("STATEGATE_")})
    e["PATH"] = f"{stategate_bin().parent}{os.pathsep}{e['PATH']}"
    e.update(extra or {})
    return e


def _state_file(path: Path) -> dict:
    return json.loads(path.read_text())


def test_runbook_s3_to_stategate_and_back(doc, server, store, request, tmp_path, tf_env):
    garage = request.getfixturevalue("garage_env")
    ws_name = f"mig-s3-{store[0]}-{uuid.uuid4().hex[:8]}"
    key = f"runbook-{uuid.uuid4().hex[:8]}/terraform.tfstate"
    aws = {
        "AWS_ACCESS_KEY_ID": garage["STATEGATE_S3_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": garage["STATEGATE_S3_SECRET_ACCESS_KEY"],
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    subs = [
        (DOC_WS, f"WS={ws_name}"),
        (DOC_SG, server.url),
        (DOC_S3_ENDPOINT, garage["STATEGATE_S3_ENDPOINT"]),
        (DOC_BUCKET, f'bucket                      = "{garage["STATEGATE_S3_BUCKET"]}"'),
        (DOC_KEY, key),
    ]
    work = tmp_path / "ws"
    work.mkdir()
    env = _shell_env(tf_env, server, aws)
    sh = DocShell(work, env, subs)
    direct = boto3_s3(garage["STATEGATE_S3_ENDPOINT"], garage)

    def s3_state() -> dict:
        return json.loads(direct.get_object(Bucket=garage["STATEGATE_S3_BUCKET"], Key=key)["Body"].read())

    # --- today: Terraform's own s3 backend, state in Garage (the doc's block) ---
    (work / "backend.tf").write_text(sh.text(block(doc, "1", "hcl")))
    (work / "main.tf").write_text(RESOURCES)
    tf = Tf(work, env)
    tf.init()
    tf.apply()
    before = s3_state()
    assert resources_of(before) == ["terraform_data.a", "terraform_data.b"]
    listed_before = tf.state_list()

    # --- 0. Before you start, 1. move, 2. verify: the document's commands ---
    sh.run(block(doc, "intro", "sh"), "intro (WS, SG)")
    sh.run(block(doc, "0", "sh"), "step 0")
    backups = list(work.glob("backup-*.tfstate"))
    assert len(backups) == 1 and _state_file(backups[0])["serial"] == before["serial"], backups

    sh.run(block(doc, "1", "sh"), "step 1 (s3 -> stategate)")
    assert (work / "backend.tf.s3").exists()
    ws = server.workspace(ws_name)
    got = ws.get()
    assert got.status == 200, got
    moved = got.json()
    assert resources_of(moved) == resources_of(before)
    assert moved["resources"] == before["resources"]
    # As the document says: a NEW lineage and serial 1 (Terraform's remote state manager
    # re-reads the empty destination before its first write; client behaviour).
    assert moved["lineage"] != before["lineage"] and moved["serial"] == 1, \
        f"docs/migration.md step 1 describes a new lineage and serial 1; got {moved['lineage']} / {moved['serial']}"

    out = sh.run(block(doc, "2", "sh"), "step 2 (verify)").stdout
    for r in listed_before:
        assert r in out, f"`terraform state list` after the move lacks {r}:\n{out}"
    exported = sh.exported()
    assert exported.get("TF_HTTP_ADDRESS") == ws.address, exported.get("TF_HTTP_ADDRESS")

    tf_sg = Tf(work, {**env, **ws.env})
    assert tf_sg.state_list() == listed_before
    tf_sg.plan_no_changes()
    assert s3_state()["serial"] == before["serial"], "the migration wrote to the source"

    # --- life on stategate: one more apply ---
    (work / "main.tf").write_text(RESOURCES + MORE)
    assert "1 added" in tf_sg.apply().stdout
    on_sg = ws.get().json()
    assert on_sg["serial"] > before["serial"]
    assert resources_of(on_sg) == ["terraform_data.a", "terraform_data.b", "terraform_data.c"]

    # --- 4. Backing out to the s3 backend ---
    sh.run(block(doc, "4", "sh", 0), "step 4 (back to s3)")
    after = s3_state()
    assert after["serial"] >= on_sg["serial"], (after["serial"], on_sg["serial"])
    assert after["lineage"] == on_sg["lineage"]
    assert after["resources"] == on_sg["resources"], "the s3 object does not hold stategate's newer state"
    assert "backend \"s3\"" in (work / "backend.tf").read_text()
    tf_s3 = Tf(work, env)
    assert tf_s3.state_list() == ["terraform_data.a", "terraform_data.b", "terraform_data.c"]
    tf_s3.plan_no_changes()
    # stategate still has every version it stored
    assert ws.get().json() == on_sg
    assert len(server.db_rows(ws_name)) >= 2


def test_runbook_local_to_stategate_and_back(doc, server, store, tmp_path, tf_env):
    ws_name = f"mig-local-{store[0]}-{uuid.uuid4().hex[:8]}"
    work = tmp_path / "ws"
    work.mkdir()
    env = _shell_env(tf_env, server)
    sh = DocShell(work, env, [(DOC_WS, f"WS={ws_name}"), (DOC_SG, server.url)])

    # --- today: the local backend ---
    (work / "main.tf").write_text(RESOURCES)
    tf = Tf(work, env)
    tf.init()
    tf.apply()
    local = _state_file(work / "terraform.tfstate")
    assert resources_of(local) == ["terraform_data.a", "terraform_data.b"]

    # --- 3. From the local backend to stategate ---
    sh.run(block(doc, "intro", "sh"), "intro (WS, SG)")
    sh.run(block(doc, "0", "sh"), "step 0")
    sh.run(block(doc, "3", "sh"), "step 3 (local -> stategate)")
    # What the document says happens to the local file: emptied, previous content kept
    # in terraform.tfstate.backup.
    assert (work / "terraform.tfstate").read_text().strip() == "", "terraform.tfstate was not emptied"
    kept = _state_file(work / "terraform.tfstate.backup")
    assert kept["resources"] == local["resources"] and kept["serial"] == local["serial"]
    ws = server.workspace(ws_name)
    got = ws.get()
    assert got.status == 200, got
    moved = got.json()
    assert moved["resources"] == local["resources"]
    assert moved["outputs"] == local["outputs"]
    tf_sg = Tf(work, {**env, **ws.env})
    assert tf_sg.state_list() == ["terraform_data.a", "terraform_data.b"]
    tf_sg.plan_no_changes()

    # --- life on stategate ---
    (work / "main.tf").write_text(RESOURCES + MORE)
    assert "1 added" in tf_sg.apply().stdout
    on_sg = ws.get().json()

    # --- 4. Backing out to the local backend ---
    sh.run(block(doc, "4", "sh", 1), "step 4 (back to local)")
    assert not (work / "backend.tf").exists()
    back = _state_file(work / "terraform.tfstate")
    assert back["resources"] == on_sg["resources"]
    assert back["lineage"] == on_sg["lineage"] and back["serial"] >= on_sg["serial"]
    tf_local = Tf(work, env)
    assert tf_local.state_list() == ["terraform_data.a", "terraform_data.b", "terraform_data.c"]
    tf_local.plan_no_changes()

"""A refused Terraform request says why where the operator looks. Terraform shows only
the status of most refusals ("Unexpected HTTP response code 400"), so the reason is
both in the body (for curl and other clients) and on the server's log line for the
request."""

from __future__ import annotations

from harness import BACKEND_HTTP, http

REASON = "invalid workspace name"


def test_a_refused_workspace_name_is_explained_in_the_body_and_the_log(server, make_tf):
    # A leading `-` is refused by the name rules (before authentication: a name reveals
    # nothing), whatever the credential.
    address = f"{server.url}/api/v1/tf/state/-not-a-name"
    tf = make_tf("refused", {"TF_HTTP_ADDRESS": address, "TF_HTTP_PASSWORD": "anything"})
    tf.write(BACKEND_HTTP + 'resource "terraform_data" "x" {}\n')
    init = tf.init(check=False)
    run = init if init.returncode != 0 else tf.plan(check=False)
    assert run.returncode != 0, str(run)
    assert "400" in run.stderr, str(run)

    r = http("GET", address)
    assert r.status == 400 and REASON in r.text(), r.text()

    lines = [l for l in server.log_text().splitlines()
             if 'status=400' in l and 'route="invalid"' in l and f'refusal="{REASON}' in l]
    assert lines, server.log_tail()

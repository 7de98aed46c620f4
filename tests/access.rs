//! Workspace credentials in-process (issue 21): rotation of the derived credential,
//! issued scoped tokens, the outputs-only state, consumers, and the hostile table of
//! every credential that must be refused (one identical 401, nothing changed).

mod common;

use common::{lock_info, status, TestServer};
use stategate::names::Pattern;
use stategate::tofu::access::Scope;
use stategate::tofu::credentials::{Grant, NewWorkspaceToken};

const STATE_WITH_OUTPUTS: &str = r#"{"version":4,"terraform_version":"1.15.0","serial":SERIAL,"lineage":"lin","outputs":{"url":{"value":"https://app.example","type":"string"},"db_password":{"value":"hunter2-output","type":"string","sensitive":true}},"resources":[{"mode":"managed","type":"terraform_data","name":"x","provider":"provider[\"terraform.io/builtin/terraform\"]","instances":[{"schema_version":0,"attributes":{"id":"1","input":"resource-secret"}}]}],"check_results":null}"#;

fn state_with_outputs(serial: u64) -> String {
    STATE_WITH_OUTPUTS.replace("SERIAL", &serial.to_string())
}

/// The status a domain error is answered with, for the few the tests expect.
trait Code {
    fn code(&self) -> u16;
}

impl Code for stategate::error::Error {
    fn code(&self) -> u16 {
        use stategate::error::Error;
        match self {
            Error::Invalid(_) => 400,
            Error::NotFound(_) => 404,
            Error::Conflict(_) => 409,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn outputs_url(s: &TestServer, ws: &str) -> String {
    format!("{}/api/v1/tf/outputs/{ws}", s.base)
}

/// A request to `url` with `secret` as the Basic password.
fn basic(method: &str, url: &str, secret: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method.parse().unwrap(), url)
        .basic_auth("stategate", Some(secret))
}

/// A request to `url` with `secret` as a Bearer token.
fn bearer(method: &str, url: &str, secret: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method.parse().unwrap(), url)
        .bearer_auth(secret)
}

async fn token(
    s: &TestServer,
    name: &str,
    patterns: &str,
    scope: Scope,
    expires: Option<i64>,
) -> String {
    token_with(s, name, patterns, scope, expires, false).await
}

async fn token_with(
    s: &TestServer,
    name: &str,
    patterns: &str,
    scope: Scope,
    expires_in: Option<i64>,
    include_sensitive: bool,
) -> String {
    let grant = Grant {
        patterns: patterns
            .split(',')
            .map(|p| Pattern::parse(p).unwrap())
            .collect(),
        scope,
        include_sensitive,
    };
    let new = NewWorkspaceToken {
        name: name.into(),
        grant,
        expires_in,
    };
    s.app
        .tofu
        .create_token(new, "operator:test")
        .await
        .unwrap()
        .0
}

/// What a refusal must not change.
fn snapshot(s: &TestServer) -> Vec<i64> {
    [
        "SELECT count(*) FROM versions",
        "SELECT count(*) FROM tf_locks",
        "SELECT coalesce(max(id), 0) FROM audit",
        "SELECT count(*) FROM tokens",
        "SELECT count(*) FROM tokens WHERE revoked_at IS NOT NULL",
        "SELECT count(*) FROM tf_credential_generations",
        "SELECT count(*) FROM tf_consumers",
    ]
    .iter()
    .map(|sql| s.count(sql))
    .collect()
}

/// Write one state to `ws` with its derived credential, under a lock.
async fn seed(s: &TestServer, ws: &str, serial: u64) {
    assert_eq!(
        status(s.tf("LOCK", ws).body(lock_info("seed"))).await.0,
        200
    );
    let w = s
        .tf("POST", ws)
        .query(&[("ID", "seed")])
        .body(state_with_outputs(serial));
    assert_eq!(status(w).await.0, 200);
    assert_eq!(
        status(s.tf("UNLOCK", ws).body(lock_info("seed"))).await.0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_a_credential_refuses_the_old_one_at_once_and_only_for_that_workspace() {
    let s = TestServer::start().await;
    seed(&s, "prod", 1).await;
    seed(&s, "dev", 1).await;
    let old = s.bearer("prod");
    let url = s.url("prod");
    assert_eq!(status(basic("GET", &url, &old)).await.0, 200);

    let generation = s
        .app
        .tofu
        .rotate_credential("prod", "operator:test")
        .await
        .unwrap();
    assert_eq!(generation, 1);
    let new = s.root.workspace_bearer_at("prod", 1);
    assert_ne!(new, old);
    let before = snapshot(&s);
    let (_, refusal) = status(basic("GET", &url, "wrong")).await;
    for (method, body) in [
        ("GET", None),
        ("LOCK", Some(lock_info("old"))),
        ("POST", Some(state_with_outputs(2))),
    ] {
        for req in [basic(method, &url, &old), bearer(method, &url, &old)] {
            let req = match &body {
                Some(b) => req.body(b.clone()),
                None => req,
            };
            assert_eq!(
                status(req).await,
                (401, refusal.clone()),
                "{method} with the old bearer"
            );
        }
    }
    assert_eq!(snapshot(&s), before, "the old bearer changed something");
    // The new one works for everything; the other workspace's is unchanged.
    assert_eq!(status(basic("GET", &url, &new)).await.0, 200);
    assert_eq!(
        status(basic("LOCK", &url, &new).body(lock_info("N")))
            .await
            .0,
        200
    );
    let w = basic("POST", &url, &new)
        .query(&[("ID", "N")])
        .body(state_with_outputs(2));
    assert_eq!(status(w).await.0, 200);
    assert_eq!(
        status(basic("UNLOCK", &url, &new).body(lock_info("N")))
            .await
            .0,
        200
    );
    assert_eq!(status(s.tf("GET", "dev")).await.0, 200);
    // `workspace env` prints the new one.
    let env = s
        .app
        .tofu
        .client_env("http://h", "prod", false)
        .await
        .unwrap();
    assert!(env.contains(&new) && !env.contains(&old));
    // Audited, without the secret.
    let (actor, payload): (String, String) = s
        .db()
        .query_row(
            "SELECT actor, payload FROM audit WHERE event = 'tf.credential_rotated' AND scope = 'tf/prod'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(actor, "operator:test");
    assert!(payload.contains("\"generation\":1"));
    assert!(!payload.contains(&new) && !payload.contains(&old));
    // Rotating again retires generation 1.
    s.app
        .tofu
        .rotate_credential("prod", "operator:test")
        .await
        .unwrap();
    assert_eq!(status(basic("GET", &url, &new)).await.0, 401);
    let newest = s.root.workspace_bearer_at("prod", 2);
    assert_eq!(status(basic("GET", &url, &newest)).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issued_tokens_do_what_their_scope_allows_as_basic_and_bearer() {
    let s = TestServer::start().await;
    seed(&s, "prod-eu", 1).await;
    let write = token(&s, "ci", "prod-*", Scope::Write, None).await;
    let read = token(&s, "reader", "prod-*", Scope::Read, None).await;
    assert!(write.starts_with("sgw_"));
    let url = s.url("prod-eu");
    for (i, send) in [basic, bearer].into_iter().enumerate() {
        let id = format!("T{i}");
        assert_eq!(status(send("GET", &url, &write)).await.0, 200);
        assert_eq!(
            status(send("LOCK", &url, &write).body(lock_info(&id)))
                .await
                .0,
            200
        );
        let w = send("POST", &url, &write)
            .query(&[("ID", id.as_str())])
            .body(state_with_outputs(2 + i as u64));
        assert_eq!(status(w).await.0, 200);
        assert_eq!(
            status(send("UNLOCK", &url, &write).body(lock_info(&id)))
                .await
                .0,
            200
        );
        assert_eq!(status(send("GET", &url, &read)).await.0, 200);
        assert_eq!(
            status(send("GET", &outputs_url(&s, "prod-eu"), &read))
                .await
                .0,
            200
        );
    }
    // The lock records the token's name.
    assert_eq!(
        status(basic("LOCK", &url, &write).body(lock_info("C")))
            .await
            .0,
        200
    );
    let credential: String = s
        .db()
        .query_row(
            "SELECT credential FROM tf_locks WHERE workspace = 'prod-eu'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(credential, "token:ci");
    assert_eq!(
        status(basic("UNLOCK", &url, &write).body(lock_info("C")))
            .await
            .0,
        200
    );
    // Listed with scope, patterns and (batched) last use; never the secret.
    let listed = s.app.tofu.list_tokens().await.unwrap();
    let ci = listed.iter().find(|t| t.name == "ci").unwrap();
    assert_eq!(
        (ci.scope, ci.workspaces.clone()),
        ("write", vec!["prod-*".to_string()])
    );
    assert!(ci.last_used.is_some(), "last use is seen before the flush");
    assert_eq!(
        s.count("SELECT count(*) FROM tf_token_grants WHERE last_used_unix IS NOT NULL"),
        0,
        "no write per request"
    );
    s.app.tofu.flush_last_used().await.unwrap();
    assert_eq!(
        s.count("SELECT count(*) FROM tf_token_grants WHERE last_used_unix IS NOT NULL"),
        2
    );
    assert!(!format!("{listed:?}").contains(&write));
    // A second live token of the same name is refused.
    let again = NewWorkspaceToken {
        name: "ci".into(),
        grant: Grant {
            patterns: vec![Pattern::parse("x").unwrap()],
            scope: Scope::Read,
            include_sensitive: false,
        },
        expires_in: None,
    };
    assert_eq!(
        s.app
            .tofu
            .create_token(again, "t")
            .await
            .unwrap_err()
            .code(),
        409
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outputs_state_holds_outputs_only() {
    let s = TestServer::start().await;
    seed(&s, "prod", 3).await;
    let outputs = token(&s, "remote", "prod", Scope::Outputs, None).await;
    let sensitive = token_with(&s, "remote-all", "prod", Scope::Outputs, None, true).await;
    let url = outputs_url(&s, "prod");
    let (code, body) = status(basic("GET", &url, &outputs)).await;
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (doc["serial"].as_i64(), doc["lineage"].as_str()),
        (Some(3), Some("lin"))
    );
    assert_eq!(doc["terraform_version"], "1.15.0");
    assert_eq!(doc["resources"], serde_json::json!([]));
    assert_eq!(doc["outputs"]["url"]["value"], "https://app.example");
    assert!(doc["outputs"].get("db_password").is_none());
    assert!(!body.contains("hunter2-output") && !body.contains("resource-secret"));
    // The grant that says so, and the workspace's own credential, see sensitive outputs.
    for secret in [sensitive, s.bearer("prod")] {
        let (code, body) = status(bearer("GET", &url, &secret)).await;
        assert_eq!(code, 200);
        assert!(body.contains("hunter2-output") && !body.contains("resource-secret"));
    }
    // Only GET; an outputs token cannot read the whole state.
    for method in ["POST", "LOCK", "UNLOCK", "DELETE", "PUT"] {
        assert_eq!(
            status(basic(method, &url, &outputs)).await.0,
            405,
            "{method}"
        );
    }
    assert_eq!(status(basic("GET", &s.url("prod"), &outputs)).await.0, 401);
    // No state yet: 404, like the state address.
    assert_eq!(
        status(basic("GET", &outputs_url(&s, "empty"), &s.bearer("empty")))
            .await
            .0,
        404
    );
}

/// Issue 37, finding 7: a refused outputs read derives the same number of bearers
/// whether the workspace names no consumer, one or the most allowed, and whether it
/// exists at all, so the time of the 401 is no oracle of either. Counted on this
/// thread (the credential check runs on the caller's task), with a real consumer's
/// credential still accepted.
#[tokio::test]
async fn a_refused_outputs_read_does_the_same_work_whatever_the_consumers() {
    use stategate::tofu::access::Use;
    let s = TestServer::start().await;
    let many: Vec<String> = (0..stategate::tofu::credentials::MAX_CONSUMERS)
        .map(|i| format!("app-{i}"))
        .collect();
    for (ws, consumers) in [
        ("none", vec![]),
        ("one", vec!["app-0".to_string()]),
        ("many", many),
    ] {
        seed(&s, ws, 1).await;
        if !consumers.is_empty() {
            s.app.tofu.set_consumers(ws, consumers, "t").await.unwrap();
        }
    }
    let wrong = s.bearer("stranger");
    let mut work = Vec::new();
    for ws in ["none", "one", "many", "missing"] {
        let before = stategate::crypto::derivations_on_this_thread();
        let found = s
            .app
            .tofu
            .authenticate(ws, Some(wrong.clone().into_bytes()), Use::ReadOutputs)
            .await
            .unwrap();
        assert!(found.is_none(), "{ws}");
        work.push((ws, stategate::crypto::derivations_on_this_thread() - before));
    }
    assert!(
        work.iter().all(|(_, n)| *n == work[0].1),
        "derivations per refused outputs read: {work:?}"
    );
    let consumer = s
        .app
        .tofu
        .authenticate(
            "many",
            Some(s.bearer("app-63").into_bytes()),
            Use::ReadOutputs,
        )
        .await
        .unwrap();
    assert!(consumer.is_some(), "the last consumer is still accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_read_outputs_with_their_own_credential() {
    let s = TestServer::start().await;
    seed(&s, "network", 1).await;
    let url = outputs_url(&s, "network");
    assert_eq!(status(basic("GET", &url, &s.bearer("app-a"))).await.0, 401);
    s.app
        .tofu
        .set_consumers(
            "network",
            vec!["app-a".into(), "app-b".into()],
            "operator:test",
        )
        .await
        .unwrap();
    let (code, body) = status(basic("GET", &url, &s.bearer("app-a"))).await;
    assert_eq!(code, 200);
    assert!(
        !body.contains("hunter2-output"),
        "a consumer gets no sensitive output"
    );
    assert_eq!(status(bearer("GET", &url, &s.bearer("app-b"))).await.0, 200);
    // The consumer's rotated credential follows it.
    s.app.tofu.rotate_credential("app-a", "t").await.unwrap();
    assert_eq!(status(basic("GET", &url, &s.bearer("app-a"))).await.0, 401);
    let rotated = s.root.workspace_bearer_at("app-a", 1);
    assert_eq!(status(basic("GET", &url, &rotated)).await.0, 200);
    assert_eq!(
        s.app.tofu.consumers("network").await.unwrap(),
        vec!["app-a".to_string(), "app-b".to_string()]
    );
    assert_eq!(
        s.app
            .tofu
            .set_consumers("network", vec!["network".into()], "t")
            .await
            .unwrap_err()
            .code(),
        400,
        "a workspace is not its own consumer"
    );
    s.app
        .tofu
        .set_consumers("network", vec![], "t")
        .await
        .unwrap();
    assert_eq!(status(basic("GET", &url, &rotated)).await.0, 401);
}

/// Every credential that must be refused, on every method it could try: the same 401
/// body as a wrong secret, and nothing changed (versions, locks, audit, tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_credentials_get_one_401_and_change_nothing() {
    let s = TestServer::start().await;
    seed(&s, "prod", 1).await;
    seed(&s, "dev", 1).await;
    let revoked = token(&s, "gone", "prod", Scope::Write, None).await;
    let expired = token(&s, "old", "prod", Scope::Write, Some(-1)).await;
    let outputs = token(&s, "outs", "prod", Scope::Outputs, None).await;
    let read = token(&s, "reads", "prod", Scope::Read, None).await;
    let dev_write = token(&s, "dev-ci", "dev", Scope::Write, None).await;
    // Used once while live: the replay after revocation must fail too.
    assert_eq!(status(basic("GET", &s.url("prod"), &revoked)).await.0, 200);
    let done = s
        .app
        .tofu
        .revoke_token("gone", "operator:test")
        .await
        .unwrap();
    assert!(done.recorded);
    s.app
        .tofu
        .set_consumers("prod", vec!["app".into()], "operator:test")
        .await
        .unwrap();
    // A lock held by someone else, so a refused UNLOCK would be visible.
    assert_eq!(
        status(s.tf("LOCK", "prod").body(lock_info("held"))).await.0,
        200
    );

    // Drift run credentials (`tofu::run_credential`): one of a run on another
    // workspace, one expired, one whose run has finished (revoked).
    let run_secret = |ws: &str, name: &str, expires: i64| {
        let (secret, hash) = stategate::tofu::run_credential::new_secret().unwrap();
        stategate::tofu::run_credential::insert(&s.db(), &hash, ws, name, expires).unwrap();
        secret
    };
    let far = 4_000_000_000;
    let dev_run = run_secret("dev", "drift:run-901", far);
    let expired_run = run_secret("prod", "drift:run-902", 1);
    let finished_run = run_secret("prod", "drift:run-903", far);
    stategate::tofu::run_credential::revoke(&s.db(), "drift:run-903").unwrap();
    // Not backend credentials at all: an operator token, a web UI session id.
    let operator = s
        .app
        .operator
        .admin_write(|c| {
            stategate::operator::identity::create_operator(c, "ops@example.com", "test")
        })
        .await
        .unwrap();
    let session_id = {
        let token = operator.clone();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        s.app
            .operator
            .admin_write(move |c| {
                Ok(stategate::ui::session::open(c, token.as_bytes(), now)?
                    .unwrap()
                    .cookie_value)
            })
            .await
            .unwrap()
    };

    let (code, refusal) = status(basic("GET", &s.url("prod"), "wrong")).await;
    assert_eq!(code, 401);
    let state = s.url("prod");
    let outs = outputs_url(&s, "prod");
    let every_write = ["LOCK", "POST", "UNLOCK", "DELETE"];
    let mut cases: Vec<(&str, &str, String, String)> = Vec::new();
    let mut add = |case: &'static str, methods: &[&'static str], url: &str, secret: &str| {
        for m in methods {
            cases.push((case, m, url.to_string(), secret.to_string()));
        }
    };
    add(
        "wrong secret",
        &["GET", "LOCK", "POST", "UNLOCK", "DELETE"],
        &state,
        "sgw_wrong",
    );
    add("wrong on outputs", &["GET"], &outs, "nope");
    add(
        "revoked token (replay)",
        &["GET", "LOCK", "POST", "UNLOCK", "DELETE"],
        &state,
        &revoked,
    );
    add("revoked token on outputs", &["GET"], &outs, &revoked);
    add(
        "expired token",
        &["GET", "LOCK", "POST", "UNLOCK"],
        &state,
        &expired,
    );
    add("expired token on outputs", &["GET"], &outs, &expired);
    add(
        "outputs scope on the state",
        &["GET", "LOCK", "POST", "UNLOCK", "DELETE"],
        &state,
        &outputs,
    );
    add("read scope writing", &every_write, &state, &read);
    add("write token deleting", &["DELETE"], &state, &dev_write);
    add(
        "another workspace's token",
        &["GET", "LOCK", "POST", "UNLOCK"],
        &state,
        &dev_write,
    );
    add(
        "another workspace's token on outputs",
        &["GET"],
        &outs,
        &dev_write,
    );
    add(
        "another workspace's bearer",
        &["GET", "LOCK", "POST", "UNLOCK", "DELETE"],
        &state,
        &s.bearer("dev"),
    );
    add(
        "consumer on the state",
        &["GET", "LOCK", "POST", "UNLOCK", "DELETE"],
        &state,
        &s.bearer("app"),
    );
    add("non-consumer on outputs", &["GET"], &outs, &s.bearer("dev"));
    let all = ["GET", "LOCK", "POST", "UNLOCK", "DELETE"];
    add("another workspace's drift run", &all, &state, &dev_run);
    add(
        "an expired drift run credential",
        &all,
        &state,
        &expired_run,
    );
    add("a finished drift run (replay)", &all, &state, &finished_run);
    add("a drift run on outputs", &["GET"], &outs, &dev_run);
    add("an operator token", &all, &state, &operator);
    add("a web UI session id", &all, &state, &session_id);
    add("an operator token on outputs", &["GET"], &outs, &operator);
    add(
        "a token's hash",
        &["GET"],
        &state,
        &stategate::tokens::hash(read.as_bytes()),
    );
    let before = snapshot(&s);
    for (case, method, url, secret) in &cases {
        let body = match *method {
            "LOCK" | "UNLOCK" => lock_info("held"),
            "POST" => state_with_outputs(9),
            _ => String::new(),
        };
        for send in [basic, bearer] {
            let (code, text) = status(send(method, url, secret).body(body.clone())).await;
            assert_eq!((code, &text), (401, &refusal), "{case}: {method} {url}");
        }
    }
    assert_eq!(
        snapshot(&s),
        before,
        "a refused credential changed something"
    );
    assert_eq!(
        s.count("SELECT count(*) FROM tf_locks WHERE lock_id = 'held'"),
        1,
        "the lock is still held"
    );
    // The live ones still work (the table proves the refusals, not a broken server).
    assert_eq!(status(basic("GET", &state, &read)).await.0, 200);
    assert_eq!(status(basic("GET", &outs, &outputs)).await.0, 200);
    assert_eq!(status(basic("GET", &outs, &s.bearer("app"))).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_recorded_so_a_restore_cannot_resurrect_it() {
    let s = TestServer::start().await;
    let secret = token(&s, "ci", "*", Scope::Write, None).await;
    let id = stategate::tokens::id_of(&stategate::tokens::hash(secret.as_bytes()));
    // By id works as well as by name; unknown names are a 404.
    assert_eq!(
        s.app
            .tofu
            .revoke_token("nobody", "t")
            .await
            .unwrap_err()
            .code(),
        404
    );
    let done = s.app.tofu.revoke_token(&id, "operator:test").await.unwrap();
    assert_eq!((done.name.as_str(), done.recorded), ("ci", true));
    let log =
        stategate::tokens::RevocationLog::new(s.app.tofu.store().blobs().clone(), s.root.clone());
    let records = log.load().await.unwrap();
    assert!(records
        .iter()
        .any(|r| r.kind == "workspace" && r.sha256 == stategate::tokens::hash(secret.as_bytes())));
    // Undo the revocation as an old backup would, then re-apply what the store recorded.
    s.db()
        .execute(
            "UPDATE tokens SET revoked_at = NULL WHERE kind = 'workspace'",
            [],
        )
        .unwrap();
    let conn = s.db();
    stategate::tokens::after_restore(&conn, &records, "now").unwrap();
    assert_eq!(status(basic("GET", &s.url("prod"), &secret)).await.0, 401);
    let audited = s.count("SELECT count(*) FROM audit WHERE event IN ('tf.token_created', 'tf.token_revoked') AND payload NOT LIKE '%sgw_%'");
    assert_eq!(audited, 2);
}

/// The admin API's credential routes (admin role): rotate, consumers, tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_rotates_shares_and_issues_tokens() {
    let s = TestServer::start().await;
    seed(&s, "prod", 1).await;
    let admin = s
        .app
        .operator
        .admin_write(|c| stategate::operator::identity::create_operator(c, "root@x.io", "t"))
        .await
        .unwrap();
    let call = |method: &str, path: &str, body: Option<serde_json::Value>| {
        let req = reqwest::Client::new()
            .request(
                method.parse().unwrap(),
                format!("{}/api/v1/admin/{path}", s.base),
            )
            .bearer_auth(&admin);
        match body {
            Some(b) => req.body(b.to_string()),
            None => req,
        }
    };
    let old = s.bearer("prod");
    let (code, body) = status(call("POST", "workspaces/prod/credential/rotate", None)).await;
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"generation":1,"workspace":"prod"}"#)
    );
    assert_eq!(status(basic("GET", &s.url("prod"), &old)).await.0, 401);

    let set = serde_json::json!({ "consumers": ["app-a"] });
    assert_eq!(
        status(call("PUT", "workspaces/prod/consumers", Some(set)))
            .await
            .0,
        200
    );
    let (code, body) = status(call("GET", "workspaces/prod/consumers", None)).await;
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"consumers":["app-a"],"workspace":"prod"}"#)
    );
    assert_eq!(
        status(basic("GET", &outputs_url(&s, "prod"), &s.bearer("app-a")))
            .await
            .0,
        200
    );

    let new = serde_json::json!({ "name": "ci", "workspaces": ["prod", "stage-*"], "scope": "read", "expires": "30d" });
    let (code, body) = status(call("POST", "workspace-tokens", Some(new))).await;
    assert_eq!(code, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(created["expires_at"].as_i64().unwrap() > stategate::tokens::now() + 29 * 86_400);
    assert_eq!(status(bearer("GET", &s.url("prod"), &secret)).await.0, 200);
    let (code, body) = status(call("GET", "workspace-tokens", None)).await;
    assert_eq!(code, 200);
    assert!(body.contains("\"name\":\"ci\"") && !body.contains(&secret));
    // Bad input: 400, nothing issued.
    let before = snapshot(&s);
    for bad in [
        serde_json::json!({ "name": "x", "workspaces": "prod", "scope": "admin" }),
        serde_json::json!({ "name": "x", "workspaces": "a/b", "scope": "read" }),
        serde_json::json!({ "name": "x", "workspaces": "prod", "scope": "read", "expires": "forever" }),
        serde_json::json!({ "name": "bad name", "workspaces": "prod", "scope": "read" }),
        serde_json::json!({ "name": "x", "workspaces": "prod", "scope": "read", "extra": 1 }),
    ] {
        assert_eq!(
            status(call("POST", "workspace-tokens", Some(bad.clone())))
                .await
                .0,
            400,
            "{bad}"
        );
    }
    assert_eq!(snapshot(&s), before);
    let (code, _) = status(call("POST", "workspace-tokens/ci/revoke", None)).await;
    assert_eq!(code, 200);
    assert_eq!(status(bearer("GET", &s.url("prod"), &secret)).await.0, 401);
    assert_eq!(
        status(call("POST", "workspace-tokens/ci/revoke", None))
            .await
            .0,
        404
    );
}

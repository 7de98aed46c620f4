//! The admin HTTP API (`/api/v1/admin/`) in process on port 0: operator auth on every
//! route (one 401 body for missing, wrong and revoked tokens), the check order (auth,
//! then input, then state), each operation and the audit rows it writes.

mod common;

use common::roles::{
    expected_allowed, role_operators, snapshot, unfinished_runs, Aim, ROLE_OPERATORS, SECRET,
};
use common::{lock_info, state, status, TestServer};
use serde_json::{json, Value};
use stategate::cluster::identity::{self, Role};
use stategate::http::error::HttpError;
use stategate::operator::identity as operators;

struct Env {
    server: TestServer,
    token: String,
    http: reqwest::Client,
}

const OPS: &str = "ops@example.com";

impl Env {
    async fn start() -> Env {
        Self::start_with(|_| {}).await
    }

    async fn start_with(adjust: impl FnOnce(&mut stategate::config::Config)) -> Env {
        let server = TestServer::start_with(|c| {
            c.cluster.state_enc_key = Some(common::DEK.into());
            adjust(c);
        })
        .await;
        let token = server
            .app
            .operator
            .admin_write(|c| operators::create_operator(c, OPS, "test"))
            .await
            .unwrap();
        Env {
            server,
            token,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1/admin/{path}", self.server.base)
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
        self.call_as(Some(&self.token), method, path, body).await
    }

    async fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, String) {
        let mut req = self.http.request(method.parse().unwrap(), self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        status(req).await
    }

    async fn json(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (code, text) = self.call(method, path, body).await;
        assert_eq!(code, 200, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"))
    }

    async fn write(&self, ws: &str, serial: u64, resources: &str) {
        let (code, text) = status(
            self.server
                .tf("POST", ws)
                .body(state(serial, "lin-1", resources)),
        )
        .await;
        assert_eq!(code, 200, "{text}");
    }

    /// Audit rows of a scope as (event, actor).
    fn audit(&self, scope: &str) -> Vec<(String, String)> {
        let conn = self.server.db();
        let mut stmt = conn
            .prepare("SELECT event, actor FROM audit WHERE scope = ?1 ORDER BY id")
            .unwrap();
        stmt.query_map([scope], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

fn resource(name: &str, attrs: &str) -> String {
    format!(
        r#"{{"mode":"managed","type":"null_resource","name":"{name}","provider":"p","instances":[{{"attributes":{attrs}}}]}}"#
    )
}

const ACTOR: &str = "operator:ops@example.com";

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn every_route_wants_an_operator_token_and_says_so_identically() {
    let env = Env::start().await;
    env.write("prod", 1, "").await;
    let second = env.server.operator_token(OPS).await;
    let revoked = env.server.operator_token(OPS).await;
    env.server.revoke_operator_token(&revoked).await;
    // A cluster-API admin token and the workspace bearer are not operator tokens.
    let principal = env
        .server
        .app
        .operator
        .admin_write(|c| {
            identity::create_org(c, "acme")?;
            identity::create_principal(c, "acme", "a@acme", Role::Admin)
        })
        .await
        .unwrap();
    let bearer = env.server.bearer("prod");
    // An issued workspace token (even a write one) and a web UI session id are not
    // operator tokens either.
    let grant = stategate::tofu::credentials::Grant {
        patterns: vec![stategate::names::Pattern::parse("*").unwrap()],
        scope: stategate::tofu::access::Scope::Write,
        include_sensitive: true,
    };
    let issued = env
        .server
        .app
        .tofu
        .create_token(
            stategate::tofu::credentials::NewWorkspaceToken {
                name: "ci-any".into(),
                grant,
                expires_in: None,
            },
            "operator:test",
        )
        .await
        .unwrap()
        .0;
    let session_id = {
        let token = second.clone();
        env.server
            .app
            .operator
            .admin_write(move |c| {
                Ok(
                    stategate::ui::session::open(c, token.as_bytes(), now_unix())?
                        .unwrap()
                        .cookie_value,
                )
            })
            .await
            .unwrap()
    };
    let routes: &[(&str, &str)] = &[
        ("GET", "whoami"),
        ("GET", "workspaces"),
        ("GET", "workspaces/prod"),
        ("GET", "workspaces/prod/versions"),
        ("GET", "workspaces/prod/versions/1"),
        ("GET", "workspaces/prod/timeline"),
        ("GET", "workspaces/prod/timeline?address=%00"),
        ("GET", "workspaces/prod/diff?from=1&to=1"),
        ("GET", "workspaces/prod/rollback?to=1"),
        ("POST", "workspaces/prod/rollback"),
        ("POST", "workspaces/prod/unlock"),
        ("GET", "search?q=null_resource"),
        ("POST", "workspaces/prod/restore"),
        ("POST", "workspaces/prod/allow-write"),
        ("POST", "workspaces/prod/freeze"),
        ("POST", "workspaces/prod/unfreeze"),
        ("GET", "freezes"),
        ("POST", "workspaces/prod/move/dev"),
        ("POST", "workspaces/prod/credential/rotate"),
        ("GET", "workspaces/prod/consumers"),
        ("PUT", "workspaces/prod/consumers"),
        ("GET", "workspace-tokens"),
        ("POST", "workspace-tokens"),
        ("POST", "workspace-tokens/ci/revoke"),
        ("GET", "audit"),
        ("GET", "clusters"),
        ("GET", "drift"),
        ("GET", "drift/1"),
        ("POST", "drift/prod/run"),
        ("POST", "drift/1/apply"),
        ("GET", "keys"),
        ("POST", "keys/rotate"),
        ("POST", "keys/retire"),
        // Bad input is judged only after the token: still 401.
        ("GET", "workspaces/..%2Fx/versions/zz"),
    ];
    let bad: [Option<&str>; 7] = [
        None,
        Some("sgo_wrong"),
        Some(&revoked),
        Some(&principal),
        Some(&bearer),
        Some(&issued),
        Some(&session_id),
    ];
    let mut bodies = std::collections::BTreeSet::new();
    for (method, path) in routes {
        let before = snapshot(&env.server);
        for token in bad {
            let (code, body) = env
                .call_as(token, method, path, Some(json!({"to": 1})))
                .await;
            assert_eq!(code, 401, "{method} {path} with {token:?}");
            bodies.insert(body);
        }
        assert_eq!(
            snapshot(&env.server),
            before,
            "{method} {path}: a refused credential changed something"
        );
        let (code, _) = env.call_as(Some(&second), method, path, None).await;
        assert_ne!(code, 401, "{method} {path} with a good token");
    }
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(bodies.first().unwrap().contains("operator token"));
    let me = env.json("GET", "whoami", None).await;
    assert_eq!(me["email"], OPS);
}

#[tokio::test]
async fn check_order_is_auth_then_input_then_state() {
    let env = Env::start().await;
    env.write("prod", 1, "").await;
    // (method, path, body, status with a good token)
    let table: &[(&str, &str, Option<Value>, u16)] = &[
        ("GET", "workspaces/bad%20name", None, 400),
        ("GET", "workspaces/nope", None, 404),
        ("GET", "workspaces/prod/versions/zero", None, 400),
        ("GET", "workspaces/prod/versions/0", None, 400),
        ("GET", "workspaces/prod/versions/9", None, 404),
        ("GET", "workspaces/nope/versions/1", None, 404),
        ("GET", "workspaces/nope/versions", None, 404),
        ("GET", "workspaces/prod/versions?limit=-1", None, 400),
        ("GET", "workspaces/prod/versions/1?masked=maybe", None, 400),
        ("GET", "workspaces/prod/timeline?address=a%00b", None, 400),
        ("GET", "workspaces/prod/timeline?address=", None, 400),
        ("GET", "workspaces/prod/timeline?limit=0", None, 400),
        ("GET", "workspaces/prod/timeline?limit=10001", None, 400),
        ("GET", "workspaces/prod/timeline?limit=x", None, 400),
        ("GET", "workspaces/nope/timeline", None, 404),
        ("GET", "workspaces/bad%20name/timeline", None, 400),
        ("GET", "workspaces/prod/diff?from=1", None, 400),
        ("GET", "workspaces/prod/diff?from=1&to=9", None, 404),
        ("POST", "workspaces/prod/rollback", None, 400),
        ("GET", "workspaces/prod/rollback", None, 400),
        ("GET", "workspaces/prod/rollback?to=x", None, 400),
        ("GET", "workspaces/prod/rollback?to=9", None, 404),
        ("GET", "workspaces/nope/rollback?to=1", None, 404),
        (
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 1, "from": 0})),
            400,
        ),
        (
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 1, "from": 7})),
            409,
        ),
        ("GET", "search", None, 400),
        ("GET", "search?q=%20", None, 400),
        (
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": "one"})),
            400,
        ),
        (
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 1, "x": 1})),
            400,
        ),
        // An array of the fields in order is not the object.
        ("POST", "workspaces/prod/rollback", Some(json!([1])), 400),
        (
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 9})),
            404,
        ),
        (
            "POST",
            "workspaces/prod/unlock",
            Some(json!({"lock_id": "a b"})),
            400,
        ),
        (
            "POST",
            "workspaces/prod/restore",
            Some(json!({"x": 1})),
            400,
        ),
        ("POST", "workspaces/prod/restore", None, 409),
        ("POST", "workspaces/nope/restore", None, 404),
        ("POST", "workspaces/prod/allow-write", None, 400),
        (
            "POST",
            "workspaces/prod/allow-write",
            Some(json!({"reason": "r", "minutes": 0})),
            400,
        ),
        (
            "POST",
            "workspaces/prod/allow-write",
            Some(json!({"reason": "\u{7}"})),
            400,
        ),
        (
            "POST",
            "workspaces/bad%20name/allow-write",
            Some(json!({"reason": "r"})),
            400,
        ),
        ("GET", "audit?limit=0", None, 400),
        ("GET", "audit?limit=5000", None, 400),
        ("GET", "audit?since=yesterday", None, 400),
        ("GET", "audit?until=2026-02-30", None, 400),
        ("POST", "keys/retire", None, 400),
        ("POST", "keys/retire", Some(json!({"generation": "x"})), 400),
        ("POST", "keys/rotate", Some(json!({"generation": 1})), 400),
        ("GET", "keys/retire", None, 405),
        ("POST", "keys/rewrap", None, 404),
        ("DELETE", "workspaces/prod", None, 405),
        ("GET", "nope", None, 404),
    ];
    for (method, path, body, expected) in table {
        let (code, text) = env.call(method, path, body.clone()).await;
        assert_eq!(code, *expected, "{method} {path} {body:?}: {text}");
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert!(parsed["error"].is_string(), "{text}");
    }
    // None of that changed or audited anything.
    assert_eq!(
        env.audit("tf/prod"),
        [("tf.state_written".to_string(), "tf:prod".to_string())]
    );
    assert_eq!(env.server.count("SELECT count(*) FROM versions"), 1);
    assert_eq!(env.server.count("SELECT count(*) FROM key_generations"), 0);
}

/// Sends `body` as is to a key route with the operator token: (status, body).
async fn raw_key_call(env: &Env, path: &str, body: Vec<u8>) -> (u16, String) {
    status(
        env.http
            .post(env.url(path))
            .bearer_auth(&env.token)
            .body(body),
    )
    .await
}

#[tokio::test]
async fn key_routes_refuse_malformed_bodies_and_change_nothing() {
    let env = Env::start().await;
    // A ring where retiring 0 would go through: a newer generation, old enough, and
    // nothing sealed under 0. So only the body stops each row below.
    let (code, text) = env.call("POST", "keys/rotate", None).await;
    assert_eq!(code, 200, "{text}");
    env.server
        .db()
        .execute(
            "UPDATE key_generations SET created_at = '2020-01-01T00:00:00Z'",
            [],
        )
        .unwrap();
    let nested = format!(
        r#"{{"generation": {}0{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let table: Vec<(&str, Vec<u8>, u16)> = vec![
        ("keys/retire", b"".to_vec(), 400),
        ("keys/retire", b"{}".to_vec(), 400),
        ("keys/retire", br#"{"generation": "x"}"#.to_vec(), 400),
        ("keys/retire", br#"{"generation": "0"}"#.to_vec(), 400),
        ("keys/retire", br#"{"generation": -1}"#.to_vec(), 400),
        ("keys/retire", br#"{"generation": 0.5}"#.to_vec(), 400),
        ("keys/retire", br#"{"generation": null}"#.to_vec(), 400),
        (
            "keys/retire",
            br#"{"generation": 4294967296}"#.to_vec(),
            400,
        ),
        (
            "keys/retire",
            br#"{"generation": 99999999999999999999999999999}"#.to_vec(),
            400,
        ),
        ("keys/retire", br#"{"generation": 1e400}"#.to_vec(), 400),
        ("keys/retire", br#"{"generation": 0, "x": 1}"#.to_vec(), 400),
        (
            "keys/retire",
            br#"{"generation": 0, "generation": 0}"#.to_vec(),
            400,
        ),
        ("keys/retire", br#"[0]"#.to_vec(), 400),
        ("keys/retire", br#"0"#.to_vec(), 400),
        ("keys/retire", br#"{"generation": 0"#.to_vec(), 400),
        ("keys/retire", b"{\"generation\": 0}\xff".to_vec(), 400),
        ("keys/retire", nested.into_bytes(), 400),
        // Larger than any admin body: refused before it is read.
        (
            "keys/retire",
            format!(r#"{{"generation": 0{}}}"#, " ".repeat(5000)).into_bytes(),
            413,
        ),
        ("keys/rotate", br#"{"x": 1}"#.to_vec(), 400),
        ("keys/rotate", b"[".to_vec(), 400),
        ("keys/rotate", vec![b' '; 5000], 413),
    ];
    // The snapshot counts the ring's rows and its retired ones.
    let before = snapshot(&env.server);
    for (path, body, expected) in table {
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(60)
            .collect::<String>();
        let (code, text) = raw_key_call(&env, path, body).await;
        assert_eq!(code, expected, "{path} {shown}: {text}");
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert!(parsed["error"].is_string(), "{text}");
        assert_eq!(
            snapshot(&env.server),
            before,
            "{path} {shown}: changed something"
        );
    }
    // The ring was ready: the same retire with a good body goes through.
    let (code, text) = raw_key_call(&env, "keys/retire", br#"{"generation": 0}"#.to_vec()).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        env.audit("keyring"),
        [
            ("key.rotated".to_string(), ACTOR.to_string()),
            ("key.retired".to_string(), ACTOR.to_string())
        ]
    );
}

#[tokio::test]
async fn list_show_history_diff_and_rollback() {
    let env = Env::start().await;
    env.write("prod", 1, &resource("a", r#"{"id":"1","x":1}"#))
        .await;
    let two = [
        resource("a", r#"{"id":"1","x":2,"password":"hunter2"}"#),
        resource("b", r#"{"id":"2"}"#),
    ]
    .join(",");
    env.write("prod", 2, &two).await;
    env.write("dev", 1, "").await;

    let list = env.json("GET", "workspaces", None).await;
    let names: Vec<&str> = list["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["dev", "prod"]);
    let prod = env.json("GET", "workspaces/prod", None).await;
    assert_eq!(
        (
            prod["version"].as_i64(),
            prod["serial"].as_i64(),
            prod["deleted"].as_bool()
        ),
        (Some(2), Some(2), Some(false))
    );

    let versions = env.json("GET", "workspaces/prod/versions", None).await;
    let v: Vec<i64> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["version"].as_i64().unwrap())
        .collect();
    assert_eq!(v, [2, 1]);
    let limited = env
        .json("GET", "workspaces/prod/versions?limit=1", None)
        .await;
    assert_eq!(limited["versions"].as_array().unwrap().len(), 1);

    let (code, text) = env.call("GET", "workspaces/prod/versions/1", None).await;
    assert_eq!(
        (code, text),
        (
            200,
            state(1, "lin-1", &resource("a", r#"{"id":"1","x":1}"#))
        )
    );
    let latest = env
        .json("GET", "workspaces/prod/versions/latest", None)
        .await;
    assert_eq!(latest["serial"], 2);
    assert!(
        latest.to_string().contains("hunter2"),
        "unmasked by default for operators"
    );
    let masked = env
        .json("GET", "workspaces/prod/versions/latest?masked=1", None)
        .await;
    assert!(!masked.to_string().contains("hunter2"));

    let d = env
        .json("GET", "workspaces/prod/diff?from=1&to=2", None)
        .await;
    assert_eq!(d["resources"][0]["address"], "null_resource.a");
    assert_eq!(d["resources"][0]["change"], "changed");
    let attrs: Vec<&str> = d["resources"][0]["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(attrs, ["password", "x"]);
    assert_eq!(
        d["resources"][1],
        json!({"address": "null_resource.b", "change": "added"})
    );
    assert!(!d.to_string().contains("hunter2"), "{d}");

    let done = env
        .json("POST", "workspaces/prod/rollback", Some(json!({"to": 1})))
        .await;
    assert_eq!(
        (
            done["written"].as_bool(),
            done["current"]["version"].as_i64()
        ),
        (Some(true), Some(3))
    );
    assert_eq!(done["current"]["actor"], ACTOR);
    let again = env
        .json("POST", "workspaces/prod/rollback", Some(json!({"to": 1})))
        .await;
    assert_eq!(again["written"], false);
    assert_eq!(
        env.audit("tf/prod").last().unwrap(),
        &("tf.rollback".to_string(), ACTOR.to_string())
    );
    // Version 1's content, under a serial above every stored one (2): a plan saved
    // before the rollback is refused as stale instead of applying to it.
    let (code, text) = status(env.server.tf("GET", "prod")).await;
    assert_eq!(
        (code, text),
        (
            200,
            state(3, "lin-1", &resource("a", r#"{"id":"1","x":1}"#))
        )
    );

    // The audit listing, filtered.
    let audit = env
        .json("GET", "audit?scope=tf%2Fprod&event=tf.rollback", None)
        .await;
    let rows = audit["audit"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["actor"], ACTOR);
    assert_eq!(
        (
            &rows[0]["payload"]["serial"],
            &rows[0]["payload"]["restored_serial"]
        ),
        (&json!(3), &json!(1))
    );
    // A time window: everything so far is before tomorrow, nothing is after it.
    let tomorrow = (time::OffsetDateTime::now_utc() + time::Duration::days(1)).date();
    let before = env
        .json(
            "GET",
            &format!("audit?scope=tf%2Fprod&until={tomorrow}"),
            None,
        )
        .await;
    assert!(!before["audit"].as_array().unwrap().is_empty());
    let after = env
        .json(
            "GET",
            &format!("audit?scope=tf%2Fprod&since={tomorrow}"),
            None,
        )
        .await;
    assert_eq!(after["audit"], json!([]));
    // The web UI's reading of the filters: a bare workspace name is its scope, the
    // event a prefix of the name or of a part after a dot, taken literally.
    let env = &env;
    let events = |query: &'static str| async move {
        let listed = env.json("GET", query, None).await;
        listed["audit"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["event"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        events("audit?scope=prod&event=rollback").await,
        ["tf.rollback"]
    );
    let written = events("audit?scope=prod&event=tf.state").await;
    assert!(
        !written.is_empty() && written.iter().all(|e| e.starts_with("tf.state")),
        "{written:?}"
    );
    assert_eq!(
        events("audit?scope=prod").await,
        events("audit?scope=tf%2Fprod").await
    );
    assert!(events("audit?scope=prod&event=tf.*").await.is_empty());
}

#[tokio::test]
async fn unlock_is_audited_with_the_operator_and_refused_for_a_changed_lock() {
    let env = Env::start_with(|c| c.locks.stale_after_seconds = 60).await;
    env.write("prod", 1, "").await;
    // Unlocked: says so, changes nothing, audits nothing.
    let none = env.json("POST", "workspaces/prod/unlock", None).await;
    assert_eq!(none, json!({"unlocked": false, "holder": null}));
    let (code, _) = status(env.server.tf("LOCK", "prod").body(lock_info("L1"))).await;
    assert_eq!(code, 200);
    // Held for two hours: stale in the listing and in /metrics.
    env.server
        .db()
        .execute(
            "UPDATE tf_locks SET created_at = ?1",
            [common::rfc3339(
                time::OffsetDateTime::now_utc() - time::Duration::hours(2),
            )],
        )
        .unwrap();
    let list = env.json("GET", "workspaces", None).await;
    let lock = &list["workspaces"][0]["lock"];
    assert_eq!(
        (lock["who"].as_str(), lock["stale"].as_bool()),
        (Some("tester@host"), Some(true))
    );
    assert!(lock["age_seconds"].as_i64().unwrap() >= 7200);
    let (_, metrics) =
        status(reqwest::Client::new().get(format!("{}/metrics", env.server.base))).await;
    assert!(
        metrics.contains(r#"stategate_lock_held_seconds{workspace="prod"} 72"#),
        "{metrics}"
    );

    let (code, text) = env
        .call(
            "POST",
            "workspaces/prod/unlock",
            Some(json!({"lock_id": "other"})),
        )
        .await;
    assert_eq!(code, 409, "{text}");
    let freed = env
        .json(
            "POST",
            "workspaces/prod/unlock",
            Some(json!({"lock_id": "L1"})),
        )
        .await;
    assert_eq!(
        (freed["unlocked"].as_bool(), freed["holder"]["id"].as_str()),
        (Some(true), Some("L1"))
    );
    let events = env.audit("tf/prod");
    assert_eq!(
        events.last().unwrap(),
        &("tf.lock_forced".to_string(), ACTOR.to_string())
    );
    assert_eq!(events.iter().filter(|e| e.0 == "tf.lock_forced").count(), 1);
    let (_, metrics) =
        status(reqwest::Client::new().get(format!("{}/metrics", env.server.base))).await;
    assert!(!metrics.contains(r#"workspace="prod""#), "freed: {metrics}");
    // The holder's next write is refused (its lock is gone), a fresh run works.
    let (code, _) = status(
        env.server
            .tf("POST", "prod")
            .query(&[("ID", "L1")])
            .body(state(2, "lin-1", "")),
    )
    .await;
    assert_eq!(code, 409);
    env.write("prod", 2, "").await;
}

#[tokio::test]
async fn restore_undoes_a_delete_and_refuses_while_locked() {
    let env = Env::start().await;
    env.write("prod", 1, "").await;
    env.write("prod", 2, &resource("a", r#"{"id":"1"}"#)).await;
    let (code, _) = status(env.server.tf("DELETE", "prod")).await;
    assert_eq!(code, 200);
    let (code, _) = status(env.server.tf("GET", "prod")).await;
    assert_eq!(code, 404);
    // A tombstone cannot be shown or diffed.
    let (code, text) = env
        .call("GET", "workspaces/prod/versions/latest", None)
        .await;
    assert_eq!(code, 409, "{text}");
    let (code, _) = env
        .call("GET", "workspaces/prod/diff?from=2&to=3", None)
        .await;
    assert_eq!(code, 409);
    let listed = env.json("GET", "workspaces/prod", None).await;
    assert_eq!(listed["deleted"], true);

    let (code, _) = status(env.server.tf("LOCK", "prod").body(lock_info("L1"))).await;
    assert_eq!(code, 200);
    let (code, text) = env.call("POST", "workspaces/prod/restore", None).await;
    assert_eq!(code, 423, "{text}");
    let (code, _) = status(env.server.tf("UNLOCK", "prod").body(lock_info("L1"))).await;
    assert_eq!(code, 200);

    let done = env
        .json("POST", "workspaces/prod/restore", Some(json!({})))
        .await;
    assert_eq!(
        (
            done["to_version"].as_i64(),
            done["current"]["version"].as_i64()
        ),
        (Some(2), Some(4))
    );
    // The restored content carries a serial above every stored one (2), so a plan
    // saved before the delete is stale.
    let (code, text) = status(env.server.tf("GET", "prod")).await;
    assert_eq!(
        (code, text),
        (200, state(3, "lin-1", &resource("a", r#"{"id":"1"}"#)))
    );
    assert_eq!(
        env.audit("tf/prod").last().unwrap(),
        &("tf.restored".to_string(), ACTOR.to_string())
    );
    let (code, _) = env.call("POST", "workspaces/prod/restore", None).await;
    assert_eq!(code, 409, "not deleted any more");
}

#[tokio::test]
async fn an_unreadable_version_is_an_error_never_empty() {
    let env = Env::start().await;
    env.write("prod", 1, "").await;
    for blob in env.server.blob_files() {
        std::fs::write(&blob, b"garbage").unwrap();
    }
    for path in [
        "workspaces/prod/versions/1",
        "workspaces/prod/versions/latest",
        "workspaces/prod/diff?from=1&to=1",
    ] {
        let (code, text) = env.call("GET", path, None).await;
        assert_eq!(code, 500, "{path}: {text}");
        assert!(text.contains("cannot be read"), "{text}");
    }
    // Nothing was revealed, so nothing was audited as revealed.
    assert!(!env.audit("tf/prod").iter().any(|e| e.0 == "state.revealed"));
    // Search names it as unreadable rather than passing over it.
    let found = env.json("GET", "search?q=null", None).await;
    assert_eq!(found["unreadable"], json!(["prod"]));
    assert_eq!(found["hits"], json!([]));
}

/// `state.revealed` rows as (actor, payload).
fn reveals(env: &Env) -> Vec<(String, Value)> {
    let conn = env.server.db();
    let mut stmt = conn
        .prepare("SELECT actor, payload FROM audit WHERE event = 'state.revealed' ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        Ok((
            r.get(0)?,
            serde_json::from_str(&r.get::<_, String>(1)?).unwrap(),
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

#[tokio::test]
async fn an_unmasked_show_is_audited_as_a_reveal_and_a_masked_one_is_not() {
    let env = Env::start().await;
    env.write(
        "prod",
        1,
        &resource("a", r#"{"id":"1","password":"hunter2"}"#),
    )
    .await;
    let masked = env
        .json("GET", "workspaces/prod/versions/1?masked=1", None)
        .await;
    assert!(!masked.to_string().contains("hunter2"));
    assert!(reveals(&env).is_empty(), "masked is not a reveal");
    let (code, text) = env
        .call("GET", "workspaces/prod/versions/latest", None)
        .await;
    assert_eq!(code, 200);
    assert!(text.contains("hunter2"));
    assert_eq!(
        reveals(&env),
        [(ACTOR.to_string(), json!({"version": 1, "via": "api"}))]
    );
    let (code, _) = env.call("GET", "workspaces/prod/versions/5", None).await;
    assert_eq!(code, 404);
    assert_eq!(reveals(&env).len(), 1, "a refused show reveals nothing");
    let listed = env
        .json("GET", "audit?scope=tf%2Fprod&event=state.revealed", None)
        .await;
    assert_eq!(listed["audit"][0]["scope"], "tf/prod");
    assert!(!listed.to_string().contains("hunter2"));
}

#[tokio::test]
async fn rollback_preview_and_a_rollback_pinned_to_what_was_seen() {
    let env = Env::start().await;
    env.write("prod", 1, &resource("a", r#"{"id":"1","x":1}"#))
        .await;
    env.write(
        "prod",
        2,
        &resource("b", r#"{"id":"2","password":"hunter2"}"#),
    )
    .await;
    let preview = env.json("GET", "workspaces/prod/rollback?to=1", None).await;
    assert_eq!(
        (
            preview["from_version"].as_i64(),
            preview["to_version"].as_i64(),
            preview["to_serial"].as_i64(),
        ),
        (Some(2), Some(1), Some(3)) // the serial after every stored one
    );
    assert_eq!(
        preview["diff"]["resources"],
        json!([
            {"address": "null_resource.a", "change": "added"},
            {"address": "null_resource.b", "change": "removed"},
        ])
    );
    assert_eq!(preview["lock"], Value::Null);
    assert!(!preview.to_string().contains("hunter2"));
    // Locked: the preview names the holder.
    let (code, _) = status(env.server.tf("LOCK", "prod").body(lock_info("L1"))).await;
    assert_eq!(code, 200);
    let preview = env.json("GET", "workspaces/prod/rollback?to=1", None).await;
    assert_eq!(preview["lock"]["id"], "L1");
    let (code, _) = status(env.server.tf("UNLOCK", "prod").body(lock_info("L1"))).await;
    assert_eq!(code, 200);
    // A write after the preview: a rollback pinned to version 2 is refused.
    env.write("prod", 3, "").await;
    let (code, text) = env
        .call(
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 1, "from": 2})),
        )
        .await;
    assert_eq!(code, 409, "{text}");
    assert!(!env.audit("tf/prod").iter().any(|e| e.0 == "tf.rollback"));
    let done = env
        .json(
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 1, "from": 3})),
        )
        .await;
    assert_eq!(done["current"]["version"], 4);
}

#[tokio::test]
async fn search_finds_resources_in_every_workspaces_newest_version() {
    let env = Env::start().await;
    env.write("prod", 1, &resource("old", r#"{"id":"1"}"#))
        .await;
    env.write(
        "prod",
        2,
        &resource("web", r#"{"id":"1","password":"hunter2"}"#),
    )
    .await;
    env.write("dev", 1, &resource("web", r#"{"id":"2"}"#)).await;
    let found = env.json("GET", "search?q=null_resource.WEB", None).await;
    let hits: Vec<(&str, i64, &str, &str)> = found["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["workspace"].as_str().unwrap(),
                h["version"].as_i64().unwrap(),
                h["address"].as_str().unwrap(),
                h["type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hits,
        [
            ("dev", 1, "null_resource.web", "null_resource"),
            ("prod", 2, "null_resource.web", "null_resource"),
        ]
    );
    assert_eq!(found["workspaces_scanned"], 2);
    assert_eq!(found["truncated"], Value::Null);
    assert_eq!(found["limits"]["max_workspaces"], 500);
    assert!(!found.to_string().contains("hunter2"));
    let old = env.json("GET", "search?q=old", None).await;
    assert_eq!(old["hits"], json!([]), "only the newest versions");
}

#[tokio::test]
async fn clusters_with_their_lease() {
    let env = Env::start().await;
    let (admin, cluster) = env
        .server
        .app
        .operator
        .admin_write(|c| {
            identity::create_org(c, "acme")?;
            let t = identity::create_principal(c, "acme", "a@acme", Role::Admin)?;
            Ok((
                t,
                identity::create_cluster(c, "acme", Some("prod"), None)?.id,
            ))
        })
        .await
        .unwrap();
    let listed = env.json("GET", "clusters", None).await;
    assert_eq!(listed["clusters"][0]["lease"], Value::Null);
    let (code, _) = status(
        reqwest::Client::new()
            .post(format!("{}/v1/clusters/{cluster}/lock", env.server.base))
            .bearer_auth(&admin)
            .body(r#"{"operation":"provision","host":"box"}"#),
    )
    .await;
    assert_eq!(code, 200);
    let listed = env.json("GET", "clusters", None).await;
    let c = &listed["clusters"][0];
    assert_eq!(
        (c["id"].as_str(), c["org"].as_str(), c["name"].as_str()),
        (Some(cluster.as_str()), Some("acme"), Some("prod"))
    );
    assert_eq!(
        (
            c["lease"]["holder_email"].as_str(),
            c["lease"]["stale"].as_bool()
        ),
        (Some("a@acme"), Some(false))
    );
    let (_, metrics) =
        status(reqwest::Client::new().get(format!("{}/metrics", env.server.base))).await;
    assert!(
        metrics.contains(&format!(
            "stategate_lease_held_seconds{{cluster=\"{cluster}\"}}"
        )),
        "{metrics}"
    );
}

/// A version larger than `max_view_bytes` is refused, naming the limit, by every view
/// that would read it whole — before anything is read, revealed or audited — while
/// Terraform still reads it and a rollback (streamed) still restores it.
#[tokio::test]
async fn views_refuse_versions_larger_than_max_view_bytes() {
    let env = Env::start_with(|c| c.max_view_bytes = 2048).await;
    env.write("prod", 1, "").await;
    let big = resource("big", &format!(r#"{{"id":"{}"}}"#, "x".repeat(4000)));
    env.write("prod", 2, &big).await;
    env.json("GET", "workspaces/prod/versions/1?masked=1", None)
        .await;
    for path in [
        "workspaces/prod/versions/2",
        "workspaces/prod/versions/latest",
        "workspaces/prod/versions/2?masked=1",
        "workspaces/prod/diff?from=1&to=2",
        "workspaces/prod/rollback?to=2",
    ] {
        let (code, text) = env.call("GET", path, None).await;
        assert_eq!(code, 409, "{path}: {text}");
        assert!(
            text.contains("max_view_bytes") && text.contains("version 2"),
            "{path}: {text}"
        );
    }
    assert!(!env.audit("tf/prod").iter().any(|e| e.0 == "state.revealed"));
    let (code, body) = status(env.server.tf("GET", "prod")).await;
    assert_eq!(code, 200);
    assert!(body.len() > 4000 && body.contains("big"));
    env.write("prod", 3, "").await;
    let done = env
        .json(
            "POST",
            "workspaces/prod/rollback",
            Some(json!({"to": 2, "from": 3})),
        )
        .await;
    assert_eq!(done["current"]["version"], 4);
    let (_, body) = status(env.server.tf("GET", "prod")).await;
    assert!(body.contains("big"));
}

// ---- Roles: role × every route, refusals identical and changing nothing ----

async fn role_env() -> (
    Env,
    Vec<(&'static str, &'static str, Option<&'static str>, String)>,
) {
    let env = Env::start().await;
    for ws in ["prod-x", "dev-a"] {
        let secret = format!(r#"{{"password":"{SECRET}","n":1}}"#);
        env.write(ws, 1, &resource("one", &secret)).await;
        let two = format!(r#"{{"password":"{SECRET}","n":2}}"#);
        env.write(ws, 2, &resource("one", &two)).await;
        let (code, _) = status(
            env.server
                .tf("LOCK", ws)
                .body(lock_info(&format!("L-{ws}"))),
        )
        .await;
        assert_eq!(code, 200);
    }
    unfinished_runs(&env.server, &["prod-x", "dev-a"]);
    let tokens = role_operators(&env.server).await;
    let ops = ROLE_OPERATORS
        .iter()
        .zip(tokens)
        .map(|((email, role, patterns), token)| (*email, *role, *patterns, token))
        .collect();
    (env, ops)
}

fn run_of(ws: &str) -> i64 {
    if ws == "prod-x" {
        1
    } else {
        2
    }
}

#[tokio::test]
async fn every_admin_route_by_role_refuses_identically_and_changes_nothing() {
    let (env, ops) = role_env().await;
    // (method, path, body, least role, aim) for every route of the admin API, on a
    // workspace inside and one outside the limited operators' `dev-*`.
    let mut routes: Vec<(&str, String, Option<Value>, &str, Aim)> = vec![
        ("GET", "whoami".into(), None, "viewer", Aim::Nothing),
        ("GET", "workspaces".into(), None, "viewer", Aim::Listing),
        ("GET", "audit".into(), None, "viewer", Aim::Listing),
        ("GET", "search?q=null".into(), None, "viewer", Aim::Listing),
        ("GET", "drift".into(), None, "viewer", Aim::Listing),
        ("GET", "clusters".into(), None, "viewer", Aim::Site),
        ("GET", "freezes".into(), None, "viewer", Aim::Listing),
        // A move needs the role on both workspaces (refused states change nothing:
        // the fixture's locks refuse the allowed ones after the guard).
        (
            "POST",
            "workspaces/dev-a/move/prod-x".into(),
            Some(json!({"addresses": ["null_resource.one"]})),
            "operator",
            Aim::Both("dev-a", "prod-x"),
        ),
        (
            "POST",
            "workspaces/prod-x/move/dev-a".into(),
            Some(json!({"addresses": ["null_resource.one"]})),
            "operator",
            Aim::Both("prod-x", "dev-a"),
        ),
        (
            "POST",
            "workspaces/dev-a/move/dev-b".into(),
            Some(json!({"addresses": ["null_resource.one"]})),
            "operator",
            Aim::Both("dev-a", "dev-b"),
        ),
        ("GET", "workspace-tokens".into(), None, "admin", Aim::Site),
        // The keyring seals every workspace: an admin not limited to patterns.
        ("GET", "keys".into(), None, "admin", Aim::Site),
        ("POST", "keys/rotate".into(), None, "admin", Aim::Site),
        (
            "POST",
            "keys/retire".into(),
            Some(json!({"generation": 0})),
            "admin",
            Aim::Site,
        ),
        (
            "POST",
            "workspace-tokens".into(),
            Some(json!({"name": "ci", "workspaces": "dev-*", "scope": "read"})),
            "admin",
            Aim::Site,
        ),
        (
            "POST",
            "workspace-tokens/nobody/revoke".into(),
            None,
            "admin",
            Aim::Site,
        ),
        // A workspace that does not exist is refused like one that does.
        (
            "GET",
            "workspaces/prod-nope".into(),
            None,
            "viewer",
            Aim::Ws("prod-nope"),
        ),
    ];
    for ws in ["prod-x", "dev-a"] {
        let w = |p: &str| format!("workspaces/{ws}{p}");
        let run = run_of(ws);
        routes.extend([
            ("GET", w(""), None, "viewer", Aim::Ws(ws)),
            ("GET", w("/versions"), None, "viewer", Aim::Ws(ws)),
            ("GET", w("/timeline"), None, "viewer", Aim::Ws(ws)),
            (
                "GET",
                w("/timeline?address=null_resource.a"),
                None,
                "viewer",
                Aim::Ws(ws),
            ),
            (
                "GET",
                w("/versions/1?masked=1"),
                None,
                "viewer",
                Aim::Ws(ws),
            ),
            ("GET", w("/versions/1"), None, "admin", Aim::Ws(ws)),
            ("GET", w("/versions/latest"), None, "admin", Aim::Ws(ws)),
            ("GET", w("/versions/1?masked=0"), None, "admin", Aim::Ws(ws)),
            ("GET", w("/diff?from=1&to=2"), None, "viewer", Aim::Ws(ws)),
            ("GET", w("/rollback?to=1"), None, "viewer", Aim::Ws(ws)),
            ("GET", w("/consumers"), None, "admin", Aim::Ws(ws)),
            (
                "PUT",
                w("/consumers"),
                Some(json!({"consumers": ["app"]})),
                "admin",
                Aim::Ws(ws),
            ),
            ("POST", w("/credential/rotate"), None, "admin", Aim::Ws(ws)),
            (
                "POST",
                w("/rollback"),
                Some(json!({"to": 1})),
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                w("/unlock"),
                Some(json!({})),
                "operator",
                Aim::Ws(ws),
            ),
            ("POST", w("/restore"), None, "operator", Aim::Ws(ws)),
            (
                "POST",
                w("/allow-write"),
                Some(json!({"reason": "adopt", "minutes": 5})),
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                w("/freeze"),
                Some(json!({"reason": "window", "for": "1h"})),
                "operator",
                Aim::Ws(ws),
            ),
            ("POST", w("/unfreeze"), None, "operator", Aim::Ws(ws)),
            (
                "GET",
                format!("drift?workspace={ws}"),
                None,
                "viewer",
                Aim::Ws(ws),
            ),
            ("GET", format!("drift/{run}"), None, "viewer", Aim::Ws(ws)),
            (
                "POST",
                format!("drift/{ws}/run"),
                None,
                "operator",
                Aim::Ws(ws),
            ),
            (
                "POST",
                format!("drift/{run}/apply"),
                None,
                "operator",
                Aim::Ws(ws),
            ),
        ]);
    }
    let refusal = stategate::error::Error::NotPermitted.body();
    let refusal = std::str::from_utf8(&refusal).unwrap().to_string();
    let (mut refused, mut allowed) = (0, 0);
    for (email, role, patterns, token) in &ops {
        for (method, path, body, least, aim) in &routes {
            let before = snapshot(&env.server);
            let (code, text) = env.call_as(Some(token), method, path, body.clone()).await;
            let what = format!("{email} ({role} {patterns:?}) {method} {path}");
            if expected_allowed(role, *patterns, least, *aim) {
                allowed += 1;
                assert!(
                    code != 401 && code != 403,
                    "{what}: allowed, got {code} {text}"
                );
            } else {
                refused += 1;
                assert_eq!((code, text.as_str()), (403, refusal.as_str()), "{what}");
                assert!(
                    !text.contains(SECRET) && !text.contains(token.as_str()),
                    "{what}"
                );
                assert_eq!(
                    snapshot(&env.server),
                    before,
                    "{what}: a refusal changed something"
                );
            }
        }
    }
    assert!(
        refused > 50 && allowed > 50,
        "{refused} refused, {allowed} allowed"
    );
    // The refused reveals left no `state.revealed` row of a refused operator.
    let conn = env.server.db();
    let revealers: Vec<String> = conn
        .prepare("SELECT DISTINCT actor FROM audit WHERE event = 'state.revealed' ORDER BY actor")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        revealers,
        ["operator:admin-dev@x.io", "operator:admin@x.io"]
    );
    // No force-unlock of prod-x by anyone limited to dev-*, or by a viewer.
    let forced: Vec<(String, String)> = conn
        .prepare("SELECT scope, actor FROM audit WHERE event = 'tf.lock_forced' ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        forced,
        [
            (
                "tf/dev-a".to_string(),
                "operator:operator-dev@x.io".to_string()
            ),
            ("tf/prod-x".into(), "operator:operator@x.io".into()),
        ]
    );
    // A missing or wrong token is still the 401 it was, before any role is looked at.
    let (code, text) = env.call_as(None, "GET", "clusters", None).await;
    assert_eq!(code, 401, "{text}");
    let (code, _) = env
        .call_as(Some("sgo_wrong"), "POST", "workspaces/prod-x/unlock", None)
        .await;
    assert_eq!(code, 401);
}

#[tokio::test]
async fn listings_show_only_the_workspaces_an_operator_may_see() {
    let (env, ops) = role_env().await;
    let token = |email: &str| ops.iter().find(|o| o.0 == email).unwrap().3.clone();
    let get = |token: String, path: &'static str| {
        let env = &env;
        async move {
            let (code, text) = env.call_as(Some(&token), "GET", path, None).await;
            assert_eq!(code, 200, "{path}: {text}");
            text
        }
    };
    for email in ["viewer-dev@x.io", "operator-dev@x.io", "admin-dev@x.io"] {
        for path in ["workspaces", "search?q=null", "audit?limit=1000", "drift"] {
            let text = get(token(email), path).await;
            assert!(!text.contains("prod-x"), "{email} {path}: {text}");
            assert!(text.contains("dev-a"), "{email} {path}: {text}");
        }
        // Nothing site-wide in its audit log either (operators, logins, clusters).
        let audit: Value = serde_json::from_str(&get(token(email), "audit").await).unwrap();
        let scopes: std::collections::BTreeSet<&str> = audit["audit"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["scope"].as_str().unwrap())
            .collect();
        assert_eq!(
            scopes.into_iter().collect::<Vec<_>>(),
            ["tf/dev-a"],
            "{email}"
        );
        let me: Value = serde_json::from_str(&get(token(email), "whoami").await).unwrap();
        assert_eq!(me["workspaces"], json!(["dev-*"]));
    }
    for email in ["viewer@x.io", "admin@x.io"] {
        for path in ["workspaces", "search?q=null", "audit?limit=1000", "drift"] {
            let text = get(token(email), path).await;
            assert!(
                text.contains("prod-x") && text.contains("dev-a"),
                "{email} {path}: {text}"
            );
        }
    }
    let me: Value = serde_json::from_str(&get(token("viewer@x.io"), "whoami").await).unwrap();
    assert_eq!(
        (me["role"].as_str(), me["workspaces"].clone()),
        (Some("viewer"), json!([]))
    );
    // The operator of before roles (created without one) is an admin of everything.
    let me = env.json("GET", "whoami", None).await;
    assert_eq!(me["role"], "admin");
}

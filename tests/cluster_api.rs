//! The cluster tfstate & lock API in-process: the real gateway on 127.0.0.1:0, real
//! SQLite, the local blob store and a test clock (no sleeps: staleness is reached by
//! advancing the clock). Walks every row of `cluster-api.md`.

mod common;

use std::sync::Arc;

use serde_json::{json, Value};
use stategate::cluster::identity::{self, AdminError, Role};
use stategate::cluster::{Clock, TestClock, MAX_STATE_BYTES};
use stategate::crypto::RootKey;

/// ADJ_STATE_ENC_KEY of the tests (different from the DEK on purpose).
const ENC_KEY: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const NOT_CONFIGURED: &[u8] = br#"{"error": "state sync not configured"}"#;
const STALE: i64 = 300;

type AdminJob =
    Box<dyn FnOnce(&stategate::store::sql::Connection) -> Result<String, AdminError> + Send>;

struct Env {
    server: common::TestServer,
    clock: TestClock,
    http: reqwest::Client,
    /// Tokens by short name: alice, bob, erin (acme admins), mallory (acme member),
    /// carol (globex admin), dave (initech admin: the third org).
    tokens: std::collections::HashMap<&'static str, String>,
    /// acme's cluster.
    cluster: String,
    /// globex's cluster.
    other_cluster: String,
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Env {
    async fn start(enc_key: Option<&str>) -> Env {
        let clock = TestClock::default();
        let server = common::TestServer::start_with_clock(
            |config| {
                config.cluster.state_enc_key = enc_key.map(Into::into);
                config.cluster.lease_stale_seconds = STALE as u64;
            },
            Arc::new(clock.clone()),
        )
        .await;
        let mut tokens = std::collections::HashMap::new();
        let (cluster, other_cluster) = {
            let ops = &server.app.operator;
            let admin = |f: AdminJob| async move { ops.admin_write(f).await.unwrap() };
            for org in ["acme", "globex", "initech"] {
                admin(Box::new(move |c| {
                    identity::create_org(c, org).map(|()| String::new())
                }))
                .await;
            }
            for (name, org, role) in [
                ("alice", "acme", Role::Admin),
                ("bob", "acme", Role::Admin),
                ("erin", "acme", Role::Admin),
                ("mallory", "acme", Role::Member),
                ("carol", "globex", Role::Admin),
                ("dave", "initech", Role::Admin),
            ] {
                let email = format!("{name}@{org}.example");
                let token = admin(Box::new(move |c| {
                    identity::create_principal(c, org, &email, role)
                }))
                .await;
                tokens.insert(name, token);
            }
            let cluster = admin(Box::new(|c| {
                identity::create_cluster(c, "acme", Some("prod"), None).map(|r| r.id)
            }))
            .await;
            let other = admin(Box::new(|c| {
                identity::create_cluster(c, "globex", None, None).map(|r| r.id)
            }))
            .await;
            (cluster, other)
        };
        Env {
            server,
            clock,
            http: reqwest::Client::new(),
            tokens,
            cluster,
            other_cluster,
        }
    }

    fn token(&self, who: &str) -> &str {
        &self.tokens[who]
    }

    /// `who`: a principal name, `None` for no Authorization, or `Some("raw:<header>")`
    /// for a literal Authorization header.
    async fn call(
        &self,
        who: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Resp {
        let mut req = self.http.request(
            method.parse().unwrap(),
            format!("{}{path}", self.server.base),
        );
        match who {
            None => {}
            Some(raw) if raw.starts_with("raw:") => {
                req = req.header("Authorization", &raw[4..]);
            }
            Some(name) => req = req.bearer_auth(self.token(name)),
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req.send().await.unwrap();
        Resp {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.bytes().await.unwrap().to_vec(),
        }
    }

    fn path(&self, cluster: &str, route: &str) -> String {
        format!("/v1/clusters/{cluster}/{route}")
    }

    async fn lock(&self, who: &str, op: &str, host: &str) -> Resp {
        let body = json!({"operation": op, "host": host})
            .to_string()
            .into_bytes();
        self.call(
            Some(who),
            "POST",
            &self.path(&self.cluster, "lock"),
            Some(body),
        )
        .await
    }

    async fn push(&self, who: &str, state: &str) -> Resp {
        self.call(
            Some(who),
            "PUT",
            &self.path(&self.cluster, "tfstate"),
            Some(state.as_bytes().to_vec()),
        )
        .await
    }

    async fn heartbeat(&self, who: &str) -> Resp {
        self.call(
            Some(who),
            "POST",
            &self.path(&self.cluster, "lock/heartbeat"),
            None,
        )
        .await
    }

    async fn release(&self, who: &str, force: bool) -> Resp {
        let q = if force { "?force=1" } else { "" };
        self.call(
            Some(who),
            "DELETE",
            &format!("{}{q}", self.path(&self.cluster, "lock")),
            None,
        )
        .await
    }

    async fn pull(&self, who: &str) -> Resp {
        self.call(Some(who), "GET", &self.path(&self.cluster, "tfstate"), None)
            .await
    }

    /// Audit rows of a cluster, oldest first: (event, actor, org, payload).
    fn audit(&self, cluster: &str) -> Vec<(String, String, String, Value)> {
        stategate::store::audit::list_audit(
            &self.server.db(),
            Some(&format!("cluster/{cluster}")),
            None,
            10_000,
        )
        .unwrap()
        .into_iter()
        .filter(|r| !r.event.starts_with("admin."))
        .map(|r| {
            assert!(!r.at.is_empty());
            (r.event, r.actor, r.org.unwrap_or_default(), r.payload)
        })
        .collect()
    }

    fn audit_events(&self) -> Vec<String> {
        self.audit(&self.cluster).into_iter().map(|a| a.0).collect()
    }

    /// Everything a request could change: version rows, leases, audit, blob files.
    fn snapshot(&self) -> String {
        let conn = self.server.db();
        let mut out = String::new();
        for sql in [
            "SELECT scope, version, serial, lineage, sha256, size, blob_key FROM versions ORDER BY scope, version",
            "SELECT cluster_id, holder_id, operation, host, acquired_at, heartbeat_at FROM cluster_leases ORDER BY cluster_id",
            "SELECT id, actor, org, scope, event, payload FROM audit ORDER BY id",
        ] {
            let mut stmt = conn.prepare(sql).unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    Ok((0..n)
                        .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap();
            for row in rows {
                out.push_str(&row.unwrap());
                out.push('\n');
            }
            out.push_str("--\n");
        }
        for f in self.server.blob_files() {
            out.push_str(&f.display().to_string());
            out.push('\n');
        }
        out
    }

    fn version_count(&self) -> i64 {
        self.server
            .db()
            .query_row(
                "SELECT count(*) FROM versions WHERE scope = ?1",
                [format!("cluster/{}", self.cluster)],
                |r| r.get(0),
            )
            .unwrap()
    }
}

/// A tfstate (`common::state`) whose content differs by `marker`.
fn marked_state(serial: u64, lineage: &str, marker: &str) -> String {
    common::state(serial, lineage, &format!(r#"{{"name":"{marker}"}}"#))
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// A lease holder as a refused caller sees it (409).
#[derive(Debug, Clone, Copy)]
struct Holder {
    email: &'static str,
    operation: &'static str,
    host: &'static str,
    /// Seconds since the holder's last heartbeat.
    age: i64,
}

impl Holder {
    /// A 409 whose `error` names the holder, plus the five holder fields.
    fn check(&self, r: &Resp, ctx: &str) {
        assert_eq!(r.status, 409, "{ctx}");
        let body = r.json();
        assert!(
            body["error"].as_str().unwrap().contains(self.email),
            "{ctx}"
        );
        assert_eq!(body["holder_email"], self.email, "{ctx}");
        assert_eq!(body["operation"], self.operation, "{ctx}");
        assert_eq!(body["host"], self.host, "{ctx}");
        assert!(
            body["acquired_at"].as_str().unwrap().ends_with('Z'),
            "{ctx}"
        );
        assert_eq!(body["heartbeat_age_seconds"], self.age, "{ctx}");
    }
}

/// The contract walk's two leases: alice's (provision from host-a) and bob's
/// (deprovision from host-b), `age` seconds after their last heartbeat.
fn held_by(who: &str, age: i64) -> Expect {
    let (email, operation, host) = match who {
        "alice" => ("alice@acme.example", "provision", "host-a"),
        "bob" => ("bob@acme.example", "deprovision", "host-b"),
        other => panic!("{other} holds no lease in the walk"),
    };
    Expect::Holder(Holder {
        email,
        operation,
        host,
        age,
    })
}

/// What a step expects of the response body.
enum Expect {
    /// Parsed JSON equals this.
    Json(Value),
    /// A JSON error whose message contains this, plus the fields given.
    Error(&'static str, Value),
    /// The holder body of a 409: error + the five holder fields.
    Holder(Holder),
    /// Empty body.
    Empty,
    /// The state bytes pushed in step `n` of the walk.
    StateOf(usize),
}

struct Step {
    advance: i64,
    who: &'static str,
    method: &'static str,
    route: &'static str,
    body: Option<String>,
    status: u16,
    expect: Expect,
    /// Audit events this step must append (in order); nothing else may be appended.
    audit: &'static [&'static str],
}

fn step(
    who: &'static str,
    method: &'static str,
    route: &'static str,
    body: Option<String>,
    status: u16,
    expect: Expect,
    audit: &'static [&'static str],
) -> Step {
    Step {
        advance: 0,
        who,
        method,
        route,
        body,
        status,
        expect,
        audit,
    }
}

fn lock_body(op: &str, host: &str) -> Option<String> {
    Some(json!({"operation": op, "host": host}).to_string())
}

/// Every row of the contract for an authorized admin, in one walk over one cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_walk() {
    let env = Env::start(Some(ENC_KEY)).await;
    let t0 = env.clock.now();
    let at = |offset: i64| stategate::cluster::clock::rfc3339(t0 + offset);
    let s1 = marked_state(1, "lin-A", "marker-one");
    let s1b = marked_state(1, "lin-A", "marker-one-but-different");
    let s2 = marked_state(2, "lin-A", "marker-two");
    let steps: Vec<Step> = vec![
        // 0: GET with nothing pushed → 404.
        step(
            "alice",
            "GET",
            "tfstate",
            None,
            404,
            Expect::Error("no state", json!({})),
            &[],
        ),
        // 1: PUT without holding the lock → 409, nobody holds it.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(s1.clone()),
            409,
            Expect::Error("do not hold", json!({})),
            &[],
        ),
        // 2: acquire → 200 {"acquired_at"}.
        step(
            "alice",
            "POST",
            "lock",
            lock_body("provision", "host-a"),
            200,
            Expect::Json(json!({"acquired_at": at(0)})),
            &["cluster.state_lock_acquired"],
        ),
        // 3: the holder again, 10 s later → 200, timestamps refreshed.
        Step {
            advance: 10,
            ..step(
                "alice",
                "POST",
                "lock",
                lock_body("provision", "host-a"),
                200,
                Expect::Json(json!({"acquired_at": at(10)})),
                &["cluster.state_lock_acquired"],
            )
        },
        // 4: another admin while the heartbeat is fresh → 409 with the holder.
        Step {
            advance: 5,
            ..step(
                "bob",
                "POST",
                "lock",
                lock_body("deprovision", "host-b"),
                409,
                held_by("alice", 5),
                &[],
            )
        },
        // 5: PUT by a non-holder while someone holds it → 409 with the holder.
        step(
            "bob",
            "PUT",
            "tfstate",
            Some(s1.clone()),
            409,
            held_by("alice", 5),
            &[],
        ),
        // 6: first push → stored.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(s1.clone()),
            200,
            Expect::Json(json!({"serial": 1})),
            &["cluster.state_pushed"],
        ),
        // 7: GET returns the exact bytes (headers checked below).
        step(
            "alice",
            "GET",
            "tfstate",
            None,
            200,
            Expect::StateOf(6),
            &[],
        ),
        // 8: GET needs no lock.
        step("bob", "GET", "tfstate", None, 200, Expect::StateOf(6), &[]),
        // 9: identical retry → 200 no-op.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(s1.clone()),
            200,
            Expect::Json(json!({"serial": 1})),
            &[],
        ),
        // 10: equal serial, different content → 409.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(s1b.clone()),
            409,
            Expect::Error(
                "already stored with different content",
                json!({"stored_serial": 1}),
            ),
            &[],
        ),
        // 11: stored serial greater → 409.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(marked_state(0, "lin-A", "zero")),
            409,
            Expect::Error("stale state", json!({"stored_serial": 1})),
            &[],
        ),
        // 12: lineage mismatch (even with a higher serial) → 409.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(marked_state(2, "lin-B", "x")),
            409,
            Expect::Error("lineage mismatch", json!({"stored_lineage": "lin-A"})),
            &[],
        ),
        // 13: not a tfstate → 400.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some("{\"hello\": 1}".into()),
            400,
            Expect::Error("not a Terraform/OpenTofu state", json!({})),
            &[],
        ),
        // 14: higher serial, same lineage → stored.
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(s2.clone()),
            200,
            Expect::Json(json!({"serial": 2})),
            &["cluster.state_pushed"],
        ),
        // 15: GET now returns serial 2.
        step("bob", "GET", "tfstate", None, 200, Expect::StateOf(14), &[]),
        // 16: heartbeat by a non-holder → 409 (lock lost), with the holder.
        step(
            "bob",
            "POST",
            "lock/heartbeat",
            None,
            409,
            held_by("alice", 5),
            &[],
        ),
        // 17: heartbeat by the holder → 200, empty.
        Step {
            advance: 60,
            ..step(
                "alice",
                "POST",
                "lock/heartbeat",
                None,
                200,
                Expect::Empty,
                &[],
            )
        },
        // 18: release by a non-holder → 409, not released.
        Step {
            advance: STALE,
            ..step(
                "bob",
                "DELETE",
                "lock",
                None,
                409,
                held_by("alice", STALE),
                &[],
            )
        },
        // 19: exactly at the threshold the lease is not stale yet.
        step(
            "bob",
            "POST",
            "lock",
            lock_body("deprovision", "host-b"),
            409,
            held_by("alice", STALE),
            &[],
        ),
        // 20: one second later it is: bob takes it over (audited with the previous holder).
        Step {
            advance: 1,
            ..step(
                "bob",
                "POST",
                "lock",
                lock_body("deprovision", "host-b"),
                200,
                Expect::Json(json!({"acquired_at": at(10 + 5 + 60 + STALE + 1)})),
                &["cluster.state_lock_stolen"],
            )
        },
        // 21: the old holder's heartbeat → 409 lock lost, naming the new holder.
        step(
            "alice",
            "POST",
            "lock/heartbeat",
            None,
            409,
            held_by("bob", 0),
            &[],
        ),
        // 22: the old holder's push → 409 (lock check before the conflict rules).
        step(
            "alice",
            "PUT",
            "tfstate",
            Some(marked_state(3, "lin-A", "late")),
            409,
            held_by("bob", 0),
            &[],
        ),
        // 23: the old holder's release → 409.
        step("alice", "DELETE", "lock", None, 409, held_by("bob", 0), &[]),
        // 24: holder release → 200 empty.
        step(
            "bob",
            "DELETE",
            "lock",
            None,
            200,
            Expect::Empty,
            &["cluster.state_lock_released"],
        ),
        // 25: again → 200 (idempotent), nothing audited.
        step("bob", "DELETE", "lock", None, 200, Expect::Empty, &[]),
        // 26: heartbeat with nothing held → 409 lock lost.
        step(
            "bob",
            "POST",
            "lock/heartbeat",
            None,
            409,
            Expect::Error("lock lost", json!({})),
            &[],
        ),
        // 27: alice takes it (state-push) ...
        step(
            "alice",
            "POST",
            "lock",
            lock_body("state-push", "host-a"),
            200,
            Expect::Json(json!({"acquired_at": at(10 + 5 + 60 + STALE + 1)})),
            &["cluster.state_lock_acquired"],
        ),
        // 28: ... and another org admin breaks it, fresh or not (audited).
        step(
            "erin",
            "DELETE",
            "lock?force=1",
            None,
            200,
            Expect::Empty,
            &["cluster.state_lock_broken"],
        ),
        // 29: force with nothing held → 200, nothing audited.
        step(
            "erin",
            "DELETE",
            "lock?force=1",
            None,
            200,
            Expect::Empty,
            &[],
        ),
    ];

    let mut pushed: Vec<Option<String>> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        env.clock.advance(s.advance);
        let before = env.audit_events().len();
        let r = env
            .call(
                Some(s.who),
                s.method,
                &env.path(&env.cluster, s.route),
                s.body.clone().map(String::into_bytes),
            )
            .await;
        let ctx = format!(
            "step {i}: {} {} {} -> {} {}",
            s.who,
            s.method,
            s.route,
            r.status,
            r.text()
        );
        assert_eq!(r.status, s.status, "{ctx}");
        if !r.body.is_empty() {
            assert_eq!(r.header("content-type"), Some("application/json"), "{ctx}");
        }
        match &s.expect {
            Expect::Json(v) => assert_eq!(&r.json(), v, "{ctx}"),
            Expect::Error(needle, fields) => {
                let body = r.json();
                assert!(body["error"].as_str().unwrap().contains(needle), "{ctx}");
                for (k, v) in fields.as_object().unwrap() {
                    assert_eq!(&body[k], v, "{ctx}: field {k}");
                }
            }
            Expect::Holder(holder) => holder.check(&r, &ctx),
            Expect::Empty => assert!(r.body.is_empty(), "{ctx}"),
            Expect::StateOf(n) => {
                let sent = pushed[*n].as_deref().unwrap();
                assert_eq!(r.body, sent.as_bytes(), "{ctx}");
                let meta: Value = serde_json::from_str(sent).unwrap();
                assert_eq!(
                    r.header("x-stategate-serial"),
                    Some(meta["serial"].to_string().as_str()),
                    "{ctx}"
                );
                assert_eq!(
                    r.header("x-stategate-lineage"),
                    meta["lineage"].as_str(),
                    "{ctx}"
                );
                let etag = format!("\"{}\"", sha256_hex(sent.as_bytes()));
                assert_eq!(r.header("etag"), Some(etag.as_str()), "{ctx}");
                assert!(
                    r.header("last-modified").unwrap().ends_with(" GMT"),
                    "{ctx}"
                );
                assert!(
                    r.header("x-stategate-version")
                        .unwrap()
                        .parse::<i64>()
                        .is_ok(),
                    "{ctx}"
                );
            }
        }
        let events = env.audit_events();
        assert_eq!(&events[before..], s.audit, "{ctx}: audit");
        pushed.push(if s.method == "PUT" && s.status == 200 {
            s.body.clone()
        } else {
            None
        });
    }

    // Stored versions: exactly the two accepted pushes (the no-op stored nothing).
    assert_eq!(env.version_count(), 2);
    // Audit rows carry actor, org, cluster (scope) and time; payloads as specified.
    let audit = env.audit(&env.cluster);
    let by_event = |e: &str| {
        audit
            .iter()
            .filter(|a| a.0 == e)
            .cloned()
            .collect::<Vec<_>>()
    };
    let pushes = by_event("cluster.state_pushed");
    assert_eq!(pushes[0].1, "alice@acme.example");
    assert_eq!(pushes[0].2, "acme");
    assert_eq!(pushes[0].3, json!({"serial": 1, "size": s1.len()}));
    assert_eq!(pushes[1].3, json!({"serial": 2, "size": s2.len()}));
    let stolen = &by_event("cluster.state_lock_stolen")[0];
    assert_eq!(stolen.1, "bob@acme.example");
    assert_eq!(
        stolen.3,
        json!({
            "operation": "deprovision",
            "host": "host-b",
            "previous_holder": {
                "holder_email": "alice@acme.example",
                "operation": "provision",
                "host": "host-a",
                "acquired_at": at(10),
                "heartbeat_age_seconds": STALE + 1,
            }
        })
    );
    let broken = &by_event("cluster.state_lock_broken")[0];
    assert_eq!(broken.1, "erin@acme.example");
    assert_eq!(
        broken.3["previous_holder"]["holder_email"],
        "alice@acme.example"
    );
    assert_eq!(broken.3["previous_holder"]["operation"], "state-push");
    // No content in the audit log, ever.
    let all = serde_json::to_string(&audit.iter().map(|a| &a.3).collect::<Vec<_>>()).unwrap();
    assert!(!all.contains("marker-") && !all.contains("lin-A"), "{all}");
}

/// The six routes, as (method, route suffix, body).
fn six_routes() -> Vec<(&'static str, &'static str, Option<Vec<u8>>)> {
    vec![
        ("GET", "tfstate", None),
        (
            "PUT",
            "tfstate",
            Some(marked_state(1, "l", "m").into_bytes()),
        ),
        (
            "POST",
            "lock",
            Some(br#"{"operation":"provision","host":"h"}"#.to_vec()),
        ),
        ("POST", "lock/heartbeat", None),
        ("DELETE", "lock", None),
        ("DELETE", "lock?force=1", None),
    ]
}

/// 401 / 403 / 404 on every route, identical 404 bodies for missing, malformed and
/// other-org clusters, and nothing changed by any of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_org_scoping_on_every_route() {
    let env = Env::start(Some(ENC_KEY)).await;
    // carol (globex) holds her own cluster's lock: a foreign lease must not leak either.
    let r = env
        .call(
            Some("carol"),
            "POST",
            &env.path(&env.other_cluster, "lock"),
            Some(br#"{"operation":"provision","host":"g"}"#.to_vec()),
        )
        .await;
    assert_eq!(r.status, 200);
    let before = env.snapshot();
    let missing = uuid::Uuid::new_v4().to_string();
    let not_found_body = br#"{"error":"cluster not found"}"#;
    let mut reference_404: Option<Vec<u8>> = None;
    for (method, route, body) in six_routes() {
        // (who, cluster id, status)
        let cases: Vec<(Option<&str>, String, u16)> = vec![
            (None, env.cluster.clone(), 401),
            (Some("raw:Bearer"), env.cluster.clone(), 401),
            (
                Some("raw:Bearer sgp_not-a-real-token"),
                env.cluster.clone(),
                401,
            ),
            (Some("raw:Token abc"), env.cluster.clone(), 401),
            (Some("raw:Basic !!!"), env.cluster.clone(), 401),
            (None, "not-a-uuid".into(), 401), // auth comes first, even for a bad id
            (Some("mallory"), env.cluster.clone(), 403),
            (Some("alice"), missing.clone(), 404),
            (Some("alice"), env.other_cluster.clone(), 404), // another org's cluster
            (Some("carol"), env.cluster.clone(), 404),
            (Some("dave"), env.cluster.clone(), 404),
            (Some("alice"), "not-a-uuid".into(), 404),
            (Some("alice"), "x.y".into(), 404),
            (Some("alice"), format!("{}x", env.cluster), 404),
            (Some("mallory"), env.other_cluster.clone(), 404), // member, wrong org: 404 first
        ];
        for (who, id, status) in cases {
            let r = env
                .call(who, method, &env.path(&id, route), body.clone())
                .await;
            let ctx = format!(
                "{method} {route} as {who:?} on {id}: {} {}",
                r.status,
                r.text()
            );
            assert_eq!(r.status, status, "{ctx}");
            assert!(r.json()["error"].is_string(), "{ctx}");
            if status == 404 {
                assert_eq!(&r.body[..], not_found_body, "{ctx}");
                let first = reference_404.get_or_insert_with(|| r.body.clone());
                assert_eq!(first, &r.body, "{ctx}");
            }
            if status == 401 {
                assert!(
                    r.json()["error"].as_str().unwrap().contains("Bearer"),
                    "{ctx}"
                );
            }
        }
    }
    assert_eq!(
        env.snapshot(),
        before,
        "a rejected request changed something"
    );
    // The id is a UUID in any spelling uuid accepts (here: uppercase).
    let r = env
        .call(
            Some("alice"),
            "GET",
            &env.path(&env.cluster.to_uppercase(), "tfstate"),
            None,
        )
        .await;
    assert_eq!(r.status, 404);
    assert!(r.text().contains("no state"), "{}", r.text());
}

/// No ADJ_STATE_ENC_KEY: every route answers exactly 503 {"error": "state sync not
/// configured"} to an authorized admin, after (never before) the auth and org checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_flag_off_is_503_on_every_route_after_auth() {
    for key in [None, Some("")] {
        let env = Env::start(key).await;
        assert!(!env.server.app.cluster.is_configured());
        let before = env.snapshot();
        for (method, route, body) in six_routes() {
            let path = env.path(&env.cluster, route);
            let r = env.call(Some("alice"), method, &path, body.clone()).await;
            assert_eq!(r.status, 503, "{method} {route}: {}", r.text());
            assert_eq!(&r.body[..], NOT_CONFIGURED, "{method} {route}");
            assert_eq!(r.header("content-type"), Some("application/json"));
            // Even a malformed body: the flag answers first.
            if method == "PUT" || route == "lock" {
                let r = env
                    .call(Some("alice"), method, &path, Some(b"garbage".to_vec()))
                    .await;
                assert_eq!((r.status, &r.body[..]), (503, NOT_CONFIGURED));
            }
            // The admin/org check comes first.
            for (who, id, status) in [
                (None, env.cluster.clone(), 401),
                (Some("mallory"), env.cluster.clone(), 403),
                (Some("carol"), env.cluster.clone(), 404),
                (Some("alice"), "not-a-uuid".to_string(), 404),
            ] {
                let r = env
                    .call(who, method, &env.path(&id, route), body.clone())
                    .await;
                assert_eq!(
                    r.status,
                    status,
                    "{method} {route} as {who:?}: {}",
                    r.text()
                );
            }
        }
        assert_eq!(env.snapshot(), before);
    }
}

/// PUT checks run in the contract's order: auth, key, lock holder, 10 MiB cap, parse,
/// conflict rules. Each row breaks every later rule too, so only the order explains
/// the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_validation_order() {
    let env = Env::start(Some(ENC_KEY)).await;
    let off = Env::start(None).await;
    assert_eq!(env.lock("alice", "provision", "a").await.status, 200);
    assert_eq!(
        env.push("alice", &marked_state(5, "lin", "v5"))
            .await
            .status,
        200
    );
    let put_head = |env: &Env, who: Option<&str>, len: u64, extra: &str| {
        let auth = who
            .map(|w| format!("Authorization: Bearer {}\r\n", env.token(w)))
            .unwrap_or_default();
        format!(
            "PUT /v1/clusters/{}/tfstate HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len}\r\n{extra}Connection: close\r\n\r\n",
            env.cluster
        )
    };
    let huge = MAX_STATE_BYTES + 1;
    let before = env.snapshot();
    // Declared-oversized, never-sent bodies: rejected before a byte is read.
    let rows: Vec<(&Env, Option<&str>, u16, &str)> = vec![
        (&env, None, 401, "Bearer"),
        (&env, Some("carol"), 404, "cluster not found"),
        (&env, Some("mallory"), 403, "admin"),
        (&off, Some("alice"), 503, "state sync not configured"),
        (&env, Some("bob"), 409, "alice@acme.example"), // not the holder: before the cap
        (&env, Some("alice"), 413, "limit"),
    ];
    for (e, who, status, needle) in rows {
        let (code, text) =
            common::raw_request(&e.server.base, &put_head(e, who, huge, ""), None).await;
        assert_eq!(code, status, "{who:?}: {text}");
        assert!(text.contains(needle), "{who:?}: {text}");
    }
    // No Content-Length (chunked): the read stops at the cap.
    let chunk = vec![b' '; 1024 * 1024];
    let mut chunked = Vec::new();
    for _ in 0..11 {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = format!(
        "PUT /v1/clusters/{}/tfstate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        env.cluster,
        env.token("alice")
    );
    let (code, text) = common::raw_request(&env.server.base, &head, Some(chunked)).await;
    assert_eq!(code, 413, "{text}");
    // Under the cap: parse (400) before the conflict rules; then the rules (409).
    let r = env.push("alice", "[1, 2]").await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = env
        .push("alice", &marked_state(4, "other-lineage", "x"))
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("lineage"));
    assert_eq!(env.snapshot(), before);

    // Exactly 10 MiB is accepted, and read back byte for byte.
    let mut big = marked_state(6, "lin", "big").into_bytes();
    big.pop(); // the closing brace
    let pad = MAX_STATE_BYTES as usize - big.len() - r#","pad":""}"#.len();
    big.extend_from_slice(format!(r#","pad":"{}"}}"#, "p".repeat(pad)).as_bytes());
    assert_eq!(big.len() as u64, MAX_STATE_BYTES);
    let r = env
        .call(
            Some("alice"),
            "PUT",
            &env.path(&env.cluster, "tfstate"),
            Some(big.clone()),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"serial": 6}));
    let r = env.pull("bob").await;
    assert_eq!(r.status, 200);
    assert!(r.body == big, "10 MiB state did not round-trip");
}

/// Malformed and hostile input: a clear 4xx JSON error each, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_4xx_and_changes_nothing() {
    let env = Env::start(Some(ENC_KEY)).await;
    assert_eq!(env.lock("alice", "provision", "a").await.status, 200);
    assert_eq!(
        env.push("alice", &marked_state(1, "lin", "v1"))
            .await
            .status,
        200
    );
    let before = env.snapshot();
    let lock = env.path(&env.cluster, "lock");
    let tfstate = env.path(&env.cluster, "tfstate");
    let b = |s: &str| Some(s.as_bytes().to_vec());
    type Row<'a> = (&'a str, &'a str, String, Option<Vec<u8>>, u16, &'a str);
    let rows: Vec<Row> = vec![
        (
            "bob",
            "POST",
            lock.clone(),
            b("{not json"),
            400,
            "invalid lock request",
        ),
        (
            "bob",
            "POST",
            lock.clone(),
            b(""),
            400,
            "invalid lock request",
        ),
        (
            "bob",
            "POST",
            lock.clone(),
            b(r#"{"operation":"apply","host":"h"}"#),
            400,
            "unknown operation",
        ),
        (
            "bob",
            "POST",
            lock.clone(),
            b(r#"{"operation":"provision"}"#),
            400,
            "host",
        ),
        (
            "bob",
            "POST",
            lock.clone(),
            b(r#"{"operation":"provision","host":["h"]}"#),
            400,
            "invalid lock request",
        ),
        (
            "bob",
            "POST",
            lock.clone(),
            Some(vec![b' '; 17 * 1024]),
            413,
            "limit",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b("{\"serial\": 1"),
            400,
            "invalid JSON",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(""),
            400,
            "not a Terraform/OpenTofu state",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(r#"{"version":4,"serial":-1,"lineage":"lin"}"#),
            400,
            "serial",
        ),
        // Terraform's serial is a uint64: what an i64 cannot hold is refused, and says so.
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(r#"{"version":4,"serial":9223372036854775808,"lineage":"lin"}"#),
            400,
            "larger than 9223372036854775807, the largest serial stategate can store",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(r#"{"version":4,"serial":18446744073709551615,"lineage":"lin"}"#),
            400,
            "the largest serial stategate can store",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(r#"{"version":4,"serial":2.5,"lineage":"lin"}"#),
            400,
            "non-negative integer",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(r#"{"version":4,"serial":2,"lineage":""}"#),
            400,
            "lineage",
        ),
        (
            "alice",
            "PUT",
            tfstate.clone(),
            b(r#"{"version":4,"serial":"2","lineage":"lin"}"#),
            400,
            "serial",
        ),
        (
            "alice",
            "DELETE",
            format!("{lock}?force=yes"),
            None,
            400,
            "force",
        ),
        ("alice", "PATCH", tfstate.clone(), None, 405, "not allowed"),
        ("alice", "GET", lock.clone(), None, 405, "not allowed"),
        (
            "alice",
            "GET",
            format!("/v1/clusters/{}/nope", env.cluster),
            None,
            404,
            "no such route",
        ),
        (
            "alice",
            "GET",
            env.path("%00", "tfstate"),
            None,
            404,
            "cluster not found",
        ),
        (
            "alice",
            "GET",
            env.path(&"9".repeat(5000), "tfstate"),
            None,
            404,
            "cluster not found",
        ),
        (
            "raw:Bearer sgp_AAAA",
            "GET",
            tfstate.clone(),
            None,
            401,
            "Bearer",
        ),
        (
            "raw:bearer",
            "PUT",
            tfstate.clone(),
            b(&marked_state(2, "lin", "x")),
            401,
            "Bearer",
        ),
    ];
    for (who, method, path, body, status, needle) in rows {
        let r = env.call(Some(who), method, &path, body).await;
        let ctx = format!(
            "{who} {method} {}: {} {}",
            &path[..path.len().min(80)],
            r.status,
            r.text()
        );
        assert_eq!(r.status, status, "{ctx}");
        let err = r.json()["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_default();
        assert!(err.contains(needle), "{ctx}");
        assert!(
            !err.contains("rusqlite") && !err.contains("sqlite"),
            "{ctx}"
        );
    }
    assert_eq!(env.snapshot(), before, "bad input changed something");
    // Still alice's lock, still serial 1.
    assert_eq!(env.heartbeat("alice").await.status, 200);
    assert_eq!(
        env.pull("bob").await.header("x-stategate-serial"),
        Some("1")
    );
}

/// Blobs are sealed under a key derived from ADJ_STATE_ENC_KEY (not the DEK) and hold
/// no plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_encrypted_under_the_state_key() {
    let env = Env::start(Some(ENC_KEY)).await;
    assert_eq!(env.lock("alice", "provision", "a").await.status, 200);
    let s = marked_state(1, "lin", "very-secret-marker");
    assert_eq!(env.push("alice", &s).await.status, 200);
    let files = env.server.blob_files();
    assert_eq!(files.len(), 1);
    let blob = std::fs::read(&files[0]).unwrap();
    assert!(!String::from_utf8_lossy(&blob).contains("very-secret-marker"));
    let scope = format!("cluster/{}", env.cluster);
    let sha = sha256_hex(s.as_bytes());
    let open = |key: &str| {
        stategate::store::format::decode(
            &RootKey::from_base64(key).unwrap().blob_key(&scope),
            &blob,
            &scope,
            1,
            Some(&sha),
        )
    };
    assert_eq!(open(ENC_KEY).unwrap(), s.as_bytes());
    assert!(open(common::DEK).is_err());
}

/// Racing writers: the rules hold inside the commit, so exactly one of several
/// different same-serial pushes wins, and exactly one of several acquirers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_have_one_winner() {
    let env = Arc::new(Env::start(Some(ENC_KEY)).await);
    let mut tasks = Vec::new();
    for who in ["alice", "bob", "erin"] {
        let env = env.clone();
        tasks.push(tokio::spawn(async move {
            (who, env.lock(who, "provision", who).await.status)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (who, status) = t.await.unwrap();
        assert!(status == 200 || status == 409, "{status}");
        if status == 200 {
            winners.push(who);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let holder = winners[0];
    let mut tasks = Vec::new();
    for i in 0..6 {
        let env = env.clone();
        tasks.push(tokio::spawn(async move {
            env.push(holder, &marked_state(1, "lin", &format!("racer-{i}")))
                .await
                .status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409, 409, 409]);
    assert_eq!(env.version_count(), 1);
    assert_eq!(
        env.audit_events()
            .iter()
            .filter(|e| *e == "cluster.state_pushed")
            .count(),
        1
    );
}

/// Issue 4's scenario: two admins' CLIs against one cluster, an org admin breaking a
/// lock, and a third org's admin who sees nothing but 404s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admins_one_cluster() {
    let env = Env::start(Some(ENC_KEY)).await;
    let (a, b) = ("alice", "bob");

    // A: acquire → pull (nothing yet) → push serial 1 → heartbeat every 60 s.
    assert_eq!(env.lock(a, "provision", "laptop-a").await.status, 200);
    assert_eq!(env.pull(a).await.status, 404);
    assert_eq!(env.push(a, &marked_state(1, "L", "a1")).await.status, 200);
    for _ in 0..3 {
        env.clock.advance(60);
        assert_eq!(env.heartbeat(a).await.status, 200);
    }
    // B is refused with A's details.
    env.clock.advance(20);
    let a_holds = |age| Holder {
        email: "alice@acme.example",
        operation: "provision",
        host: "laptop-a",
        age,
    };
    a_holds(20).check(&env.lock(b, "deprovision", "laptop-b").await, "B refused");
    // A goes silent (its tofu hangs, its laptop sleeps): B waits, then steals.
    env.clock.advance(STALE - 20);
    a_holds(STALE).check(
        &env.lock(b, "deprovision", "laptop-b").await,
        "not stale yet",
    );
    env.clock.advance(1);
    assert_eq!(env.lock(b, "deprovision", "laptop-b").await.status, 200);
    // A wakes up: its push and heartbeat are rejected, naming B.
    let b_holds = Holder {
        email: "bob@acme.example",
        operation: "deprovision",
        host: "laptop-b",
        age: 0,
    };
    let late_push = env.push(a, &marked_state(2, "L", "a2-late")).await;
    b_holds.check(&late_push, "A's late push");
    b_holds.check(&env.heartbeat(a).await, "A's late heartbeat");
    // B pulls A's last good state, pushes the next serial, releases.
    let r = env.pull(b).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, marked_state(1, "L", "a1").as_bytes());
    assert_eq!(r.header("x-stategate-serial"), Some("1"));
    assert_eq!(env.push(b, &marked_state(2, "L", "b2")).await.status, 200);
    assert_eq!(env.release(b, false).await.status, 200);
    // A (any admin) now sees B's state.
    assert_eq!(
        env.pull(a).await.body,
        marked_state(2, "L", "b2").as_bytes()
    );
    // A acquires again and stalls; org admin erin force-breaks it while it is fresh.
    assert_eq!(env.lock(a, "state-push", "laptop-a").await.status, 200);
    assert_eq!(env.release("erin", false).await.status, 409); // not without force
    assert_eq!(env.release("erin", true).await.status, 200);
    assert_eq!(env.push(a, &marked_state(3, "L", "a3")).await.status, 409);
    // The third org's admin: 404 on all six routes, same body as a missing cluster.
    let missing = uuid::Uuid::new_v4().to_string();
    for (method, route, body) in six_routes() {
        let theirs = env
            .call(
                Some("dave"),
                method,
                &env.path(&env.cluster, route),
                body.clone(),
            )
            .await;
        let nothing = env
            .call(
                Some("dave"),
                method,
                &env.path(&missing, route),
                body.clone(),
            )
            .await;
        assert_eq!(theirs.status, 404, "{method} {route}");
        assert_eq!(theirs.body, nothing.body, "{method} {route}");
        assert_eq!(nothing.status, 404);
    }

    let audit = env.audit(&env.cluster);
    let events: Vec<(&str, &str)> = audit.iter().map(|a| (a.0.as_str(), a.1.as_str())).collect();
    assert_eq!(
        events,
        [
            ("cluster.state_lock_acquired", "alice@acme.example"),
            ("cluster.state_pushed", "alice@acme.example"),
            ("cluster.state_lock_stolen", "bob@acme.example"),
            ("cluster.state_pushed", "bob@acme.example"),
            ("cluster.state_lock_released", "bob@acme.example"),
            ("cluster.state_lock_acquired", "alice@acme.example"),
            ("cluster.state_lock_broken", "erin@acme.example"),
        ]
    );
    assert_eq!(
        audit[2].3["previous_holder"]["holder_email"],
        "alice@acme.example"
    );
    assert_eq!(
        audit[2].3["previous_holder"]["heartbeat_age_seconds"],
        STALE + 1
    );
    assert_eq!(
        audit[6].3["previous_holder"]["holder_email"],
        "alice@acme.example"
    );
    assert!(audit.iter().all(|a| a.2 == "acme"));
    assert_eq!(env.version_count(), 2);
}

/// A push is held whole, and the blob store collects a sealed copy of it (up to its
/// write buffer) while writing: both count in the body budget at once. A push that
/// fits beside other requests' bodies but not with its copy is told to retry (429) and
/// changes nothing; once the others are done it goes in.
#[tokio::test]
async fn a_push_counts_its_store_copy_in_the_body_budget() {
    const KIB: u64 = 1024;
    let env = Env::start(Some(ENC_KEY)).await;
    assert_eq!(env.lock("alice", "provision", "a").await.status, 200);
    let state = marked_state(1, "lin", &"x".repeat(300 * KIB as usize));
    let copy =
        (state.len() as u64).min(env.server.app.cluster.store().blobs().write_buffer_bytes());
    assert!(copy >= 200 * KIB, "the local store buffers {copy} bytes");
    // Other requests hold all but room for the body and half its copy.
    let budget = &env.server.app.body_budget;
    let room = state.len() as u64 + copy / 2;
    let others = budget.reserve(budget.available_bytes() - room).unwrap();
    let before = env.snapshot();
    let refused = env.push("alice", &state).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(env.snapshot(), before);
    drop(others);
    assert_eq!(env.push("alice", &state).await.status, 200);
    assert_eq!(env.pull("alice").await.body, state.as_bytes());
}
